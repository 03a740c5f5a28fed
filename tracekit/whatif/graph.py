"""A step's cross-rank dependency graph as numpy arrays, replayed by vectorised longest path.

Each node is an interval on one lane (a training thread, a device stream, a rank's comm lane) or an
instant (a collective's arrival, the moment its last member arrives). A node starts when its latest
predecessor ends, plus its own `gap` (measured: start − latest predecessor end), and lasts `dur`:

    start[v] = max(end[u] for u → v) + gap[v]      end[v] = start[v] + dur[v]

so replaying the unchanged graph gives back the measured times exactly, and a what-if changes
`dur` (or `gap`) of a class of nodes and replays. Nodes without predecessors keep their measured start.
The gap is the time the node's lane spent on nothing the graph explains: host work between device
launches, a host stall, launch latency.

Replay visits the nodes level by level (level = longest chain of edges from a source), so each level
is one vectorised `np.maximum.reduceat` over its in-edges: the Python loop runs once per level (the
depth of the graph, about the number of ops on the longest lane), never once per node. Measured on the
2-core box (benchmarks/critical_path_bench.py) against a per-node loop and networkx.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable

import os

import numpy as np

from tracekit.tables.columns import unique_inverse

try:
    from tracekit.whatif import kgraph
except ImportError:  # no compiler at install time: the numpy passes
    kgraph = None


class Category(IntEnum):
    """What a node's time is, for the critical path's composition."""

    COMPUTE = 0
    TRANSFER = 1
    """a collective's or P2P op's transfer after its last member arrived"""
    WAIT = 2
    """waiting for a peer (a collective's arrival before the last member)"""
    HOST = 3
    """host work between device launches / host ops on a CPU training thread"""
    STALL = 4
    """host or data stall: host gaps, data loading"""
    OTHER = 5
    """memcpy, memset, other device work"""
    MARK = 6
    """zero-length bookkeeping node (arrival, step start)"""


CATEGORY_NAMES = {Category.COMPUTE: "compute", Category.TRANSFER: "exposed_transfer",
                  Category.WAIT: "waiting_for_peer", Category.HOST: "host", Category.STALL: "host_data_stall",
                  Category.OTHER: "other_device", Category.MARK: "mark"}


class MemberIO:
    """Per instance, its members' (rank, bytes sent, bytes received) as `InstInfo.io` reads them (`io[i]`: a
    list of tuples, in member order), held as flat arrays by instance (CSR): a 10,000-rank partial recording
    has ~6 M members, as tuples ~1 GB."""

    def __init__(self, inst: np.ndarray, rank: np.ndarray, sent: np.ndarray, received: np.ndarray, n: int) -> None:
        order = np.argsort(inst, kind="stable")
        self.rank = np.asarray(rank, np.int64)[order]
        self.sent = np.asarray(sent, np.float64)[order]
        self.received = np.asarray(received, np.float64)[order]
        self.offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(np.asarray(inst, np.int64), minlength=n), out=self.offsets[1:])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> list[tuple[int, float, float]]:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return list(zip(self.rank[lo:hi].tolist(), self.sent[lo:hi].tolist(), self.received[lo:hi].tolist()))

    def __iter__(self):
        return (self[i] for i in range(len(self)))


@dataclass
class InstInfo:
    """Per collective / P2P instance of a graph, indexed by instance id (`StepGraph.inst`)."""

    key: np.ndarray
    """matching's instance key (`pg#seq`; P2P pairs `p2p:src>dst:pg#k`), object array"""
    pg_name: np.ndarray
    dim: np.ndarray
    op: np.ndarray
    """object arrays of str"""
    bytes: np.ndarray
    """float64: the largest member's bytes (NaN: unknown)"""
    n: np.ndarray
    """int64: members"""
    io: list[list[tuple[int, float, float]]] | MemberIO
    """per member: (rank, bytes sent, bytes received; NaN when unknown)"""

    def __len__(self) -> int:
        return len(self.key)

    def at(self, field_name: str, ids: np.ndarray) -> np.ndarray:
        """`field_name` of instances `ids` (float64 NaN, or 'nan' for strings, where an id is none of
        them, e.g. -1)."""
        col = getattr(self, field_name)
        ids = np.asarray(ids, np.int64)
        ok = (ids >= 0) & (ids < len(self))
        fill: Any = "nan" if col.dtype == object else np.nan
        out = np.full(ids.shape, fill, dtype=object if col.dtype == object else np.float64)
        out[ok] = col[ids[ok]]
        return out


@dataclass
class GraphCache:
    """What the replays of one graph compute once and reuse (each what-if of a large run asks again): read
    through the functions that fill them, never directly. A graph made from another (dataclasses.replace)
    starts with an empty one."""

    derived: dict = field(default_factory=dict)
    """name -> (the arrays it was computed from, the names, a read-only per-node array): `derived`, which
    window_of, the lane masks and fixes.bucket_windows read through"""
    first_ops: tuple | None = None
    """(the arrays they were found from, per window its first op): graph._first_gap_removed"""
    predictions: dict = field(default_factory=dict)
    """fixes -> per window the replayed step time: replay.predict_all"""
    rank_sequences: dict = field(default_factory=dict)
    mask_keys: list = field(default_factory=list)
    """[(a read-only mask, its rank_sequences key)]: a cached mask (host_lane_mask) is not hashed again"""
    peer_groups: dict = field(default_factory=dict)
    """(sequences, stage, length) -> (the group's ranks, their values sorted per position): fixes.peer_medians"""
    buckets: dict = field(default_factory=dict)
    overlap_graphs: dict = field(default_factory=dict)
    instance_static: dict = field(default_factory=dict)
    same_collective: dict = field(default_factory=dict)
    """whatif/fixes.py's per-graph facts (keyed as each function there documents)"""
    base: tuple | None = None
    """(the arrays it was computed from, the unchanged replay's starts and ends, edges out of each node as CSR):
    replay_changed"""
    unchanged: tuple | None = None
    """(the arrays it was computed from, the unchanged replay's starts): unchanged_replay"""
    rank_nodes: tuple | None = None
    """(the rank array it was computed from, node ids sorted by rank, their ranks): graph.rank_nodes"""
    sharing: dict = field(default_factory=dict)
    """(the layout's hosts, cores and CPU records) -> each host's processor-sharing model: sharing.host_shares"""
    extremes: dict = field(default_factory=dict)
    """per-window extremes of terminal nodes (measured; of the unchanged replay) and the terminal nodes grouped
    by window: window_bounds"""


