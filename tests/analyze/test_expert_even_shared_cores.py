"""Issue 32: balanced routing replayed where the expert-parallel ranks share one host's cores.

A hand-built step of one MoE pass on 2 CPU ranks (a dispatch all_to_all, each rank's expert compute, a
combine all_to_all), timed as processor sharing times it: while both ranks compute each progresses at the
pace the host gives two runnable ranks; the cold rank, done first, waits inside the combine holding no core,
and the hot rank's remaining tokens run 1.5x faster, alone. Rank 0 receives 256 KiB of tokens (6 ms at the
shared pace), rank 1 768 KiB (256 KiB in the same 6 ms, then 512 KiB alone at 1.5x: 8 ms; 14 ms in all).

Balanced (512 KiB each), both ranks compute side by side the whole pass at the shared pace: 12 ms each, so
the pass is 2 ms shorter. The fit of time against load across the ranks reads the hot rank's alone-pace
tail as the per-token cost (8 ms per 512 KiB) and left the cold rank's 6 ms as fitting in its wait: 10 ms,
4 ms saved, twice the answer. On GPU ranks (each its own device: no shared cores) that fit is the model,
and the replay is unchanged. Expected values are the integers above.
"""

from __future__ import annotations

import numpy as np

from tracekit.whatif.fixes import Fix, RunFacts, apply_fixes
from tracekit.whatif.graph import Category, InstInfo, StepGraph, replay

MS = 1_000_000
KIB = 1024
LOAD = {0: 256 * KIB, 1: 768 * KIB}  # bytes each rank receives in the dispatch (and sends in the combine)
EXPERT = {0: 6 * MS, 1: 6 * MS + 8 * MS}
XFER = 0  # each all_to_all's transfer after the last arrival (0: the pass is its compute and its waits)


def _pass_graph() -> tuple[StepGraph, dict[int, int], int]:
    """(graph, rank -> its expert compute node, the measured end of the pass)."""
    rank, lane, cat, start, dur, inst = [], [], [], [], [], []

    def node(r, c, s, d, i=-1):
        rank.append(r), lane.append(max(r, 0)), cat.append(c), start.append(s), dur.append(d), inst.append(i)
        return len(rank) - 1

    src, dst = [], []
    sync_d = node(-1, Category.MARK, 0, 0, 0)
    combine_at = XFER + max(EXPERT.values())  # the hot rank's arrival at the combine
    sync_c = node(-1, Category.MARK, combine_at, 0, 1)
    comp, ends = {}, []
    for r in (0, 1):
        arr_d = node(r, Category.MARK, 0, 0, 0)
        x_d = node(r, Category.TRANSFER, 0, XFER, 0)
        comp[r] = node(r, Category.COMPUTE, XFER, EXPERT[r])
        arr_c = node(r, Category.MARK, XFER + EXPERT[r], 0, 1)
        x_c = node(r, Category.TRANSFER, combine_at, XFER, 1)
        ends.append(combine_at + XFER)
        for a, b in ((arr_d, sync_d), (sync_d, x_d), (arr_d, x_d), (x_d, comp[r]), (comp[r], arr_c),
                     (arr_c, sync_c), (sync_c, x_c), (arr_c, x_c)):
            src.append(a), dst.append(b)
    # per instance and member: (rank, bytes sent, bytes received); the combine mirrors the dispatch
    io = [[(r, 512 * KIB, LOAD[r]) for r in (0, 1)], [(r, LOAD[r], 512 * KIB) for r in (0, 1)]]
    info = InstInfo(key=np.array(["ep#0", "ep#1"], object), pg_name=np.array(["ep", "ep"], object),
                    dim=np.array(["ep", "ep"], object), op=np.array(["all_to_all"] * 2, object),
                    bytes=np.array([float(LOAD[1])] * 2), n=np.array([2, 2]), io=io)
    g = StepGraph(rank=np.array(rank, np.int32), lane=np.array(lane, np.int32), category=np.array(cat, np.int8),
                  start=np.array(start, np.int64), dur=np.array(dur, np.int64), src=np.array(src, np.int64),
                  dst=np.array(dst, np.int64), inst=np.array(inst, np.int32), inst_info=info,
                  dim=np.where(np.array(inst) >= 0, 0, -1).astype(np.int32), dims=["ep"],
                  lane_names=["rank 0 training thread", "rank 1 training thread"])
    assert max(ends) == combine_at + XFER
    return g, comp, combine_at + XFER


def _pass_end(g: StepGraph, fixes: list[Fix], lay: RunFacts) -> tuple[int, np.ndarray]:
    dur, gap = apply_fixes(g, fixes, lay)
    start = replay(g, dur, gap)
    return int((start + dur)[g.rank >= 0].max()), dur


def test_balanced_routing_on_shared_cores_runs_every_rank_at_the_cold_ranks_pace():
    g, comp, measured = _pass_graph()
    assert _pass_end(g, [], RunFacts())[0] == measured  # the unchanged replay gives the measured pass back
    shared = RunFacts(cpu_hosts={0: "h", 1: "h"})
    end, dur = _pass_end(g, [Fix("expert_even")], shared)
    balanced = EXPERT[0] * (LOAD[0] + LOAD[1]) // 2 // LOAD[0]  # the cold rank's pace at the mean load: 12 ms
    assert dur[comp[0]] == dur[comp[1]] == balanced == 12 * MS
    assert measured - end == 2 * MS


def test_balanced_routing_on_own_devices_keeps_the_fit():
    """No shared host (GPU ranks, or CPU ranks with a core each): the hot rank at the members' fit at the
    mean load, the cold rank unchanged (its extra work fits in the time it waited)."""
    g, comp, measured = _pass_graph()
    end, dur = _pass_end(g, [Fix("expert_even")], RunFacts())
    assert dur[comp[0]] == EXPERT[0] and dur[comp[1]] == 10 * MS
    assert measured - end == 4 * MS
    # ranks on two hosts do not share cores either
    end2, _ = _pass_end(g, [Fix("expert_even")], RunFacts(cpu_hosts={0: "a", 1: "b"}))
    assert end2 == end
