"""One declaration per derived table: the facts tracekit/derive computes from a run store, as typed tables
`tracekit query` can read beside the raw ones (tables/schema.py).

A derived table is never written to the store: it is built from the store when a query names it (the same
functions the analyzers use, so a query sees exactly what the analysis saw). Times are int64 ns; `rank`
is int32. Each declaration names its columns (with a doc per column, as tables/schema.py does) and the
function that builds it.

    tracekit query STORE "SELECT rank, sum(wait_ns) / 1e6 AS waited_ms FROM matched_collectives GROUP BY rank"
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa

from tracekit.derive.activity import rank_activities
from tracekit.derive.matching import MatchingResult, analyze_matching
from tracekit.derive.topology import LayoutResult, analyze_layout, rank_hosts
from tracekit.tables.schema import column as _f
from tracekit.tables.schema import describe_schema
from tracekit.tables.store import RunStore

NS = "int64 nanoseconds"


RANK_COORDS = pa.schema([
    _f("rank", pa.int32(), "global rank"),
    _f("hostname", pa.string(), "its host (ranks table: the trace's host name, else the manifest's), null if unknown"),
    _f("dim", pa.string(), "a parallel dim the rank has a coordinate in (dp, tp, pp, cp, ep, ...)"),
    _f("coord", pa.int32(), "the rank's index within its group of that dim"),
])

GROUP_DIMS = pa.schema([
    _f("pg_name", pa.string(), "process group name"),
    _f("pg_desc", pa.string(), "its description (mesh_tp, ...)"),
    _f("dim", pa.string(), "the parallel dim the layout assigns it (derive/topology.py): dp|fsdp|tp|pp|cp|ep|world|unknown"),
    _f("size", pa.int32(), "member count"),
    _f("inferred_from", pa.string(), "evidence: pg_desc | manifest | parser | structure | none"),
    _f("confidence", pa.string(), "high | medium | low"),
])

MATCHED_COLLECTIVES = pa.schema([
    _f("pg_name", pa.string(), "process group"),
    _f("seq", pa.int64(), "the instance's sequence number within the group"),
    _f("op", pa.string(), "collective op"),
    _f("rank", pa.int32(), "member rank"),
    _f("arrival_ns", pa.int64(), "when the member entered the collective, offset-corrected matching clock, " + NS),
    _f("end_ns", pa.int64(), "when it left it (null if unknown), " + NS),
    _f("wait_ns", pa.int64(), "time it waited for the group's last arrival (0 for the last arrival), ns"),
    _f("is_last", pa.bool_(), "this member arrived last: the others waited for it"),
    _f("source", pa.string(), "where the row comes from: kineto | comms_log | flight_recorder"),
    _f("step", pa.int64(), "profiler step (null if unknown)"),
    _f("bytes", pa.int64(), "message size in bytes (null if unknown)"),
])

CLOCK_OFFSETS = pa.schema([
    _f("rank", pa.int32(), "global rank"),
    _f("offset_ns", pa.int64(), "this rank's clock minus the reference rank's, ns"),
    _f("mad_ns", pa.int64(), "median absolute deviation of the estimate, ns (null for anchors)"),
    _f("instances", pa.int64(), "collective instances the estimate used"),
    _f("applied", pa.bool_(), "the offset was applied to the rank's times"),
    _f("status", pa.string(), "anchor | same-host | negligible | corrected | uncorrectable | unmatched"),
])

ACTIVITY = pa.schema([
    _f("rank", pa.int32(), "global rank"),
    _f("kind", pa.string(), "compute | comm | other (device work other than compute and comm): disjoint within a kind"),
    _f("start_ns", pa.int64(), "interval start on the rank's clock, " + NS),
    _f("end_ns", pa.int64(), "interval end, " + NS),
])

STEP_WINDOWS = pa.schema([
    _f("rank", pa.int32(), "global rank"),
    _f("step", pa.int64(), "step number (null for a whole-trace window)"),
    _f("start_ns", pa.int64(), "window start on the rank's clock, " + NS),
    _f("end_ns", pa.int64(), "window end, " + NS),
    _f("windows", pa.string(), "how windows were chosen: gpu_steps | steps | device_span | trace"),
    _f("step_rule", pa.string(), "how steps were found: profiler_step | optimizer_step | graph_launch | "
       "repeated_ops | device_span | trace"),
])


@dataclass(frozen=True)
class DerivedTable:
    schema: pa.Schema
    doc: str
    build: Callable[["_Facts"], pa.Table]


class _Facts:
    """The derived facts of one store, each computed once when a table asks for it."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self._layout: LayoutResult | None = None
        self._matching: MatchingResult | None = None

    @property
    def layout(self) -> LayoutResult:
        if self._layout is None:
            self._layout = analyze_layout(self.store)
        return self._layout

    @property
    def matching(self) -> MatchingResult:
        if self._matching is None:
            self._matching = analyze_matching(self.store, self.layout)
        return self._matching


