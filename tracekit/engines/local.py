"""The embedded engine: per-rank parse and analysis tasks over a local process pool."""

from __future__ import annotations

import contextlib
import os
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from tracekit.parse.pool import memory_workers, parse_kineto_files, pool_context

if TYPE_CHECKING:  # concurrent.futures (and the logging it loads, ~15 ms) only when a pool starts
    from concurrent.futures import ProcessPoolExecutor

    from tracekit.engines.budget import MemoryBudget


@dataclass
class LocalEngine:
    workers: int = 1
    """Processes; 1 runs everything in this process."""
    auto: bool = False
    """The count is a default, not the user's: parsing uses no more workers than files, nor more
    than the free memory holds (`memory_workers`)."""
    budget: MemoryBudget | None = None
    """--max-memory for this process and its workers: fewer workers, each parse within its share."""
    _pool: ProcessPoolExecutor | None = field(default=None, init=False, repr=False)
    parses_locally = True
    """Its processes run on this machine (parse_run may decode a merged file here with as many)."""

    def warm_up(self) -> None:
        """Start the worker pool's fork server early (nothing to do with one worker)."""
        if self.workers > 1 and self.budget is None:  # under --max-memory the plan may choose one worker
            from tracekit.parse.pool import start_pool_server

            start_pool_server()

    def parse_kineto_files(self, paths: list[str], *, max_decompressed_bytes: int | None = None,
                           max_memory_bytes: int | None = None) -> Iterator[tuple[str, Any, str | None]]:
        workers = processes = self.workers
        if self.budget is not None and paths:
            from tracekit.parse.gz import json_size_bytes
            from tracekit.parse.pool import NORMAL_PATH_MEMORY_FACTOR

            largest = max(json_size_bytes(p) or 4 * os.path.getsize(p) for p in paths)
            workers, max_memory_bytes = self.budget.parse_plan(min(workers, len(paths)), largest,
                                                               NORMAL_PATH_MEMORY_FACTOR)
            processes = self.workers = workers  # the per-rank tasks too
        elif self.auto:
            processes = max(1, min(workers, memory_workers(paths, max_memory_bytes)))
            workers = min(processes, len(paths))
        return parse_kineto_files(paths, workers=workers, max_decompressed_bytes=max_decompressed_bytes,
                                  max_memory_bytes=max_memory_bytes, processes=processes)

    def map_ranks(self, fn: Callable[..., Any], args: list[tuple]) -> Iterator[Any]:
        """fn(*a) for each a, results in order, at most 2 tasks per worker in flight."""
        if self.workers <= 1 or len(args) <= 1:
            for a in args:
                yield fn(*a)
            return
        if self._pool is None:
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=pool_context())
        pending: deque = deque()
        todo = iter(args)
        for a in todo:
            pending.append(self._pool.submit(fn, *a))
            if len(pending) >= 2 * self.workers:
                break
        while pending:
            result = pending.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(self._pool.submit(fn, *nxt))
            yield result

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on a worker of the running pool, as a Future; None when no pool runs (one worker, or a run
        whose per-rank tasks did not need one: starting a pool for a run that small costs more than the work it
        would move) or under --max-memory (the workers' share of the budget is planned for parsing only)."""
        if self._pool is None or self.budget is not None:
            return None
        return self._pool.submit(fn, *args)

    def shared(self, value: Any) -> contextlib.AbstractContextManager:
        """A handle to `value` for `map_ranks`' tasks (tracekit/engines/shared.py): the value itself when the
        tasks run in this process, else a temporary file each worker reads once."""
        if self.workers <= 1:
            return contextlib.nullcontext(value)
        from tracekit.engines.shared import shared_file

        return shared_file(value)

    def release(self) -> None:
        """The per-rank work of an analysis is done (its cross-rank assessment runs in this process): the workers
        exit and give their memory back (at 1,024 simulated ranks ~400 MB of PSS beside the critical path's
        peak). A later `map_ranks` starts a new pool."""
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
