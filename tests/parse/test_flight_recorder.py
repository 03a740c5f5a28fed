"""Flight Recorder dumps written by real torch (gloo, 2 ranks), JSON and pickle, and the pickle guard."""

from __future__ import annotations

import json
import math
import os
import pickle
import pickletools
from pathlib import Path

import pytest

from tests.parse.gloo_run import WORLD, gloo_run_dir
from tracekit.errors import TraceFormatError, UnsafeInputError
from tracekit.parse.flight_recorder import normalize_op, parse_flight_recorder
from tracekit.parse.safe_pickle import loads_plain_data
from tracekit.tables.schema import COLLECTIVES


@pytest.fixture(scope="module")
def gloo_run() -> Path:
    return gloo_run_dir()


def _expected_collectives(run: Path, rank: int) -> list[dict]:
    """The ops the job issued on `rank`, minus P2P (gloo's Flight Recorder does not record send/recv)."""
    ops = json.loads((run / "expected" / f"ops.rank{rank}.json").read_text())
    return [o for o in ops if not o["is_p2p"]]


@pytest.mark.parametrize("form", ["fr_json", "fr_pickle"])
@pytest.mark.parametrize("rank", range(WORLD))
def test_real_dump_every_entry_parsed(gloo_run: Path, form: str, rank: int) -> None:
    path = next((gloo_run / form).glob(f"*{rank}*"))
    parsed = parse_flight_recorder(path, rank=rank)
    table = parsed.collectives
    assert table.schema == COLLECTIVES
    rows = table.to_pylist()

    # Independent reading of the same dump.
    raw = path.read_bytes()
    doc = json.loads(raw) if form == "fr_json" else pickle.loads(raw)  # trusted: our own test output
    entries = doc["entries"]
    assert len(rows) == len(entries) > 0
    for entry, row in zip(entries, rows):
        assert row["pg_name"] == entry["process_group"][0]
        assert row["pg_desc"] == entry["process_group"][1]
        assert row["seq"] == entry["collective_seq_id"]
        assert row["seq_source"] == "log"
        assert row["in_nelems"] == sum(math.prod(s) for s in entry["input_sizes"])
        assert row["out_nelems"] == sum(math.prod(s) for s in entry["output_sizes"])
        assert row["enqueue_ts"] == entry["time_created_ns"]
        assert row["name"] == entry["profiling_name"]
        assert row["source"] == "flight-recorder" and row["rank"] == rank
        # gloo dumps carry no start/end times: they stay null rather than 0.
        assert row["ts"] is None and row["dur"] is None
        assert row["state"] == entry["state"]

    # Against what the job itself issued, in order.
    expected = _expected_collectives(gloo_run, rank)
    assert [(r["op"], r["pg_name"], r["pg_desc"]) for r in rows] == \
        [(e["op"], e["pg_name"], e["pg_desc"]) for e in expected]
    for row, exp in zip(rows, expected):
        in_n = sum(math.prod(s) for s in exp["in_sizes"])
        out_n = sum(math.prod(s) for s in exp["out_sizes"])
        assert (row["in_nelems"], row["out_nelems"]) == (in_n, out_n)
        assert row["bytes"] == (4 * max(in_n, out_n) if exp["in_sizes"] else None)
        assert exp["created"] <= row["enqueue_ts"] <= exp["done"]
    # Sequence numbers count 1, 2, ... per group.
    for pg in {r["pg_name"] for r in rows}:
        seqs = [r["seq"] for r in rows if r["pg_name"] == pg]
        assert seqs == list(range(1, len(seqs) + 1))


def test_json_and_pickle_dumps_agree(gloo_run: Path) -> None:
    for rank in range(WORLD):
        a = parse_flight_recorder(gloo_run / "fr_json" / f"fr.rank{rank}.json", rank=rank).collectives
        b = parse_flight_recorder(gloo_run / "fr_pickle" / f"fr_trace_rank_{rank}", rank=rank).collectives
        assert a.equals(b)


def test_rank_not_invented(gloo_run: Path) -> None:
    parsed = parse_flight_recorder(gloo_run / "fr_json" / "fr.rank1.json")
    assert parsed.rank is None  # the dump names no rank; the run assembler uses the file name


