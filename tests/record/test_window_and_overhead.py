"""`tracekit record`'s default window, the overhead it measures inside it, and PyTorch's profiler notices
(issue 33's papercuts).

- The default window: max(8, ceil(1000 ms / fastest warmup step)) steps, at most 100 (the rule the help
  states), from the schedule the CLI builds with no options.
- A script of 200 ms steps that sleeps 100 ms more while a profiler is on (a known overhead): 8 steps kept;
  the recorder's step timing classifies each step (profiled: the kept ones; unprofiled: those after the
  export step) and its ratio is median(profiled) / median(unprofiled) of its own lists, about 1.5; analyze
  carries it in the `recording` section and the advisor's measured run divides by it.
- Kineto's `USDT ... profiler_start/stop` lines are held back from the user's terminal and counted; the
  script's own stderr lines pass.
"""

from __future__ import annotations

import json
import math
import statistics
import textwrap

import pytest
from typer.testing import CliRunner

from tests.record.conftest import PY, load_trace, profiler_steps, run_record

SLEEP_S, EXTRA_S, NUM_STEPS = 0.2, 0.1, 15

SCRIPT = textwrap.dedent(f"""
    import sys, time, torch
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    print("user line on stderr: keep me", file=sys.stderr)
    for i in range({NUM_STEPS}):
        time.sleep({SLEEP_S} + ({EXTRA_S} if torch.autograd.profiler._is_profiler_enabled else 0.0))
        opt.zero_grad()
        m(torch.randn(4, 8)).sum().backward()
        opt.step()
""")


def test_default_window_rule(monkeypatch, tmp_path):
    """The schedule `tracekit record` builds without options, against the rule written out here."""
    import tracekit.record.launch as launch
    from tracekit.cli.main import app

    seen = {}

    def capture(config, command, **_):
        seen["schedule"] = config.schedule
        raise launch.RecordError("stop here")

    monkeypatch.setattr(launch, "run_record", capture)
    CliRunner().invoke(app, ["record", "--out", str(tmp_path / "o"), "--", "python", "x.py"])
    s = seen["schedule"]
    for step_ms in (10, 50, 125, 200, 500, 800, 2000):
        want = min(100, max(8, math.ceil(1000 / step_ms)))
        assert s.active_for(step_ms * 1_000_000) == want, step_ms
    assert s.active_for(200_000_000) == s.active_for(800_000_000) == 8   # the 200-800 ms steps


def test_step_timer_classifies_and_divides():
    from tracekit.record.step_timing import StepTimer, recording_overhead

    t = StepTimer()
    t.boundary("other")  # start
    for kind in ("unprofiled", "other", "profiled", "profiled", "profiled", "other", "unprofiled", "unprofiled"):
        t.boundary(kind)
    s = t.summary()
    assert len(s["profiled_ns"]) == 3 and len(s["unprofiled_ns"]) == 2 and s["unprofiled_from"] == "after_window"
    assert s["overhead_ratio"] == statistics.median(s["profiled_ns"]) / statistics.median(s["unprofiled_ns"])
    over = recording_overhead({0: {"step_timing": {**s, "overhead_ratio": 1.2}},
                               1: {"step_timing": {**s, "overhead_ratio": 1.4}},
                               2: {"step_timing": {**s, "overhead_ratio": None}}})
    assert over["ratio"] == pytest.approx(1.3) and set(over["by_rank"]) == {"0", "1"}


def test_advisor_calibrates_on_unprofiled_steps():
    from tracekit.advise.calibrate import measured_run

    analysis = {"ranks": [{"rank": 0, "steps": 2, "step_ns": 300_000_000, "compute_ns": 150_000_000}],
                "sections": {"recording": {"recorder_overhead": {"ratio": 1.5}}}}
    m = measured_run(analysis)
    assert (m.step_ns, m.compute_ns, m.recorder_overhead) == (100_000_000, 50_000_000, 1.5)
    from tracekit.compare.expect import measured  # check --expect compares like with like

    assert measured(analysis)["step_ns"] == pytest.approx(100_000_000)
    del analysis["sections"]["recording"]
    m = measured_run(analysis)
    assert (m.step_ns, m.compute_ns, m.recorder_overhead) == (150_000_000, 75_000_000, 1.0)


@pytest.mark.slow  # ~15 s: 15 steps of 200-300 ms, torch import, analyze
def test_long_steps_window_overhead_and_notices(tmp_path, script_dir):
    from tracekit.analysis import analyze_run

    (script_dir / "train.py").write_text(SCRIPT)
    out = tmp_path / "out"
    res = run_record(out, [PY, str(script_dir / "train.py")], "--no-clock-barrier")
    assert res.returncode == 0, res.stderr
    # window: 1 wait + 2 warmup steps, then 8 steps (200 ms steps ask for ceil(1000 / 200) = 5 < 8)
    assert profiler_steps(load_trace(out / "rank0.pt.trace.json.gz")) == list(range(3, 11))
    # notices: none reach the terminal; the script's own line does; the summary says how many were held
    assert "USDT:" not in res.stderr and "user line on stderr: keep me" in res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    [rank] = manifest["ranks"]
    held = rank["notices_held"]
    assert held.get("Kineto profiler_start/profiler_stop", 0) >= 2, held
    assert f"{sum(held.values())} lines of PyTorch profiler notices not shown" in res.stderr
    # overhead: profiled = the 8 kept steps; unprofiled = steps 12-14 (step 11 exports the trace)
    timing = rank["step_timing"]
    assert len(timing["profiled_ns"]) == 8 and len(timing["unprofiled_ns"]) == NUM_STEPS - 12
    assert min(timing["profiled_ns"]) >= (SLEEP_S + EXTRA_S) * 1e9 and min(timing["unprofiled_ns"]) >= SLEEP_S * 1e9
    ratio = statistics.median(timing["profiled_ns"]) / statistics.median(timing["unprofiled_ns"])
    assert timing["overhead_ratio"] == pytest.approx(ratio)
    assert 1.2 < ratio < (SLEEP_S + EXTRA_S) / SLEEP_S + 0.2  # 1.5 injected, plus the profiler's own cost
    assert manifest["recording_overhead"]["ratio"] == pytest.approx(ratio)
    assert "recording overhead in the window: steps x" in res.stderr
    run = analyze_run(out, tmp_path / "analysis")
    assert run.analysis["sections"]["recording"]["recorder_overhead"]["ratio"] == pytest.approx(ratio)