def _table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def _rank_coords(f: _Facts) -> pa.Table:
    hosts = rank_hosts(f.store)
    rows = [{"rank": int(r["rank"]), "hostname": hosts.get(int(r["rank"])), "dim": d, "coord": int(c)}
            for r in (f.layout.section or {}).get("ranks", []) for d, c in sorted((r.get("coords") or {}).items())]
    return _table(rows, RANK_COORDS)


def _group_dims(f: _Facts) -> pa.Table:
    rows = [{k: g.get(k) for k in GROUP_DIMS.names} for g in f.layout.groups]
    return _table(rows, GROUP_DIMS)


def _matched_collectives(f: _Facts) -> pa.Table:
    m = f.matching.matched
    if m is None or m.n_rows == 0:
        return MATCHED_COLLECTIVES.empty_table()
    r = m.rows

    def col(name: str, typ: pa.DataType) -> pa.Array:  # pandas NA / NaN -> null
        return pa.array(r[name], from_pandas=True).cast(typ)

    return pa.table({"pg_name": col("pg_name", pa.string()), "seq": col("seq", pa.int64()),
                     "op": col("op", pa.string()), "rank": col("rank", pa.int32()),
                     "arrival_ns": col("arrival", pa.int64()), "end_ns": col("end", pa.int64()),
                     "wait_ns": col("wait", pa.int64()), "is_last": col("is_last", pa.bool_()),
                     "source": col("source", pa.string()), "step": col("step", pa.int64()),
                     "bytes": col("bytes", pa.int64())}, schema=MATCHED_COLLECTIVES)


def _clock_offsets(f: _Facts) -> pa.Table:
    rows = [{k: r.get(k) for k in CLOCK_OFFSETS.names} for r in (f.matching.clocks or {}).get("ranks", [])]
    return _table(rows, CLOCK_OFFSETS)


def _activity(f: _Facts) -> pa.Table:
    acts = rank_activities(f.store, f.layout)
    parts = []
    for rank in f.store.ranks():
        a = acts.get(rank)
        for kind, (lo, hi) in (("compute", a.compute), ("comm", a.comm), ("other", a.other)):
            parts.append(pa.table({"rank": pa.array(np.full(lo.size, rank, np.int32)),
                                   "kind": pa.array([kind] * lo.size, pa.string()),
                                   "start_ns": pa.array(lo.astype(np.int64)), "end_ns": pa.array(hi.astype(np.int64))},
                                  schema=ACTIVITY))
    return pa.concat_tables(parts) if parts else ACTIVITY.empty_table()


def _step_windows(f: _Facts) -> pa.Table:
    acts = rank_activities(f.store, f.layout)
    rows = []
    for rank in f.store.ranks():
        a = acts.get(rank)
        rows += [{"rank": rank, "step": s, "start_ns": lo, "end_ns": hi, "windows": a.window_source,
                  "step_rule": a.step_rule} for s, lo, hi in a.windows]
    return _table(rows, STEP_WINDOWS)


DERIVED: dict[str, DerivedTable] = {
    "rank_coords": DerivedTable(RANK_COORDS, "each rank's host and mesh coordinates (derive/topology.py)", _rank_coords),
    "group_dims": DerivedTable(GROUP_DIMS, "each process group's parallel dim and the evidence for it", _group_dims),
    "matched_collectives": DerivedTable(MATCHED_COLLECTIVES, "every member of every matched collective instance, "
                                        "with its wait for the last arrival (derive/matching.py)", _matched_collectives),
    "clock_offsets": DerivedTable(CLOCK_OFFSETS, "each rank's clock offset estimate (derive/clocks.py)", _clock_offsets),
    "activity": DerivedTable(ACTIVITY, "each rank's compute / comm / other device intervals (derive/activity.py)",
                             _activity),
    "step_windows": DerivedTable(STEP_WINDOWS, "each rank's analysis windows (steps) and how they were found",
                                 _step_windows),
}


def derived_tables(store: RunStore, sql: str | None = None) -> dict[str, pa.Table]:
    """The derived tables `sql` names (every one when sql is None), built from `store`."""
    facts = _Facts(store)
    names = [n for n in DERIVED if sql is None or re.search(rf"\b{n}\b", sql, re.IGNORECASE)]
    return {n: DERIVED[n].build(facts) for n in names}


def describe_derived(name: str) -> str:
    """Column listing for `tracekit query --schema`, like tables.schema.describe."""
    return describe_schema(f"{name} (derived: {DERIVED[name].doc}):", DERIVED[name].schema)
