"""The memory table from `[memory]` instant events, and allocator snapshots read safely, per file."""

from __future__ import annotations

import json
import os
import pickle
from decimal import Decimal
from pathlib import Path

import pyarrow.compute as pc

from tracekit.parse.kineto import parse_kineto
from tracekit.parse.run import parse_run
from tracekit.tables.store import RunStore

BASE_US = "1748000000123.456"


def _mem(ts: str, nbytes: int, total: int, addr: int, reserved: int = 0, dev: int = -1) -> dict:
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
            "args": {"Total Reserved": reserved, "Total Allocated": total, "Bytes": nbytes, "Device Id": dev,
                     "Device Type": 0 if dev < 0 else 1, "Addr": addr}}


def _trace(rank: int, extra: list | None = None) -> dict:
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#5", "pid": 1, "tid": 1,
         "ts": 1748000000100.000, "dur": 1000.5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1748000000120.0, "dur": 30.25},
        {"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces", "tid": "T", "ts": 1.0},
    ]
    allocs = [("1748000000123.456", 4096, 4096, 11), ("1748000000130.001", 8192, 12288, 22, 2 << 20, 0),
              ("1748000000140.5", -4096, 8192, 11), ("1748000002000.25", 512, 8704, 33)]
    # json.dumps writes the float text exactly as given when we splice the texts in below
    text_events = [json.dumps(e) for e in events + (extra or [])]
    for ts, b, tot, addr, *rest in allocs:
        e = _mem("TS", b, tot, addr, *rest)
        text_events.append(json.dumps(e).replace('"TS"', ts))
    return '{"traceEvents": [' + ",".join(text_events) + '], "distributedInfo": {"rank": %d}}' % rank


def test_memory_rows_match_the_json_exactly(tmp_path):
    path = tmp_path / "rank0.trace.json"
    path.write_text(_trace(0))
    mem = parse_kineto(path).tables["memory"]
    raw = [e for e in json.loads(path.read_text(), parse_float=Decimal)["traceEvents"] if e["name"] == "[memory]"]
    assert mem.column("ts").to_pylist() == [int(Decimal(e["ts"]) * 1000) for e in raw]
    assert mem.column("bytes").to_pylist() == [e["args"]["Bytes"] for e in raw]
    assert mem.column("total_allocated").to_pylist() == [e["args"]["Total Allocated"] for e in raw]
    assert mem.column("total_reserved").to_pylist() == [e["args"]["Total Reserved"] for e in raw]
    assert mem.column("device").to_pylist() == [e["args"]["Device Id"] for e in raw]
    assert mem.column("addr").to_pylist() == [e["args"]["Addr"] for e in raw]
    step_end = Decimal("1748000000100.000") + Decimal("1000.5")
    assert mem.column("step").to_pylist() == [5 if Decimal(e["ts"]) < step_end else None for e in raw]


def test_lenient_decode_keeps_memory_rows_and_drops_bad_ones(tmp_path):
    # a numeric category forces the lenient decoder; one memory event has no Bytes
    odd = {"ph": "X", "cat": 5, "name": "odd", "pid": 1, "tid": 1, "ts": 1748000000150.0, "dur": 1}
    bad = _mem("1748000000160.0", 1, 1, 1)
    del bad["args"]["Bytes"]
    bad["ts"] = 1748000000160.0
    path = tmp_path / "rank0.trace.json"
    path.write_text(_trace(0, [odd, bad]))
    parsed = parse_kineto(path)
    mem = parsed.tables["memory"]
    assert mem.num_rows == 4
    assert max(mem.column("total_allocated").to_pylist()) == 12288
    assert any("[memory] events" in w for w in parsed.info["parse_warnings"])


class _CallsSystem:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _snapshot() -> dict:
    return {"segments": [{"device": 0, "address": 1 << 20, "total_size": 2 << 20, "segment_type": "large",
                          "blocks": [{"address": 1 << 20, "size": 1 << 20, "state": "active_allocated",
                                      "frames": [{"filename": "train.py", "line": 7, "name": "forward"}]},
                                     {"address": 3 << 19, "size": 1 << 20, "state": "inactive", "frames": []}]}],
            "device_traces": [[]]}


def test_bad_snapshots_are_skipped_per_file_and_the_rest_is_parsed(tmp_path):
    src = tmp_path / "run"
    src.mkdir()
    for r in (0, 1, 2):
        (src / f"rank{r}.trace.json").write_text(_trace(r))
    (src / "memory_snapshot.rank0.pickle").write_bytes(pickle.dumps(_snapshot(), protocol=4))
    (src / "memory_snapshot.rank1.pickle").write_bytes(pickle.dumps({"segments": [_CallsSystem(tmp_path / "ran")]}, protocol=4))
    (src / "memory_snapshot.rank2.pickle").write_bytes(pickle.dumps(_snapshot(), protocol=4)[:-40])
    res = parse_run(src, tmp_path / "store", progress=False)
    reasons = {Path(s["file"]).name: s["reason"] for s in res.skipped}
    assert "would import or call code" in reasons["memory_snapshot.rank1.pickle"]
    assert not (tmp_path / "ran").exists()
    assert "memory_snapshot.rank2.pickle" in reasons
    store = RunStore(tmp_path / "store")
    assert store.ranks() == [0, 1, 2]
    seg = store.table("memory_segments")
    assert seg.column("rank").to_pylist() == [0, 0, 0]
    assert sorted(x for x in seg.column("block_size").to_pylist() if x) == [1 << 20, 1 << 20]
    mem = store.table("memory")
    for r in (0, 1, 2):
        assert pc.max(mem.filter(pc.equal(mem["rank"], r))["total_allocated"]).as_py() == 12288


def test_trace_without_memory_events_gives_an_empty_table(tmp_path):
    path = tmp_path / "rank0.trace.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1,
                                                 "ts": 1.0, "dur": 2.0}], "distributedInfo": {"rank": 0}}))
    assert parse_kineto(path).tables["memory"].num_rows == 0


def test_chunked_parse_keeps_every_memory_row():
    from tracekit.parse.chunked import parse_kineto_chunked

    src = Path(__file__).resolve().parents[2] / "fixtures" / "gpu_h100" / "rank0.pt.trace.json.gz"
    whole = parse_kineto(src).tables["memory"]
    chunked = parse_kineto_chunked(src, max_memory_bytes=64 << 20, chunk_bytes=64 << 10).tables["memory"]
    assert whole.num_rows > 100
    assert chunked.equals(whole)
