"""Processor sharing on CPU ranks that share a host's cores (docs/metrics.md §8 "Processor sharing").

A CPU rank's op is CPU work: on a host with K cores where c of the job's ranks are runnable and the
box's other processes add a load E_r (runnable threads the trace does not show, as rank r met them), each
runnable rank advances at the rate

    rate_r(t) = min(1, K / (c(t) + E_r))

(processor sharing: the cores split evenly among the runnable threads, none faster than one core; E_r per
rank, as the scheduler places the outside load beside one rank more than beside another: 3 runnable threads
on 2 cores do not share them evenly). A rank is runnable while one of its work nodes runs (compute, host,
other work, a gloo transfer: gloo moves the bytes on CPU threads) and in the short gaps of its training
thread (Python between ops: shorter than `RunFacts.stall_min_ns`); a longer gap is a stall (a sleep, a
blocked read) and a collective's wait holds no core. The trace gives c(t); each E_r is fitted so that the
model's core time over the rank's runnable time equals the CPU time `tracekit record` measured for it
(`core_time`): the core time falls as E_r grows, so a bisection finds it, and E_r = 0 where the job's own
ranks explain all the waiting.

Each node's work is its measured time × the rate it ran at (∫ rate over its interval; a runnable gap's
likewise). A fix changes a node's work in proportion to its wall time (a compute op at half its time is
half its work); the replay then runs every node's work at the rate its replayed concurrency gives, which
moves the concurrency: replay → concurrency → durations, repeated to a fixed point (`PS_ITERATIONS` at
most; stops once no node moves by `PS_TOLERANCE_NS`). The unchanged graph is a fixed point (each node's
work at the measured rate takes its measured time). A rank that sleeps less then computes beside its peer
at a shared core where it ran alone, and a rank with less work frees its peers' core share: the saving is
the one processor sharing gives, not the one of paces held at what they were measured at.

Only where every rank of a host has its cores (`host_cpus`) and wait share recorded (`RunFacts.cores`,
`RunFacts.cpu_wait`); GPU ranks never (`RunFacts.cpu_hosts` holds CPU-only ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracekit.derive import intervals as iv
from tracekit.whatif.graph import Category, StepGraph, host_lane_mask

PS_ITERATIONS = 12
"""replay → concurrency → durations rounds at most (measured: the matrix's runs settle in 3–6)"""
PS_TOLERANCE_NS = 1_000
"""a round that moves no node's duration or gap by more than this is the fixed point"""
WORK = (Category.COMPUTE, Category.HOST, Category.OTHER, Category.TRANSFER)
"""node categories that run on a core (a collective's wait, a stall and a mark hold none)"""


@dataclass
class HostShare:
    """One host's processor-sharing model: its cores, each rank's fitted outside load, its ranks' work nodes and
    runnable gaps with the work each held as measured."""

    host: str
    cores: int
    load: dict[int, float]
    """rank -> E_r: the runnable threads beside the job's ranks as the rank met them (fitted to its CPU time,
    `core_time`)"""
    share: dict[int, float]
    """rank -> its runnable share (`runnable_share`)"""
    nodes: np.ndarray
    """work nodes of the host's ranks"""
    gaps: np.ndarray
    """nodes whose (short, training-thread) gap is runnable"""
    node_work: np.ndarray
    gap_work: np.ndarray
    """ns of core time each would have taken running alone on a core (`runnable` of it at the measured
    rate, the rest as it ran)"""
    node_runnable: np.ndarray
    gap_runnable: np.ndarray
    """per node (gap): its rank's runnable share (`runnable_share`)"""


def _rate(cores: int, load: float, c: np.ndarray) -> np.ndarray:
    return np.minimum(1.0, cores / np.maximum(c + load, 1e-9))


def _concurrency(ranks: np.ndarray, a: np.ndarray, b: np.ndarray, weight: dict[int, float]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(breakpoints t, runnable ranks on each segment [t_i, t_{i+1})) of intervals [a, b) of `ranks`: each
    rank counts once (its runnable share `weight`) while any of its intervals runs."""
    starts, ends, w = [], [], []
    for r in np.unique(ranks).tolist():
        m = ranks == r
        u0, u1 = iv.union(a[m], b[m])
        starts.append(u0)
        ends.append(u1)
        w.append(np.full(u0.size, weight.get(int(r), 1.0)))
    if not starts:
        return np.zeros(1, np.int64), np.zeros(0)
    t = np.r_[np.concatenate(starts), np.concatenate(ends)]
    d = np.r_[np.concatenate(w), -np.concatenate(w)]
    o = np.argsort(t, kind="stable")
    t, d = t[o], d[o]
    bp, first = np.unique(t, return_index=True)
    c = np.cumsum(d)[np.r_[first[1:] - 1, d.size - 1]]  # after all events at each breakpoint
    return bp, np.maximum(c[:-1], 0.0)


class _Clock:
    """The cumulative core time R(t) = ∫ rate of one runnable rank on a host, piecewise linear; outside the
    breakpoints at the pace of one rank alone (a node replayed past every other interval)."""

    def __init__(self, bp: np.ndarray, c: np.ndarray, cores: int, load: float) -> None:
        self.t = bp.astype(np.float64)
        rate = _rate(cores, load, np.asarray(c, np.float64))
        self.r = np.r_[0.0, np.cumsum(rate * np.diff(self.t))]
        self.edge = float(_rate(cores, load, np.ones(1))[0])

    def at(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, np.float64)
        out = np.interp(t, self.t, self.r)
        out = np.where(t < self.t[0], (t - self.t[0]) * self.edge, out)
        return np.where(t > self.t[-1], self.r[-1] + (t - self.t[-1]) * self.edge, out)

    def when(self, r: np.ndarray) -> np.ndarray:
        """The inverse of `at` (R is strictly increasing: every rate is positive)."""
        r = np.asarray(r, np.float64)
        out = np.interp(r, self.r, self.t)
        out = np.where(r < 0.0, self.t[0] + r / self.edge, out)
        return np.where(r > self.r[-1], self.t[-1] + (r - self.r[-1]) / self.edge, out)


def _intervals(g: StepGraph, nodes: np.ndarray, gaps: np.ndarray, start: np.ndarray, dur: np.ndarray,
               gap: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank, begin, end) of the host's runnable intervals: its work nodes and runnable gaps."""
    a = np.r_[start[nodes], start[gaps] - gap[gaps]]
    b = np.r_[start[nodes] + dur[nodes], start[gaps]]
    keep = b > a
    return np.r_[g.rank[nodes], g.rank[gaps]][keep], a[keep], b[keep]


def fit_load(cpu: float, held: np.ndarray, c: np.ndarray, cores: int) -> float:
    """E such that the model's core time, Σ_segments held × rate(c, E) (`held`: per segment of concurrency `c`
    the runnable time the core time is fitted over: a rank's runnable share × the segment's length where it
    runs), equals the recorded core time `cpu` (`core_time`). The core time falls as E grows: a bisection (0
    where the job's ranks alone explain the waiting)."""
    def core_time(load: float) -> float:
        return float((held * _rate(cores, load, c)).sum())

    if cpu <= 0 or core_time(0.0) <= cpu:
        return 0.0
    lo, hi = 0.0, float(cores)
    while core_time(hi) > cpu and hi < 1e6:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if core_time(mid) > cpu else (lo, mid)
    return (lo + hi) / 2


def _runs_on(bp: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per segment [bp_i, bp_i+1): does one of the intervals [a, b) cover it (the breakpoints hold every end)?"""
    if a.size == 0:
        return np.zeros(max(bp.size - 1, 0), bool)
    u0, u1 = iv.union(a, b)
    i = np.searchsorted(u0, bp[:-1], side="right") - 1
    return (i >= 0) & (bp[:-1] < u1[np.maximum(i, 0)])


def host_shares(g: StepGraph, lay) -> list[HostShare]:
    """The model of each host whose ranks (CPU ranks sharing its cores, `RunFacts.cpu_hosts`) all have
    their cores and wait share recorded (cached per graph and the layout's hosts, cores and CPU records)."""
    key = (tuple(sorted(lay.cpu_hosts.items())), tuple(sorted(lay.cores.items())),
           tuple(sorted(lay.cpu_wait.items())), tuple(sorted(lay.cpu_runnable.items())), lay.stall_min_ns)
    cache = g.cache.sharing
    if key not in cache:
        cache[key] = _host_shares(g, lay)
    return cache[key]


def _host_shares(g: StepGraph, lay) -> list[HostShare]:
    names = sorted({h for r, h in lay.cpu_hosts.items()
                    if lay.cores.get(h) and all(lay.cpu_wait.get(p) is not None
                                                for p, q in lay.cpu_hosts.items() if q == h)})
    if not names or g.rank.size == 0:
        return []
    code = np.full(max(int(g.rank.max()), max(lay.cpu_hosts)) + 2, -1, np.int64)  # rank -> host index (-1: none)
    for r, h in lay.cpu_hosts.items():
        code[int(r)] = names.index(h) if h in names else -1
    host = code[g.rank]  # rank -1 (collective marks) reads the last entry: -1
    work = np.flatnonzero(np.isin(g.category, [int(c) for c in WORK]) & (g.dur > 0) & (host >= 0))
    short = np.flatnonzero(host_lane_mask(g) & (g.gap > 0) & (g.gap < lay.stall_min_ns) & (host >= 0))
    work, short = work[np.argsort(host[work], kind="stable")], short[np.argsort(host[short], kind="stable")]
    w_at = np.searchsorted(host[work], np.arange(len(names) + 1))
    s_at = np.searchsorted(host[short], np.arange(len(names) + 1))
    out = []
    for i, h in enumerate(names):
        nodes, gaps = work[w_at[i]:w_at[i + 1]], short[s_at[i]:s_at[i + 1]]
        rk, a, b = _intervals(g, nodes, gaps, g.start, g.dur, g.gap)
        if rk.size == 0:
            continue
        ranks = sorted(int(r) for r, q in lay.cpu_hosts.items() if q == h)
        busy_r = {r: float(_union_len(a[rk == r], b[rk == r])) for r in ranks}
        share = {r: runnable_share(lay.cpu_runnable.get(r), busy_r[r] / max(int((g.ranks == r).sum()), 1))
                 for r in ranks}
        bp, c = _concurrency(rk, a, b, share)
        k, seg = int(lay.cores[h]), np.diff(bp).astype(np.float64)
        load = {r: fit_load(core_time(lay, r, share[r] * busy_r[r], int((g.ranks == r).sum())),
                            share[r] * seg * _runs_on(bp, a[rk == r], b[rk == r]), c, k) for r in ranks}
        clocks = {r: _Clock(bp, c, k, e) for r, e in load.items()}
        rk_n, rk_g = g.rank[nodes], g.rank[gaps]
        rho_n = np.array([share[int(r)] for r in rk_n.tolist()], np.float64)
        rho_g = np.array([share[int(r)] for r in rk_g.tolist()], np.float64)
        ran_n = _each(clocks, rk_n, lambda clk, m: clk.at((g.start + g.dur)[nodes[m]]) - clk.at(g.start[nodes[m]]))
        ran_g = _each(clocks, rk_g, lambda clk, m: clk.at(g.start[gaps[m]]) - clk.at((g.start - g.gap)[gaps[m]]))
        out.append(HostShare(h, k, load, share, nodes, gaps, (1 - rho_n) * g.dur[nodes] + rho_n * ran_n,
                             (1 - rho_g) * g.gap[gaps] + rho_g * ran_g, rho_n, rho_g))
    return out


def core_time(lay, rank: int, held: float, steps: int) -> float:
    """The core time a rank's busy time in the trace held (`held`: that busy time × its runnable share), the
    target its outside load is fitted to: its recorded CPU time over the graph's `steps` (runnable time per
    step × (1 − wait share), `RunFacts.cpu_runnable`), at most `held`. Its CPU time is its training thread's,
    inside the ops and the short gaps the trace shows; its run-queue wait is not all there: a thread the
    scheduler wakes waits for the running one's slice in time the trace shows as a stall or a collective's
    wait (gloo's listener on each message, the training thread when a collective completes). Where the
    runnable time is not recorded, the wait share is taken as the busy time's: held × (1 − wait share)."""
    wait = float(lay.cpu_wait[rank])
    runnable = lay.cpu_runnable.get(rank)
    if runnable is None:
        return held * (1.0 - wait)
    return min(runnable * (1.0 - wait) * max(steps, 1), held)


def _each(clocks: dict[int, "_Clock"], ranks: np.ndarray, fn) -> np.ndarray:
    """`fn(clock, mask)` of each rank's elements (`ranks`: the rank of each) on the rank's own clock."""
    out = np.zeros(ranks.size, np.float64)
    for r, clk in clocks.items():
        m = ranks == r
        if m.any():
            out[m] = fn(clk, m)
    return out


def runnable_share(runnable: float | None, busy: float) -> float:
    """The share of a rank's busy time in the trace (its work nodes and runnable gaps, per step) in which its
    threads were runnable: its recorded runnable time per profiled step (CPU + run-queue wait,
    `RunFacts.cpu_runnable`) over that busy time, at most 1; 1 where not recorded. Below 1 an op of the rank
    also blocks (a sleep inside an operator: a simulated device's time), which holds no core: that share of
    each op keeps its time in the replay."""
    if runnable is None or busy <= 0:
        return 1.0
    return float(min(1.0, runnable / busy))


def _union_len(a: np.ndarray, b: np.ndarray) -> int:
    u0, u1 = iv.union(a, b)
    return int((u1 - u0).sum())


def shares_host(g: StepGraph, lay, rank: int) -> bool:
    """Does the rank's host have the processor-sharing model (`host_shares`)?"""
    return any(s.host == lay.cpu_hosts.get(rank) for s in host_shares(g, lay))


def measured_work(g: StepGraph, lay, nodes: np.ndarray) -> np.ndarray | None:
    """What each of `nodes` would have taken alone on a core (`HostShare.node_work`; its time where it has no
    model); None when no host of the run has one."""
    shares = host_shares(g, lay)
    if not shares:
        return None
    work = g.dur.astype(np.float64)
    for s in shares:
        work[s.nodes] = s.node_work
    return work[nodes]


def _stretch(clock: "_Clock", begin: np.ndarray, alone: np.ndarray, now: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """The wall time of work that takes `alone` on a core of its own, begun at `begin` on `clock`: its
    runnable share `rho` at the clock's rates (R(end) − R(begin) = its core time), the rest as long as `now`'s
    same share (blocked time keeps its length)."""
    blocked = (1 - rho) * now
    core = alone - blocked
    return np.rint(blocked + rho * (clock.when(clock.at(begin) + core / np.maximum(rho, 1e-9)) - begin)
                   ).astype(np.int64)


def shared_replay(g: StepGraph, lay, replay_fn, dur: np.ndarray, gap: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """(start, dur, gap, rounds) of the fixed graph (`dur`, `gap`: the fixes' durations and gaps) replayed
    under processor sharing; None when no host of the run has the model (`host_shares`). `replay_fn(dur,
    gap)` gives the starts."""
    shares = host_shares(g, lay)
    if not shares:
        return None
    fixed = []
    for s in shares:  # the fixes change a node's work in proportion to its time
        nw = s.node_work * dur[s.nodes] / np.maximum(g.dur[s.nodes], 1)
        gw = s.gap_work * np.maximum(gap[s.gaps], 0) / np.maximum(g.gap[s.gaps], 1)
        fixed.append((nw, gw, dur[s.nodes].copy(), np.maximum(gap[s.gaps], 0)))
    dur, gap = dur.copy(), gap.copy()
    rounds = 0
    for rounds in range(1, PS_ITERATIONS + 1):
        start = replay_fn(dur, gap)
        moved = 0
        for s, (nw, gw, d0, g0) in zip(shares, fixed):
            rk, a, b = _intervals(g, s.nodes, s.gaps, start, dur, np.maximum(gap, 0))
            if rk.size == 0:
                continue
            bp, c = _concurrency(rk, a, b, s.share)
            clocks = {r: _Clock(bp, c, s.cores, e) for r, e in s.load.items()}
            rk_n, rk_g = g.rank[s.nodes], g.rank[s.gaps]
            new_dur = np.rint(_each(clocks, rk_n, lambda clk, m: _stretch(
                clk, start[s.nodes[m]], nw[m], d0[m], s.node_runnable[m]))).astype(np.int64)
            begin = start[s.gaps] - np.maximum(gap[s.gaps], 0)
            stretched = _each(clocks, rk_g, lambda clk, m: _stretch(clk, begin[m], gw[m], g0[m], s.gap_runnable[m]))
            new_gap = np.where(g0 > 0, np.rint(stretched).astype(np.int64), gap[s.gaps])
            moved = max(moved, int(np.abs(new_dur - dur[s.nodes]).max(initial=0)),
                        int(np.abs(new_gap - gap[s.gaps]).max(initial=0)))
            dur[s.nodes], gap[s.gaps] = new_dur, new_gap
        if moved <= PS_TOLERANCE_NS:
            break
    return replay_fn(dur, gap), dur, gap, rounds
