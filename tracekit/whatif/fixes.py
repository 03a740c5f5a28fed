"""What-if fixes: each changes the durations (or gaps) of a class of nodes of a StepGraph; the step is then
replayed (graph.replay), so the saving accounts for everything else on the path. On CPU ranks that share a
host's cores, where the run recorded the host's cores and the ranks' core wait, every fix's replay runs
under processor sharing (whatif/sharing.py, docs/metrics.md §8 "Processor sharing in the replay"): a fix
changes each node's work (core time) in proportion to its time, and the replay finds every node's pace
from the replayed concurrency (replay → concurrency → durations to a fixed point); `rank_compute` and
`expert_even` then compare ranks in work, and the shared-core special cases below (`_free_shared_cpu`,
`_shared_cores_target`) apply only where the model does not.

- `rank_compute`: a rank's compute at its peers' pace (ranks of the same pipeline stage when the layout
  knows stages, else all ranks): each op at the peers' median of the same op (never slower than it ran)
  when they run the same op sequence (`aligned`) and that is less work, else all its ops scaled down to the
  peers' median total; and its collectives that move more bytes than the same ones on its peers' groups at
  their time (uneven inputs). Or scaled by a factor.
- `dim_bandwidth`: a dim's transfers at a given bus bandwidth (bytes × busbw factor / GB/s; transfers of
  unknown size keep their time).
- `dim_overlap`: a dim's transfers (or only those of one collective op, `op`) overlapped with compute.
  Gradient buckets (`gradient_buckets`: the dim's all-reduces / reduce-scatters issued after backward
  began) keep their length but start as soon as
  backward produced their gradients, one after the other on their stream, once every member is ready
  (`overlap_graph` rewires their start); the dim's other transfers are fully hidden (length 0; members
  still wait for each other), but on CPU ranks sharing a host's cores, where each keeps its CPU work (the
  lower envelope of its member set's and op's transfer time against bytes: `shared_core_transfer_work`).
- `slow_link`: a dim's transfers (collectives and P2P) no slower than the lower envelope of transfer time
  against bus bytes of the other member sets on the same link tier (within one host / across hosts),
  whatever their dim: its peers' links (`instances`, `lower_envelope`).
- `dim_inside_host`: a dim's transfers among members on several hosts no slower than the lower envelope of
  the run's transfers within one host (any dim, P2P included): the group placed inside a host, at the speed
  this run's intra-host links show (a `placement_mismatch` remapped); nothing changes when no transfer
  stays inside a host.
- `stage_resplit`: every pipeline stage's compute set to the mean stage compute (layers re-split evenly).
- `expert_even`: per MoE layer pass (an ep all_to_all dispatch and the combine mirroring it) each member's
  expert compute (between the two) moved to the members' mean load (bytes it received in the dispatch) at
  the per-token cost their times show, and each all_to_all as long as its link tier takes to move the
  members' mean bytes. Members that share one host's cores: every member at the least-loaded member's pace
  (`_shared_cores_target`, processor sharing).
- `microbatches`: the same batch in more, smaller micro-batches: the pipelined part's per-sample work
  shrinks (`shrink_per_sample`) and is replayed, and each added micro-batch adds the busiest rank's time
  per micro-batch (`replay._more_microbatches`).
- `host_stalls`: on one rank, each host gap of at least `stall_min_ns` on its host threads and each
  data-loading node down to the median of its peers' (same pipeline stage) at the same position in their
  host threads' sequence (the rank's own data loading and launch spacing stay, what it added goes); when the
  peers' sequences differ from the rank's, the gap before each step's first host op down to the peers'
  median gap before theirs and other such gaps and data loading to 0 (`_step_leads`); for all ranks at
  once, such gaps and data loading go to 0. A GPU rank's host gap loses only its idle part
  (`_stall_floor`: the CPU ops between runtime calls stay).
- `memcpy_overlap`: every device copy (memcpy H2D / D2H / D2D / P2P nodes, `memcpy_nodes`) of every rank
  (or one) hidden behind other work: length 0 (an asynchronous copy on a side stream, prefetched; whoever
  waited for it still starts after what preceded it). An upper bound of what overlapping the copies saves.
- `host_repair`: the host threads of GPU ranks (one rank, or all) with every slow host op at its median
  (analyze/host_bound.py: far slower than the same op on every rank and step — a starved thread): each
  host node's gap loses the slow time before it and its own time the slow time inside it
  (`StepGraph.excess_gap` / `excess_dur`, set by the builder); the device then starts each kernel at
  max(its launch, its stream, its other dependencies) as before.
- `host_work`: on the named GPU ranks (or all), the host work between launches removed — each host gap of at
  least `stall_min_ns` loses the part `host_stalls` leaves it (`_stall_floor`: the graph holds host ops that
  launch nothing, analyze/host_bound.py's `host_work`, in those gaps); the idle part and data loading stay.
- `host_ahead`: the launching threads of GPU ranks (one rank, or all) kept ahead of the device, as CUDA graphs
  (or torch.compile's) keep them: every runtime call costs nothing and the dispatch time between calls
  (a gap shorter than `stall_min_ns`) goes; a longer gap is a stall (`host_stalls`' to remove) and stays, and
  so does data loading and every wait for the device. Each kernel then starts at max(its stream, its other
  dependencies, the waits before its launch): an upper bound of what fewer, larger launches save
  (analyze/host_bound.py's `launch_overhead`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracekit.collectives import MIN_JUDGED_BYTES, bus_factor
from tracekit.derive import intervals as iv
from tracekit.tables.columns import (Columns, group_ids, group_median, num_rows, recode, sorted_unique, take,
                                     unique_inverse)
from tracekit.whatif.sharing import measured_work, shares_host
from tracekit.whatif.graph import (Category, Overlay, StepGraph, derived, device_lane_mask, host_lane_mask,
                                  launch_lane_mask, rank_nodes)

P2P_OPS = ("send", "recv", "sendrecv")
"""A `dim_overlap` of one of these overlaps all of them: a send and its recv are one transfer (overlapping
one side only leaves the other waiting for it)."""


def op_family(op: str) -> str | tuple[str, ...]:
    """The ops a `dim_overlap` of `op` overlaps (`P2P_OPS`)."""
    return P2P_OPS if op in P2P_OPS else op


KINDS = ("rank_compute", "dim_bandwidth", "dim_overlap", "slow_link", "stage_resplit", "expert_even",
         "microbatches", "host_stalls", "host_repair", "memcpy_overlap", "dim_inside_host", "host_ahead", "host_work")


@dataclass(frozen=True)
class Fix:
    kind: str
    rank: int | None = None
    dim: str | None = None
    value: float | None = None
    """rank_compute: factor (None = peers' median); dim_bandwidth: GB/s; microbatches: new m"""
    op: str | None = None
    """dim_overlap: only this collective op of the dim (None = all of them; send, recv or sendrecv: the dim's
    point-to-point transfers, one transfer seen from its two sides)"""
    ranks: tuple[int, ...] | None = None
    """host_stalls: these ranks' stalls removed together, as for all ranks at once (ranks that stall alike:
    analyze/host_stalls.py `group_alike`; their peers' median stalls as much, so the one-rank fix removes nothing)"""

    def touched_ranks(self) -> list[int]:
        """The ranks the fix changes when it names any (else [], every rank or none in particular)."""
        return [int(self.rank)] if self.rank is not None else [int(r) for r in self.ranks or ()]

    def label(self) -> str:
        if self.kind == "rank_compute":
            return f"rank {self.rank} compute at {'peers median' if self.value is None else f'{self.value:g}x'}"
        if self.kind == "dim_bandwidth":
            return f"{self.dim} collectives at {self.value:g} GB/s bus bandwidth"
        if self.kind == "dim_overlap":
            what = ("send/recv" if self.op in P2P_OPS else f"{self.op}s") if self.op else "collectives"
            return f"{self.dim} {what} overlapped"
        if self.kind == "slow_link":
            return f"slow {self.dim} link at its peers' speed"
        if self.kind == "dim_inside_host":
            return f"{self.dim} groups inside one host"
        if self.kind == "microbatches":
            return f"{int(self.value or 0)} micro-batches"
        if self.kind == "host_stalls":
            if self.ranks:
                return f"host stalls removed on {len(self.ranks)} ranks ({_ranks_text(self.ranks)})"
            return "host stalls removed" + ("" if self.rank is None else f" on rank {self.rank}")
        if self.kind == "host_repair":
            return "slow host ops at their median" + (" on every rank" if self.rank is None else f" on rank {self.rank}")
        if self.kind == "host_work":
            ranks = self.touched_ranks()
            return "host work between launches removed (ops that launch nothing; the idle gaps stay)" + (
                f" on rank {ranks[0]}" if len(ranks) == 1 else f" on ranks {_ranks_text(tuple(ranks))}" if ranks else "")
        if self.kind == "host_ahead":
            return ("launches ahead of the device (no launch cost)"
                    + (" on every GPU rank" if self.rank is None else f" on rank {self.rank}"))
        if self.kind == "memcpy_overlap":
            return "device copies overlapped" + ("" if self.rank is None else f" on rank {self.rank}")
        return {"stage_resplit": "pipeline stages re-split evenly", "expert_even": "expert load even"}.get(
            self.kind, self.kind)


def _ranks_text(ranks: tuple[int, ...], shown: int = 8) -> str:
    """The first `shown` ranks, then how many more."""
    head = ", ".join(map(str, ranks[:shown]))
    return head + (f", ... {len(ranks) - shown} more" if len(ranks) > shown else "")


@dataclass
class RunFacts:
    """What the fixes need to know about the measured run (from the layout/pipeline sections and the ranks
    table): each rank's mesh coordinates as measured, its host, its pipeline stage and how the pipeline ran.
    Not a parallel layout (`tracekit.layout.ParallelLayout` is the one): measured, possibly partial."""

    coords: dict[int, dict[str, int]] = field(default_factory=dict)
    """rank → {dim: coordinate}"""
    pp: int = 1
    microbatches: int | None = None
    virtual_stages: int = 1
    stall_min_ns: int = 1_000_000
    """a host gap this long with nothing recorded is a stall, not dispatch overhead (µs)"""
    cpu_hosts: dict[int, str] = field(default_factory=dict)
    """CPU-only ranks (no device work in the trace) → their host: ranks of one host share its cores"""
    hosts: dict[int, str] = field(default_factory=dict)
    """rank → host name (a group within one host uses its links, one spanning hosts the network's)"""
    stages: dict[int, int] = field(default_factory=dict)
    """rank → its pipeline stage from the send/recv graph (pipeline section), where `coords` name no pp"""
    cores: dict[str, int] = field(default_factory=dict)
    """host → the CPU cores its ranks may run on (`ranks.host_cpus`, the fewest of its ranks'), where known"""
    cpu_wait: dict[int, float] = field(default_factory=dict)
    """CPU rank → the share of its runnable time its threads waited for a core (`ranks.cpu_wait_share`),
    where recorded: with `cores`, what the processor-sharing replay (whatif/sharing.py) is fitted to"""
    cpu_runnable: dict[int, float] = field(default_factory=dict)
    """CPU rank → its threads' runnable time (CPU + run-queue wait) per profiled step, ns, where recorded
    (`ranks.cpu_runnable_ns`): how much of its busy time in the trace held or wanted a core"""

    def peers(self, rank: int, ranks: np.ndarray) -> np.ndarray:
        stage = self.coords.get(rank, {}).get("pp")
        if stage is None:
            return ranks
        return np.array([r for r in ranks if self.coords.get(int(r), {}).get("pp") == stage], dtype=np.int64)


def compute_by_rank(g: StepGraph, dur: np.ndarray) -> dict[int, int]:
    m = (g.category == Category.COMPUTE) & (g.rank >= 0)
    sums = np.bincount(g.rank[m], weights=dur[m].astype(np.float64), minlength=int(g.rank.max(initial=0)) + 1)
    return {int(r): int(sums[r]) for r in np.unique(g.ranks) if r < sums.size}


def _scale_rank(g: StepGraph, dur: np.ndarray, rank: int, factor: float) -> None:
    m = (g.category == Category.COMPUTE) & (g.rank == rank)
    dur[m] = np.rint(dur[m] * factor).astype(np.int64)


def _rank_compute(g: StepGraph, dur: np.ndarray, fix: Fix, lay: RunFacts, gap: np.ndarray | None = None) -> None:
    r = int(fix.rank)
    # on a host whose ranks share cores under the replay's processor sharing (sharing.py) the peers' pace is
    # their core time (work), not their wall time: their ops ran beside the rank's own
    work = measured_work(g, lay, np.arange(g.num_nodes)) if shares_host(g, lay, r) else None
    comp = compute_by_rank(g, dur if work is None else work)
    own = comp.get(r, 0)
    if fix.value is not None:
        factor = float(fix.value)
    else:
        _heavier_transfers(g, dur, r, lay)
        mine, ref = aligned(g, g.category == Category.COMPUTE, r, lay)
        if ref is not None and work is not None:
            new = np.median(work[ref], axis=0)
            if new.sum() < work[mine].sum():  # each op's work at the peers' median, its time in proportion
                dur[mine] = np.rint(dur[mine] * np.minimum(new / np.maximum(work[mine], 1.0), 1.0)).astype(np.int64)
                return
        new = np.rint(np.median(dur[ref], axis=0)).astype(np.int64) if ref is not None else None
        if work is None and new is not None and new.sum() < dur[mine].sum():
            # each op at the peers' median of the same op, never slower than it ran: the replay is then
            # monotone (this fix with host stalls saves at least what host stalls alone save)
            dur[mine] = np.minimum(new, dur[mine])
            if gap is not None:
                _free_shared_cpu(g, dur, gap, r, lay, mine, np.minimum(dur[mine], g.dur[mine]))
            return
        peers = [comp[int(p)] for p in lay.peers(r, np.unique(g.ranks)) if int(p) != r and int(p) in comp]
        if not peers or own <= 0:
            return
        factor = min(1.0, float(np.median(peers)) / own)
    _scale_rank(g, dur, r, factor)
    m = np.flatnonzero((g.category == Category.COMPUTE) & (g.rank == r))
    if gap is not None and factor < 1.0:
        _free_shared_cpu(g, dur, gap, r, lay, m, np.rint(g.dur[m] * factor).astype(np.int64))


def aligned(g: StepGraph, mask: np.ndarray, rank: int, lay: RunFacts) -> tuple[np.ndarray, np.ndarray | None]:
    """The rank's nodes under `mask`, lane by lane in time order, and its peers' (`RunFacts.peers`) with as
    many stacked one row per peer, position by position (None when no peer's sequence has the same length:
    ranks running one program issue the same ops in the same order)."""

    seqs = rank_sequences(g, mask)

    def seq(r: int) -> np.ndarray:
        return seqs.get(r, _NO_NODES)

    mine = seq(rank)
    same = [s for p in lay.peers(rank, np.unique(g.ranks)) if p != rank and (s := seq(int(p))).size == mine.size]
    return mine, (np.stack(same) if same and mine.size else None)


_NO_NODES = np.zeros(0, np.int64)


def peer_medians(g: StepGraph, mask: np.ndarray, rank: int, lay: RunFacts):
    """`aligned`'s sequence of the rank's nodes under `mask` and, position by position, the median over its
    peers' of the measured gap and duration (as `np.median(g.gap[ref], axis=0)` of `aligned`'s `ref`, the same
    values), each a function computing it; None when `aligned`'s `ref` is None. The peers of one rank are the
    other members of its group (`RunFacts.peers` with sequences as long): each group's values are sorted once
    per position (cached per graph and mask) and a rank's medians come from that order without its own value,
    so every rank of a large run costs its own sequence, not a stack of its peers' (quadratic in ranks)."""
    seqs = rank_sequences(g, mask)
    mine = seqs.get(rank, _NO_NODES)
    if mine.size == 0:
        return None
    ranks = np.unique(g.ranks)
    stage = lay.coords.get(rank, {}).get("pp")
    key = (id(seqs), stage, mine.size)
    cache = g.cache.peer_groups
    if key not in cache or cache[key][0] is not seqs:
        members = [int(p) for p in lay.peers(rank, ranks) if seqs.get(int(p), _NO_NODES).size == mine.size]
        cache[key] = (seqs, members, {})
    _, members, sorted_by = cache[key]
    if len(members) < 2 or rank not in members:
        return None
    row = members.index(rank)

    def median(values: np.ndarray, name: str) -> np.ndarray:
        if name not in sorted_by:
            stack = values[np.stack([seqs[p] for p in members])]
            order = np.argsort(stack, axis=0, kind="stable")
            where = np.empty(order.shape, np.int32)
            np.put_along_axis(where, order, np.arange(len(members), dtype=np.int32)[:, None], axis=0)
            sorted_by[name] = (np.take_along_axis(stack, order, axis=0), where)
        col, where = sorted_by[name]
        j = where[row]  # where the rank's own value sits in each position's order
        m = len(members) - 1  # its peers

        def kth(k: int) -> np.ndarray:  # the k-th smallest of the peers' values, per position
            return np.where(k < j, col[k], col[min(k + 1, m)])

        if m % 2:
            return kth(m // 2).astype(np.float64)
        return (kth(m // 2 - 1).astype(np.float64) + kth(m // 2).astype(np.float64)) / 2

    return mine, (lambda: median(g.gap, "gap")), (lambda: median(g.dur, "dur"))


def rank_sequences(g: StepGraph, mask: np.ndarray) -> dict[int, np.ndarray]:
    """Per rank: its nodes under `mask`, lane by lane in time order (ties by id): one sort of the graph,
    grouped by rank, not a scan of the graph per rank (cached per graph and mask)."""
    import hashlib

    key = next((k for m, k in g.cache.mask_keys if m is mask), None)
    if key is None:
        key = (mask.size, hashlib.blake2b(np.packbits(mask).tobytes(), digest_size=16).digest())
        if not mask.flags.writeable:  # a cached mask (host_lane_mask): the same object is the same mask
            g.cache.mask_keys.append((mask, key))
    cache = g.cache.rank_sequences
    if key not in cache:
        v = np.flatnonzero(mask)
        v = v[np.lexsort((v, g.start[v], g.lane[v], g.rank[v]))]
        r = g.rank[v]
        bounds = np.flatnonzero(np.r_[True, r[1:] != r[:-1], True]) if v.size else np.zeros(1, np.int64)
        cache[key] = {int(r[a]): v[a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())}
    return cache[key]


def _heavier_transfers(g: StepGraph, dur: np.ndarray, rank: int, lay: RunFacts) -> None:
    """The rank's collectives that move more bytes than the same collective (dim, op, sequence number) on
    its peers' groups take the peers' median transfer time: a rank with more tokens (longer sequences) also
    sends bigger activations, which its peers' pace does not include."""
    inst = instances(g, g.dur, lay)
    if num_rows(inst) == 0:
        return
    peers = np.setdiff1d(lay.peers(rank, np.unique(g.ranks)), [rank])
    mine, others = _member_sets(g, lay, rank, peers)
    code, n = _same_collective(g, lay, inst)  # the same collective on the peers' groups
    bus_peers = group_median(code[others], n, inst["bus"][others])[code]
    t_peers = group_median(code[others], n, inst["t"][others])[code]
    heavy = mine & (inst["bus"] > bus_peers)
    cut = np.clip(inst["t"][heavy] - t_peers[heavy], 0, None)
    v = np.flatnonzero((g.category == Category.TRANSFER) & (g.rank == rank) & (g.inst >= 0))
    dur[v] = np.maximum(dur[v] - np.rint(by_inst(inst["inst"][heavy], cut, g.inst[v])).astype(np.int64), 0)


def _free_shared_cpu(g: StepGraph, dur: np.ndarray, gap: np.ndarray, rank: int, lay: RunFacts, m: np.ndarray,
                     kept: np.ndarray) -> None:
    """CPU-only ranks that share a host share its cores: while `rank` ran the compute the fix removes
    (of each of its compute ops `m`, what runs past `kept`, measured), a peer on the same host that recorded
    nothing was kept off a core. Each such gap on a peer's host thread shrinks by its overlap with that
    removed compute, and so does each of the peers' transfers (gloo runs them on CPU threads) (docs/metrics.md §8). GPU ranks never: their compute is on their own device."""
    host = lay.cpu_hosts.get(rank)
    if host is None or shares_host(g, lay, rank):  # the replay's processor sharing frees the cores (sharing.py)
        return
    peers = [r for r, h in lay.cpu_hosts.items() if h == host and r != rank]
    if not peers or m.size == 0:
        return

    a, b = iv.union(g.start[m] + kept, g.start[m] + g.dur[m])
    if a.size == 0:
        return
    cum = np.r_[0, np.cumsum(b - a)]

    def covered(t: np.ndarray) -> np.ndarray:  # removed compute before t
        k = np.searchsorted(a, t, side="right") - 1
        kk = np.maximum(k, 0)
        return np.where(k >= 0, cum[kk] + np.clip(t - a[kk], 0, (b - a)[kk]), 0)

    mine = np.isin(g.rank, peers)
    v = np.flatnonzero(mine & host_lane_mask(g) & (gap > 0))
    gap[v] = np.maximum(gap[v] - (covered(g.start[v]) - covered(g.start[v] - g.gap[v])), 0)
    x = np.flatnonzero(np.isin(g.rank, [*peers, rank]) & (g.category == Category.TRANSFER) & (dur > 0))  # comm threads too
    dur[x] = np.maximum(dur[x] - (covered(g.start[x] + g.dur[x]) - covered(g.start[x])), 0)


def _transfers(g: StepGraph, dim: str | None) -> np.ndarray:
    m = g.category == Category.TRANSFER
    if dim is not None:
        di = g.dims.index(dim) if dim in g.dims else -2
        m &= g.dim == di
    return m & (g.inst >= 0)


GRADIENT_OPS = ("all_reduce", "reduce_scatter")
GRADIENT_DIMS = ("dp", "fsdp", "dp_cp", "edp")
"""data-parallel dims: their reductions after backward began are gradients (tp's, cp's are activations)"""


def gradient_dims(g: StepGraph) -> np.ndarray:
    """Per node: its dim is a data-parallel one (`GRADIENT_DIMS`)."""
    return np.isin(g.dim, [i for i, d in enumerate(g.dims) if d in GRADIENT_DIMS])


def gradient_buckets(g: StepGraph, dim: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The dim's gradient buckets (reductions of a data-parallel dim) that backward could have started earlier: per bucket its arrival node,
    its transfer node and the compute node after which its gradients exist (cached per graph and dim).

    The trace shows backward's kernels (launched by autograd's ops) and each bucket's size, not which kernel
    produced which gradient. Model (trace only): backward produces the gradients in reverse layer order at a
    steady rate, and buckets are issued in the order they fill, so bucket k (cumulative bytes B_k of the
    step's buckets B) is ready once the rank's backward compute, from the start of its last backward pass
    (`StepGraph.win_backward`: after the last forward kernel; gradients are final, and DDP fills its buckets,
    in the last pass of a step that accumulates micro-batches or runs a pipeline) to the last bucket (issued
    once backward is done), has run the same share B_k / B of its time; the last bucket at backward's end. A
    bucket that already started before that point (DDP overlapping as designed) is left alone. In a 1F1B
    pipeline's first stage the last forward comes before the last few backward passes: the span starts
    there, and its ready points come early (an optimistic saving). Windows whose backward is unknown (CPU
    ranks, traces without autograd ops) have none."""
    cache = g.cache.buckets
    if dim not in cache:
        xfer = np.flatnonzero(_transfers(g, dim) & gradient_dims(g) & _op_is(g, GRADIENT_OPS) & (g.rank >= 0))
        if xfer.size == 0:  # not a data-parallel dim (every overlap what-if of tp, cp, ep asks): no buckets
            cache[dim] = (np.zeros(0, np.int64),) * 3
            return cache[dim]
        comp = np.flatnonzero(g.category == Category.COMPUTE)
        # the arrivals of the dim's reductions only (the lookup below asks for no other)
        arrive = np.flatnonzero((g.category == Category.MARK) & np.isin(g.inst, sorted_unique(g.inst[xfer])) & (g.rank >= 0))
        arr_of = dict(zip(zip(g.rank[arrive].tolist(), g.inst[arrive].tolist()), arrive.tolist()))
        recv = _by_window(g, np.flatnonzero(_transfers(g, "pp") & _op_is(g, "recv") & (g.rank >= 0)))
        xfer, comp = _by_window(g, xfer), _by_window(g, comp)
        out: list[tuple[int, int, int]] = []
        for w in np.flatnonzero(g.win_backward >= 0).tolist():
            key = _window_key(g.ranks[w], g.win_step[w])
            mine = _slice(xfer, key)
            mine = mine[g.start[mine] >= g.win_backward[w]]
            arr = np.array([arr_of.get((int(g.rank[v]), int(g.inst[v])), -1) for v in mine], np.int64)
            mine, arr = mine[arr >= 0], arr[arr >= 0]
            if mine.size:
                o = np.argsort(g.start[arr], kind="stable")
                begin = last_pass_start(g, _slice(recv, key), int(g.win_backward[w]), int(g.start[arr[o][-1]]))
                keep = g.start[mine[o]] >= begin
                out += _ready_points(g, arr[o][keep], mine[o][keep], _slice(comp, key), begin) if keep.any() else []
        cols = np.array(out, np.int64).reshape(-1, 3)
        cache[dim] = (cols[:, 0], cols[:, 1], cols[:, 2])
    return cache[dim]


def last_pass_start(g: StepGraph, recvs: np.ndarray, backward_start: int, last_arrival: int) -> int:
    """Where a window's last backward pass began: `backward_start` (its first backward kernel after its last
    forward kernel, `StepGraph.win_backward`), or later, after the last point-to-point receive that ended
    before its last gradient bucket arrived (`recvs`: the window's pipeline receives; context parallelism's
    ring passes blocks by send/recv inside every layer's backward). A pipeline stage runs the
    backward passes of several micro-batches back to back after its last forward (1F1B's first stages run
    p - s of them, GPipe all of them), each once the next stage's gradients for it arrive; its gradients are
    final, and DDP fills its buckets, in the last. A stage's last forward comes after its last receive (the
    last stage) and leaves `backward_start` as it is."""
    if recvs.size == 0:
        return backward_start
    end = g.start[recvs] + g.dur[recvs]
    end = end[end <= last_arrival]
    return max(backward_start, int(end.max())) if end.size else backward_start


def _window_key(rank: Any, step: Any) -> Any:
    return np.asarray(rank).astype(np.int64) * (1 << 32) + np.asarray(step).astype(np.int64)


def _by_window(g: StepGraph, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`nodes` sorted by (rank, step, start), with their window keys."""
    nodes = nodes[np.lexsort((g.start[nodes], g.step[nodes], g.rank[nodes]))]
    return nodes, _window_key(g.rank[nodes], g.step[nodes])


def _slice(sorted_nodes: tuple[np.ndarray, np.ndarray], key: int) -> np.ndarray:
    nodes, keys = sorted_nodes
    lo, hi = np.searchsorted(keys, [key, key + 1])
    return nodes[lo:hi]


def _ready_points(g: StepGraph, arr: np.ndarray, xfer: np.ndarray, comp: np.ndarray, bwd_start: int
                  ) -> list[tuple[int, int, int]]:
    """(arrival, transfer, ready compute node) of one window's buckets (in issue order) that started after
    their share of backward's compute (`gradient_buckets`' model) had run."""
    bwd = comp[(g.start[comp] >= bwd_start) & (g.start[comp] < g.start[arr[-1]])]
    size = g.inst_info.at("bytes", g.inst[xfer])
    if bwd.size == 0 or not np.isfinite(size).all() or size.sum() <= 0:
        return []
    cum = np.cumsum(g.dur[bwd])
    share = np.cumsum(size) / size.sum()
    ready = bwd[np.minimum(np.searchsorted(cum, share * cum[-1]), bwd.size - 1)]
    late = g.start[arr] > g.start[ready] + g.dur[ready]
    return list(zip(arr[late].tolist(), xfer[late].tolist(), ready[late].tolist()))


def overlap_graph(g: StepGraph, dim: str | None, op: str | None = None) -> StepGraph:
    """`g` with the dim's gradient buckets (`gradient_buckets`) started by their gradients: each bucket's
    arrival follows its ready compute node instead of the other streams' work it waited for (the end of
    backward); its stream order (the previous bucket's end), its launch and its members stay (cached for
    the last dim asked: each such graph has its own edges and replay plan, as large as the graph's). With
    `op`, only that op's buckets."""
    cache = g.cache.overlap_graphs
    key = (dim, op)
    if key not in cache:
        cache.clear()
        arr, xfer, ready = gradient_buckets(g, dim)
        if op is not None:
            keep = _op_is(g, op_family(op))[xfer]
            arr, ready = arr[keep], ready[keep]
        if arr.size == 0:
            cache[key] = g
        else:
            # the dropped edges among the arrivals' in-edges only, and each new edge array written once (a
            # 1,024-rank graph's 8 M edges: no edge-wide gathers of lanes, no second copy per array)
            cand = np.flatnonzero(np.isin(g.dst, arr))
            s, d = g.src[cand], g.dst[cand]
            keep = np.ones(g.src.size, bool)
            keep[cand[device_lane_mask(g)[s] & (g.lane[s] != g.lane[d])]] = False
            moved = dataclasses.replace(g, src=_kept_and(g.src, keep, ready), dst=_kept_and(g.dst, keep, arr),
                                        _plan=None)
            # the per-node facts (`graph.derived`: read from node arrays the two graphs share, never from edges)
            # computed once for both, not again for each moved graph
            moved.cache.derived = g.cache.derived
            cache[key] = moved
    return cache[key]


def _kept_and(a: np.ndarray, keep: np.ndarray, more: np.ndarray) -> np.ndarray:
    """`np.r_[a[keep], more]`, written straight into the result, in `a`'s dtype (node ids: `graph.add_edges`)."""
    n = int(np.count_nonzero(keep))
    out = np.empty(n + more.size, a.dtype)
    np.compress(keep, a, out=out[:n])
    out[n:] = more
    return out


def replay_graph(g: StepGraph, fixes: list[Fix]) -> StepGraph:
    """The graph the fixes replay on: `g`, or with edges a fix moves (`overlap_graph`; one dim at a time)."""
    for fix in fixes:
        if fix.kind == "dim_overlap":  # the dim's ops several fixes overlap together: all of its buckets
            ops = {x.op and op_family(x.op) for x in fixes if x.kind == "dim_overlap" and x.dim == fix.dim}
            return overlap_graph(g, fix.dim, fix.op if len(ops) == 1 else None)
    return g


def bucket_windows(g: StepGraph) -> np.ndarray:
    """Per node: it is a gradient reduction (`GRADIENT_OPS` on `GRADIENT_DIMS`) in a window whose backward is
    known (`StepGraph.win_backward`), where `gradient_buckets`' model decides what overlapping it can gain
    (read-only; cached per graph: every overlap what-if asks, and its node-wide isin cost ~1 s on a 1,024-rank
    graph)."""
    def compute() -> np.ndarray:
        known = np.flatnonzero(g.win_backward >= 0)
        if known.size == 0:
            return np.zeros(g.rank.size, dtype=bool)
        keys = _window_key(g.ranks[known], g.win_step[known])
        return (gradient_dims(g) & _op_is(g, GRADIENT_OPS) & (g.category == Category.TRANSFER)
                & np.isin(_window_key(g.rank, g.step), keys))
    return derived(g, "bucket_windows", (g.win_backward, g.ranks, g.win_step, g.rank, g.step, g.dim, g.inst,
                                         g.inst_info, g.category), tuple(g.dims), compute)


def _dim_overlap(g: StepGraph, dur: np.ndarray, fix: Fix, lay: RunFacts) -> None:
    """Hide the dim's transfers. Gradient buckets of windows whose backward is known are not hidden: the late
    ones start with their gradients (`overlap_graph`), and the others already started then, overlapping as
    designed; what they still expose is their transfer time after backward (bandwidth, the stream's queue),
    which overlapping cannot remove (a simulated 1F1B run whose expert-gradient buckets, each issued as its
    layer's backward ended, queue 4 x 13.4 ms on one stream replayed a 4.9 ms saving when they were hidden)."""
    m = _transfers(g, fix.dim)
    if fix.op is not None:
        m &= _op_is(g, op_family(fix.op))
    m &= ~bucket_windows(g)  # rewired (`overlap_graph`) or on time: left as they are
    hidden = np.flatnonzero(m)
    dur[hidden] = np.minimum(dur[hidden], shared_core_transfer_work(g, hidden, lay))


def shared_core_transfer_work(g: StepGraph, nodes: np.ndarray, lay: RunFacts) -> np.ndarray:
    """Per transfer node of `nodes`: what hiding it behind compute leaves of it. 0 (all of it hidden) but on
    CPU ranks sharing a host's cores (`RunFacts.cpu_hosts`): there a transfer is CPU work of the host (gloo
    moves the bytes on CPU threads), which overlapping moves under compute on the same saturated cores
    instead of removing it; only the waiting in it (for the peer's thread, for a core) goes. Its CPU work is
    the lower envelope of transfer time against bus bytes of the same member set and op (`lower_envelope`
    of `instances`' `t`): what moving its bytes took the host when nothing stood in the way (an upper bound
    of the work, so the saving left is a lower bound of the waiting). Transfers of unknown size keep 0
    (docs/metrics.md §8)."""
    out = np.zeros(nodes.size, np.int64)
    shared = np.isin(g.rank[nodes], np.fromiter(lay.cpu_hosts, np.int64, len(lay.cpu_hosts)))
    if not shared.any():
        return out
    inst = instances(g, g.dur, lay)
    if num_rows(inst) == 0:
        return out
    code, _ = group_ids(inst["ranks"], inst["op"])
    work = np.zeros(code.size, np.int64)
    for c in np.unique(code).tolist():
        k = np.flatnonzero(code == c)
        bus, t = inst["bus"][k].astype(np.float64), inst["t"][k].astype(np.float64)
        work[k] = np.minimum(np.rint(envelope_at(*lower_envelope(bus, t), bus)), t)
    pos = np.minimum(np.searchsorted(inst["inst"], g.inst[nodes]), inst["inst"].size - 1)
    known = shared & (inst["inst"][pos] == g.inst[nodes])
    out[known] = np.maximum(work[pos[known]], 0)
    return out


def _dim_bandwidth(g: StepGraph, dur: np.ndarray, fix: Fix) -> None:
    m = np.flatnonzero(_transfers(g, fix.dim))
    if m.size == 0 or g.inst_info is None:
        return
    info = g.inst_info
    factor = bus_factors(info.at("op", g.inst[m]), info.at("n", g.inst[m]))
    size = info.at("bytes", g.inst[m])
    # a bandwidth fix moves the bytes faster: it neither slows a transfer already faster than the bandwidth
    # nor takes the latency out of messages too small to be bandwidth-bound (the analyzer never judges
    # those: collectives.MIN_JUDGED_BYTES), else the replayed saving of a `low_bus_bandwidth` finding counts
    # every small collective of the dim at zero latency (a TP job's saving far above the time it lost)
    ok = np.isfinite(size) & (size >= MIN_JUDGED_BYTES)
    t = size * factor / (float(fix.value) * 1e9) * 1e9
    dur[m[ok]] = np.minimum(dur[m[ok]], np.rint(t[ok]).astype(np.int64))


INSTANCE_COLS = {"inst": np.int64, "t": np.int64, "ranks": object, "dim": object, "op": object, "bus": np.float64,
                 "inter": bool}
"""`instances`' columns and their types."""


def bus_factors(op: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Per instance: the NCCL-tests bus-bandwidth factor of its op over its `n` members (1 for ops without)."""
    return np.array([bus_factor(str(o), int(k)) or 1.0 for o, k in zip(op.tolist(), n.tolist())], np.float64)


def instances(g: StepGraph, dur: np.ndarray, lay: RunFacts) -> Columns:
    """Per collective / P2P instance `inst` (ascending) with a known size: dim, op, its members `ranks`
    (sorted tuples), bus bytes (bytes × the NCCL-tests factor), transfer time `t` (its shortest member's
    transfer: first end − last arrival, DESIGN §3) under `dur`, and its link tier `inter` (members on
    several hosts). All but `t` are the graph's (`_instance_static`, cached)."""
    st = _instance_static(g, lay)
    if st is None:
        return {k: np.zeros(0, dtype=t) for k, t in INSTANCE_COLS.items()}
    if dur is g.dur and st.get("measured") is not None and st["measured"][0] is g.dur:
        t = st["measured"][1]  # the measured times: every straggler's fix asks for them (cached per graph)
    else:
        t = np.full(st["size"], np.iinfo(np.int64).max, np.int64)
        np.minimum.at(t, st["inv"], dur[st["nodes"]])
        t = t[st["keep"]]
        if dur is g.dur:
            t.flags.writeable = False
            st["measured"] = (g.dur, t)
    return {"inst": st["cols"]["inst"], "t": t, **{k: v for k, v in st["cols"].items() if k != "inst"}}


def _instance_static(g: StepGraph, lay: RunFacts) -> dict[str, Any] | None:
    """What `instances` returns but `t`, with each kept instance's members as flat arrays (`member_pos`:
    the instance's row, `member_rank`), and the transfer nodes / instance position each came from. Cached
    per graph and the layout's hosts."""
    key = tuple(sorted(lay.hosts.items()))
    cache = g.cache.instance_static
    if key in cache:
        return cache[key]
    m = np.flatnonzero((g.category == Category.TRANSFER) & (g.inst >= 0))
    if m.size == 0 or g.inst_info is None:
        cache[key] = None
        return None
    inv = recode(g.inst[m])  # np.unique's ids and inverse without its argsort of every transfer node
    ids = sorted_unique(g.inst[m])
    lo, span = int(g.rank[m].min()), int(g.rank[m].max() - g.rank[m].min()) + 1
    pair = sorted_unique(inv.astype(np.int64) * span + (g.rank[m].astype(np.int64) - lo))  # by inst, then rank
    p_inst, p_rank = pair // span, pair % span + lo
    bounds = np.flatnonzero(np.r_[True, p_inst[1:] != p_inst[:-1], True])
    flat = p_rank.tolist()
    ranks = np.empty(ids.size, dtype=object)
    ranks[:] = [tuple(flat[a:b]) for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
    uniq, at = unique_inverse(p_rank)
    hcode = np.unique(np.array([lay.hosts.get(r, "?") for r in uniq.tolist()], object), return_inverse=True)[1]
    hcode = hcode.reshape(-1)[at.reshape(-1)]
    inter = np.minimum.reduceat(hcode, bounds[:-1]) != np.maximum.reduceat(hcode, bounds[:-1])
    info = g.inst_info
    op = info.at("op", ids)
    bus = info.at("bytes", ids) * bus_factors(op, info.at("n", ids))
    keep = np.isfinite(bus) & (bus > 0)
    row = np.cumsum(keep) - 1
    sel = keep[p_inst]
    cols = take({"inst": ids, "ranks": ranks, "dim": info.at("dim", ids), "op": op, "bus": bus, "inter": inter}, keep)
    cache[key] = {"size": ids.size, "inv": inv, "nodes": m, "keep": keep, "cols": cols,
                  "member_pos": row[p_inst[sel]], "member_rank": p_rank[sel]}
    return cache[key]


def _member_sets(g: StepGraph, lay: RunFacts, rank: int, peers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per instance of `instances`: whether `rank` is a member; whether every member is one of `peers`."""
    st = _instance_static(g, lay)
    n = st["cols"]["inst"].size
    pos, rk = st["member_pos"], st["member_rank"]
    mine = np.bincount(pos, weights=rk == rank, minlength=n) > 0
    outside = np.bincount(pos, weights=~np.isin(rk, peers) | (rk == rank), minlength=n) > 0
    return mine, ~outside


def _same_collective(g: StepGraph, lay: RunFacts, inst: Columns) -> tuple[np.ndarray, int]:
    """Group ids of `instances` by (dim, op, sequence number of the collective's key): the same collective
    on each group (cached per graph and the layout's hosts, like `instances`)."""
    key = tuple(sorted(lay.hosts.items()))
    cache = g.cache.same_collective
    if key not in cache:
        ordinal = np.array([str(k).rsplit("#", 1)[-1] for k in g.inst_info.at("key", inst["inst"]).tolist()],
                           object)
        cache[key] = group_ids(inst["dim"], inst["op"], ordinal)
    return cache[key]


def by_inst(ids: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """`values` (one per instance of `ids`) at the instances `at`: 0 where `at` is none of them or the
    value is NaN (as a reindex then fillna(0))."""
    n = int(max(ids.max(initial=-1), at.max(initial=-1))) + 1
    dense = np.zeros(n)
    dense[ids] = values
    out = np.where(at >= 0, dense[np.maximum(at, 0)], 0.0)
    return np.where(np.isnan(out), 0.0, out)


def link_time(inst: Columns, bus: np.ndarray) -> np.ndarray:
    """What moving `bus` bus bytes takes on the links of `inst`'s instances: their lower envelope (of the
    median time per member set, op and size)."""
    if num_rows(inst) == 0:
        x = y = np.zeros(0, np.float64)
    else:  # the median per (member set, op, size), sorted once (the envelope depends on the points only)
        code, _ = group_ids(inst["ranks"], inst["op"], inst["bus"])
        o = np.lexsort((inst["t"], code))
        first = np.flatnonzero(np.r_[True, code[o][1:] != code[o][:-1]])
        n = np.diff(np.r_[first, o.size])
        t = inst["t"][o].astype(np.float64)
        x = inst["bus"][o][first].astype(np.float64)
        y = (t[first + (n - 1) // 2] + t[first + n // 2]) / 2  # np.median: the middle, or the mean of the two
    return envelope_at(*lower_envelope(x, y), bus)


def lower_envelope(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lower convex hull of points (x, y): on one link transfer time is latency + bytes / bandwidth, a
    line; points above it met something slower (a slow link, a busy peer)."""
    o = np.lexsort((y, x))
    hull: list[int] = []
    for i in o.tolist():
        if hull and x[hull[-1]] == x[i]:
            continue  # same size: the fastest (first) stays
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (y[b] - y[a]) * (x[i] - x[a]) >= (y[i] - y[a]) * (x[b] - x[a]):
                hull.pop()  # b lies on or above the segment a → i
            else:
                break
        hull.append(i)
    return x[hull], y[hull]


def envelope_at(hx: np.ndarray, hy: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The envelope's time for sizes `q`: interpolated inside, the nearest segment's line outside (a single
    point, or a line falling with size: proportional to size)."""
    if hx.size == 1:
        return hy[0] * q / hx[0]
    out = np.interp(q, hx, hy)
    lo, hi = (hy[1] - hy[0]) / (hx[1] - hx[0]), (hy[-1] - hy[-2]) / (hx[-1] - hx[-2])
    out = np.where(q < hx[0], np.maximum(hy[0] - (hx[0] - q) * max(lo, 0.0), 0.0), out)
    return np.where(q > hx[-1], hy[-1] + (q - hx[-1]) * (hi if hi > 0 else hy[-1] / hx[-1]), out)


def _slow_link(g: StepGraph, dur: np.ndarray, fix: Fix, lay: RunFacts) -> None:
    """Each of the dim's instances no slower than its peers' links move as many bus bytes: the lower
    envelope of the other member sets' instances (any dim, P2P included) on the same link tier."""
    inst = instances(g, g.dur, lay)
    if num_rows(inst) == 0:
        return
    mine = inst["dim"] == fix.dim if fix.dim is not None else np.ones(num_rows(inst), bool)
    excess = np.zeros(num_rows(inst))
    for inter, ranks in set(zip(inst["inter"][mine].tolist(), inst["ranks"][mine].tolist())):
        same = np.array([rs == ranks for rs in inst["ranks"]], dtype=bool)
        own, peers = mine & (inst["inter"] == inter) & same, (inst["inter"] == inter) & ~same
        if peers.any():
            excess[own] = np.maximum(inst["t"][own] - link_time(take(inst, peers), inst["bus"][own]), 0)
    m = np.flatnonzero(_transfers(g, fix.dim))
    cut = np.rint(by_inst(inst["inst"], excess, g.inst[m])).astype(np.int64)
    dur[m] = np.maximum(dur[m] - cut, 0)


def replayable(g: StepGraph, fix: Fix, lay: RunFacts) -> bool:
    """Whether the graph holds what the fix changes. `dim_inside_host` needs one of the dim's instances
    across hosts and one instance within a host (a partial recording's graph holds the traced ranks only: a
    group with one traced member shows no transfer across hosts); the other fixes are always replayed."""
    if fix.kind != "dim_inside_host":
        return True
    inst = instances(g, g.dur, lay)
    if num_rows(inst) == 0:
        return False
    return bool(((inst["dim"] == fix.dim) & inst["inter"]).any() and (~inst["inter"]).any())


def _dim_inside_host(g: StepGraph, dur: np.ndarray, fix: Fix, lay: RunFacts) -> None:
    """Each of the dim's instances across hosts no slower than the run's intra-host links move as many bus
    bytes (the lower envelope of the instances whose members share a host, any dim)."""
    inst = instances(g, g.dur, lay)
    if num_rows(inst) == 0:
        return
    mine = (inst["dim"] == fix.dim) & inst["inter"]
    intra = ~inst["inter"]
    if not mine.any() or not intra.any():
        return
    excess = np.zeros(num_rows(inst))
    excess[mine] = np.maximum(inst["t"][mine] - link_time(take(inst, intra), inst["bus"][mine]), 0)
    m = np.flatnonzero(_transfers(g, fix.dim))
    cut = np.rint(by_inst(inst["inst"], excess, g.inst[m])).astype(np.int64)
    dur[m] = np.maximum(dur[m] - cut, 0)


def _stage_resplit(g: StepGraph, dur: np.ndarray, lay: RunFacts) -> None:
    comp = compute_by_rank(g, dur)
    stages: dict[int, list[int]] = {}
    for r in comp:
        st = lay.coords.get(r, {}).get("pp", lay.stages.get(r))
        if st is not None:
            stages.setdefault(st, []).append(r)
    if len(stages) < 2:
        return
    stage_c = {st: float(np.mean([comp[r] for r in rs])) for st, rs in stages.items()}
    mean = float(np.mean(list(stage_c.values())))
    factor = {r: mean / stage_c[st] for st, rs in stages.items() if stage_c[st] > 0 for r in rs}
    if factor:  # each rank's compute scaled as `_scale_rank` does, all ranks in one pass over the graph
        ranks = np.array(list(factor), np.int64)
        m = (g.category == Category.COMPUTE) & np.isin(g.rank, ranks)
        at = np.zeros(int(ranks.max()) + 1)
        at[ranks] = list(factor.values())
        dur[m] = np.rint(dur[m] * at[g.rank[m]]).astype(np.int64)


def _expert_even(g: StepGraph, dur: np.ndarray, lay: RunFacts) -> None:
    """Per MoE layer pass (`moe_passes`): each member's expert compute (its compute between the dispatch's
    end and the combine's arrival) at the members' mean load (what it received in the dispatch), at the
    per-token cost the members' times show (their fit of time against load: a host that dispatches each
    expert's ops pays a fixed part whatever the load); the members' mean time when sizes are unknown. Only
    the hot members shrink: the pass ends with its slowest member, and a cold member's extra work fits in
    the time it waited for the hot ones (on a CPU run the graph keeps that wait as a fixed gap).
    Members that share one host's cores (`RunFacts.cpu_hosts`) are the exception (`_shared_cores_target`):
    there the cold member's wait gave its core to the hot ones, and balanced routing gives it work that
    takes a core back. And the all_to_alls moving the even share (`_even_all_to_all`)."""
    xfer = np.flatnonzero(_transfers(g, "ep") & _op_is(g, "all_to_all"))
    if xfer.size == 0:  # no ep group named (a job that moves its tokens over the world group): its all_to_alls
        xfer = np.flatnonzero(_transfers(g, None) & _op_is(g, "all_to_all"))
    if xfer.size == 0:
        return
    for parts, load, ranks, begin, end in moe_passes(g, xfer).values():
        own = np.array([dur[p].sum() for p in parts], np.float64)
        if all(shares_host(g, lay, int(r)) for r in ranks.tolist()):
            # processor sharing in the replay (sharing.py): each member's core time (work) to the members'
            # fit of work against load, the cold members' growing too; the replay finds every member's pace
            work = np.array([measured_work(g, lay, p).sum() * dur[p].sum() / max(g.dur[p].sum(), 1) for p in parts])
            target = own * _even_load(work, load) / np.maximum(work, 1.0)
        else:
            target = _shared_cores_target(own, begin, end, load, ranks, lay)
        if target is None:
            target = np.minimum(_even_load(own, load), own)  # the cold members' extra work fits in their wait
        for p, o, t in zip(parts, own, target):
            if o > 0:
                dur[p] = np.rint(dur[p] * (max(t, 0.0) / o)).astype(np.int64)
    _even_all_to_all(g, dur, xfer, lay)


def _even_load(own: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Each member's `own` (time or work) at the members' mean load: own = fixed + per-token cost × load, the
    members' fit (the mean where sizes are unknown or even)."""
    if np.isfinite(load).all() and np.ptp(load) > 0:
        return own + max(float(np.polyfit(load, own, 1)[0]), 0.0) * (load.mean() - load)
    return np.full(own.size, own.mean())


def _shared_cores_target(own: np.ndarray, begin: np.ndarray, end: np.ndarray, load: np.ndarray, ranks: np.ndarray,
                         lay: RunFacts) -> np.ndarray | None:
    """Each member's expert compute time with routing balanced, where the pass's members are CPU ranks of one
    host that share its cores (`RunFacts.cpu_hosts`); None elsewhere (or when sizes are unknown or even).
    `own`: each member's compute in the pass; `begin`, `end`: the dispatch's end and its arrival at the
    combine on its thread (measured ns): its span between is its compute and the gaps between, where it was
    preempted or ran Python.

    Processor sharing (docs/metrics.md §8): while every member computes, each runs at the pace the host
    gives n runnable ranks; a member that finished waits inside the combine holding no core, so the hot
    member's tail runs faster, alone. The least-loaded member computed the whole pass beside the others: its
    wall time per token is the pace of n ranks at once, and with the load even every member computes its
    mean share at that pace from start to end. So every member's span becomes the least-loaded member's span
    scaled to the mean load (the cold members grow: their extra tokens take a core back from the hot ones),
    its compute changed by as much. The fit of time against load across members (used elsewhere) reads the
    hot member's cheaper alone-pace tail as the per-token cost. The model bounds the pass: alone a rank runs
    no slower than beside the others and at most n times faster (1 ≤ s₁/sₙ ≤ n), so the balanced pass is no
    longer than the measured one and no shorter than the fit's; the least-loaded member's single pass is the
    box's (a 0.3 ms op preempted for 4-13 ms), and the bounds hold it to what the model allows. No member
    arrives at the combine later than the last one did (a member whose thread woke late from the dispatch
    has less room: the pass's work, not its start, is what moves). The fixed
    part of a pass (work that does not grow with tokens) is taken as 0: the trace does not separate it from
    the least-loaded member's own time."""
    if not (np.isfinite(load).all() and np.ptp(load) > 0) or ranks.size < 2:
        return None
    hosts = {lay.cpu_hosts.get(int(r)) for r in ranks.tolist()}
    if len(hosts) != 1 or None in hosts:
        return None
    cold = int(np.argmin(load))
    span = end - begin
    if load[cold] <= 0 or span[cold] <= 0:
        return None
    fit = np.minimum(span + max(float(np.polyfit(load, span, 1)[0]), 0.0) * (load.mean() - load), span)
    pass_ns = np.clip(span[cold] * load.mean() / load[cold], fit.max(), span.max())
    return np.maximum(own + (np.minimum(pass_ns, end.max() - begin) - span), 0.0)


def moe_passes(g: StepGraph, xfer: np.ndarray
               ) -> dict[int, tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Dispatch instance → (each member's expert compute nodes, each member's load, each member's rank, and
    per member the dispatch's end and its arrival at the combine, measured ns). A rank's all_to_alls
    pair up in its order as dispatch and combine, the combine mirroring the dispatch's sizes (others, such
    as a split-size exchange, are skipped); the expert compute is the rank's compute between them."""
    sizes = g.inst_info.io if g.inst_info is not None else []
    # the members of the instances looked up below only (those of `xfer`), not of every instance of the graph
    io = {(int(r), i): (a, b) for i in sorted_unique(g.inst[xfer]).tolist() if 0 <= i < len(sizes)
          for r, a, b in sizes[i]}
    arrive = np.flatnonzero((g.category == Category.MARK) & (g.inst >= 0) & (g.rank >= 0))
    arr_of = dict(zip(zip(g.rank[arrive].tolist(), g.inst[arrive].tolist()), g.start[arrive].tolist()))
    comp = np.flatnonzero(g.category == Category.COMPUTE)
    comp = comp[np.lexsort((g.start[comp], g.rank[comp]))]
    out: dict[int, tuple[list[np.ndarray], list[float], list[int], list[float], list[float]]] = {}
    for r in np.unique(g.rank[xfer]).tolist():
        mine = xfer[g.rank[xfer] == r]
        mine = mine[np.argsort(g.start[mine], kind="stable")].tolist()
        lo, hi = np.searchsorted(g.rank[comp], [r, r + 1])
        cs = comp[lo:hi]
        i = 0
        while i + 1 < len(mine):
            d, c = mine[i], mine[i + 1]
            (a_in, a_out), (b_in, b_out) = io.get((r, int(g.inst[d])), (np.nan,) * 2), io.get((r, int(g.inst[c])), (np.nan,) * 2)
            if not (a_in == b_out and a_out == b_in) and not np.isnan([a_in, b_in]).all():
                i += 1
                continue
            a, b = g.start[d] + g.dur[d], arr_of.get((r, int(g.inst[c])), g.start[c])
            parts, loads, who, begins, ends = out.setdefault(int(g.inst[d]), ([], [], [], [], []))
            parts.append(cs[(g.start[cs] >= a) & (g.start[cs] + g.dur[cs] <= b)])
            loads.append(float(a_out))
            who.append(r)
            begins.append(float(a))
            ends.append(float(b))
            i += 2
    return {k: (p, np.array(x, np.float64), np.array(w, np.int64), np.array(t0, np.float64), np.array(t1, np.float64))
            for k, (p, x, w, t0, t1) in out.items()}


def _op_is(g: StepGraph, op: str | tuple[str, ...]) -> np.ndarray:
    """Per node: it belongs to an instance of collective `op` (or of one of them)."""
    n = int(g.inst.max(initial=-1)) + 1
    if g.inst_info is None or n == 0:
        return np.zeros(g.num_nodes, bool)
    # each instance's op as text, once per graph (every overlap what-if asks for its op's nodes)
    ops = derived(g, "instance_ops", (g.inst, g.inst_info), (), lambda: g.inst_info.at("op", np.arange(n)).astype(str))
    hit = np.isin(ops, [op] if isinstance(op, str) else list(op))  # per instance, then per node
    return (g.inst >= 0) & hit[np.maximum(g.inst, 0)]


def _even_all_to_all(g: StepGraph, dur: np.ndarray, nodes: np.ndarray, lay: RunFacts) -> None:
    """Each all_to_all's transfer as long as its links (the lower envelope of the instances on its link
    tier) take to move the even share: the members' mean received bytes (= mean sent) in place of the
    largest member's (its bus bytes scale by mean / largest); unchanged when sizes are unknown."""
    inst = instances(g, g.dur, lay)
    if nodes.size == 0 or num_rows(inst) == 0:
        return
    a2a = take(inst, inst["op"] == "all_to_all")
    mean_out = np.array([np.mean([b for _, _, b in g.inst_info.io[i]]) for i in a2a["inst"].tolist()], np.float64)
    share = np.nan_to_num(mean_out / g.inst_info.at("bytes", a2a["inst"]), nan=1.0).clip(max=1.0)
    even = a2a["bus"] * share
    new = a2a["t"].astype(np.float64)
    for inter in (False, True):
        sel = a2a["inter"] == inter
        if sel.any():
            new[sel] = np.minimum(new[sel], link_time(take(inst, inst["inter"] == inter), even[sel]))
    cut = by_inst(a2a["inst"], a2a["t"] - new, g.inst[nodes])
    dur[nodes] = np.maximum(dur[nodes] - np.rint(cut).astype(np.int64), 0)


def _host_stalls(g: StepGraph, dur: np.ndarray, gap: np.ndarray, fix: Fix, lay: RunFacts) -> None:
    """`host_stalls` (module docstring). A GPU rank's host node keeps the part of its gap that is host ops
    launching nothing (`_stall_floor`; `host_work` removes that part): its gap as an earlier fix left it, less
    the measured gap's idle part, so the two fixes together remove the whole gap in either order."""
    host = host_lane_mask(g)

    def floor(ids: np.ndarray) -> np.ndarray:  # the gap less its idle part, as an earlier fix left it
        return np.maximum(gap[ids] - (np.asarray(g.gap)[ids] - _stall_floor(g, ids)), 0)

    if fix.rank is None and fix.ranks:  # these ranks' stalls removed (as below, on their nodes only)
        mine = np.concatenate([rank_nodes(g, int(r)) for r in fix.ranks])
        sel = mine[host[mine] & (gap[mine] >= lay.stall_min_ns)]
        gap[sel] = floor(sel)
        dur[mine[g.category[mine] == Category.STALL]] = 0
        return
    if fix.rank is None:
        sel = np.flatnonzero(host & (gap >= lay.stall_min_ns))
        gap[sel] = floor(sel)
        dur[g.category == Category.STALL] = 0
        return
    peer = peer_medians(g, host, int(fix.rank), lay)
    mine = peer[0] if peer is not None else aligned(g, host, int(fix.rank), lay)[0]
    stall = gap[mine] >= lay.stall_min_ns
    load = g.category[mine] == Category.STALL
    sel = mine[stall]
    if peer is not None:
        gap_med, dur_med = peer[1](), peer[2]()
        gap[sel] = np.maximum(np.minimum(gap[sel], gap_med[stall].astype(np.int64)), floor(sel))
        dur[mine[load]] = np.minimum(dur[mine[load]], dur_med[load].astype(np.int64))
    else:
        lead = _step_leads(g, host, int(fix.rank), lay)
        gap[sel] = np.maximum(np.minimum(gap[sel], lead[sel]), floor(sel))
        dur[mine[load]] = 0


def _stall_floor(g: StepGraph, ids: np.ndarray) -> np.ndarray:
    """Per node of `ids`: the least gap a stall fix leaves it. A GPU rank's host node: its measured gap less the
    part of it in the rank's host gaps and data loading (`StepGraph.host_idle`; the rest is host ops that
    launch nothing, held in the gap since the graph's host nodes are runtime calls); any other node: 0."""
    out = np.zeros(ids.size, np.int64)
    if not g.host_idle or ids.size == 0:
        return out
    base = np.asarray(g.gap)[ids]
    end = g.start[ids]
    ranks = g.rank[ids]
    for r, (lo, hi) in g.host_idle.items():
        at = np.flatnonzero(ranks == r)
        if at.size:
            idle = iv.covered((lo, hi), end[at] - base[at], end[at]) if lo.size else np.zeros(at.size, np.int64)
            out[at] = np.maximum(base[at] - idle, 0)
    return out


def _host_work(g: StepGraph, dur: np.ndarray, gap: np.ndarray, fix: Fix, lay: RunFacts) -> None:
    """The named ranks' (or every rank's) host work between launches removed: the graph holds a GPU rank's host
    ops between runtime calls as the calls' gaps, so each host gap of at least `stall_min_ns` loses its part
    that is not idle (`_stall_floor`: host ops that launch nothing, analyze/host_bound.py `host_work`); its idle
    part and data loading stay (`host_stalls` removes those)."""
    host = host_lane_mask(g)
    ranks = fix.ranks or ((fix.rank,) if fix.rank is not None else ())
    ids = np.concatenate([rank_nodes(g, int(r)) for r in ranks]) if ranks else np.arange(g.num_nodes)
    sel = ids[host[ids] & (np.asarray(g.gap)[ids] >= lay.stall_min_ns)]
    gap[sel] = np.maximum(gap[sel] - _stall_floor(g, sel), 0)


def _host_repair(g: StepGraph, dur: np.ndarray, gap: np.ndarray, fix: Fix) -> None:
    m = np.ones(g.num_nodes, bool) if fix.rank is None else rank_nodes(g, int(fix.rank))
    gap[m] = np.maximum(gap[m] - g.excess_gap[m], 0)
    dur[m] = np.maximum(dur[m] - g.excess_dur[m], 0)


def _host_ahead(g: StepGraph, dur: np.ndarray, gap: np.ndarray, fix: Fix, lay: RunFacts) -> None:
    if fix.rank is None:
        m = np.flatnonzero(launch_lane_mask(g) & (g.rank >= 0))
    else:  # the rank's nodes from one sort of the graph (a fix per rank of a large run: not a scan each)
        m = rank_nodes(g, int(fix.rank))
        m = m[launch_lane_mask(g)[m]]
    dur[m[g.category[m] == Category.HOST]] = 0
    short = m[gap[m] < lay.stall_min_ns]
    gap[short] = np.minimum(gap[short], 0)  # a negative gap (calls overlapping on the clock) stays as measured


def _step_leads(g: StepGraph, host: np.ndarray, rank: int, lay: RunFacts) -> np.ndarray:
    """Per node: how much of its gap the peers also have. The gap before the rank's first host op of a
    step keeps the median of its peers' gaps before theirs (the time every rank spends between steps);
    any other gap keeps 0. Used when the peers' op sequences differ from the rank's."""
    keep = np.zeros(g.gap.size, np.int64)
    idx = np.flatnonzero(host & (g.rank >= 0) & (g.step >= 0))
    idx = idx[np.lexsort((g.start[idx], g.step[idx], g.rank[idx]))]
    new = np.ones(idx.size, dtype=bool)
    new[1:] = (g.rank[idx[1:]] != g.rank[idx[:-1]]) | (g.step[idx[1:]] != g.step[idx[:-1]])
    first = idx[new]  # each (rank, step)'s first host op
    peers = np.setdiff1d(lay.peers(rank, np.unique(g.ranks)), [rank])
    theirs = first[np.isin(g.rank[first], peers)]
    for n in first[g.rank[first] == rank]:
        same = theirs[g.step[theirs] == g.step[n]]
        if same.size:
            keep[n] = int(np.median(g.gap[same]))
    return keep


def shrink_per_sample(g: StepGraph, dur: np.ndarray, lay: RunFacts, where: np.ndarray, ratio: float) -> np.ndarray:
    """`dur` with the work under `where` that scales with a micro-batch's samples at `ratio` of its size:
    compute, memcpy and other device work scaled; transfers of every dim but the gradient ones (activations:
    tp, cp, ep, pp) lose what moving the fewer bytes saves on their link tier's lower envelope (latency +
    bytes / bandwidth, `link_time`), so each keeps its fixed cost; of unknown size or on a tier with one
    size, scaled. Host work and gradient transfers keep their time."""
    out = dur.copy()
    work = where & np.isin(g.category, [Category.COMPUTE, Category.OTHER])
    xfer = np.flatnonzero(where & (g.category == Category.TRANSFER) & ~gradient_dims(g))
    out[work] = np.rint(dur[work] * ratio).astype(np.int64)
    out[xfer] = np.rint(dur[xfer] * ratio).astype(np.int64)
    inst = instances(g, dur, lay)
    for inter in np.unique(inst["inter"]).tolist():
        tier = take(inst, inst["inter"] == inter)
        if np.unique(tier["bus"]).size < 2:
            continue  # one size: no line to take a latency from
        bus = tier["bus"]
        saved = link_time(tier, bus) - link_time(tier, bus * ratio)
        mine = xfer[np.isin(g.inst[xfer], tier["inst"])]
        out[mine] = np.maximum(dur[mine] - np.rint(by_inst(tier["inst"], saved, g.inst[mine])).astype(np.int64), 0)
    return out


def shared_host_idle(g: StepGraph, lay: RunFacts) -> float:
    """CPU-only ranks sharing a host: the largest share, over hosts, of the analyzed steps in which none of
    the host's ranks ran anything (op, transfer). A rank in its pipeline bubble gives its core to the
    other stage's ranks on the host, so more micro-batches can only recover time the whole host sat idle
    (docs/metrics.md §8). 1.0 (no cap) when the ranks do not share hosts or have devices."""
    hosts: dict[str, list[int]] = {}
    for r, h in lay.cpu_hosts.items():
        hosts.setdefault(h, []).append(r)
    if not hosts or all(len(rs) < 2 for rs in hosts.values()) or g.ranks.size == 0:
        return 1.0

    lo, hi = int(g.win_start.min()), int(g.win_end.max())
    busy = (g.dur > 0) & (g.category != Category.MARK) & (g.rank >= 0)
    best = 0.0
    for rs in hosts.values():
        m = np.flatnonzero(busy & np.isin(g.rank, rs))
        a, b = iv.union(np.clip(g.start[m], lo, hi), np.clip(g.start[m] + g.dur[m], lo, hi))
        best = max(best, 1.0 - float((b - a).sum()) / max(hi - lo, 1))
    return best


_MEMCPY_NAME = re.compile(r"memcpy|^copy(host|device)to|^\[?memcpy", re.IGNORECASE)
_COPY_DIRECTION = re.compile(r"HtoD|DtoH|DtoD|PtoP|HostToDevice|DeviceToHost|DeviceToDevice", re.IGNORECASE)
_DIRECTION_NAME = {"hosttodevice": "HtoD", "devicetohost": "DtoH", "devicetodevice": "DtoD"}


def memcpy_nodes(g: StepGraph) -> np.ndarray:
    """Device copy nodes (memcpy kernels: other device work named `Memcpy HtoD (...)`, `CopyHostToDevice`...)."""
    other = np.flatnonzero(g.category == Category.OTHER)
    out = np.zeros(g.category.size, bool)
    if g.name:
        out[other] = [bool(_MEMCPY_NAME.search(g.name[i] or "")) for i in other.tolist()]
    return out


def copy_direction(name: str) -> str:
    """HtoD / DtoH / DtoD / PtoP of a memcpy kernel's name, "other" when the name does not say."""
    m = _COPY_DIRECTION.search(name or "")
    if m is None:
        return "other"
    d = m.group(0)
    return _DIRECTION_NAME.get(d.lower(), d[0].upper() + "to" + d[-1].upper())


LOCAL_FIXES = ("host_stalls", "host_repair", "host_ahead", "host_work")
"""Fixes that, naming ranks (`Fix.touched_ranks`), change only those ranks' nodes: `apply_fixes_sparse`."""
SPARSE_MAX_FIXES = 8
"""More fixes than this (one per rank of a finding naming many ranks) are applied to whole arrays: each
write into an overlay merges into all it holds, and they would reach too much of the graph anyway."""


def apply_fixes_sparse(g: StepGraph, fixes: list[Fix], lay: RunFacts) -> tuple[Overlay, Overlay] | None:
    """`apply_fixes`' durations and gaps as overlays of the graph's (`graph.Overlay`: only the changed
    values held) when every fix is one of LOCAL_FIXES on named ranks; None otherwise. The same fix
    functions write into them: the values are `apply_fixes`' exactly."""
    if not fixes or len(fixes) > SPARSE_MAX_FIXES or not all(f.kind in LOCAL_FIXES and f.touched_ranks()
                                                              for f in fixes):
        return None
    dur, gap = Overlay(g.dur), Overlay(g.gap)
    for fix in fixes:
        if fix.kind == "host_stalls":
            _host_stalls(g, dur, gap, fix, lay)  # type: ignore[arg-type]
        elif fix.kind == "host_work":
            _host_work(g, dur, gap, fix, lay)  # type: ignore[arg-type]
        elif fix.kind == "host_ahead":
            _host_ahead(g, dur, gap, fix, lay)  # type: ignore[arg-type]
        else:
            _host_repair(g, dur, gap, fix)  # type: ignore[arg-type]
    return dur, gap


def apply_fixes(g: StepGraph, fixes: list[Fix], lay: RunFacts) -> tuple[np.ndarray, np.ndarray]:
    """Durations and gaps with the fixes applied (all but micro-batches, which `replay` re-schedules)."""
    dur = g.dur.copy()
    gap = g.gap.copy()
    for fix in fixes:
        if fix.kind == "rank_compute":
            _rank_compute(g, dur, fix, lay, gap)
        elif fix.kind == "dim_bandwidth":
            _dim_bandwidth(g, dur, fix)
        elif fix.kind == "dim_overlap":
            _dim_overlap(g, dur, fix, lay)
        elif fix.kind == "slow_link":
            _slow_link(g, dur, fix, lay)
        elif fix.kind == "dim_inside_host":
            _dim_inside_host(g, dur, fix, lay)
        elif fix.kind == "stage_resplit":
            _stage_resplit(g, dur, lay)
        elif fix.kind == "expert_even":
            _expert_even(g, dur, lay)
        elif fix.kind == "microbatches":
            pass  # re-scheduled in the replay (replay.predict_all): it needs the replayed pipelined part
        elif fix.kind == "host_stalls":
            _host_stalls(g, dur, gap, fix, lay)
        elif fix.kind == "host_repair":
            _host_repair(g, dur, gap, fix)
        elif fix.kind == "host_work":
            _host_work(g, dur, gap, fix, lay)
        elif fix.kind == "host_ahead":
            _host_ahead(g, dur, gap, fix, lay)
        elif fix.kind == "memcpy_overlap":
            m = memcpy_nodes(g)
            dur[m & ((g.rank == fix.rank) if fix.rank is not None else True)] = 0
        else:
            raise ValueError(f"unknown what-if fix {fix.kind!r} (known: {', '.join(KINDS)})")
    return dur, gap
