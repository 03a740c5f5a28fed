"""Replaying steps: measured vs replayed step time, the critical path and its composition, what-ifs.

A run's step time for one step is its slowest rank's (ranks are held together by their collectives);
a what-if's prediction is the replayed step with the fixes applied (graph.replay), averaged over the
analyzed steps like the measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.derive import intervals as iv
from tracekit.whatif.fixes import (Fix, RunFacts, apply_fixes, apply_fixes_sparse, gradient_dims, replay_graph,
                                   shared_host_idle, shrink_per_sample)
from tracekit.whatif.sharing import host_shares, shared_replay
from tracekit.whatif.graph import (CATEGORY_NAMES, Category, StepGraph, critical_path, measured_step_ns,
                                  device_lane_mask, host_lane_mask, launch_lane_mask, rank_step_ns, replay, replay_changed,
                                  unchanged_replay, window_bounds, window_of, window_span_until)


@dataclass
class StepResult:
    step: int
    graph: StepGraph
    measured_ns: int
    replayed_ns: int
    start: np.ndarray
    """replayed node starts (unchanged graph; shared by the steps of one graph)"""
    rows: np.ndarray = None  # type: ignore[assignment]
    """the graph's windows of this step"""
    rule: str = "profiler_step"
    """how the steps were found (whatif/steps.py `analysed_steps`: profiler_step, optimizer_step,
    graph_launch, repeated_ops, or device_span: a GPU rank's first to last device event as one step)"""


def replay_steps_of(g: StepGraph, rule: str = "profiler_step") -> list[StepResult]:
    """One result per step of the graph, from one unchanged replay (`rule`: how its steps were found)."""
    start = unchanged_replay(g)
    times = rank_step_ns(g, start)
    meas = measured_step_ns(g)
    out = []
    for s in np.unique(g.win_step).tolist():
        rows = np.flatnonzero(g.win_step == s)
        out.append(StepResult(step=int(s), graph=g, measured_ns=int(meas[rows].max()),
                              replayed_ns=int(times[rows].max()), start=start, rows=rows, rule=rule))
    return out


def replay_step(step: int, g: StepGraph) -> StepResult:
    """The result for one step of `g` (a graph of that step alone, or of several)."""
    res = [r for r in replay_steps_of(g) if r.step == step] or replay_steps_of(g)
    return res[0]


def predict_all(g: StepGraph, fixes: list[Fix], lay: RunFacts) -> np.ndarray:
    """Per window of `g`: its step time with `fixes` applied, replayed (cached per graph and fixes). On CPU ranks
    sharing a host's cores with the records the model needs (whatif/sharing.py) the replay is processor
    sharing's fixed point; the added micro-batches' re-schedule (`_more_microbatches`) starts from it."""
    cache = g.cache.predictions
    key = tuple(fixes)
    if key not in cache:
        shared = bool(host_shares(g, lay))  # CPU ranks sharing a host's cores: every pace from the replay's concurrency
        sparse = None if shared else apply_fixes_sparse(g, fixes, lay)
        if sparse is not None:  # a fix on a few ranks: re-time what it reaches, nothing copied of the graph
            done = replay_changed(g, *sparse)
            if done is not None:
                cache[key] = rank_step_ns(g, done[0], sparse[0], sparse[1], done[1])
                return cache[key]
        dur, gap = (sparse[0].dense(), sparse[1].dense()) if sparse is not None else apply_fixes(g, fixes, lay)
        rg = replay_graph(g, fixes)
        # the same graph: re-time only what the fixes change (a fix on one rank of a large run; the sparse
        # attempt above already gave up when it reached too much)
        done = replay_changed(g, dur, gap) if rg is g and sparse is None and not shared else None
        if shared:
            start, dur, gap, _ = shared_replay(g, lay, lambda d, gp: replay(rg, d, gp), dur, gap)
            times = rank_step_ns(g, start, dur, gap)
        elif done is not None:
            start, touched = done
            times = rank_step_ns(g, start, dur, gap, touched)
        else:
            start = replay(rg, dur, gap)
            times = rank_step_ns(g, start, dur, gap)
        more = [f for f in fixes if f.kind == "microbatches"]
        if more:  # the replay handed over, not kept here: `_more_microbatches` frees what it no longer needs
            replayed = [start, dur, gap, times]
            del start, dur, gap
            times = _more_microbatches(g, fixes, lay, int(more[-1].value or 0), replayed)
        if rg is not g:  # an overlap what-if's graph (its own edges and plan, as large as `g`'s) is not kept
            g.cache.overlap_graphs.clear()  # beside `g` for the what-ifs after it: its prediction is cached
        cache[key] = times
    return cache[key]


