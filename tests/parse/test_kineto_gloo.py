"""The modern gloo CPU shape from a real 2-rank torch.profiler run (c10d:: on the caller thread,
gloo: on pt_gloo_runloop threads) against what the job says it issued."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from tracekit.parse.kineto import parse_kineto

JOB = Path(__file__).with_name("kineto_gloo_job.py")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def gloo_profiled_2rank(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kineto_gloo")
    proc = subprocess.run([sys.executable, str(JOB), str(out)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_collectives_match_issued_ops(gloo_profiled_2rank: Path, rank: int):
    issued = json.loads((gloo_profiled_2rank / f"issued.rank{rank}.json").read_text())
    p = parse_kineto(gloo_profiled_2rank / f"rank{rank}.json")
    assert p.rank == rank and p.world_size == 2
    assert p.info["backend"] == "gloo" and p.info["trace_kind"] == "cpu"
    assert {g["pg_desc"] for g in p.process_groups} == {"default_pg", "mesh_tp"}
    rows = p.tables["collectives"].to_pylist()
    steps = p.tables["steps"].column("step").to_pylist()
    assert len(steps) == len(issued) == 2
    expected = [dict(op, step=s) for s, ops in zip(steps, issued) for op in ops]
    assert [r["op"] for r in rows] == [e["op"] for e in expected]
    for r, e in zip(rows, expected):
        assert r["step"] == e["step"]
        assert r["caller"] == e["caller"], (r["name"], r["caller"])
        assert r["enqueue_ts"] is not None and r["name"].startswith("c10d::")
        # every call found its gloo worker event, which starts after the call was issued
        assert r["ts"] is not None and r["dur"] is not None and r["ts"] >= r["enqueue_ts"]
        assert r["state"] == "completed"
        if e["in"] is not None:
            assert (r["in_nelems"], r["out_nelems"]) == (e["in"], e["out"])
            assert r["dtype"] == "float" and r["bytes"] == max(e["in"], e["out"]) * 4
        if e["op"] == "all_to_all":
            assert r["in_split_sizes"] == e["in_split"] and r["out_split_sizes"] == e["out_split"]
        assert r["is_p2p"] == (e["op"] in ("send", "recv"))
        assert r["seq"] is None and r["seq_source"] is None  # gloo traces carry no sequence numbers


@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_worker_times_come_from_gloo_events(gloo_profiled_2rank: Path, rank: int):
    path = gloo_profiled_2rank / f"rank{rank}.json"
    doc = json.loads(path.read_text(), parse_float=Decimal)
    names = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names.setdefault(e["tid"], e["args"]["name"])
    gloo = sorted((int(Decimal(e["ts"]) * 1000), int(Decimal(e["dur"]) * 1000))
                  for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("gloo:"))
    rows = parse_kineto(path).tables["collectives"].to_pylist()
    assert sorted((r["ts"], r["dur"]) for r in rows) == gloo
    ev = parse_kineto(path).tables["events"]
    runloop = {n for n, c in zip(ev.column("thread_name").to_pylist(), ev.column("name").to_pylist())
               if c.startswith("gloo:all_reduce")}
    assert any("pt_gloo_runloop" in (n or "") for n in runloop)


def test_bucket_all_reduces_pair_with_their_own_gloo_events_when_gloo_runs_them_out_of_order(tmp_path: Path):
    """Two DDP buckets (TensorList inputs with recorded dims) issued in order; gloo's two worker threads start
    the second bucket's event first (as in a CI run of the reference runtime). Each c10d call must take the
    worker event of its own size, not the earliest one after it."""
    def x(name, ts, dur, tid, **args):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}

    bucket = lambda n: x("c10d::allreduce_", 0, 0, 1, **{"Input Dims": [[[n]], [], [], [], [], []],  # noqa: E731
                                                         "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]})
    first, second = bucket(29184), bucket(28928)
    first.update(ts=100.0, dur=20.0)
    second.update(ts=130.0, dur=10.0)
    events = [first, second,
              x("gloo:all_reduce", 150.0, 50.0, 2, **{"Input Dims": [[28928]], "Input type": ["float"]}),
              x("gloo:all_reduce", 160.0, 40.0, 3, **{"Input Dims": [[29184]], "Input type": ["float"]})]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": events}))
    rows = sorted(parse_kineto(path).tables["collectives"].to_pylist(), key=lambda r: r["enqueue_ts"])
    # (enqueue, worker start) in ns, from the events above: each bucket's own worker event
    assert [(r["enqueue_ts"], r["ts"], r["in_nelems"]) for r in rows] == [(100_000, 160_000, 29184),
                                                                         (130_000, 150_000, 28928)]
