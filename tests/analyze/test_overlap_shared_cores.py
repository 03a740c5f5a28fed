"""Issue 32: the overlap fix where the ranks share one host's cores.

A hand-built step on 2 CPU ranks: each computes 10 ms, then the two meet in an all_to_all, three times. The
transfers after the last arrival take 1 ms (256 KiB), 2 ms (512 KiB) and 9 ms (512 KiB again: 7 ms longer
than the same bytes took before, a gloo thread kept waiting). On CPU ranks of one host gloo moves the bytes
on the host's own cores: hiding a transfer behind compute moves that work under compute on the same cores,
so what overlapping can remove is only the time above what moving those bytes takes the host (the lower
envelope of transfer time against bytes: 1 ms for 256 KiB, 2 ms for 512 KiB). Step 30 + 12 = 42 ms; hidden on
shared cores 30 + 1 + 2 + 2 = 35 ms (7 ms saved); on ranks with their own cores (or devices) all 12 ms of
transfer is hidden (30 ms). Expected values are the integers above.
"""

from __future__ import annotations

import numpy as np

from tracekit.whatif.fixes import Fix, RunFacts, apply_fixes, replay_graph
from tracekit.whatif.graph import Category, InstInfo, StepGraph, replay

MS = 1_000_000
KIB = 1024
COMPUTE = 10 * MS
SIZES = [256 * KIB, 512 * KIB, 512 * KIB]   # bytes each rank sends in each all_to_all
XFER = [1 * MS, 2 * MS, 9 * MS]             # each all_to_all's transfer after the last arrival


def _graph() -> tuple[StepGraph, int]:
    """(graph, measured end of the step)."""
    rank, lane, cat, start, dur, inst = [], [], [], [], [], []

    def node(r, c, s, d, i=-1):
        rank.append(r), lane.append(max(r, 0)), cat.append(c), start.append(s), dur.append(d), inst.append(i)
        return len(rank) - 1

    src, dst = [], []
    t = 0
    prev = {0: None, 1: None}
    for i, x in enumerate(XFER):
        sync = node(-1, Category.MARK, t + COMPUTE, 0, i)
        for r in (0, 1):
            comp = node(r, Category.COMPUTE, t, COMPUTE)
            arr = node(r, Category.MARK, t + COMPUTE, 0, i)
            xfer = node(r, Category.TRANSFER, t + COMPUTE, x, i)
            edges = [(comp, arr), (arr, sync), (sync, xfer), (arr, xfer)]
            if prev[r] is not None:
                edges.append((prev[r], comp))
            for a, b in edges:
                src.append(a), dst.append(b)
            prev[r] = xfer
        t += COMPUTE + x
    n = len(XFER)
    info = InstInfo(key=np.array([f"ep#{i}" for i in range(n)], object), pg_name=np.array(["ep"] * n, object),
                    dim=np.array(["ep"] * n, object), op=np.array(["all_to_all"] * n, object),
                    bytes=np.array([float(b) for b in SIZES]), n=np.array([2] * n),
                    io=[[(r, b, b) for r in (0, 1)] for b in SIZES])
    g = StepGraph(rank=np.array(rank, np.int32), lane=np.array(lane, np.int32), category=np.array(cat, np.int8),
                  start=np.array(start, np.int64), dur=np.array(dur, np.int64), src=np.array(src, np.int64),
                  dst=np.array(dst, np.int64), inst=np.array(inst, np.int32), inst_info=info,
                  dim=np.where(np.array(inst) >= 0, 0, -1).astype(np.int32), dims=["ep"],
                  lane_names=["rank 0 training thread", "rank 1 training thread"])
    return g, t


def _end(g: StepGraph, fixes: list[Fix], lay: RunFacts) -> int:
    dur, gap = apply_fixes(g, fixes, lay)
    start = replay(replay_graph(g, fixes), dur, gap)
    return int((start + dur)[g.rank >= 0].max())


def test_hiding_a_cpu_collective_on_shared_cores_keeps_its_work():
    g, measured = _graph()
    assert measured == 3 * COMPUTE + sum(XFER) == 42 * MS
    assert _end(g, [], RunFacts()) == measured  # the unchanged replay gives the measured step back
    fix = [Fix("dim_overlap", dim="ep", op="all_to_all")]
    shared = RunFacts(cpu_hosts={0: "h", 1: "h"}, hosts={0: "h", 1: "h"})
    assert measured - _end(g, fix, shared) == 7 * MS  # only the 9 ms transfer's 7 ms above 2 ms


def test_hiding_a_collective_on_own_cores_hides_all_of_it():
    """Ranks with their own cores or devices (no `cpu_hosts`), or on two hosts: the transfer is not the
    host's CPU work on cores the compute needs, and hiding it removes all of it."""
    g, measured = _graph()
    fix = [Fix("dim_overlap", dim="ep", op="all_to_all")]
    assert measured - _end(g, fix, RunFacts(hosts={0: "h", 1: "h"})) == 12 * MS
    assert measured - _end(g, fix, RunFacts(cpu_hosts={}, hosts={0: "a", 1: "b"})) == 12 * MS
