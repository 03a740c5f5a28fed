"""Hand-built run stores for analyzer unit tests: each test states its tables row by row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from tracekit.parse.classify import classify_events
from tracekit.tables.schema import TABLES
from tracekit.tables.store import RunStore, RunStoreWriter


def table(name: str, rows: list[dict[str, Any]]) -> pa.Table:
    """Rows (dicts of some columns) -> a table of the declared schema, other columns null."""
    schema = TABLES[name]
    cols = {}
    for f in schema:
        vals = [r.get(f.name) for r in rows]
        typ = pa.string() if pa.types.is_dictionary(f.type) else f.type
        cols[f.name] = pa.array(vals, type=typ)
    out = pa.table(cols)
    if name == "events" and all(r.get("role") is None for r in rows):
        out = classify_events(out)  # the parser's classification of hand-written rows
    return out


def build_store(path: Path, tables: dict[str, list[dict[str, Any]]], manifest: dict | None = None) -> RunStore:
    meta = {"manifest": manifest} if manifest else {}
    w = RunStoreWriter(path, meta=meta)
    for name, rows in tables.items():
        if name in TABLES and name != "ranks" and name != "process_groups":
            by_rank: dict[int, list] = {}
            for r in rows:
                by_rank.setdefault(r["rank"], []).append(r)
            for rank in sorted(by_rank):
                w.append(name, table(name, by_rank[rank]))
        else:
            w.append(name, table(name, rows))
    return w.close()


GLOO_MAIN, GLOO_THREAD = "thread 1 (python)", "thread 2 (pt_gloo_runloop)"


def two_rank_gloo_run(path: Path, per_step, step_ns: int, steps: int, nbytes: int,
                      rank_rows: dict[int, dict[str, Any]] | None = None, manifest: dict | None = None) -> RunStore:
    """A hand-built 2-rank CPU run shaped like a recorded DDP job: `steps` steps of `step_ns`, one gloo bucket
    all-reduce a step (its record on the gloo thread, in the comms log and in the trace). `per_step(rank,
    step, base)` -> (the rank's main-thread events of that step, its arrival at the all-reduce, its end).
    `rank_rows`: more columns of a rank's row of the ranks table (`host_cpus`, `cpu_wait_share`); `manifest`: the
    run's manifest (store meta)."""
    ranks, step_rows, events, coll = [], [], [], []
    for r in (0, 1):
        ranks.append({"rank": r, "world_size": 2, "hostname": "vm", "trace_kind": "cpu",
                      "first_ts": 0, "last_ts": steps * step_ns, **(rank_rows or {}).get(r, {})})
        for s in range(steps):
            base = s * step_ns
            step_rows.append({"rank": r, "step": s, "ts": base, "dur": step_ns})
            evs, arrival, end = per_step(r, s, base)
            events += [{"rank": r, "tid": 1, "thread_name": GLOO_MAIN, "step": s, **e} for e in evs]
            events.append({"rank": r, "name": "gloo:all_reduce", "cat": "user_annotation", "tid": 2,
                           "thread_name": GLOO_THREAD, "ts": arrival, "dur": end - arrival, "step": s})
            common = {"rank": r, "pg_name": "0", "pg_desc": "default_pg", "op": "all_reduce", "group_ranks": [0, 1],
                      "group_size": 2, "bytes": nbytes, "step": s, "ts": arrival, "dur": end - arrival,
                      "enqueue_ts": arrival}
            coll.append({**common, "source": "comms-log", "seq": s + 1, "seq_source": "log"})
            coll.append({**common, "source": "kineto", "seq": None})
    return build_store(path, {"ranks": ranks, "steps": step_rows, "events": events, "collectives": coll,
                              "process_groups": [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]}]},
                       manifest)