class _Exploit:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_malicious_pickle_refused_without_side_effect(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    payload = pickle.dumps({"version": "2.10", "pg_config": {}, "entries": [_Exploit(str(target))]})
    assert any(op.name in ("STACK_GLOBAL", "GLOBAL") for op, _, _ in pickletools.genops(payload))
    dump = tmp_path / "fr_trace_rank_0"
    dump.write_bytes(payload)
    with pytest.raises(UnsafeInputError) as info:
        parse_flight_recorder(dump, rank=0)
    assert info.value.file == str(dump)
    assert "refused" in info.value.reason or "only plain data" in info.value.reason
    assert not target.exists()


def test_unpickler_itself_refuses_globals(tmp_path: Path) -> None:
    """Second wall: even without the opcode scan, find_class resolves nothing."""
    from tracekit.parse.safe_pickle import _PlainDataUnpickler
    import io

    target = tmp_path / "pwned2"
    payload = pickle.dumps(_Exploit(str(target)))
    with pytest.raises(UnsafeInputError):
        _PlainDataUnpickler(io.BytesIO(payload), "x").load()
    assert not target.exists()
    assert loads_plain_data(pickle.dumps({"a": [1, (2, 3)], "b": None})) == {"a": [1, (2, 3)], "b": None}


def test_not_a_dump(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(TraceFormatError):
        parse_flight_recorder(p, rank=0)


def test_nccl_style_entries_with_times_and_p2p(tmp_path: Path) -> None:
    """Hand-written NCCL-style dump (we cannot run NCCL here): times, P2P peer mapping, pg_config ranks."""
    doc = {
        "version": "2.4", "rank": 3,
        "pg_config": {"7": {"name": "7", "desc": "mesh_pp", "ranks": "[1, 3]"}},
        "pg_status": {},
        "entries": [
            {"record_id": 0, "pg_id": 7, "process_group": ["7", "mesh_pp"], "collective_seq_id": 0,
             "p2p_seq_id": 4, "profiling_name": "nccl:send 1->0", "time_created_ns": 100,
             "time_discovered_started_ns": 150, "time_discovered_completed_ns": 400,
             "input_sizes": [[2, 8]], "input_dtypes": ["BFloat16"], "output_sizes": [[2, 8]],
             "output_dtypes": ["BFloat16"], "state": "completed"},
            {"record_id": 1, "pg_id": 7, "process_group": ["7", "mesh_pp"], "collective_seq_id": 9,
             "p2p_seq_id": 0, "profiling_name": "nccl:_reduce_scatter_base", "time_created_ns": 500,
             "time_discovered_started_ns": 0, "time_discovered_completed_ns": 0,
             "input_sizes": [[16]], "input_dtypes": ["Float"], "output_sizes": [[8]],
             "output_dtypes": ["Float"], "state": "scheduled"},
            {"record_id": 2, "pg_id": 7, "process_group": ["7", "mesh_pp"], "collective_seq_id": 10,
             "p2p_seq_id": 0, "profiling_name": "nccl:all_reduce", "time_created_ns": 600,
             "time_discovered_started_ns": 700, "time_discovered_completed_ns": 90_000, "duration_ms": 0.0125,
             "input_sizes": [[4]], "input_dtypes": ["Half"], "output_sizes": [[4]],
             "output_dtypes": ["Half"], "state": "completed"},
        ],
    }
    p = tmp_path / "dump.json"
    p.write_text(json.dumps(doc))
    parsed = parse_flight_recorder(p)
    assert parsed.rank == 3 and parsed.rank_source == "flight-recorder"
    assert parsed.process_groups[0]["ranks"] == [1, 3]
    send, rs, ar = parsed.collectives.to_pylist()
    assert (ar["ts"], ar["dur"], ar["bytes"], ar["state"]) == (700, 12_500, 8, "completed")  # CUDA-event duration wins
    assert (send["op"], send["is_p2p"], send["seq"], send["peer"]) == ("send", True, 4, 1)
    assert (send["ts"], send["dur"], send["enqueue_ts"], send["bytes"]) == (150, 250, 100, 32)
    assert send["group_ranks"] == [1, 3] and send["group_size"] == 2
    assert (rs["op"], rs["is_p2p"], rs["seq"], rs["ts"], rs["bytes"]) == ("reduce_scatter", False, 9, None, 64)


@pytest.mark.parametrize("name,op", [
    ("gloo:all_reduce", "all_reduce"), ("nccl:_allgather_base", "all_gather"),
    ("nccl:all_gather_into_tensor_coalesced", "all_gather"), ("nccl:reduce_scatter_tensor_coalesced", "reduce_scatter"),
    ("nccl:all_to_all", "all_to_all"), ("gloo:alltoall_base", "all_to_all"), ("nccl:recv 0<-1", "recv"),
    ("nccl:broadcast", "broadcast"), ("nccl:reduce", "reduce"), ("gloo:barrier", "barrier"),
    ("nccl:coalesced", "unknown"), (None, "unknown"),
])
def test_normalize_op(name, op) -> None:
    assert normalize_op(name) == op
