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
