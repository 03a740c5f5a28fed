"""Per-rank analysis tasks an engine runs in parallel; the cross-rank analyzers then read the results.

The task is the breakdown's `load_rank_activity` (each rank's busy intervals, read from that rank's
rows of the Parquet store only); the prefetch stands in for the `activity` analyzer, so breakdown,
unoverlapped and stragglers receive the engine's results as their `activity` argument.
Prefetched activities are kept up to `ACTIVITY_PREFETCH_BYTES`; ranks past that are computed on
demand by the analyzers (in this process), so memory stays bounded for huge runs.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tracekit.derive.activity import RankActivities, RankActivity, load_rank_activity, rank_activities
from tracekit.derive.topology import LayoutResult
from tracekit.engines.shared import engine_shared, shared_value
from tracekit.tables.arrow_env import defer_pandas
from tracekit.tables.store import RunStore

ACTIVITY_PREFETCH_BYTES = 1 << 30


RANKS_PER_ACTIVITY_TASK = 16
"""Most ranks one activity task loads (`prefetch_rank_activity`): at 10,000 ranks, one task a rank spent the
prefetch's time in handing tasks over (15-20 s wall for 5 CPU-s)."""


def rank_activity_task(store_path: str, rank: int, rank_row: dict[str, Any], dims: Any) -> RankActivity:
    """`load_rank_activity` of one rank; `dims`: the layout's pg_name -> dim map or an engine's handle to it
    (`engines.shared`: as large as the run's groups, it is sent to each worker once, not with every rank)."""
    defer_pandas()  # a worker's first pyarrow conversion would import pandas (~40 MB per worker) for nothing
    return load_rank_activity(_open_store(store_path), rank, rank_row, shared_value(dims))


def rank_activities_task(store_path: str, ranks: list[tuple[int, dict[str, Any]]], dims: Any) -> list[RankActivity]:
    """`rank_activity_task` of each (rank, its `ranks` row), in order."""
    return [rank_activity_task(store_path, rank, row, dims) for rank, row in ranks]


_OPEN: dict[str, tuple[tuple[int, int, int], RunStore]] = {}


def _open_store(path: str) -> RunStore:
    """The store at `path`, opened once per process: its Parquet footers and rank index (each as large as the
    run's ranks) are read once, not once per rank's task. Opened again when its meta.json changed (a store
    written anew at the same path); one store is held at a time."""
    import os

    st = os.stat(os.path.join(path, "meta.json"))
    key = (st.st_ino, st.st_mtime_ns, st.st_size)
    held = _OPEN.get(path)
    if held is None or held[0] != key:
        _OPEN.clear()
        _OPEN[path] = held = (key, RunStore(path))
    return held[1]


def activity_nbytes(act: RankActivity) -> int:
    sets = [act.compute, act.comm, act.other, *act.comm_by_group.values()]
    return sum(a.nbytes for s in sets for a in s if isinstance(a, np.ndarray))


def prefetch_rank_activity(engine: Any, max_bytes: int | None = None
                           ) -> Callable[[RunStore, LayoutResult | None], RankActivities]:
    """An `activity` analyzer (analyze_store's `prefetch`) that computes ranks' activities on `engine`;
    at most `max_bytes` of them held (default: ACTIVITY_PREFETCH_BYTES, less under the engine's --max-memory)."""
    if max_bytes is None:
        budget = getattr(engine, "budget", None)
        max_bytes = min(ACTIVITY_PREFETCH_BYTES, budget.prefetch_bytes) if budget is not None else ACTIVITY_PREFETCH_BYTES

    def prefetched_activities(store: RunStore, layout: LayoutResult | None) -> RankActivities:
        acts = rank_activities(store, layout)
        ranks = store.ranks()
        path = str(store.path.resolve())
        # enough tasks for every worker to have two, each of at most RANKS_PER_ACTIVITY_TASK ranks
        per_task = max(1, min(RANKS_PER_ACTIVITY_TASK, len(ranks) // (2 * max(1, getattr(engine, "workers", 1)))))
        chunks = [ranks[i:i + per_task] for i in range(0, len(ranks), per_task)]
        with engine_shared(engine, acts.dims) as dims:
            held = 0
            results = engine.map_ranks(rank_activities_task,
                                       [(path, [(r, acts.rows.get(r, {})) for r in c], dims) for c in chunks])
            for r, act in ((r, a) for c, got in zip(chunks, results) for r, a in zip(c, got)):
                acts.held[r] = act
                held += activity_nbytes(act)
                if held > max_bytes:
                    break  # the rest is computed on demand
            close = getattr(results, "close", None)
            if close is not None:
                close()  # stop submitting further tasks
        return acts

    return prefetched_activities


def analyzer_step_task(fn: Callable[..., Any], params: tuple[str, ...], store_path: str, config: Any,
                       inputs: dict[str, Any]) -> Any:
    """One analyzer step (tracekit/analyze/runner.py) on a worker: its store opened there, its other inputs
    as the main process computed them."""
    defer_pandas()
    args = {"store": _open_store(store_path), "config": config, **inputs}
    return fn(**{p: args[p] for p in params})


def step_submitter(engine: Any) -> Callable[..., Any] | None:
    """`measure`'s `submit` on `engine` (None when it cannot run tasks on the side): a step, its parameters,
    the store, the config and its inputs in, a future (or None while no worker runs) out."""
    submit = getattr(engine, "submit", None)
    if submit is None:
        return None

    def submit_step(fn: Callable[..., Any], params: tuple[str, ...], store: RunStore, config: Any,
                    inputs: dict[str, Any]) -> Any:
        return submit(analyzer_step_task, fn, params, str(store.path.resolve()), config, inputs)

    return submit_step
