"""`--max-memory`: the memory budget of the whole command, this process and its local workers.

The budget is planned, then watched:
- planned: the local engine runs no more parse workers than fit beside this process (its own
  memory when parsing starts, measured) at one worker's baseline plus its parse each; each worker's
  parse gets the rest of its share as its own budget (files over it take the chunked path); the
  per-rank activities prefetched for the analyzers are capped at an eighth of the budget (the rest
  is computed on demand).
- watched: the summed PSS of this process and its children (PSS: shared pages counted once, as the
  machine pays them) is sampled while the command runs. The cross-rank analysis runs in this
  process and grows with the run; when the peak went over the budget the command says so, with
  how much this process and how much the workers held at that moment, and what the budget would
  have to be.

Workers of a Ray cluster run on the cluster's nodes, outside this budget (each parse task gets the
whole budget as its own); the budget then covers this process.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

WORKER_BASE_BYTES = 64 << 20
"""A parse worker's own memory before it parses (interpreter, numpy, pyarrow; PSS, forked from the
fork server: measured ~35-45 MB per worker on 2026-12 builds, with headroom)."""
MIN_PARSE_BYTES = 4 << 20
"""The smallest per-worker parse budget planned: the chunked parser works in chunks of a fraction of it."""
PREFETCH_SHARE = 8
"""Prefetched per-rank activities may hold 1/PREFETCH_SHARE of the budget."""


def _pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def child_pids(pid: int) -> list[int]:
    """The direct children of process `pid` (every thread's `/proc/<pid>/task/<tid>/children`); [] when gone."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def tree_pss_bytes(pid: int | None = None) -> tuple[int, int]:
    """(PSS of process `pid` (default: this one), PSS of all its descendants)."""
    pid = os.getpid() if pid is None else pid
    own = _pss_bytes(pid)
    rest, todo = 0, child_pids(pid)
    while todo:
        p = todo.pop()
        rest += _pss_bytes(p)
        todo += child_pids(p)
    return own, rest


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


@dataclass
class MemoryBudget:
    total: int
    """Bytes for this process and its local workers together."""
    interval_s: float = 0.5
    peak: int = 0
    peak_own: int = 0
    peak_workers: int = 0
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    # -- plan ------------------------------------------------------------------------------------
    def parse_plan(self, workers: int, largest_json: int, factor: float) -> tuple[int, int]:
        """(workers, each worker's parse budget) that fit beside this process as it is now:
        `factor` x the largest file's JSON is one one-shot parse (parse/pool.py)."""
        own, _ = tree_pss_bytes()
        free = max(self.total - own, 0)
        one_shot = int(largest_json * factor) + largest_json  # its parse and the result it hands over
        fit = max(1, free // (WORKER_BASE_BYTES + min(one_shot, max(MIN_PARSE_BYTES, free))))
        w = max(1, min(workers, fit))
        each = free // w - WORKER_BASE_BYTES if w > 1 else free  # one worker: parsing in this process
        return w, max(min(each, self.total), min(MIN_PARSE_BYTES, self.total))

    @property
    def prefetch_bytes(self) -> int:
        return self.total // PREFETCH_SHARE

    # -- watch -----------------------------------------------------------------------------------
    def sample(self) -> None:
        own, workers = tree_pss_bytes()
        if own + workers > self.peak:
            self.peak, self.peak_own, self.peak_workers = own + workers, own, workers

    def start(self) -> MemoryBudget:
        def loop() -> None:
            while not self._stop.is_set():
                self.sample()
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=loop, name="tracekit-memory-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample()

    def __enter__(self) -> MemoryBudget:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def exceeded(self) -> bool:
        return self.peak > self.total

    def report(self) -> str:
        """One line: the peak against the budget, and when over it, where the memory was and why."""
        line = (f"peak memory {_mb(self.peak)} (this process {_mb(self.peak_own)}, workers "
                f"{_mb(self.peak_workers)}; summed PSS, sampled every {self.interval_s:g} s) of --max-memory "
                f"{_mb(self.total)}")
        if not self.exceeded:
            return line
        where = ("the cross-rank analysis in this process needs more than the budget for this run"
                 if self.peak_own > self.total - WORKER_BASE_BYTES else
                 "the workers' parses together with this process went over it")
        return (f"--max-memory {_mb(self.total)} could not be kept: {line}; {where} "
                f"(it would need --max-memory {_mb(self.peak)} or more).")
