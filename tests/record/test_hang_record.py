"""Real hangs made with `tracekit record --hang-timeout` on 4 gloo ranks under torchrun (tests/record/hang_job.py).

Each scenario's expected answer is what the job was told to do (the test wrote the fault): which rank,
which collective (the job issues one all_reduce per step on the default group, so the step BAD's is
all_reduce number BAD + 1; the pipeline's stage-1 rank waits in its recv number BAD * MICRO + MICRO: the
skipped micro-batch's recv took the next one's data) and which kind. A healthy job with the same knobs
must leave no hang files and report none. About 15 s per scenario on the 2-core box (marked slow).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.record.conftest import run_record, torchrun

JOB = Path(__file__).with_name("hang_job.py")
sys.path.insert(0, str(JOB.parent))
from hang_job import BAD, MICRO, STEPS  # noqa: E402  (the job's own constants: the faults it injects)

# minutes of multi-process runs: in scripts/test.sh's second pass, after the suite (tests/conftest.py: `long`)
pytestmark = pytest.mark.long

TIMEOUT_S = "3"
HUNG_EXIT = 3

# scenario -> (root ranks, kind, op the root is absent from / waited on in, its sequence number, record stops it)
EXPECTED = {
    "sleep": ([1], "missing", "all_reduce", BAD + 1, True),
    # rank 3 skipped one all_reduce, so its closing barrier is its call number STEPS where the others call
    # their last all_reduce (the desync shows as a mismatch there)
    "desync": ([3], "mismatch", "all_reduce", STEPS, True),
    "mismatch": ([2], "mismatch", "all_reduce", BAD + 1, False),
    "die": ([2], "dead", "all_reduce", BAD + 1, False),
    "pipeline": ([0], "missing", "recv", BAD * MICRO + MICRO, True),
}


def _analyze(run_dir: Path, out: Path) -> tuple[int, dict]:
    """`tracekit analyze RUN --out OUT` (in process: the CLI's exit code and its analysis.json)."""
    from typer.testing import CliRunner

    from tracekit.cli.main import app

    res = CliRunner().invoke(app, ["analyze", str(run_dir), "--out", str(out), "-q"])
    return res.exit_code, json.loads((out / "analysis.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_record_leaves_a_post_mortem_that_names_the_fault(scenario, tmp_path):
    ranks, kind, op, seq, stopped = EXPECTED[scenario]
    run_dir = tmp_path / "run"
    res = run_record(run_dir, torchrun(JOB, 4, scenario), "--hang-timeout", TIMEOUT_S, timeout=240)
    if stopped:  # a hang: record saw no progress for the timeout, dumped, stopped the job
        assert res.returncode == HUNG_EXIT, res.stderr[-3000:]
        assert "the job is hung" in res.stderr
    else:  # the job failed on its own (gloo aborts a rank on a size mismatch; torchrun stops the others)
        assert res.returncode not in (0, HUNG_EXIT), res.stderr[-3000:]
        assert "post-mortem" in res.stderr
    dumps = sorted(p.name for p in (run_dir / "hang").glob("flight_recorder.rank*.json"))
    assert dumps == [f"flight_recorder.rank{r}.json" for r in range(4)]
    rc, a = _analyze(run_dir, tmp_path / "analysis")
    assert rc == HUNG_EXIT
    top = a["findings"][0]
    assert top["kind"] == "hang" and top["severity"] == "critical"
    assert top["ranks"] == ranks and top["evidence"]["hang_kind"] == kind, top["summary"]
    c = top["evidence"]["collective"]
    assert c["op"] == op and c["pg_name"] == "0"
    if seq is not None:
        assert c["seq"] == seq
    if scenario == "desync":  # rank 3 skipped one all_reduce: its barrier meets the others' last all_reduce
        mism = top["evidence"]["mismatched"]
        assert [m["rank"] for m in mism] == [3] and mism[0]["op"] == "barrier"
    if scenario == "mismatch":
        mism = top["evidence"]["mismatched"]
        assert [(m["rank"], m["in_sizes"]) for m in mism] == [(2, "32")] and c["in_sizes"] == "16"
    if scenario == "pipeline":
        assert c["waiting_rank"] == 1 and c["peer"] == 0 and c["peer_skipped"]
    if scenario == "die":
        assert 2 in a["sections"]["hang"]["dumps"]["dead"]
    if scenario == "sleep":  # the root's stack says where it is: the job's sleep, not a collective
        frames = a["sections"]["hang"]["root_causes"][0]["frames"]["1"]
        assert "hang_job.py" in frames.splitlines()[0] and " main" in frames.splitlines()[0]


@pytest.mark.slow
def test_healthy_job_with_the_same_knobs_reports_no_hang(tmp_path):
    run_dir = tmp_path / "run"
    res = run_record(run_dir, torchrun(JOB, 4, "healthy"), "--hang-timeout", TIMEOUT_S, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "hung" not in res.stderr and "post-mortem" not in res.stderr
    assert not (run_dir / "hang").exists() and not (run_dir / ".hang").exists()
    assert not (run_dir / "hang-analysis").exists()


@pytest.mark.slow
def test_hang_with_traces_of_the_same_job(tmp_path):
    """The job is profiled (steps 2-3), then hangs at step TRAIN_BAD: the analysis of the run directory has
    the usual per-rank breakdown and the hang section beside it, the hang first."""
    run_dir = tmp_path / "run"
    res = run_record(run_dir, torchrun(JOB, 4, "train"), "--hang-timeout", TIMEOUT_S, "--wait", "1", "--warmup", "1",
                     "--active", "2", timeout=240)
    assert res.returncode == HUNG_EXIT, res.stderr[-3000:]
    assert sorted(p.name for p in run_dir.glob("rank*.pt.trace.json.gz")) == [f"rank{r}.pt.trace.json.gz" for r in range(4)]
    rc, a = _analyze(run_dir, tmp_path / "analysis")
    assert rc == HUNG_EXIT
    assert sorted(r["rank"] for r in a["ranks"]) == [0, 1, 2, 3] and all(r["steps"] == 2 for r in a["ranks"])
    top = a["findings"][0]
    assert top["kind"] == "hang" and top["ranks"] == [1] and top["evidence"]["hang_kind"] == "missing"
    # the job's gradient all_reduce: one per step on the default group, so step TRAIN_BAD's is number TRAIN_BAD + 1
    # (FR counts collectives from Python and from the profiler's clock barrier alike: compare to the others' entry)
    c = top["evidence"]["collective"]
    assert c["op"] == "all_reduce" and c["in_sizes"] == str(32 * 32 + 32) and c["entered"] == [0, 2, 3]
    last = {r["rank"]: r for r in a["sections"]["hang"]["last_entered"]}
    assert all(last[r]["seq"] == c["seq"] for r in (0, 2, 3)) and last[1]["seq"] < c["seq"]
    assert len(a["findings"]) > 1  # the usual findings follow
    html = (tmp_path / "analysis" / "report.html").read_text()
    assert "Hang post-mortem" in html and "Per-rank breakdown" in html


@pytest.mark.slow
def test_hang_action_report_leaves_the_job_running(tmp_path):
    """--hang-action report: the dumps and their analysis appear, the job's ranks stay alive until someone
    stops `tracekit record` (SIGTERM, passed on to the job)."""
    import os
    import signal
    import subprocess
    import time

    from tests.record.conftest import PY, child_env

    run_dir = tmp_path / "run"
    cmd = [PY, "-m", "tracekit", "record", "--out", str(run_dir), "--hang-timeout", TIMEOUT_S,
           "--hang-action", "report", "--", *torchrun(JOB, 4, "sleep")]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        verdict = run_dir / "hang-analysis" / "analysis.json"
        while not verdict.is_file() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert verdict.is_file(), "no analysis of the hang was written"
        time.sleep(2)  # the job was not stopped
        assert proc.poll() is None
        beats = [json.loads(p.read_text()) for p in (run_dir / ".hang").glob("rank*.json")]
        assert len(beats) == 4 and all(not b.get("exited") for b in beats)
        for b in beats:
            os.kill(b["pid"], 0)  # every rank still alive
        top = json.loads(verdict.read_text())["findings"][0]
        assert top["kind"] == "hang" and top["ranks"] == [1]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert "the job is hung" in err and "stopping the job" not in err
