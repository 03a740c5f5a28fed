"""The what-if fixes' per-rank lookups (grouped once per graph, issue 28) give what a scan of the whole graph
per rank gives: each rank's node sequence and its peers', and each collective instance's members, link tier
and shortest transfer, computed here by brute force on random graphs; a replay of only the nodes a change
reaches gives the whole replay's starts and step times, each rank's peer medians numpy's median of the
stacked peers, and the run's step time the per-rank mean."""

from __future__ import annotations

import numpy as np

from tracekit.whatif.fixes import RunFacts, aligned, instances
from tracekit.whatif.graph import Category, InstInfo, StepGraph, replay


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


def _dag(rng: np.random.Generator, ranks: int = 48, per_rank: int = 60, cross: int = 8) -> StepGraph:
    """Wide enough to replay level by level: a chain per rank, `cross` collective points joining random rank
    pairs (an edge each way from the nodes before), two steps per rank."""
    n = ranks * per_rank
    rank = np.repeat(np.arange(ranks), per_rank)
    dur = rng.integers(1, 9, n).astype(np.int64) * 1000
    start = np.zeros(n, np.int64)
    chain = np.arange(n).reshape(ranks, per_rank)
    src, dst = [chain[:, :-1].ravel()], [chain[:, 1:].ravel()]
    for c in np.sort(rng.choice(np.arange(2, per_rank - 1), cross, replace=False)):
        a, b = rng.permutation(ranks)[:2]
        src += [np.array([chain[a, c - 1], chain[b, c - 1]])]
        dst += [np.array([chain[b, c], chain[a, c]])]
    src, dst = np.concatenate(src), np.concatenate(dst)
    g0 = StepGraph(rank=rank, lane=rank.astype(np.int64), category=np.full(n, Category.HOST, np.int8),
                   start=start, dur=dur, src=src, dst=dst, lane_names=[f"r{r} thread" for r in range(ranks)])
    gap = rng.integers(0, 4, n).astype(np.int64) * 500
    s = replay(g0, dur, gap)  # measured: a replay with random gaps, so the graph's gaps are those
    step = (np.arange(n) % per_rank >= per_rank // 2).astype(np.int64)
    ranks_w = np.repeat(np.arange(ranks), 2).astype(np.int64)
    win_step = np.tile([0, 1], ranks).astype(np.int64)
    first = s[chain[:, 0]]
    mid = s[chain[:, per_rank // 2]]
    last = (s + dur)[chain[:, -1]]
    win_start = np.column_stack([first, mid]).ravel()
    win_end = np.column_stack([mid, last]).ravel()
    return StepGraph(rank=rank, lane=rank.astype(np.int64), category=np.full(n, Category.HOST, np.int8),
                     start=s, dur=dur, src=src, dst=dst, lane_names=[f"r{r} thread" for r in range(ranks)],
                     step=step, ranks=ranks_w, win_step=win_step, win_start=win_start, win_end=win_end)


def _change_one_rank(g, rng, trial: int, dur, gap) -> None:
    """Shorten five nodes of one random rank: their durations on odd trials, else their gaps (every fourth
    trial lengthens them by 3 µs instead)."""
    r = int(rng.integers(0, 48))
    nodes = np.flatnonzero(g.rank == r)[rng.integers(0, 60, 5)]
    if trial % 2:
        dur[nodes] = np.maximum(dur[nodes] - rng.integers(0, 8000, nodes.size), 0)
    else:
        gap[nodes] = np.maximum(gap[nodes] - 1000, 0) + (trial % 4 == 0) * 3000


def test_replay_of_changed_nodes_equals_the_whole_replay():
    """replay_changed re-times only what a change reaches: the starts of the whole level-by-level replay, the
    nodes it reports are exactly those whose start or end moved, and the windows' step times from them equal
    those computed over every node."""
    from tracekit.whatif.graph import rank_step_ns, replay_changed

    rng = np.random.default_rng(3)
    g = _dag(rng)
    assert not g.plan.narrow
    base = replay(g)
    assert np.array_equal(base, g.start)  # the graph's gaps are its measured ones
    checked = partial = 0
    for trial in range(40):
        dur, gap = g.dur.copy(), g.gap.copy()
        _change_one_rank(g, rng, trial, dur, gap)
        got = replay_changed(g, dur, gap)
        want = replay(g, dur, gap)
        if got is None:  # the change reached too much of the graph: the caller replays it whole
            continue
        start, touched = got
        assert np.array_equal(start, want)
        moved = np.flatnonzero((want != base) | (want + dur != base + g.dur))
        assert np.array_equal(np.sort(touched), moved)
        partial += moved.size < g.num_nodes // 4
        assert np.array_equal(rank_step_ns(g, start, dur, gap, touched), rank_step_ns(g, want, dur, gap))
        checked += 1
    assert checked >= 30 and partial >= 10
    dur = g.dur.copy()
    dur[::2] += 1  # half the graph changes: over CHANGED_SHARE, left to the whole replay
    assert replay_changed(g, dur, g.gap.copy()) is None
    assert replay_changed(g, g.dur.astype(np.float64), g.gap.copy()) is None  # float durations: whole replay


def test_peer_medians_equal_numpy_median_of_the_peers():
    """peer_medians gives, per rank, np.median over its peers' aligned sequences (`aligned`'s ref) of the
    measured gaps and durations, from each group's values sorted once."""
    from tracekit.whatif.fixes import peer_medians

    rng = np.random.default_rng(5)
    g = _dag(rng, ranks=13, per_rank=40)
    g.dur[rng.integers(0, g.num_nodes, 200)] = 3000  # many ties
    lay = RunFacts(coords={r: {"pp": r % 3} for r in range(13) if r != 4})  # rank 4: every rank is its peer
    host = g.category == Category.HOST
    seen = 0
    for r in range(13):
        mine, ref = aligned(g, host, r, lay)
        got = peer_medians(g, host, r, lay)
        if ref is None:
            assert got is None
            continue
        assert np.array_equal(got[0], mine)
        for i, values in ((1, g.gap), (2, g.dur)):
            want = np.median(values[ref], axis=0)
            assert got[i]().dtype == want.dtype and np.array_equal(got[i](), want)
        seen += 1
    assert seen >= 10


def test_run_step_time_equals_the_mean_rank_by_rank():
    from tracekit.assess.critical_path import run_step_ns

    rng = np.random.default_rng(9)
    g = _dag(rng, ranks=20, per_rank=30)
    times = rng.integers(10**8, 10**9, g.ranks.size).astype(np.int64)
    rows = np.arange(g.ranks.size)
    want = int(max(float(np.mean(times[rows][g.ranks[rows] == r])) for r in np.unique(g.ranks)))
    assert run_step_ns(g, times, rows) == want
    rows = rows[g.win_step == 1]
    assert run_step_ns(g, times, rows) == int(max(float(times[rows][g.ranks[rows] == r][0]) for r in range(20)))


def test_overlay_reads_and_writes_as_the_array():
    """graph.Overlay (a fix's changes without a copy of the graph's arrays) against a numpy copy: random writes
    by id arrays (repeated ids: the last wins), boolean masks and float values (cast as numpy casts them)."""
    from tracekit.whatif.graph import Overlay

    rng = np.random.default_rng(11)
    base = rng.integers(0, 10**12, 500).astype(np.int64)
    base.flags.writeable = False
    arr, ov = base.copy(), Overlay(base)
    for trial in range(60):
        if trial % 3 == 0:
            m = rng.random(500) < 0.05
            v = rng.integers(0, 10**9, int(m.sum()))
            arr[m] = v
            ov[m] = v
        elif trial % 3 == 1:
            i = rng.integers(0, 500, 20)  # repeats
            v = rng.random(20) * 1e6  # floats into int64: truncated
            arr[i] = v
            ov[i] = v
        else:
            i = rng.integers(0, 500, 10)
            arr[i] = 0
            ov[i] = 0
        q = rng.integers(0, 500, 50)
        assert np.array_equal(ov[q], arr[q])
    assert np.array_equal(ov.dense(), arr)
    assert np.array_equal(ov.changed(), np.flatnonzero(arr != base))
    assert np.array_equal(base, base.copy())  # never written


def test_sparse_replay_of_changed_nodes_equals_the_whole_replay():
    """replay_changed with overlays (nothing of the graph copied) gives the whole replay's starts, the same
    moved nodes and the same windows' step times as the dense arrays."""
    from tracekit.whatif.graph import Overlay, rank_step_ns, replay_changed

    rng = np.random.default_rng(5)
    g = _dag(rng)
    base = replay(g)
    checked = 0
    for trial in range(40):
        dur, gap = Overlay(g.dur), Overlay(g.gap)
        _change_one_rank(g, rng, trial, dur, gap)
        want = replay(g, dur.dense(), gap.dense())
        got = replay_changed(g, dur, gap)
        dense = replay_changed(g, dur.dense(), gap.dense())
        assert (got is None) == (dense is None)
        if got is None:
            continue
        start, touched = got
        assert isinstance(start, Overlay) and np.array_equal(start.dense(), want)
        assert np.array_equal(np.sort(touched), np.sort(dense[1]))
        moved = np.flatnonzero((want != base) | (want + dur.dense() != base + g.dur))
        assert np.array_equal(np.sort(touched), moved)
        assert np.array_equal(rank_step_ns(g, start, dur, gap, touched), rank_step_ns(g, want, dur.dense(), gap.dense()))
        checked += 1
    assert checked >= 30


def test_rank_nodes_equal_a_scan_per_rank():
    """Each rank's nodes (one sort of the graph, cached) are the ids a scan of the whole graph finds, for ranks in
    the graph and outside it, whether the graph holds its ranks as int64 or as the int32 graph builds use."""
    import dataclasses

    from tracekit.whatif.graph import rank_nodes

    g64 = _graph(np.random.default_rng(5))
    g32 = dataclasses.replace(g64, rank=g64.rank.astype(np.int32))
    for g in (g64, g32):
        for r in [-3, -1, *range(12), 12, 40_000]:
            assert np.array_equal(rank_nodes(g, r), np.flatnonzero(g.rank == r)), (g.rank.dtype, r)


def test_member_io_holds_each_instances_members_in_order():
    """`InstInfo.io` as flat arrays by instance (`MemberIO`, a 10,000-rank partial recording's ~6 M members)
    gives per instance the (rank, sent, received) tuples of its members in row order, as the list of lists
    built member by member does (random members, empty instances, NaN sizes); negative ids count from the end."""
    from tracekit.whatif.graph import MemberIO

    rng = np.random.default_rng(3)
    n, rows = 50, 700
    inst = rng.integers(0, n - 5, rows)  # the last instances have no members
    rank = rng.integers(0, 64, rows)
    sent = np.where(rng.random(rows) < 0.1, np.nan, rng.integers(0, 1 << 20, rows).astype(np.float64))
    received = rng.integers(0, 1 << 20, rows).astype(np.float64)
    plain: list[list[tuple[int, float, float]]] = [[] for _ in range(n)]
    for i, r, a, b in zip(inst.tolist(), rank.tolist(), sent.tolist(), received.tolist()):
        plain[i].append((r, a, b))
    io = MemberIO(inst, rank, sent, received, n)
    assert len(io) == n
    for i in range(n):
        got = io[i]
        assert len(got) == len(plain[i]) and all(
            x[0] == y[0] and x[2] == y[2] and (x[1] == y[1] or (np.isnan(x[1]) and np.isnan(y[1])))
            for x, y in zip(got, plain[i])), i
    assert io[-1] == [] and len(list(io)) == n


def test_start_nodes_at_each_ranks_earliest_window_host_start_or_node():
    """Each rank's pinned start node (`add_start_nodes`: the windows grouped by rank once) starts at the earliest
    of its windows' starts, its host start and the first node of each of its lanes, found here by a scan of the
    whole graph per rank; it precedes exactly those first nodes. Windows in an order other than by rank too."""
    from tracekit.whatif.graph import add_start_nodes

    rng = np.random.default_rng(11)
    for shuffled in (False, True):
        g = _graph(rng)
        n0 = g.num_nodes
        chained = np.flatnonzero(g.lane >= 0)  # each lane's nodes chained in (start, id) order, as builds do
        chained = chained[np.lexsort((chained, g.start[chained], g.lane[chained]))]
        same = g.lane[chained[1:]] == g.lane[chained[:-1]]
        g.src, g.dst = chained[:-1][same], chained[1:][same]
        g.ranks = np.repeat(np.arange(12), 2).astype(np.int64)
        g.win_step = np.tile([0, 1], 12).astype(np.int64)
        g.win_start = rng.integers(-20_000, 60_000, 24).astype(np.int64)
        if shuffled:
            o = rng.permutation(24)
            g.ranks, g.win_step, g.win_start = g.ranks[o], g.win_step[o], g.win_start[o]
        host_start = {3: -50_000, 7: 10**9}
        add_start_nodes(g, host_start)
        new = np.arange(n0, g.num_nodes)
        assert sorted(g.rank[new].tolist()) == list(range(12))
        for v in new.tolist():
            r = int(g.rank[v])
            first: dict[int, int] = {}
            for u in range(n0):  # the first node of each of its lanes: earliest start, then lowest id
                if g.rank[u] == r and g.lane[u] >= 0:
                    k = int(g.lane[u])
                    if k not in first or (g.start[u], u) < (g.start[first[k]], first[k]):
                        first[k] = u
            want = min([int(g.win_start[i]) for i in range(24) if g.ranks[i] == r]
                       + [host_start.get(r, 10**18)] + [int(g.start[u]) for u in first.values()])
            assert g.start[v] == want, (shuffled, r)
            assert set(g.dst[g.src == v].tolist()) == set(first.values())
