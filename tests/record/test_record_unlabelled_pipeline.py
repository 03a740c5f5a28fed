"""An unseen GPipe job — plain send/recv on the default group, no labels — recorded with
`tracekit record -- torchrun --nproc-per-node 4 tests/user_scripts/gpipe_p2p.py` (gloo, 4 stages).

The pipeline must be found from the p2p graph alone: 4 stages in rank order, m micro-batches from
the sends per step, GPipe from the order of sends and receives, a `pipeline_bubble` at warning or
above at m=2 (theory (p−1)/(m+p−1) = 60%), and a smaller bubble at m=8 (theory 27%). The measured
bubble is also recomputed from the raw trace files with plain json/Decimal arithmetic (each stage's
own step less the time its receives were outstanding, over the longest step of the four).
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import pytest

from tests.record.conftest import assert_job_ok, run_record, torchrun
from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run

# minutes of multi-process runs: in scripts/test.sh's second pass, after the suite (tests/conftest.py: `long`)
pytestmark = pytest.mark.long

SCRIPT = Path(__file__).resolve().parents[1] / "user_scripts" / "gpipe_p2p.py"
STAGES = 4
# profile step 1 of 3 (step 0 is start-up)
RECORD_OPTS = ("--wait", "1", "--warmup", "0", "--active", "1")


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    out = {}
    for m in (2, 8):
        tmp = tmp_path_factory.mktemp(f"gpipe_m{m}")
        res = run_record(tmp / "traces", torchrun(SCRIPT, STAGES, "--microbatches", str(m), "--steps", "3"),
                         *RECORD_OPTS, timeout=300)
        assert_job_ok(res, tmp / "traces")
        store = parse_run(tmp / "traces", tmp / "store", progress=False).store
        out[m] = (tmp / "traces", analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False)))
    return out


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return [e for e in json.loads(fh.read(), parse_float=Decimal)["traceEvents"] if e.get("ph") == "X"]


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def _bubble_from_files(traces: Path) -> float:
    """Mean over profiled steps of mean over stages of 1 − (step − receive waits)/longest step."""
    ns = lambda v: int(Decimal(v) * 1000)  # noqa: E731
    per_step: dict[int, dict[int, tuple[int, int]]] = {}
    for rank in range(STAGES):
        evs = _events(traces / f"rank{rank}.pt.trace.json.gz")
        recvs = [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in evs if e["name"] == "gloo:recv"]
        for e in evs:
            if e["name"].startswith("ProfilerStep#"):
                a, b = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
                wait = _union_ns([(max(x, a), min(y, b)) for x, y in recvs if x < b and y > a])
                per_step.setdefault(int(e["name"].split("#")[1]), {})[rank] = (b - a, (b - a) - wait)
    bubbles = []
    for stages in per_step.values():
        window = max(d for d, _ in stages.values())
        bubbles.append(sum(1 - busy / window for _, busy in stages.values()) / len(stages))
    return sum(bubbles) / len(bubbles)


@pytest.mark.slow
def test_gpipe_found_without_labels(recordings):
    traces, analysis = recordings[2]
    names = {e["name"] for e in _events(traces / "rank1.pt.trace.json.gz") if e.get("cat") == "user_annotation"}
    assert not any(":" in n and not n.startswith(("gloo:", "Optimizer.")) for n in names), names  # no labels
    sec = analysis["sections"]["pipeline"]
    assert sec["source"] == "p2p"
    assert [p["ranks"] for p in sec["pipelines"]] == [[0, 1, 2, 3]]
    assert sec["num_stages"] == 4 and sec["num_microbatches"] == 2 and sec["schedule_detected"] == "gpipe"
    assert sec["theoretical_bubble"] == pytest.approx(3 / 5)
    (f,) = [f for f in analysis["findings"] if f["kind"] == "pipeline_bubble"]
    assert f["severity"] in ("warning", "critical") and f["dim"] == "pp" and f["ranks"] == [0, 1, 2, 3]
    from_files = _bubble_from_files(traces)
    print(f"\nGPipe p=4 m=2: measured {sec['measured_bubble']:.3f}, from the files {from_files:.3f}, theory 0.600")
    assert sec["measured_bubble"] == pytest.approx(from_files, abs=0.05)


@pytest.mark.slow
def test_more_microbatches_shrink_the_bubble(recordings):
    small = recordings[2][1]["sections"]["pipeline"]
    large = recordings[8][1]["sections"]["pipeline"]
    assert large["num_microbatches"] == 8 and large["schedule_detected"] == "gpipe"
    assert large["theoretical_bubble"] == pytest.approx(3 / 11)
    print(f"\nGPipe p=4 m=8: measured {large['measured_bubble']:.3f}, theory 0.273")
    assert large["measured_bubble"] < small["measured_bubble"]


@pytest.mark.slow
def test_the_profiler_traces_alone_show_the_pipeline(recordings, tmp_path):
    """Without tracekit's collective log (a user's own torch.profiler traces): the peers come from the
    c10d send/recv ops' arguments on a default-group-only trace, and the same pipeline is found."""
    import shutil

    traces, analysis = recordings[2]
    for rank in range(STAGES):
        shutil.copy(traces / f"rank{rank}.pt.trace.json.gz", tmp_path)
    store = parse_run(tmp_path, tmp_path / "store", progress=False).store
    p2p = [c for c in store.table("collectives").to_pylist() if c["op"] in ("send", "recv")]
    assert p2p and all(c["source"] == "kineto" for c in p2p)
    assert all(c["peer"] is not None and abs(c["peer"] - c["rank"]) == 1 for c in p2p)
    sec = analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False))["sections"]["pipeline"]
    assert [p["ranks"] for p in sec["pipelines"]] == [[0, 1, 2, 3]]
    assert sec["num_microbatches"] == 2 and sec["schedule_detected"] == "gpipe"
    assert sec["measured_bubble"] == pytest.approx(analysis["sections"]["pipeline"]["measured_bubble"], abs=1e-9)