def _more_microbatches(g: StepGraph, fixes: list[Fix], lay: RunFacts, new_m: int,
                       replayed: list[np.ndarray]) -> np.ndarray:
    """Per window: the step with `new_m` micro-batches of the same batch (docs/metrics.md §8). The pipelined
    part's work that scales with a micro-batch's size shrinks by m / new_m (`shrink_per_sample`: host
    launches and each transfer's fixed cost stay) and the step is replayed; each micro-batch added then adds
    one micro-batch of the busiest rank of the step (its busy time in the shrunk pipelined part ÷ m: in a
    pipeline's steady state the slowest stage paces every micro-batch). On CPU ranks sharing a host, the
    saving is at most the host's idle share of the pipelined part (`shared_host_idle`). `replayed`: [start, dur,
    gap, times] of the replay with the fixes, emptied here (the starts and durations freed once used: the
    all-fixes replay of a 1,024-rank graph peaked there)."""
    start, dur, gap, times = replayed
    replayed.clear()
    m = lay.microbatches
    if lay.pp <= 1 or not m or new_m <= 0 or new_m == m:
        return times
    begin, _ = window_bounds(g, start, dur, gap)
    pipelined = pipelined_ns(g, start, dur, begin, times)
    w = window_of(g)
    # each window's bound summed before it is spread over the nodes (one node-wide temporary, not three)
    inside = (w >= 0) & (start + dur <= (begin + pipelined)[np.maximum(w, 0)])
    dur2 = shrink_per_sample(g, dur, lay, inside, m / new_m)
    del start, dur
    start2 = replay(replay_graph(g, fixes), dur2, gap)
    per_mb = _busy_ns(g, inside, start2, dur2) / m
    pace = np.zeros(g.ranks.size)
    for s in np.unique(g.win_step):
        pace[g.win_step == s] = per_mb[g.win_step == s].max()
    new = rank_step_ns(g, start2, dur2, gap) + (new_m - m) * pace
    return np.rint(np.maximum(new, times - shared_host_idle(g, lay) * pipelined)).astype(np.int64)


