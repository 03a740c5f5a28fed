"""The what-if fixes' per-rank lookups (grouped once per graph, issue 28) give what a scan of the whole graph
per rank gives: each rank's node sequence and its peers', and each collective instance's members, link tier
and shortest transfer, computed here by brute force on random graphs."""

from __future__ import annotations

import numpy as np

from tracekit.whatif.fixes import RunFacts, aligned, instances
from tracekit.whatif.graph import Category, InstInfo, StepGraph


def _graph(rng: np.random.Generator, ranks: int = 12, nodes: int = 600) -> StepGraph:
    rank = rng.permutation(np.r_[np.repeat(np.arange(ranks), nodes // ranks), np.full(20, -1)])  # equal counts
    nodes = rank.size
    lane = np.where(rank >= 0, rank * 3 + rng.integers(0, 3, nodes), -1)
    cat = rng.integers(0, 7, nodes)
    start = rng.integers(0, 50, nodes).astype(np.int64) * 1000  # many ties: the sort must break them by id
    dur = rng.integers(0, 5000, nodes).astype(np.int64)
    inst = np.where((cat == Category.TRANSFER) & (rank >= 0), rng.integers(0, 20, nodes), -1).astype(np.int32)
    info = InstInfo(key=np.array([f"pg{i % 3}#{i}" for i in range(20)], object),
                    pg_name=np.array([f"pg{i % 3}" for i in range(20)], object),
                    dim=np.array(["dp", "tp", "pp"] * 6 + ["dp", "tp"], object),
                    op=np.array(["all_reduce", "all_gather"] * 10, object),
                    bytes=np.where(np.arange(20) % 7 == 0, np.nan, 1e6 * (1 + np.arange(20))),
                    n=np.full(20, 2, np.int64), io=[[] for _ in range(20)])
    return StepGraph(rank=rank, lane=lane, category=cat, start=start, dur=dur, src=np.zeros(0, np.int64),
                     dst=np.zeros(0, np.int64), inst=inst, inst_info=info, lane_names=[f"l{i}" for i in range(3 * ranks)])


def _seq(g: StepGraph, mask: np.ndarray, r: int) -> np.ndarray:
    v = np.flatnonzero(mask & (g.rank == r))
    return v[np.lexsort((v, g.start[v], g.lane[v]))]


def test_aligned_equals_a_scan_per_peer():
    rng = np.random.default_rng(7)
    g = _graph(rng)
    lay = RunFacts(coords={r: {"pp": r % 2} for r in range(0, 12, 1) if r != 5})
    stacked = 0
    for mask in (g.category == Category.COMPUTE, g.category == Category.HOST, g.rank >= 0):
        for r in range(12):
            mine, ref = aligned(g, mask, r, lay)
            want = _seq(g, mask, r)
            assert np.array_equal(mine, want)
            peers = lay.peers(r, np.unique(g.ranks))
            same = [s for p in peers if p != r and (s := _seq(g, mask, int(p))).size == want.size]
            if same and want.size:
                assert ref is not None and np.array_equal(ref, np.stack(same))
                stacked += 1
            else:
                assert ref is None
    assert stacked >= 12  # every rank's peers share its sequence length under `g.rank >= 0`


def test_instances_equal_a_scan_per_instance():
    rng = np.random.default_rng(11)
    g = _graph(rng)
    lay = RunFacts(hosts={r: f"h{r // 4}" for r in range(12) if r != 9})  # rank 9's host unknown
    dur = g.dur + rng.integers(0, 100, g.num_nodes)
    got = instances(g, dur, lay)
    rows = []
    for i in range(20):
        m = (g.category == Category.TRANSFER) & (g.inst == i)
        b = g.inst_info.bytes[i] * (2 * (2 - 1) / 2 if g.inst_info.op[i] == "all_reduce" else (2 - 1) / 2)
        if not m.any() or not np.isfinite(b) or b <= 0:
            continue
        members = tuple(sorted(set(g.rank[m].tolist())))
        rows.append((i, int(dur[m].min()), members, len({lay.hosts.get(r, "?") for r in members}) > 1, b))
    assert got["inst"].tolist() == [r[0] for r in rows]
    assert got["t"].tolist() == [r[1] for r in rows]
    assert got["ranks"].tolist() == [r[2] for r in rows]
    assert got["inter"].tolist() == [r[3] for r in rows]
    assert np.allclose(got["bus"], [r[4] for r in rows])
    again = instances(g, g.dur, lay)  # the graph's part is reused; the times follow `dur`
    assert again["t"].tolist() == [int(g.dur[(g.category == Category.TRANSFER) & (g.inst == r[0])].min()) for r in rows]