@dataclass
class StepGraph:
    """Nodes (parallel int arrays) and edges of one step; times are int64 ns on one common clock."""

    rank: np.ndarray
    lane: np.ndarray
    """global lane id (rank, thread or stream), see `lane_names`"""
    category: np.ndarray
    start: np.ndarray
    """measured start"""
    dur: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    dim: np.ndarray = None  # type: ignore[assignment]
    """index into `dims` (-1: none) for collective nodes"""
    inst: np.ndarray = None  # type: ignore[assignment]
    """collective instance index (-1: none)"""
    name: list[str] = field(default_factory=list)
    """per-node label (for export); may be empty"""
    lane_names: list[str] = field(default_factory=list)
    dims: list[str] = field(default_factory=list)
    terminal: np.ndarray = None  # type: ignore[assignment]
    """per node: True when it counts for its rank's step end"""
    step: np.ndarray = None  # type: ignore[assignment]
    """per node: the profiled step it belongs to (-1: none; terminal nodes count for their step's window)"""
    ranks: np.ndarray = None  # type: ignore[assignment]
    """per window: the rank (windows sorted by rank, then step)"""
    win_step: np.ndarray = None  # type: ignore[assignment]
    win_start: np.ndarray = None  # type: ignore[assignment]
    win_end: np.ndarray = None  # type: ignore[assignment]
    """per window: the step and the rank's measured step window"""
    win_backward: np.ndarray = None  # type: ignore[assignment]
    """per window: measured start of its last backward pass (`build.last_backward_start`; -1: not known)"""
    excess_gap: np.ndarray = None  # type: ignore[assignment]
    excess_dur: np.ndarray = None  # type: ignore[assignment]
    """per node (host threads of GPU ranks): slow host time (ops far slower than the same op elsewhere,
    analyze/host_bound.py) in the gap before it / in its own time; 0 elsewhere"""
    assumed_edges: np.ndarray = None  # type: ignore[assignment]
    """(k, 2) src, dst: edges the trace does not show, added so that a what-if that makes the host faster
    keeps a launch-bound op after another stream's op that ended before it (whatif.build.infer_stream_waits);
    they are also in src / dst"""
    host_idle: dict = field(default_factory=dict)
    """per GPU rank: its host gaps (no host op recorded, at least host_stalls' MIN_GAP_NS) and data loading, as
    intervals on the common clock: the part of a host node's gap a stall fix may remove (whatif/fixes.py
    `host_stalls`); the rest of the gap is host ops that launch nothing"""
    inst_info: InstInfo | None = None
    """per collective instance (index = inst): key, pg_name, dim, op, bytes, n, io"""
    _plan: "_Plan | None" = None
    cache: GraphCache = field(init=False, repr=False, compare=False)
    """Facts of this graph its replays reuse (empty for a graph made with dataclasses.replace)."""

    def __post_init__(self) -> None:
        self.cache = GraphCache()
        n = len(self.start)
        for attr, fill in (("dim", -1), ("inst", -1)):
            if getattr(self, attr) is None:
                setattr(self, attr, np.full(n, fill, dtype=np.int32))
        for attr in ("excess_gap", "excess_dur"):
            if getattr(self, attr) is None:
                setattr(self, attr, np.zeros(n, dtype=np.int64))
        if self.assumed_edges is None:
            self.assumed_edges = np.zeros((0, 2), dtype=np.int64)
        if self.terminal is None:
            self.terminal = np.ones(n, dtype=bool)
        if self.step is None:
            self.step = np.zeros(n, dtype=np.int64)
        if self.ranks is None:
            self.ranks, pos = unique_inverse(self.rank[self.rank >= 0])
            self.ranks = self.ranks.astype(np.int64)
            self.win_step = np.zeros(self.ranks.size, dtype=np.int64)
            self.win_start = np.full(self.ranks.size, np.iinfo(np.int64).max, np.int64)
            np.minimum.at(self.win_start, pos, self.start[self.rank >= 0])
            self.win_end = np.zeros(self.ranks.size, np.int64)
            np.maximum.at(self.win_end, pos, np.where(self.terminal, self.end, 0)[self.rank >= 0])
        if self.win_backward is None or self.win_backward.size != self.ranks.size:
            self.win_backward = np.full(self.ranks.size, -1, np.int64)

    @property
    def num_nodes(self) -> int:
        return len(self.start)

    @property
    def end(self) -> np.ndarray:
        return self.start + self.dur

    @property
    def gap(self) -> np.ndarray:
        return self.plan.gap

    @property
    def plan(self) -> "_Plan":
        if self._plan is None:
            self._plan = _make_plan(self)
        return self._plan


@dataclass
class _Plan:
    order: np.ndarray
    """nodes sorted by level"""
    level_bounds: np.ndarray
    """order[level_bounds[i]:level_bounds[i+1]] are level i"""
    in_ptr: np.ndarray
    """CSR of in-edges by node id (the C replay's and the critical-path walk's)"""
    in_src: np.ndarray
    gap: np.ndarray
    narrow: bool = False
    """Few nodes per level (a one-rank chain): `replay` goes node by node."""
    edge_src_pos: np.ndarray | None = None
    """numpy's level-by-level replay (`_level_edges`, made when it first runs): in-edges' sources, grouped by
    destination in `order`, as positions in `order` (`replay` keeps its arrays in level order: a level's
    nodes are then one slice, not an index array to gather and scatter by)"""
    edge_bounds: np.ndarray | None = None
    """per level: slice of edge_src_pos"""
    seg_starts: list | None = None
    """per level: reduceat offsets (relative) of each node's in-edges"""


