"""Every real trace in shared/traces parses, and its tables agree with an independent reading.

The reference is computed here with plain `gzip` + `json.loads(parse_float=Decimal)` (no tracekit
code), so timestamps are exact: a float64 reading would round epoch-scale µs values.
"""

from __future__ import annotations

import gzip
import json
import os
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache
from pathlib import Path

import pytest

from tracekit.errors import TraceFormatError
from tracekit.parse.kineto import is_kineto_trace, parse_kineto
from tracekit.tables.schema import TABLES

_DIR = Path(os.environ.get("TRACEKIT_SHARED_TRACES") or Path(__file__).resolve().parents[2].parent / "shared" / "traces")
FILES = sorted(p for p in _DIR.glob("*/*") if p.is_file()) if _DIR.is_dir() else []
KERNEL_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
NOT_CALLS = {"wait", "coalesced"}


def _ns(v) -> int:
    return int((Decimal(v) * 1000).to_integral_value(rounding=ROUND_HALF_UP))


@lru_cache(maxsize=None)
def reference(path: Path) -> dict | None:
    """Independent facts about a trace file; None when it is not a Kineto trace."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw, parse_float=Decimal)
    if not isinstance(doc, dict) or "traceEvents" not in doc:
        return None
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    host = [e for e in xs if not str(e.get("cat", "")).lower().startswith("gpu_")]
    rpc = [e for e in host if e.get("name") == "record_param_comms"
           and (e.get("args") or {}).get("Collective name") not in (None, *NOT_CALLS)]
    gloo = [e for e in host if str(e.get("name", "")).startswith("gloo:")]
    nccl = [e for e in host if str(e.get("name", "")).startswith("nccl:")]
    c10d = [e for e in host if str(e.get("name", "")).startswith("c10d::")]
    if rpc:
        calls, shape = len(rpc), "args"
    elif gloo:
        calls, shape = max(len(gloo), len(c10d)), "gloo"
    elif nccl:
        calls, shape = len(nccl), "nccl"
    else:
        calls, shape = len(c10d), "c10d"
    di = doc.get("distributedInfo") or {}
    return {
        "num_x": len(xs),
        "num_kernels": sum(1 for e in xs if str(e.get("cat", "")).lower() in KERNEL_CATS),
        "num_calls": calls,
        "shape": shape,
        "ts": [_ns(e["ts"]) for e in xs],
        "dur": [(_ns(e["dur"]) if e.get("dur") is not None and e["dur"] >= 0 else None) for e in xs],
        "rank": di.get("rank"),
        "world_size": di.get("world_size"),
        "pg_names": [str(g["pg_name"]) for g in di.get("pg_config") or []],
        "steps": sorted(int(e["name"].split("#")[1]) for e in host
                        if str(e.get("name", "")).startswith("ProfilerStep#")),
    }


@lru_cache(maxsize=None)
def parsed(path: Path):
    return parse_kineto(path)


def _ids(paths: list[Path]) -> list[str]:
    return [f"{p.parent.name}/{p.name}" for p in paths]


ids = _ids(FILES)


def _shape(path: Path) -> str | None:
    """Selects the files each test applies to at collection (plain json, no tracekit code), so no test
    skips itself: None when not a Kineto trace, else the collectives' shape as `reference` reads it."""
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    if not isinstance(doc, dict) or "traceEvents" not in doc:
        return None
    rpc = any(e.get("ph") == "X" and e.get("name") == "record_param_comms"
              and not str(e.get("cat", "")).lower().startswith("gpu_")
              and (e.get("args") or {}).get("Collective name") not in (None, *NOT_CALLS) for e in doc["traceEvents"])
    return "args" if rpc else "other"


SHAPES = {p: _shape(p) for p in FILES}
KINETO = [p for p in FILES if SHAPES[p] is not None]
MODERN = [p for p in FILES if SHAPES[p] == "args"]


def test_shared_traces_present():
    assert len(FILES) >= 19, f"expected the 19 shared trace files under {_DIR}"


@pytest.mark.parametrize("path", FILES, ids=ids)
def test_parses_or_is_rejected_clearly(path: Path):
    ref = reference(path)
    if ref is None:
        assert not is_kineto_trace(path)
        with pytest.raises(TraceFormatError, match="not a Kineto trace"):
            parse_kineto(path)
        return
    assert is_kineto_trace(path)
    p = parsed(path)
    for name, table in p.tables.items():
        assert table.schema == TABLES[name], name


@pytest.mark.parametrize("path", KINETO, ids=_ids(KINETO))
def test_counts_match_independent_reading(path: Path):
    ref = reference(path)
    assert ref is not None  # the files that are not Kineto traces: test_parses_or_is_rejected_clearly
    p = parsed(path)
    # events = every ph "X" event (nothing routed elsewhere); kernels = device kernel/memcpy/memset rows
    assert p.tables["events"].num_rows == ref["num_x"] == p.info["num_events"]
    assert p.tables["kernels"].num_rows == ref["num_kernels"]
    assert p.tables["collectives"].num_rows == ref["num_calls"]
    rules = set(p.tables["steps"].column("rule").to_pylist())
    if ref["steps"]:  # ProfilerStep annotations are the steps
        assert p.tables["steps"].column("step").to_pylist() == ref["steps"] and rules == {"profiler_step"}
    else:  # without them, only iterations found where the trace repeats (parse/classify.iteration_windows)
        assert rules <= {"optimizer_step", "graph_launch", "repeated_ops"}


@pytest.mark.parametrize("path", KINETO, ids=_ids(KINETO))
def test_times_are_exact_ns(path: Path):
    ref = reference(path)
    assert ref is not None
    ev = parsed(path).tables["events"]
    assert ev.column("ts").to_pylist() == ref["ts"]
    assert ev.column("dur").to_pylist() == ref["dur"]


@pytest.mark.parametrize("path", KINETO, ids=_ids(KINETO))
def test_rank_and_world_size(path: Path):
    ref = reference(path)
    assert ref is not None
    p = parsed(path)
    assert p.rank == ref["rank"]
    assert p.world_size == ref["world_size"]
    expected_col = ref["rank"] if ref["rank"] is not None else -1
    for name in ("events", "kernels", "collectives", "steps"):
        assert set(p.tables[name].column("rank").to_pylist()) <= {expected_col}
    assert [g["pg_name"] for g in p.process_groups] == ref["pg_names"]


@pytest.mark.parametrize("path", MODERN, ids=_ids(MODERN))
def test_modern_schema_collectives_are_complete(path: Path):
    ref = reference(path)
    assert ref is not None and ref["shape"] == "args"
    rows = parsed(path).tables["collectives"].to_pylist()
    assert rows
    for r in rows:
        assert r["op"] not in (None, "unknown")
        assert r["pg_name"] is not None and r["group_size"] is not None
        assert r["in_nelems"] is not None and r["out_nelems"] is not None
        assert r["dtype"] is not None and r["bytes"] is not None
        assert r["enqueue_ts"] is not None and r["source"] == "kineto"
