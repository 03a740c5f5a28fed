"""Per-rank analysis tasks an engine runs in parallel; the cross-rank analyzers then read the results.

The task is the breakdown's `load_rank_activity` (each rank's busy intervals, read from that rank's
rows of the Parquet store only); breakdown, unoverlapped and stragglers all find it in ctx.cache.
Prefetched activities are kept up to `ACTIVITY_PREFETCH_BYTES`; ranks past that are computed on
demand by the analyzers (in this process), so memory stays bounded for huge runs.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tracekit.analyze.breakdown import RankActivity, load_rank_activity, rank_rows
from tracekit.analyze.engine import AnalysisContext
from tracekit.analyze.layout import group_dims
from tracekit.tables.store import RunStore

ACTIVITY_PREFETCH_BYTES = 1 << 30


def rank_activity_task(store_path: str, rank: int, rank_row: dict[str, Any], dims: dict[str, str]) -> RankActivity:
    return load_rank_activity(RunStore(store_path), rank, rank_row, dims)


def activity_nbytes(act: RankActivity) -> int:
    sets = [act.compute, act.comm, act.other, *act.comm_by_group.values()]
    return sum(a.nbytes for s in sets for a in s if isinstance(a, np.ndarray))


def prefetch_rank_activity(engine: Any, max_bytes: int = ACTIVITY_PREFETCH_BYTES
                           ) -> Callable[[RunStore, AnalysisContext], None]:
    """A `prefetch` hook for analyze_store that computes ranks' activities on `engine`."""

    def run(store: RunStore, ctx: AnalysisContext) -> None:
        rows = ctx.cache.get("rank_rows") or rank_rows(store)
        ctx.cache["rank_rows"] = rows
        dims = group_dims(ctx.section("layout"))
        ranks = store.ranks()
        cache = ctx.cache.setdefault("activity", {})
        args = [(str(store.path.resolve()), r, rows.get(r, {}), dims) for r in ranks]
        held = 0
        results = engine.map_ranks(rank_activity_task, args)
        for r, act in zip(ranks, results):
            cache[r] = act
            held += activity_nbytes(act)
            if held > max_bytes:
                break  # the rest is computed on demand
        close = getattr(results, "close", None)
        if close is not None:
            close()  # stop submitting further tasks

    return run
