"""Per-rank analysis tasks an engine runs in parallel; the cross-rank analyzers then read the results.

The task is the breakdown's `load_rank_activity` (each rank's busy intervals, read from that rank's
rows of the Parquet store only); breakdown, unoverlapped and stragglers all find it in ctx.cache.
"""

from __future__ import annotations

from typing import Any, Callable

from tracekit.analyze.breakdown import RankActivity, load_rank_activity, rank_rows
from tracekit.analyze.engine import AnalysisContext
from tracekit.analyze.layout import group_dims
from tracekit.tables.store import RunStore


def rank_activity_task(store_path: str, rank: int, rank_row: dict[str, Any], dims: dict[str, str]) -> RankActivity:
    return load_rank_activity(RunStore(store_path), rank, rank_row, dims)


def prefetch_rank_activity(engine: Any) -> Callable[[RunStore, AnalysisContext], None]:
    """A `prefetch` hook for analyze_store that computes every rank's activity on `engine`."""

    def run(store: RunStore, ctx: AnalysisContext) -> None:
        rows = ctx.cache.get("rank_rows") or rank_rows(store)
        ctx.cache["rank_rows"] = rows
        dims = group_dims(ctx.section("layout"))
        ranks = store.ranks()
        cache = ctx.cache.setdefault("activity", {})
        args = [(str(store.path.resolve()), r, rows.get(r, {}), dims) for r in ranks]
        for r, act in zip(ranks, engine.map_ranks(rank_activity_task, args)):
            cache[r] = act

    return run