SMALL_GRAPH_NODES = 8192
"""Graphs up to this many nodes take their levels node by node: a one-rank trace is one long chain
(4,049 nodes, as many levels), where a vectorised pass per level costs ~17 µs against ~1 µs per node
(0.07 -> 0.004 s); a wide graph this small costs at most a few ms either way."""


def _levels_by_node(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """topo_levels' result, one node at a time (Kahn's algorithm over Python lists)."""
    succ: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(src.tolist(), dst.tolist()):
        succ[s].append(d)
    indeg = np.bincount(dst, minlength=n).tolist()
    level = [-1] * n
    frontier = [v for v in range(n) if indeg[v] == 0]
    lv = 0
    while frontier:
        nxt = []
        for v in frontier:
            level[v] = lv
            for w in succ[v]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    nxt.append(w)
        frontier = nxt
        lv += 1
    return np.array(level, dtype=np.int64)


def topo_levels(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Longest-chain level of every node (Kahn's algorithm: in C where built, `kgraph.levels`; else one
    vectorised pass per level, node by node for small graphs and for narrow ones, found after the first
    NARROW_PROBE_LEVELS levels)."""
    if native_graph():
        level = np.empty(n, np.int64)
        s, d = _same_ints(src, dst)
        kgraph.levels(n, s, d, level)
    else:
        level = _levels_by_node(n, src, dst) if n <= SMALL_GRAPH_NODES else _levels_by_level(n, src, dst)
    if level is None:  # narrow: few nodes per level, a vectorised pass per level costs more than the nodes
        level = _levels_by_node(n, src, dst)
    if (level < 0).any():
        raise ValueError(f"dependency graph has a cycle through {int((level < 0).sum())} node(s)")
    return level


NARROW_PROBE_LEVELS = 64
"""`_levels_by_level` gives up (for `_levels_by_node`) when its first this many levels hold fewer than
NARROW_NODES_PER_LEVEL nodes each on average: a 2-rank CPU trace of 9,074 nodes has 4,536 levels
(0.089 s a pass per level, 0.005 s node by node); a wide graph keeps its vectorised passes."""


def _levels_by_level(n: int, src: np.ndarray, dst: np.ndarray, probe: bool = True) -> np.ndarray | None:
    """topo_levels' result, one vectorised pass per level (nodes on a cycle keep -1); None (with `probe`)
    when the graph is narrow (NARROW_PROBE_LEVELS)."""
    indeg = np.bincount(dst, minlength=n).astype(np.int64)
    # successors as CSR by source; ids in the smallest dtype that holds them and no sorted copy of `src`
    # (a 1,024-rank graph's 8 M edges: ~0.2 GB less at the plan's peak)
    succ = dst[np.argsort(src, kind="stable")].astype(id_dtype(n), copy=False)
    ptr = np.r_[0, np.cumsum(np.bincount(src, minlength=n))]
    level = np.full(n, -1, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    lv = 0
    while frontier.size:
        level[frontier] = lv
        starts = ptr[frontier]
        counts = ptr[frontier + 1] - starts
        total = int(counts.sum())
        if total == 0:
            break
        offs = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total)
        nxt, cnt = np.unique(succ[offs], return_counts=True)
        indeg[nxt] -= cnt
        frontier = nxt[indeg[nxt] == 0]
        lv += 1
        if probe and lv == NARROW_PROBE_LEVELS:
            probe = False
            if int((level >= 0).sum()) < NARROW_NODES_PER_LEVEL * lv:
                return None
    return level


def native_graph() -> bool:
    """Whether levels and integer replays run in C here (`kgraph`, built by pip install where a compiler
    exists; TRACEKIT_NATIVE=0 turns it off): the same results as the numpy passes; a full replay of the
    10,000-rank benchmark's graph (19 M nodes, 35 M edges) ~1 s against ~2 s (cProfile'd runs)."""
    return kgraph is not None and os.environ.get("TRACEKIT_NATIVE", "1") != "0"


def _same_ints(*arrays: np.ndarray) -> list[np.ndarray]:
    """The index arrays as C-contiguous integers of one width (int32 where all are, else int64), as kgraph
    reads them."""
    dt = np.int32 if all(a.dtype == np.int32 for a in arrays) else np.int64
    return [np.ascontiguousarray(a, dtype=dt) for a in arrays]


def id_dtype(n: int) -> type:
    """The dtype of node or edge ids below `n`: int32 where they fit (half the memory of a large graph's)."""
    return np.int32 if n < 2**31 - 1 else np.int64


def _make_plan(g: StepGraph) -> _Plan:
    n = g.num_nodes
    small = id_dtype(max(n, len(g.src)))
    # each temporary freed once used and ids held as `small`: the plan of a 1,024-rank graph (4 M nodes, 8 M
    # edges; one more per overlap what-if) peaked at ~0.6 GB beyond the graph
    level = topo_levels(n, g.src, g.dst)
    order = np.argsort(level, kind="stable").astype(small)
    nlev = int(level.max()) + 1 if n else 0
    level_bounds = np.searchsorted(level[order], np.arange(nlev + 1))
    del level
    in_ptr = np.r_[0, np.cumsum(np.bincount(g.dst, minlength=n))].astype(small)
    in_src = g.src[np.argsort(g.dst, kind="stable")].astype(small)
    # the latest end of each node's predecessors, per node over its in-edges (the same maximum as an
    # unbuffered maximum.at over the edges)
    ready = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    has = np.flatnonzero(in_ptr[1:] > in_ptr[:-1])
    if has.size:
        ready[has] = np.maximum.reduceat((g.start + g.dur)[in_src], in_ptr[has])
    gap = np.where(ready == np.iinfo(np.int64).min, 0, g.start - ready)
    return _Plan(order=order, level_bounds=level_bounds, in_ptr=in_ptr, in_src=in_src, gap=gap,
                 narrow=NARROW_NODES_PER_LEVEL * nlev >= n)


def _level_edges(plan: _Plan) -> tuple[np.ndarray, np.ndarray, list]:
    """The plan's in-edges in level order for numpy's level-by-level `replay` (edge_src_pos, edge_bounds,
    seg_starts), made when that replay first runs (the C replay reads in_ptr/in_src)."""
    if plan.edge_src_pos is None:
        n, small = plan.order.size, plan.order.dtype
        order, in_ptr, in_src, level_bounds = plan.order, plan.in_ptr, plan.in_src, plan.level_bounds
        nlev = level_bounds.size - 1
        pos = np.empty(n, dtype=small)
        pos[order] = np.arange(n, dtype=small)
        # the in-edges grouped by destination in level order, each node's in the edges' order: its block of
        # the in-edges by node id (in_src), the blocks taken in `order` (no second sort of the edges by
        # position: ~1 s of a 1,024-rank graph's plan)
        count = (in_ptr[1:] - in_ptr[:-1])[order].astype(np.int64)
        ecum = np.zeros(n + 1, np.int64)
        np.cumsum(count, out=ecum[1:])
        take_at = np.arange(ecum[-1], dtype=np.int64)
        take_at += np.repeat(in_ptr[order].astype(np.int64) - ecum[:-1], count)
        edge_src_pos = pos[in_src[take_at]]
        del take_at, pos
        edge_bounds = ecum[level_bounds]
        # per level (level 0 has no in-edges): where each node's in-edges begin, relative to the level's
        # first edge; found for all levels at once (a level's first edge always begins a new node)
        group = ecum[:-1][count > 0]
        del count, ecum
        cuts = np.searchsorted(group, edge_bounds)
        plan.seg_starts = [(group[cuts[i]:cuts[i + 1]] - edge_bounds[i]).astype(small) for i in range(1, nlev)]
        plan.edge_src_pos, plan.edge_bounds = edge_src_pos, edge_bounds
    return plan.edge_src_pos, plan.edge_bounds, plan.seg_starts


NARROW_NODES_PER_LEVEL = 4
"""A graph with at most this many nodes per level on average replays node by node: one numpy pass per
level costs ~8 µs, one node in Python ~1 µs (a one-rank trace is a chain: as many levels as nodes)."""


def replay(g: StepGraph, dur: np.ndarray | None = None, gap: np.ndarray | None = None) -> np.ndarray:
    """Start of every node when the graph runs with `dur`/`gap` (default: measured). Ends = start + dur."""
    plan = g.plan
    dur = g.dur if dur is None else dur
    gap = plan.gap if gap is None else gap
    if native_graph() and all(a.dtype == np.int64 for a in (g.start, dur, gap)):
        out = np.empty(g.num_nodes, np.int64)
        order, in_ptr, in_src = _same_ints(plan.order, plan.in_ptr, plan.in_src)
        first = int(plan.level_bounds[1]) if plan.level_bounds.size > 1 else g.num_nodes
        kgraph.replay(order, first, in_ptr, in_src, *(np.ascontiguousarray(a) for a in (g.start, dur, gap)), out)
        return out
    if plan.narrow:
        return _replay_by_node(g, plan, dur, gap)
    # every array in level order (position p holds node order[p]): each level's nodes are a slice, read and
    # written as views; only its in-edges' source ends are gathered (one level pass of a 1,024-rank graph's
    # tens of thousands cost ~3 s of numpy calls with an index array per read and write)
    order = plan.order
    start = g.start[order]
    dur, gap = dur[order], gap[order]
    end = start + dur
    src, eb, segs = _level_edges(plan)
    lb, eb = plan.level_bounds.tolist(), eb.tolist()
    for i, seg in enumerate(segs, start=1):
        lo, hi = lb[i], lb[i + 1]
        s = np.maximum.reduceat(end[src[eb[i]:eb[i + 1]]], seg) + gap[lo:hi]
        start[lo:hi] = s
        end[lo:hi] = s + dur[lo:hi]
    del end, dur, gap  # the level-ordered copies go before the result is allocated (a large graph's peak)
    out = np.empty_like(start)
    out[order] = start
    return out


class Overlay:
    """A node array of the graph (`base`, never written) with some values replaced: the durations or gaps a
    fix on a few ranks changes, without a copy of the graph's arrays per what-if (whatif/fixes.py
    `apply_fixes_sparse`). Read and written by node ids (an integer array or a boolean mask over the nodes)
    as the array would be, numpy's casting included; `dense()` is the array itself."""

    def __init__(self, base: np.ndarray, ids: np.ndarray | None = None, vals: np.ndarray | None = None):
        self.base = base
        self.ids = np.zeros(0, np.int64) if ids is None else ids
        """replaced node ids, sorted, unique"""
        self.vals = np.zeros(0, base.dtype) if vals is None else vals

    @property
    def dtype(self) -> np.dtype:
        return self.base.dtype

    @property
    def size(self) -> int:
        return self.base.size

    def _ids(self, idx: Any) -> np.ndarray:
        idx = np.asarray(idx)
        return np.flatnonzero(idx) if idx.dtype == bool else idx.astype(np.int64, copy=False)

    def __getitem__(self, idx: Any) -> np.ndarray:
        i = self._ids(idx)
        out = self.base[i]
        if self.ids.size and i.size:
            loc = np.minimum(np.searchsorted(self.ids, i), self.ids.size - 1)
            hit = self.ids[loc] == i
            out[hit] = self.vals[loc[hit]]
        return out

    def __setitem__(self, idx: Any, value: Any) -> None:
        i = self._ids(idx).reshape(-1)
        v = np.empty(i.size, self.base.dtype)
        v[...] = value  # as `array[idx] = value` casts
        ids, vals = np.concatenate([self.ids, i]), np.concatenate([self.vals, v])
        o = np.argsort(ids, kind="stable")  # a later write of a node wins, as on an array
        ids, vals = ids[o], vals[o]
        last = np.r_[ids[1:] != ids[:-1], True] if ids.size else np.zeros(0, bool)
        self.ids, self.vals = ids[last], vals[last]

    def changed(self) -> np.ndarray:
        """The node ids whose value differs from the base's."""
        return self.ids[self.vals != self.base[self.ids]]

    def dense(self) -> np.ndarray:
        out = self.base.copy()
        out[self.ids] = self.vals
        return out


def rank_nodes(g: StepGraph, rank: int) -> np.ndarray:
    """The node ids of `rank`, ascending (one sort of the graph by rank, cached; not a scan per rank)."""
    held = g.cache.rank_nodes
    if held is None or held[0] is not g.rank:
        order = np.argsort(g.rank, kind="stable")
        g.cache.rank_nodes = held = (g.rank, order, g.rank[order])
    _, order, by = held
    # the needles in the sorted ranks' own dtype: a Python list (int64) would make numpy cast the whole int32
    # array on every call (a copy of the graph's ranks per rank asked: quadratic in ranks)
    a, b = np.searchsorted(by, np.array([rank, rank + 1], dtype=by.dtype))
    return order[a:b]


CHANGED_SHARE = 1 / 128
"""`replay_changed` re-times node by node (~3 µs each, in Python) while the nodes it revisits stay under this
share of the graph; past it the level-by-level `replay` (~45 ns a node) is cheaper. Measured on 256 simulated
ranks (1.0 M nodes): a full replay 0.045 CPU-s, a what-if given up after 1/32 of the nodes 0.08-0.3 CPU-s
(26 of 31 what-ifs reached the whole run through its collectives); at 1/128 a what-if given up costs at most
about one replay more."""


def _base_replay(g: StepGraph) -> tuple:
    """The unchanged replay's starts and ends, the plan's position of each node and the out-edges as CSR
    (cached per graph: every what-if of a large run starts from them)."""
    plan = g.plan
    key = (g.start, g.dur, g.src, g.dst, plan)
    held = g.cache.base
    if held is None or any(a is not b for a, b in zip(held[0], key)):
        start = unchanged_replay(g)
        small = np.int32 if g.num_nodes < 2**31 - 1 else np.int64  # ids: half the memory of a large graph's
        pos = np.empty(g.num_nodes, small)
        pos[plan.order] = np.arange(g.num_nodes, dtype=small)
        o = np.argsort(g.src, kind="stable")
        out_ptr = np.r_[0, np.cumsum(np.bincount(g.src, minlength=g.num_nodes))].astype(small)
        out_dst = g.dst[o].astype(small)
        end = start + g.dur
        for a in (pos, out_ptr, out_dst, end):
            a.flags.writeable = False
        g.cache.base = held = (key, start, pos, out_ptr, out_dst, end)
    return held[1:5]


def unchanged_replay(g: StepGraph) -> np.ndarray:
    """`replay(g)`, read-only, cached per graph: the steps' results (replay.replay_steps_of) and every what-if's
    `replay_changed` start from the same unchanged replay (one full replay of a large graph, not two)."""
    key = (g.start, g.dur, g.src, g.dst, g.plan)
    held = g.cache.unchanged
    if held is None or any(a is not b for a, b in zip(held[0], key)):
        start = replay(g)
        start.flags.writeable = False
        g.cache.unchanged = held = (key, start)
    return held[1]


def _base_ends(g: StepGraph) -> np.ndarray:
    """The unchanged replay's node ends (`_base_replay`'s)."""
    _base_replay(g)
    return g.cache.base[5]


def replay_changed(g: StepGraph, dur: np.ndarray, gap: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """`replay(g, dur, gap)` (the same starts, exactly) and the nodes whose start or end differ from the
    unchanged replay's, re-timing only the nodes downstream of a changed duration or gap, in the plan's order,
    and stopping where a node's start comes out as before (a rank's earlier op that still waits for its peers
    at the next collective): a fix on one rank of a large run re-times that rank, not the run. None (replay the
    whole graph) when the durations or gaps are not integers, or when more than CHANGED_SHARE of the nodes
    would be re-timed.
    With `Overlay` durations and gaps (a fix on a few ranks, `apply_fixes_sparse`) nothing of the graph's
    size is copied or compared: the changed nodes are the overlays', the starts come back as an Overlay of
    the unchanged replay's."""
    import heapq

    sparse = isinstance(dur, Overlay)
    if dur.dtype != np.int64 or gap.dtype != np.int64 or g.plan.narrow:
        return None
    start0, pos, out_ptr, out_dst = _base_replay(g)
    if sparse:
        changed = np.union1d(dur.changed(), gap.changed())
        start = end = None
    else:
        changed = np.flatnonzero((dur != g.dur) | (gap != g.gap))
        start, end = start0.copy(), start0 + g.dur
    if changed.size == 0:
        return (Overlay(start0) if sparse else start), changed
    limit = max(int(CHANGED_SHARE * g.num_nodes), 64)
    if changed.size > limit:
        return None
    plan = g.plan
    in_ptr, in_src = memoryview(plan.in_ptr), memoryview(plan.in_src)
    opt, odst, posv = memoryview(out_ptr), memoryview(out_dst), memoryview(pos)
    if sparse:  # the base arrays read through, the new values in dicts
        st, en = memoryview(start0), memoryview(_base_ends(g))
        du, gp = memoryview(np.ascontiguousarray(g.dur)), memoryview(np.ascontiguousarray(g.gap))
        new_d = dict(zip(dur.ids.tolist(), dur.vals.tolist()))
        new_g = dict(zip(gap.ids.tolist(), gap.vals.tolist()))
    else:
        st, en = memoryview(start), memoryview(end)
        du, gp = memoryview(np.ascontiguousarray(dur)), memoryview(np.ascontiguousarray(gap))
        new_d, new_g = {}, {}
    new_s: dict[int, int] = {}
    new_e: dict[int, int] = {}
    heap = [(p, v) for p, v in zip(pos[changed].tolist(), changed.tolist())]
    heapq.heapify(heap)
    queued = set(changed.tolist())
    touched = []
    visits = 0
    while heap:
        _, v = heapq.heappop(heap)
        visits += 1
        if visits > limit:
            return None
        a, b = in_ptr[v], in_ptr[v + 1]
        if b > a:
            s = max([new_e.get(u, en[u]) for u in (in_src[k] for k in range(a, b))]) + new_g.get(v, gp[v])
        else:
            s = new_s.get(v, st[v])
        e = s + new_d.get(v, du[v])
        if s == new_s.get(v, st[v]) and e == new_e.get(v, en[v]):
            continue
        new_s[v], new_e[v] = s, e
        touched.append(v)
        for k in range(opt[v], opt[v + 1]):
            w = odst[k]
            if w not in queued:
                queued.add(w)
                heapq.heappush(heap, (posv[w], w))
    touched_ids = np.array(touched, np.int64)
    if sparse:
        ids = np.sort(touched_ids)
        return Overlay(start0, ids, np.array([new_s[v] for v in ids.tolist()], np.int64)), touched_ids
    if touched:
        start[touched_ids] = [new_s[v] for v in touched]
    return start, touched_ids


def _replay_by_node(g: StepGraph, plan: _Plan, dur: np.ndarray, gap: np.ndarray) -> np.ndarray:
    """replay's result, one node at a time in level order (numpy's casts: a start is truncated to int64
    when stored, its end keeps the untruncated sum)."""
    start, d, gp = g.start.tolist(), dur.tolist(), gap.tolist()
    end = [a + b for a, b in zip(start, d)]
    ptr, src = plan.in_ptr.tolist(), plan.in_src.tolist()
    for v in plan.order[plan.level_bounds[min(1, len(plan.level_bounds) - 1)]:].tolist():
        s = max([end[u] for u in src[ptr[v]:ptr[v + 1]]]) + gp[v]
        start[v] = s
        end[v] = s + d[v]
    return np.fromiter(map(int, start), np.int64, len(start))  # int(): numpy's truncating cast, exact for ints


def critical_path(g: StepGraph, start: np.ndarray, dur: np.ndarray, last: int) -> np.ndarray:
    """Node ids from a source to `last`, each step back following the predecessor that ended last
    (a lane predecessor wins ties)."""
    plan = g.plan
    ptr, src, end, lane = plan.in_ptr, plan.in_src, start + dur, g.lane
    if plan.narrow:  # a long chain: Python lists walk it faster than numpy scalars
        ptr, src, end, lane = ptr.tolist(), src.tolist(), end.tolist(), lane.tolist()
    path = [last]
    v = last
    while ptr[v] != ptr[v + 1]:
        preds = src[ptr[v]:ptr[v + 1]]
        latest = max([end[u] for u in preds])
        best = [u for u in preds if end[u] == latest]
        v = int(next((u for u in best if lane[u] == lane[v]), best[0]))
        path.append(v)
    return np.array(path[::-1], dtype=np.int64)


def append_nodes(g: StepGraph, *, rank: np.ndarray, category: int, start: np.ndarray,
                 names: str = "") -> np.ndarray:
    """Add lane-less, non-terminal zero-length nodes; returns their ids (drops the replay plan)."""
    k = len(start)
    ids = np.arange(g.num_nodes, g.num_nodes + k, dtype=np.int64)
    g.rank = np.r_[g.rank, rank.astype(np.int32)]
    g.lane = np.r_[g.lane, np.full(k, -1, np.int64)]
    g.category = np.r_[g.category, np.full(k, category, np.int8)]
    g.start = np.r_[g.start, start.astype(np.int64)]
    g.dur = np.r_[g.dur, np.zeros(k, np.int64)]
    g.dim = np.r_[g.dim, np.full(k, -1, np.int32)]
    g.inst = np.r_[g.inst, np.full(k, -1, np.int32)]
    g.terminal = np.r_[g.terminal, np.zeros(k, bool)]
    g.step = np.r_[g.step, np.full(k, -1, np.int64)]
    g.excess_gap = zero_backed(np.r_[g.excess_gap, np.zeros(k, np.int64)])
    g.excess_dur = zero_backed(np.r_[g.excess_dur, np.zeros(k, np.int64)])
    if g.name:
        g.name = g.name + [names] * k
    g._plan = None
    return ids


def zero_backed(values: np.ndarray) -> np.ndarray:
    """`values` as int64 in a fresh `np.zeros` array with only its nonzero entries written. A large zeroed array
    is mapped memory the OS backs by its zero page until written, so the pages holding only zeros are never
    resident: `StepGraph.excess_gap` / `excess_dur` (slow host time, 0 on nearly every node) of a 1,024-rank
    graph are 2 x 33 MB written in full."""
    out = np.zeros(values.shape, np.int64)
    nz = np.flatnonzero(values)
    out[nz] = values[nz]
    return out


def add_start_nodes(g: StepGraph, host_start: dict[int, int] | None = None) -> None:
    """A pinned start node per rank (at its first window's start, its `host_start` or its earliest node,
    whichever is earliest), before the first node of each of the rank's lanes."""
    if g.ranks.size == 0:
        return
    ranks, first_row = np.unique(g.ranks, return_index=True)
    same = (g.lane[g.src] == g.lane[g.dst]) & (g.lane[g.dst] >= 0)
    has_pred = np.zeros(g.num_nodes, bool)
    has_pred[g.dst[same]] = True
    first = np.flatnonzero((g.lane >= 0) & ~has_pred)
    pos = np.searchsorted(ranks, g.rank[first])
    ok = (pos < ranks.size) & (ranks[np.minimum(pos, ranks.size - 1)] == g.rank[first])
    first, pos = first[ok], pos[ok]
    host_start = host_start or {}
    # each rank's earliest window start: one pass over the windows grouped by rank (a scan of every window per
    # rank was quadratic in ranks)
    by_rank = np.argsort(g.ranks, kind="stable")
    cut = np.searchsorted(g.ranks[by_rank], ranks)
    at = np.minimum.reduceat(g.win_start[by_rank], cut).astype(np.int64)
    np.minimum(at, np.array([host_start.get(int(r), np.iinfo(np.int64).max) for r in ranks.tolist()], np.int64), out=at)
    np.minimum.at(at, pos, g.start[first])
    ids = append_nodes(g, rank=ranks, category=Category.MARK, start=at, names="step start")
    add_edges(g, ids[pos], first)


def add_edges(g: StepGraph, src: np.ndarray, dst: np.ndarray) -> None:
    """`src` -> `dst` appended to the graph's edges, which stay in `id_dtype` (int32 below 2**31 nodes: a
    1,024-rank graph's 8 M edges are 63 MB an array less than as int64)."""
    small = id_dtype(g.num_nodes)
    g.src = np.concatenate([g.src, src], dtype=small, casting="same_kind")
    g.dst = np.concatenate([g.dst, dst], dtype=small, casting="same_kind")


def window_of(g: StepGraph) -> np.ndarray:
    """Per node: index of its (rank, step) window, -1 when none (read-only; cached per graph: each what-if
    replay of a large run asks again)."""
    return derived(g, "window_of", (g.ranks, g.win_step, g.rank, g.step), (), lambda: _windows_of_nodes(g))


def derived(g: StepGraph, name: str, arrays: tuple, names: tuple, compute: Callable[[], np.ndarray]) -> np.ndarray:
    """A per-node array computed once per graph from `arrays` (compared by identity: a graph's arrays are
    replaced, never written to) and `names` (compared by value), read-only, kept in `g.cache.derived`."""
    held = g.cache.derived.get(name)
    if held is None or held[1] != names or any(a is not b for a, b in zip(held[0], arrays)):
        value = compute()
        value.flags.writeable = False
        g.cache.derived[name] = held = (arrays, names, value)
    return held[2]


def _windows_of_nodes(g: StepGraph) -> np.ndarray:
    wkey = (g.ranks.astype(np.int64) << 32) | (g.win_step.astype(np.int64) & 0xFFFFFFFF)
    nkey = (g.rank.astype(np.int64) << 32) | (g.step.astype(np.int64) & 0xFFFFFFFF)
    order = np.argsort(wkey)
    pos = np.searchsorted(wkey[order], nkey)
    pos = np.minimum(pos, max(wkey.size - 1, 0))
    hit = (wkey.size > 0) & (wkey[order][pos] == nkey) & (g.rank >= 0)
    del nkey
    return np.where(hit, order[pos], -1).astype(id_dtype(wkey.size), copy=False)  # window ids: int32 a node


def window_bounds(g: StepGraph, start: np.ndarray, dur: np.ndarray | None = None,
                  gap: np.ndarray | None = None, touched: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each window's (begin, end) in a replay: it begins at its first op (less the measured lead before it)
    and ends at its last op (plus the measured tail after it); one with nothing of its own stays put.
    The lead (step marker to first op: a sleep, a data wait before the step's first op) shrinks by what a
    fix removed from the first op's gap (`gap` against the measured one), so a stall is removed wherever
    it sits relative to the step boundary. `touched`: the only nodes whose start or end differ from the
    unchanged replay's (`replay_changed`): the other windows keep that replay's extremes."""
    dur = g.dur if dur is None else dur
    w = window_of(g)
    mine = _terminal_in_window(g, w)
    low = np.iinfo(np.int64).min
    meas, first_meas, by_window = _measured_extremes(g, w, mine)
    if touched is None:
        now, first_now = _grouped_extremes(g, by_window, start, start + dur)
    else:
        now, first_now = _replayed_extremes(g, w, mine)
        now, first_now = now.copy(), first_now.copy()
        hit = w[touched[mine[touched]]]
        if hit.size:
            nodes, bounds = by_window
            hit = np.unique(hit)
            lo, hi = bounds[hit], bounds[hit + 1]
            idx = np.concatenate([nodes[a:b] for a, b in zip(lo.tolist(), hi.tolist())])
            seg = np.r_[0, np.cumsum(hi - lo)[:-1]]
            now[hit] = np.maximum.reduceat(start[idx] + dur[idx], seg)
            first_now[hit] = np.minimum.reduceat(start[idx], seg)
    has = meas > low
    lead = first_meas - g.win_start
    if gap is not None:
        lead = np.maximum(lead - _first_gap_removed(g, w, mine, gap), 0)
    begin = np.where(has, first_now - lead, g.win_start)
    end = np.where(has, now + (g.win_end - meas), g.win_end)
    return begin, end


def _terminal_in_window(g: StepGraph, w: np.ndarray) -> np.ndarray:
    """Per node: terminal and in a window (read-only; cached per graph: every what-if asks again)."""
    held = g.cache.extremes.get("mine")
    if held is None or held[0][0] is not g.terminal or held[0][1] is not w:
        m = g.terminal & (w >= 0)
        m.flags.writeable = False
        g.cache.extremes["mine"] = held = ((g.terminal, w), m)
    return held[1]


def _extremes(g: StepGraph, w: np.ndarray, mine: np.ndarray, start: np.ndarray, end: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """Per window: the latest end and the earliest start of its terminal nodes (`mine`)."""
    low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    last, first = np.full(g.ranks.size, low, np.int64), np.full(g.ranks.size, high, np.int64)
    np.maximum.at(last, w[mine], end[mine])
    np.minimum.at(first, w[mine], start[mine])
    return last, first


def _grouped_extremes(g: StepGraph, by_window: tuple, start: np.ndarray, end: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """`_extremes`, from the terminal nodes grouped by window once (`_measured_extremes`): one reduceat
    per replay instead of an unbuffered `np.maximum.at` over every terminal node."""
    low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    last, first = np.full(g.ranks.size, low, np.int64), np.full(g.ranks.size, high, np.int64)
    nodes, bounds = by_window
    has = bounds[1:] > bounds[:-1]
    if nodes.size:
        seg = bounds[:-1][has]
        last[has] = np.maximum.reduceat(end[nodes], seg)
        first[has] = np.minimum.reduceat(start[nodes], seg)
    return last, first


def _measured_extremes(g: StepGraph, w: np.ndarray, mine: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple]:
    """`_extremes` of the measured graph and the terminal nodes grouped by window (node ids, per window the
    slice bounds), cached per graph."""
    key = (g.start, g.dur, g.terminal, w)
    held = g.cache.extremes.get("measured")
    if held is None or any(a is not b for a, b in zip(held[0], key)):
        last, first = _extremes(g, w, mine, g.start, g.start + g.dur)
        nodes = np.flatnonzero(mine)
        nodes = nodes[np.argsort(w[nodes], kind="stable")]
        bounds = np.searchsorted(w[nodes], np.arange(g.ranks.size + 1))
        g.cache.extremes["measured"] = held = (key, last, first, (nodes, bounds))
    return held[1], held[2], held[3]


def _replayed_extremes(g: StepGraph, w: np.ndarray, mine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_extremes` of the unchanged replay (`replay_changed`'s base), cached per graph."""
    base = g.cache.base
    held = g.cache.extremes.get("replayed")
    if held is None or held[0] is not base:
        start = base[1]
        held = (base, *_extremes(g, w, mine, start, start + g.dur))
        g.cache.extremes["replayed"] = held
    return held[1], held[2]


def window_span_until(g: StepGraph, begin: np.ndarray, mask: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Per window: from `begin` (its replayed begin, `window_bounds`) to the latest time `at` (one per node)
    of its nodes under `mask`; -1 where the window has no such node."""
    w = window_of(g)
    m = mask & (w >= 0)
    end = np.full(g.ranks.size, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(end, w[m], at[m])
    return np.where(end > np.iinfo(np.int64).min, np.maximum(end - begin, 0), -1)


def _first_gap_removed(g: StepGraph, w: np.ndarray, mine: np.ndarray, gap: np.ndarray) -> np.ndarray:
    """Per window: how much shorter (than measured) the gap before its first op (by measured start) is."""
    out = np.zeros(g.ranks.size, np.int64)
    key = (w, g.terminal, g.start)  # the first ops are the graph's: found once (`mine` is window_bounds')
    held = g.cache.first_ops
    if held is None or any(a is not b for a, b in zip(held[0], key)):
        idx = np.flatnonzero(mine)
        idx = idx[np.lexsort((g.start[idx], w[idx]))]
        g.cache.first_ops = held = (key, idx[np.r_[True, w[idx][1:] != w[idx][:-1]]] if idx.size else idx)
    first = held[1]
    if first.size == 0:
        return out
    out[w[first]] = np.maximum(g.gap[first] - gap[first], 0)
    return out


def rank_step_ns(g: StepGraph, start: np.ndarray, dur: np.ndarray | None = None,
                 gap: np.ndarray | None = None, touched: np.ndarray | None = None) -> np.ndarray:
    """Each window's step time (aligned with g.ranks / g.win_step), as the answer key and DESIGN §3 count a
    GPU step: from the window's start to the next step's start on the same rank (the last step: to its
    end); see `window_bounds` (and `touched` there)."""
    begin, end = window_bounds(g, start, dur, gap, touched)
    nxt = _next_window(g)
    return np.where(nxt >= 0, begin[np.maximum(nxt, 0)], end) - begin


def _next_window(g: StepGraph) -> np.ndarray:
    """Per window: the same rank's window of the next analyzed step (-1: none)."""
    order = np.lexsort((g.win_step, g.ranks))
    out = np.full(g.ranks.size, -1, np.int64)
    same = g.ranks[order[1:]] == g.ranks[order[:-1]]
    out[order[:-1][same]] = order[1:][same]
    return out


def measured_step_ns(g: StepGraph) -> np.ndarray:
    """Each window's measured step time, by the same rule as rank_step_ns."""
    nxt = _next_window(g)
    return np.where(nxt >= 0, g.win_start[np.maximum(nxt, 0)], g.win_end) - g.win_start


def device_lane_mask(g: StepGraph) -> np.ndarray:
    """Per node: it sits on a device stream (read-only; cached per graph)."""
    return _lane_mask(g, "stream")


def host_lane_mask(g: StepGraph) -> np.ndarray:
    """Per node: it sits on a host thread (training thread, launching thread) (read-only; cached per graph)."""
    return _lane_mask(g, "thread")


def launch_lane_mask(g: StepGraph) -> np.ndarray:
    """Per node: it sits on a GPU rank's launching host thread (read-only; cached per graph)."""
    return _lane_mask(g, "host thread")


def _lane_mask(g: StepGraph, word: str) -> np.ndarray:
    def compute() -> np.ndarray:
        lanes = np.array([word in n for n in g.lane_names] + [False], dtype=bool)
        return lanes[np.where(g.lane >= 0, g.lane, len(g.lane_names))]
    return derived(g, f"lane_mask:{word}", (g.lane,), tuple(g.lane_names), compute)
