"""How this process shared its host's cores while it was profiled (issue 32): the CPU cores it may run on
(`host_cpus`: its affinity, else the machine's count) and, from Linux's per-thread scheduler statistics
(`/proc/self/task/*/schedstat`: CPU time, time runnable but waiting on a run queue), how long its threads
waited for a core over the profiled steps. Ranks on a host with a core each (2 ranks, 2 cores) share no
cores by their count, but a busy process beside them takes cores all the same: that shows only as their
threads waiting for one. None where the kernel keeps no such statistics.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

TASKS = Path("/proc/self/task")


def host_cpus() -> int:
    """CPU cores this process may run on (its ranks' launcher's affinity is inherited)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return max(os.cpu_count() or 1, 1)


def sample() -> dict[str, int] | None:
    """{"wall_ns", "cpu_ns", "wait_ns", "threads"}: now (monotonic) and the sums over this process's live
    threads of their CPU time and run-queue wait; None when /proc has no schedstat."""
    cpu = wait = threads = 0
    try:
        tasks = list(TASKS.iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
            cpu, wait, threads = cpu + int(fields[0]), wait + int(fields[1]), threads + 1
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    if threads == 0:
        return None
    return {"wall_ns": time.monotonic_ns(), "cpu_ns": cpu, "wait_ns": wait, "threads": threads}


def add_span(total: dict[str, Any] | None, begin: dict[str, int] | None, end: dict[str, int] | None
             ) -> dict[str, Any] | None:
    """`total` with the span begin → end added (wall, CPU and run-queue wait; threads: the most seen)."""
    if begin is None or end is None:
        return total
    out = dict(total or {"wall_ns": 0, "cpu_ns": 0, "wait_ns": 0, "threads": 0})
    for k in ("wall_ns", "cpu_ns", "wait_ns"):
        out[k] += max(end[k] - begin[k], 0)
    out["threads"] = max(out["threads"], end["threads"])
    return out
