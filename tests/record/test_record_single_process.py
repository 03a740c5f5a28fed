"""`tracekit record -- python train.py` on a single-process script that knows nothing of tracekit."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.record.conftest import PY, child_env, expected_active_steps, load_comms, load_trace, profiler_steps, run_record

NUM_STEPS = 8

SCRIPT = textwrap.dedent(f"""
    import builtins, sys, torch
    # A user sitecustomize (on PYTHONPATH before us) must still have run.
    print("user-sitecustomize:", getattr(builtins, "_user_site_ran", False))
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    aux = torch.optim.SGD(m.parameters(), lr=0.0)  # a second optimizer must not advance the step count
    for i in range({NUM_STEPS}):
        opt.zero_grad()
        with torch.profiler.record_function("user:forward"):
            loss = m(torch.randn(8, 16)).sum()
        loss.backward()
        opt.step()
        aux.step()
    sys.exit(3)
""")


@pytest.mark.slow
def test_single_process_script_is_recorded(tmp_path, script_dir):
    (script_dir / "train.py").write_text(SCRIPT)
    user_site = tmp_path / "user_site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import builtins\nbuiltins._user_site_ran = True\n")
    out = tmp_path / "out"
    res = run_record(out, [PY, str(script_dir / "train.py")], "--wait", "2", "--warmup", "1", "--active", "2",
                     env=child_env(PYTHONPATH=str(user_site)))
    assert res.returncode == 3, res.stderr  # COMMAND's exit code passes through
    assert "user-sitecustomize: True" in res.stdout
    assert "tracekit analyze" in res.stderr and "rank 0: ok" in res.stderr

    trace = load_trace(out / "rank0.pt.trace.json.gz")
    want = expected_active_steps(2, 1, 2, 1, NUM_STEPS)
    assert want == [3, 4]
    assert profiler_steps(trace) == want
    assert trace["tracekit"]["partial"] is False and trace["tracekit"]["steps"] == want
    # Every user range in the kept steps, and none of the optimizer ranges straddles a step boundary.
    steps = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
             if e.get("name", "").startswith("ProfilerStep#")}
    forwards = [e for e in trace["traceEvents"] if e.get("name") == "user:forward" and e.get("ph") == "X"]
    assert len(forwards) == len(want)
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("name", "").startswith("Optimizer.step#"):
            lo, hi = e["ts"], e["ts"] + e["dur"]
            assert any(a <= lo and hi <= b for a, b in steps.values()), e["name"]

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["command"] == [PY, str(script_dir / "train.py")]
    assert manifest["exit_code"] == 3 and manifest["world_size"] == 1 and manifest["missing_ranks"] == []
    [rank] = manifest["ranks"]
    assert rank["rank"] == 0 and rank["rank_source"] == "single_process" and rank["status"] == "ok"
    assert rank["profiled_steps"] == want and rank["trace_partial"] is False
    anchors = manifest["clock_anchors"]["0"]
    assert [a["step"] for a in anchors["trace_anchors"]] == want
    # The anchor events in the trace carry the wall clock read just before them.
    events = [e for e in trace["traceEvents"] if e.get("name") == "tracekit::clock_anchor"]
    assert [int(e["args"]["wall_ns"]) for e in events] == [a["wall_ns"] for a in anchors["trace_anchors"]]
    header, entries, footer = load_comms(out / "comms.rank0.jsonl")
    assert header["rank"] == 0 and entries == [] and footer["status"] == "ok"
    assert not (out / ".parts").exists()


def test_help_documents_every_option():
    from typer.testing import CliRunner

    from tracekit.cli.main import app

    res = CliRunner().invoke(app, ["record", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for opt in ("--out", "--wait", "--warmup", "--active", "--repeat", "--skip-first", "--ranks",
                "--ranks-per-group", "--step-on", "--log-collectives", "--clock-barrier", "--overwrite",
                "--flight-recorder", "--with-stack", "Examples"):
        assert opt in res.output, opt


def test_refuses_to_mix_recordings_and_needs_a_command(tmp_path):
    from typer.testing import CliRunner

    from tracekit.cli.main import app

    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    res = CliRunner().invoke(app, ["record", "--out", str(out), "--", PY, "-c", "pass"])
    assert res.exit_code == 2 and "--overwrite" in res.output
    res = CliRunner().invoke(app, ["record", "--out", str(tmp_path / "new")])
    assert res.exit_code == 2 and "no COMMAND" in res.output
    res = CliRunner().invoke(app, ["record", "--out", str(tmp_path / "new"), "--wait", "0", "--", PY])
    assert res.exit_code == 2 and "--wait + --skip-first" in res.output


CPU_WINDOW_SCRIPT = textwrap.dedent("""
    import torch
    w = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([w], lr=0.1)
    for i in range(7):
        x = w
        for _ in range(3000):  # many cheap ops: the trace's export takes longer than the steps
            x = x + 1
        opt.zero_grad()
        x.sum().backward()
        opt.step()
""")


@pytest.mark.slow
def test_cpu_window_spans_the_profiled_steps_not_the_export(tmp_path, script_dir):
    """The run-queue wait window (record/cpu_share.py) covers the profiled steps: its wall time is their span
    in the trace (first ProfilerStep's start to the last one's end), not that plus the profiler's export of
    the cycle, whose CPU time is not the training's (it diluted `cpu_wait_share`)."""
    (script_dir / "train.py").write_text(CPU_WINDOW_SCRIPT)
    out = tmp_path / "out"
    res = run_record(out, [PY, str(script_dir / "train.py")], "--wait", "2", "--warmup", "1", "--active", "3")
    assert res.returncode == 0, res.stderr
    trace = load_trace(out / "rank0.pt.trace.json.gz")
    steps = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")]
    assert len(steps) == 3
    span_ns = int((max(e["ts"] + e["dur"] for e in steps) - min(e["ts"] for e in steps)) * 1000)
    [rank] = json.loads((out / "manifest.json").read_text())["ranks"]
    win = rank["cpu_window"]
    # The window opens as the first step is entered and closes as the last one ends: a few Python calls
    # either side (the slack), where the export of 9,000 events took 10x the steps (2.9 s for 0.23 s).
    assert abs(win["wall_ns"] - span_ns) <= max(span_ns // 5, 5_000_000), (win, span_ns)
