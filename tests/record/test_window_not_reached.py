"""A job that ends before the profiled window: `record` and `analyze` both say so, exit codes pass through."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.record.conftest import REPO, assert_job_ok, child_env, run_record, torchrun

USER_SCRIPTS = REPO / "tests" / "user_scripts"


def _analyze(trace_dir, out) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracekit", "analyze", str(trace_dir), "--out", str(out), "-q"],
                          env=child_env(COLUMNS="400"), capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_ddp_job_shorter_than_the_window(tmp_path):
    out = tmp_path / "rec"
    steps, wait, warmup = 10, 12, 1
    res = run_record(out, torchrun(USER_SCRIPTS / "ddp_loop.py", 2, "--steps", str(steps)),
                     "--wait", str(wait), "--warmup", str(warmup), "--active", "3",
                     env=child_env(COLUMNS="400"))
    assert_job_ok(res, out)  # the job itself succeeded
    first = wait + warmup  # torch.profiler's schedule: steps 0..wait-1 idle, then warmup, then active
    window = list(range(first, first + 3))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "window_not_reached"
    assert manifest["window"]["requested_steps"] == window
    assert manifest["window"]["last_step"] == steps  # the job's 10 optimizer steps: step 10 had begun
    assert not list(out.glob("rank*.pt.trace.json.gz"))
    assert "recording ok" not in res.stderr
    msg = " ".join(res.stderr.split())
    assert f"steps {window[0]}-{window[-1]}" in msg and "never reached" in msg and f"step {steps}" in msg
    assert "next:  tracekit analyze" not in res.stderr
    ana = _analyze(out, tmp_path / "ana")
    assert ana.returncode == 1
    amsg = " ".join(ana.stderr.split())
    assert "never reached" in amsg and f"steps {window[0]}-{window[-1]}" in amsg and f"step {steps}" in amsg


def test_failing_short_job_keeps_its_exit_code(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys, torch
        m = torch.nn.Linear(2, 2); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad(); m(torch.ones(1, 2)).sum().backward(); opt.step()
        sys.exit(3)
    """))
    out = tmp_path / "rec"
    res = run_record(out, [sys.executable, str(script)], "--wait", "5", "--warmup", "1", env=child_env(COLUMNS="400"))
    assert res.returncode == 3
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "window_not_reached" and manifest["exit_code"] == 3
    # steps 6.. : --wait 5 + --warmup 1, then the default window's minimum of 8 steps (docs/metrics.md §15)
    assert manifest["window"]["last_step"] == 3 and manifest["window"]["requested_steps"] == list(range(6, 14))
    assert "never reached" in " ".join(res.stderr.split())