def _busy_ns(g: StepGraph, where: np.ndarray, start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Per window: the time its rank was busy with the nodes under `where` (no waits or stalls), the longer
    of its host threads' and its device streams' (a GPU rank's host runs ahead of its device)."""
    w = window_of(g)
    work = where & (w >= 0) & np.isin(g.category, [Category.COMPUTE, Category.OTHER, Category.TRANSFER,
                                                     Category.HOST])
    out = np.zeros(g.ranks.size)
    for lanes in (device_lane_mask(g), host_lane_mask(g)):
        m = np.flatnonzero(work & lanes)
        m = m[np.argsort(w[m], kind="stable")]
        for n in np.split(m, np.flatnonzero(np.diff(w[m])) + 1) if m.size else ():
            a, b = iv.union(start[n], start[n] + dur[n])
            out[w[n[0]]] = max(out[w[n[0]]], float((b - a).sum()))
    return out


def pipelined_ns(g: StepGraph, start: np.ndarray, dur: np.ndarray, begin: np.ndarray, times: np.ndarray
                 ) -> np.ndarray:
    """Per window: the part of its step that more micro-batches rescale. Where the window has gradient
    transfers (dp/fsdp all-reduce, reduce-scatter), up to the start of its last one (the last bucket follows
    the last micro-batch's backward) or the end of its last pipeline transfer when later; after it, the step's
    tail (that sync, the optimizer) keeps its time whatever the micro-batch count. Without gradient
    transfers nothing marks where the last backward ends (the first stage's follows its last pp receive): the
    whole step, as where the graph knows no pp dim. `begin`: the windows' replayed begins (`window_bounds`)."""
    if "pp" not in g.dims:
        return times
    transfer = g.category == Category.TRANSFER
    grad = transfer & gradient_dims(g)
    sync = window_span_until(g, begin, grad, start)
    pp = window_span_until(g, begin, transfer & (g.dim == g.dims.index("pp")), start + dur)
    return np.where(sync >= 0, np.minimum(np.maximum(sync, pp), times), times)


def predict_ns(res: StepResult, fixes: list[Fix], lay: RunFacts) -> int:
    """The step time with `fixes` applied, replayed."""
    rows = res.rows if res.rows is not None else np.arange(res.graph.ranks.size)
    return int(predict_all(res.graph, fixes, lay)[rows].max()) if rows.size else 0


def path_of(res: StepResult) -> tuple[np.ndarray, int]:
    """The critical path (node ids) ending at the step's slowest rank's last node of the step, from the
    step's window start on, and that rank."""
    g = res.graph
    rows = res.rows if res.rows is not None else np.arange(g.ranks.size)
    times = rank_step_ns(g, res.start)
    row = int(rows[int(np.argmax(times[rows]))])
    r = int(g.ranks[row])
    mine = np.flatnonzero((g.rank == r) & g.terminal & (g.step == g.win_step[row]))
    if mine.size == 0:  # nothing of the rank's own in its step window
        return np.zeros(0, np.int64), r
    last = int(mine[np.argmax((res.start + g.dur)[mine])])
    path = critical_path(g, res.start, g.dur, last)
    begin = _window_begin(res, row)
    keep = np.flatnonzero(res.start[path] + g.dur[path] > begin)  # from the window's start on
    return (path[keep[0]:] if keep.size else path[-1:]), r


def _window_begin(res: StepResult, row: int) -> int:
    return int(window_bounds(res.graph, res.start)[0][row])


_CAT_NAME = {int(c): CATEGORY_NAMES[c] for c in Category}


def composition(res: StepResult, path: np.ndarray, rank: int) -> dict[str, Any]:
    """Where the slowest rank's step goes along the path: each node's own time (by its category) and the
    gap before it (host/data stall when on a host thread, else launch/idle), plus the stretch before the
    path's first node and after its last; the parts sum to the step time."""
    g = res.graph
    rows = res.rows if res.rows is not None else np.arange(g.ranks.size)
    row = int(rows[g.ranks[rows] == rank][0])
    step_ns = int(rank_step_ns(g, res.start)[row])
    if path.size == 0:
        return {"step_ns": step_ns, "by_category": {"unattributed": step_ns}, "by_rank": {}, "by_dim": {},
                "by_lane": {}}
    begin = _window_begin(res, row)
    start, dur = res.start[path].copy(), g.dur[path].copy()
    if start[0] < begin:  # the path's first op began before the window: count its part inside
        dur[0] -= begin - start[0]
        start[0] = begin
    # nodes count only inside the window: the step's last nodes may end past it (kernels of a step still
    # running after the next step's first kernel began: a device a step behind its host, CUDA-graph replays),
    # so the parts sum to the step and no share exceeds it (docs/metrics.md §7b)
    inside = np.flatnonzero(start < begin + step_ns)
    keep = inside[-1] + 1 if inside.size else 1
    path, start = path[:keep], np.minimum(start[:keep], begin + step_ns)
    ends = np.minimum(start + dur[:keep], begin + step_ns)
    # each instant of the window counted once, in path order: a node that began before the path's previous
    # nodes ended (a kernel that starts before its launch call returns) owns only the time after them, so no
    # part is negative
    covered = np.maximum.accumulate(np.r_[begin, ends[:-1]])
    gaps = np.maximum(start - covered, 0)
    dur = np.maximum(ends - np.maximum(start, covered), 0)
    cats = [_CAT_NAME[c] for c in g.category[path].tolist()]
    lanes, ranks, dims = g.lane[path].tolist(), g.rank[path].tolist(), g.dim[path].tolist()
    on_thread = ["thread" in name for name in g.lane_names]
    before_peer = _before_peer_step(res, path, start, rank, row)
    by_cat: dict[str, int] = {}
    by_rank: dict[str, int] = {}
    by_dim: dict[str, int] = {}
    for i, (own, gap) in enumerate(zip(dur.tolist(), gaps.tolist())):
        by_cat[cats[i]] = by_cat.get(cats[i], 0) + own
        key = "host_data_stall" if lanes[i] >= 0 and on_thread[lanes[i]] else "launch_or_idle"
        key = "waiting_for_peer" if before_peer[i] else key
        by_cat[key] = by_cat.get(key, 0) + gap
        if ranks[i] >= 0:
            by_rank[str(ranks[i])] = by_rank.get(str(ranks[i]), 0) + own + gap
        if dims[i] >= 0:
            by_dim[g.dims[dims[i]]] = by_dim.get(g.dims[dims[i]], 0) + own
    by_cat["after_path"] = int(begin + step_ns - max(int(ends.max()), begin))
    by_cat.pop("mark", None)
    return {"step_ns": step_ns, "by_category": by_cat, "by_rank": by_rank, "by_dim": by_dim,
            "by_lane": _by_lane(g, path, dur, gaps, by_cat["after_path"])}


LANE_KINDS = ("host", "compute_stream", "comm_stream", "waiting", "device_idle")
"""Where the critical path runs (composition `by_lane`): host threads (their ops and the gaps between
them), device streams running compute or other device work, streams running collectives or send/recv,
cross-rank waits (a collective's last arrival), and device idle: the gap before a device node on the path,
which started later than its launch, its stream and every dependency the trace shows allow (a wait the
trace does not show: an event from another stream, a CUDA graph's internal order, the driver), counted
apart so that a device idling most of its step is not read as compute-bound (docs/metrics.md §7b)."""


def lane_kinds(g: StepGraph) -> np.ndarray:
    """Per lane of `g` (index as `lane_names`, one more at the end for lane -1): its LANE_KINDS index (see
    `_lane_kind`; a stream holding any collective / send/recv transfer is a comm stream)."""
    comm = np.zeros(len(g.lane_names) + 1, bool)
    xfer = (g.category == Category.TRANSFER) & (g.lane >= 0)
    comm[g.lane[xfer]] = True
    kinds = np.array([_lane_kind(n) for n in g.lane_names] + [3], np.int64)
    kinds[:-1][comm[:-1] & (kinds[:-1] == 1)] = 2
    return kinds


def _lane_kind(name: str) -> int:
    """A GPU rank's launching thread is host; a CPU rank's training thread is its compute (the host is its
    device) and its comm lanes communication; a device stream compute until it holds a transfer."""
    if "host thread" in name:
        return 0
    return 2 if " comm " in name else 1


def _by_lane(g: StepGraph, path: np.ndarray, dur: np.ndarray, gaps: np.ndarray, after: int) -> dict[str, int]:
    """The path's time (each node's own time and the gap before it) by the kind of lane it sits on. The
    stretch after the path's last node (`after`: nothing of the step is left to run and the rank's next step
    has not begun: its host is still in this step's tail or the next one's lead, a data wait, a sync) is
    host time."""
    kinds = lane_kinds(g)[np.where(g.lane[path] >= 0, g.lane[path], len(g.lane_names))]
    out = dict.fromkeys(LANE_KINDS, 0)
    device = (LANE_KINDS.index("compute_stream"), LANE_KINDS.index("comm_stream"))
    gpu = {int(r) for r in np.unique(g.rank[launch_lane_mask(g)])}  # ranks with a device apart from the host
    thread = host_lane_mask(g)[path]
    for k, own, gap, r, on_thread in zip(kinds.tolist(), dur.tolist(), gaps.tolist(), g.rank[path].tolist(),
                                         thread.tolist()):
        out[LANE_KINDS[k]] += own
        if gap > 0 and k in device and r in gpu and not on_thread:
            out["device_idle"] += gap
        elif gap > 0 and on_thread:  # a CPU rank's training thread idle: a host stall, not its compute
            out["host"] += gap
        else:
            out[LANE_KINDS[k]] += gap
    out["host"] += max(after, 0)
    return out


def _before_peer_step(res: StepResult, path: np.ndarray, start: np.ndarray, rank: int, row: int) -> np.ndarray:
    """Per path node: it is another rank's, at or before that rank's window of the step began. The gap before
    it is the slowest rank waiting for a peer still in its previous step (a pipeline's stages begin a step
    staggered by the last one's drain), not a stall of its own or of that peer's step."""
    g = res.graph
    begin = window_bounds(g, res.start)[0]
    step = g.win_step[row]
    peer_begin = {int(r): int(b) for r, s, b in zip(g.ranks.tolist(), g.win_step.tolist(), begin.tolist()) if s == step}
    ranks = g.rank[path].tolist()
    return np.array([r >= 0 and r != rank and r in peer_begin and t <= peer_begin[r]
                     for r, t in zip(ranks, start.tolist())], dtype=bool)


def path_rows(res: StepResult, path: np.ndarray, limit: int) -> list[dict[str, Any]]:
    """The path's nodes with time (merged runs of consecutive nodes on one lane), longest `limit` kept in order."""
    g = res.graph
    rows: list[dict[str, Any]] = []
    cols = zip(path.tolist(), g.category[path].tolist(), g.lane[path].tolist(), g.rank[path].tolist(),
               g.dim[path].tolist(), res.start[path].tolist(), (res.start[path] + g.dur[path]).tolist())
    for v, c, ln, r, d, s, e in cols:
        if c == Category.MARK:
            continue
        lane = g.lane_names[ln] if ln >= 0 else "sync"
        cat = _CAT_NAME[c]
        if rows and rows[-1]["lane"] == lane and rows[-1]["category"] == cat:
            rows[-1]["end_ns"] = e
            rows[-1]["ops"] += 1
            continue
        rows.append({"rank": r, "lane": lane, "category": cat, "name": g.name[v] if g.name else "",
                     "start_ns": s, "end_ns": e, "ops": 1, "dim": g.dims[d] if d >= 0 else None})
    if len(rows) > limit:
        keep = set(np.argsort([r["start_ns"] - r["end_ns"] for r in rows])[:limit].tolist())
        rows = [r for i, r in enumerate(rows) if i in keep]
    return rows


def timeline_json(res: StepResult, path: np.ndarray, budget: int, max_ranks: int = 64) -> dict[str, Any]:
    """The step's lanes per rank by category (merged; gaps shorter than `min_gap_ns` closed once the
    budget of intervals is exceeded) plus the critical path as its own lane, on the replay's clock.
    At most `max_ranks` ranks: those on the path first, then the lowest."""
    g = res.graph
    t0, t1 = step_span(res)
    span = max(t1 - t0, 1)
    cats = [c for c in Category if c != Category.MARK]
    lanes = [CATEGORY_NAMES[c] for c in cats] + ["critical path"]
    on_path = np.zeros(g.num_nodes, bool)
    on_path[path] = True
    path_ranks = [int(r) for r in np.unique(g.rank[path]) if r >= 0]
    shown = sorted(set(path_ranks[:max_ranks]) | set(np.unique(g.ranks).tolist()[:max(0, max_ranks - len(path_ranks))]))
    inside = (res.start + g.dur > t0) & (res.start < t1)
    keep = (g.dur > 0) & np.isin(g.rank, shown) & (g.category != Category.MARK) & inside
    lane = np.where(on_path, len(cats), np.searchsorted(np.array([int(c) for c in cats]), g.category))
    idx = np.flatnonzero(keep | (on_path & (g.dur > 0) & np.isin(g.rank, shown) & inside))
    extra = np.flatnonzero(on_path & keep)  # path nodes also stay in their category lane
    rows_rank = np.r_[g.rank[idx], g.rank[extra]]
    rows_lane = np.r_[lane[idx], np.searchsorted(np.array([int(c) for c in cats]), g.category[extra])]
    rows_s = np.r_[res.start[idx], res.start[extra]]
    rows_e = rows_s + np.r_[g.dur[idx], g.dur[extra]]
    order = np.lexsort((rows_s, rows_lane, rows_rank))
    key = rows_rank[order].astype(np.int64) * 64 + rows_lane[order]
    bounds = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True]) if key.size else np.zeros(1, np.int64)
    min_gap = 0
    while True:
        out: list[list[int]] = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            sel = order[a:b]
            r, li = int(rows_rank[sel[0]]), int(rows_lane[sel[0]])
            out.extend([r, li, s, e] for s, e in _merged(rows_s[sel], rows_e[sel], min_gap))
        if len(out) <= budget or min_gap >= span:
            break
        min_gap = max(2 * min_gap, span // 2000)
    return {"lanes": lanes, "intervals": out, "t0_ns": t0, "min_gap_ns": min_gap, "max_intervals": budget,
            "truncated_ranks": sorted(set(g.ranks.tolist()) - set(shown))}


def step_span(res: StepResult) -> tuple[int, int]:
    """The step's replayed span over its ranks: earliest window start to latest window end."""
    g = res.graph
    rows = res.rows if res.rows is not None else np.arange(g.ranks.size)
    if rows.size == 0:
        return 0, 1
    times = rank_step_ns(g, res.start)
    begin = window_bounds(g, res.start)[0]  # once: a window's begin is `_window_begin`
    begins = [int(begin[int(r)]) for r in rows]
    return int(min(begins)), int(max(b + int(times[r]) for b, r in zip(begins, rows)))


def _merged(s: np.ndarray, e: np.ndarray, min_gap: int) -> list[tuple[int, int]]:
    a, b = iv.union(s.astype(np.int64), e.astype(np.int64))
    if min_gap and a.size > 1:
        new = np.r_[True, a[1:] - b[:-1] >= min_gap]
        a, b = a[new], np.maximum.reduceat(b, np.flatnonzero(new))
    return list(zip(a.tolist(), b.tolist()))
