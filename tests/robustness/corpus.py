"""Generates bad inputs from the good 2-rank runtime traces (tests/reports/fixtures/runtime_dp2_clean).

Every bad file is derived at test time from a clean trace (never a committed copy): truncated and
corrupt gzip, truncated JSON, wrong top-level types, unknown phases, bad durations, µs/ns mix-ups,
huge strings, non-UTF-8 bytes, renumbered ranks, shifted clocks, other runs, malicious pickles.
"""

from __future__ import annotations

import copy
import gzip
import json
import pickle
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
CLEAN_RUN = REPO / "tests" / "reports" / "fixtures" / "runtime_dp2_clean"
US_PER_S = 1_000_000


def load_clean_trace(rank: int) -> dict[str, Any]:
    """The clean run's Kineto trace of `rank`, as a JSON document."""
    with gzip.open(CLEAN_RUN / f"rank{rank}.pt.trace.json.gz", "rb") as f:
        return json.loads(f.read())


def clean_gz_bytes(rank: int) -> bytes:
    return (CLEAN_RUN / f"rank{rank}.pt.trace.json.gz").read_bytes()


def write_clean_pair(d: Path) -> Path:
    """Folder `d` (created) holding the clean run's two rank traces."""
    d.mkdir(parents=True, exist_ok=True)
    for r in (0, 1):
        (d / f"rank{r}.pt.trace.json.gz").write_bytes(clean_gz_bytes(r))
    return d


def with_host_and_group_desc(doc: dict[str, Any], host: str, pg_desc: str) -> dict[str, Any]:
    """A copy of `doc` whose host name and default group's description are the given strings."""
    doc = dict(doc, host_name=host)
    di = dict(doc["distributedInfo"])
    di["pg_config"] = [dict(g, pg_desc=pg_desc) if g["pg_name"] == "0" else g for g in di["pg_config"]]
    doc["distributedInfo"] = di
    return doc


def dump(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def write(path: Path, data: bytes, gz: bool | None = None) -> Path:
    """Write `data` to `path`, gzip-compressed when the name ends in .gz (unless `gz` says otherwise)."""
    if gz is None:
        gz = path.name.endswith(".gz")
    path.write_bytes(gzip.compress(data, compresslevel=1, mtime=0) if gz else data)
    return path


def renumbered(doc: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """A copy of `doc` claiming to be `rank` of `world_size` (events shared, distributedInfo copied)."""
    out = dict(doc)
    di = dict(doc["distributedInfo"])
    di["rank"], di["world_size"] = rank, world_size
    out["distributedInfo"] = di
    return out


def map_events(doc: dict[str, Any], fn: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[str, Any]:
    """A copy of `doc` with every event passed through `fn` (None drops the event)."""
    out = dict(doc)
    events = []
    for e in doc["traceEvents"]:
        r = fn(dict(e))
        if r is not None:
            events.append(r)
    out["traceEvents"] = events
    return out


def shifted(doc: dict[str, Any], shift_us: float) -> dict[str, Any]:
    """Every timestamp moved by `shift_us` (another host's clock)."""
    def fn(e):
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = e["ts"] + shift_us
        return e
    return map_events(doc, fn)


def in_ns(doc: dict[str, Any]) -> dict[str, Any]:
    """Times written in ns where µs are expected (ts and dur 1000× too large)."""
    def fn(e):
        for k in ("ts", "dur"):
            if isinstance(e.get(k), (int, float)):
                e[k] = e[k] * 1000
        return e
    return map_events(doc, fn)


def with_bad_durations(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """Some complete events get dur -1, a negative dur, or none. Returns the doc and the counts."""
    counts = {"minus_one": 0, "negative": 0, "missing": 0}
    i = 0

    def fn(e):
        nonlocal i
        if e.get("ph") != "X" or str(e.get("name", "")).startswith("ProfilerStep"):
            return e
        i += 1
        if i % 97 == 0:
            e["dur"] = -1
            counts["minus_one"] += 1
        elif i % 89 == 0:
            e["dur"] = -12.5
            counts["negative"] += 1
        elif i % 83 == 0:
            e.pop("dur", None)
            counts["missing"] += 1
        return e
    return map_events(doc, fn), counts


def with_unknown_phases(doc: dict[str, Any]) -> dict[str, Any]:
    """Extra events of phases no Kineto writer uses ('Z', '', 7) between the real ones."""
    out = dict(doc)
    ev = list(doc["traceEvents"])
    t0 = next(e["ts"] for e in ev if e.get("ph") == "X")
    extra = [{"ph": "Z", "name": "mystery", "ts": t0, "pid": 1, "tid": 1},
             {"ph": "", "name": "blank", "ts": t0},
             {"ph": 7, "name": "numeric phase", "ts": t0}]
    out["traceEvents"] = ev[:10] + extra + ev[10:]
    return out


def malicious_pickle(sentinel: Path) -> bytes:
    """A pickle that, if loaded by `pickle.load`, would create `sentinel` through os.system."""
    class Evil:
        def __reduce__(self):
            import os
            return (os.system, (f"touch {sentinel}",))
    return pickle.dumps({"version": "2.4", "pg_config": {}, "entries": [Evil()]}, protocol=4)


def execution_trace() -> dict[str, Any]:
    """What PyTorch's execution trace observer writes: `nodes`, no `traceEvents`."""
    return {"schema": "1.1.0-chakra.0.0.4", "pid": 1, "time": "2024-01-01", "start_ts": 1,
            "nodes": [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1,
                       "inputs": {"values": [], "shapes": [], "types": []}}], "finish_ts": 2}


def copy_doc(doc: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(doc)


def flight_recorder_doc(rank: int) -> dict[str, Any]:
    """A Flight Recorder dump (JSON form) holding the clean run's logged collectives of `rank`."""
    lines = (CLEAN_RUN / f"comms.rank{rank}.jsonl").read_text().splitlines()
    entries = [json.loads(x) for x in lines[1:] if x.strip() and json.loads(x).get("type") not in ("header", "footer")]
    groups = {}
    for e in entries:
        name, desc = e["process_group"]
        groups[name] = {"name": name, "desc": desc, "ranks": str(e.get("group_ranks") or [])}
    return {"version": "2.4", "rank": rank, "pg_config": groups, "pg_status": {}, "entries": entries}


def hostile_pickles(sentinel: Path) -> dict[str, bytes]:
    """Pickles (hand-written opcodes, protocols 0-4) that import or call something if loaded normally."""
    cmd = f"touch {sentinel}".encode()
    return {
        "reduce_os_system": malicious_pickle(sentinel),
        "proto0_global_reduce": b"cos\nsystem\n(S'" + cmd + b"'\ntR.",
        "inst": b"(S'" + cmd + b"'\nios\nsystem\n.",
        "obj": b"(cos\nsystem\nS'" + cmd + b"'\no.",
        "newobj": b"\x80\x02cbuiltins\nobject\n)\x81.",
        "build_on_dict": b"\x80\x02}q\x00}q\x01X\x01\x00\x00\x00aK\x01sb.",
        "persistent_id": b"\x80\x02Pos.system\n.",
        "ext1_registry": b"\x80\x02\x82\x01.",
        "hidden_in_entries": pickle.dumps({"version": "2.4", "pg_config": {}, "entries": [
            {"record_id": 1, "frames": [{"name": __import__("collections").OrderedDict(a=1)}]}]}, protocol=2),
        "truncated": pickle.dumps({"entries": [1, 2, 3]}, protocol=4)[:-5],
    }
