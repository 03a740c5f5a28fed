"""Breakdown of each rank's step time into compute, exposed communication, other device work and idle.

Definitions (DESIGN §3, written down in docs/metrics.md), exclusive by priority so the parts sum to
the step window: compute ▸ communication overlapping no compute ("exposed") ▸ other device work ▸ idle.
Exposed communication splits into sync wait (waiting for late peers: before the group's last arrival,
from matching.py's wait intervals) and exposed transfer (the rest). Waiting is charged to whoever was
waited for: each rank's sync wait is split by the rank it waited for (`waited_for`: a collective's last
arrival, a P2P op's peer; where waits overlap, the one ending last), and `owed_wait` turns it around:
per late rank, the wait it caused on the others (the straggler finding's evidence). Overlap ratio = |comm ∩ compute| /
|comm| (HTA's definition; null when a rank has no comm).

Where "busy" comes from:
- GPU ranks (rows in `kernels`): kernels.kind compute / comm / memcpy+memset ("other device work"),
  all streams; carry-over kernels (kernels.carry_over: no launch in the trace, before the first
  linked kernel) are in no step and only counted (`carry_over_ns`).
- CPU ranks: compute = `cpu_op` events on training threads (every thread that is not a gloo/NCCL
  worker thread) except the ops that only issue communication (`c10d::*`, `record_param_comms`,
  the runtime's `comm:*`, ...) and the step annotation (a `ProfilerStep#N` cpu_op in 2021-2023
  traces is never compute); inside such an op only leaf ops count (the ops enclosing it, e.g.
  an autograd node running a synchronous comm hook, span a blocked wait, not compute).
  comm = the rank's `collectives` rows from the Kineto source (ts/dur = gloo worker thread time),
  or, failing that, events on `pt_gloo_runloop` threads, plus the time training threads spend
  inside those communication calls (lane `comm:calls`); other = 0 on CPU ranks.
  Comms-log/flight-recorder rows never enter the breakdown (Kineto is the one clock here).
Windows: on GPU ranks the GPU steps (`windows: "gpu_steps"`): step N spans from the first kernel that
step N's CPU ops launched (kernels.step; steps.device_ts) to the next step's first kernel (the last
step: to its last kernel's end, device_ts + device_dur), so a device running a step behind its host is binned by what it runs; on CPU ranks
(and GPU ranks whose kernels carry no step) each `steps` row (ProfilerStep#N, every step including
the last, `windows: "steps"`). Steps are the `ProfilerStep#N` annotations, or, on a GPU trace without them,
the iterations the parser found where the trace repeats (`step_rule`: optimizer_step | graph_launch |
repeated_ops). A GPU rank without steps is one window from its first to its last device event
(`windows: "device_span"`, as TraceLens: host-only time before or after is not idle); a CPU rank without
steps one from its first to its last event (`windows: "trace"`).
Device work outside the windows is not counted (HTA spans first to last kernel and drops the last
step; see docs/metrics.md and tests/analyze/test_hta_crosscheck.py).

Section `breakdown`:
    {"ranks": [{"rank", "steps", "step_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "other_ns",
                "idle_ns", "overlap_ratio", "bound": "compute|communication|sync_wait|idle",
                "sync_wait_ns", "exposed_transfer_ns", "carry_over_ns",
                "waited_for": {rank: ns}}],   # analysis.json "ranks" (§7)
     "owed_wait": [{"rank", "owed_ns", "owed_ns_per_step", "by_rank": {waiting rank: ns}}],  # most owed first
     "rank_details": [{"rank", "trace_kind": "gpu|cpu", "comm_source", "windows": "gpu_steps|steps|device_span|trace",
                       "step_rule": "profiler_step|optimizer_step|graph_launch|repeated_ops|device_span|trace",
                       "shares": {"compute", "exposed_comm", "other", "idle"}, "verdict_evidence": str}],
     "steps": [{"rank", "step" (null for a whole-trace window), "ts", "step_ns", "compute_ns",
                "comm_ns", "exposed_comm_ns", "other_ns", "idle_ns", "overlap_ratio", "bound"}],
     "unanalyzed_ranks": [{"rank", "reason"}],
     "timeline": {"lanes": ["compute", "comm:<dim or pg_name>", "comm:calls", ..., "other", "idle"],
                  "intervals": [[rank, lane, start_ns, end_ns], ...],   # lane = a name from "lanes"
                  "max_intervals": int, "min_gap_ns": int, "truncated_ranks": [int]}}
The timeline is down-sampled to at most `config.max_timeline_intervals` intervals by closing gaps
shorter than `min_gap_ns` (so short idle gaps disappear from the drawing, never from the numbers);
if even one interval per lane per window is too many, whole ranks are left out (`truncated_ranks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analyze import intervals as iv
from tracekit.analyze.base import AnalysisConfig, AnalyzerResult
from tracekit.analyze.layout import LayoutResult, dims_of
from tracekit.analyze.matching import MatchingResult, matched_of
from tracekit.tables.store import RunStore

ACTIVITY_CACHE_MAX_RANKS = 256


@dataclass
class RankActivity:
    """A rank's busy intervals (disjoint sets, ns on its clock) and analysis windows."""

    rank: int
    trace_kind: str
    windows: list[tuple[int | None, int, int]]
    window_source: str
    compute: iv.IntervalSet
    comm: iv.IntervalSet
    other: iv.IntervalSet
    comm_by_group: dict[str, iv.IntervalSet] = field(default_factory=dict)
    comm_source: str = "none"
    carry_over_ns: int = 0
    """GPU: device time of kernels left over from before profiling (no launch in the trace, before the
    first linked kernel): in no step, not in the windows' busy sets."""
    step_rule: str = "profiler_step"
    """How the windows were found: profiler_step | optimizer_step | graph_launch | repeated_ops (steps),
    device_span (GPU, no steps: first to last device event) or trace (CPU, no steps)."""


def _np(table: pa.Table, col: str) -> np.ndarray:
    return table.column(col).to_numpy(zero_copy_only=False)


def _starts_ends(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    table = table.filter(pc.is_valid(table["dur"]))
    ts = _np(table, "ts").astype(np.int64)
    return ts, ts + _np(table, "dur").astype(np.int64)


def _leaf_mask(ops: pa.Table) -> np.ndarray:
    """Ops with no other op starting inside them on the same thread (host ops nest properly per thread)."""
    n = ops.num_rows
    if n == 0:
        return np.zeros(0, dtype=bool)
    tid = np.nan_to_num(ops.column("tid").to_numpy(zero_copy_only=False).astype(float), nan=-1.0)
    ts = ops.column("ts").to_numpy(zero_copy_only=False).astype(np.int64)
    end = ts + ops.column("dur").to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.lexsort((-end, ts, tid))  # by thread, start, longest first (parent before child)
    t_s, s_s, e_s = tid[order], ts[order], end[order]
    leaf_sorted = np.ones(n, dtype=bool)
    leaf_sorted[:-1] = (t_s[1:] != t_s[:-1]) | (s_s[1:] >= e_s[:-1])
    leaf = np.empty(n, dtype=bool)
    leaf[order] = leaf_sorted
    return leaf


def _is(table: pa.Table, col: str, value: str) -> pa.ChunkedArray:
    """Rows whose dictionary column `col` (events.role / lane / cat, set by the parser) equals `value`."""
    return pc.fill_null(pc.equal(table.column(col).cast(pa.string()), value), False)


def gpu_step_windows(steps: list[dict[str, Any]]) -> list[tuple[int | None, int, int]]:
    """GPU step windows (DESIGN §3) from `steps` rows with device_ts/device_dur (the first start and
    last end of the kernels the step's CPU ops launched, kernels.step): step N spans from its first
    kernel to the next step's first kernel; the last step to its last kernel's end."""
    dev = sorted((s["device_ts"], s["step"], s["device_ts"] + s["device_dur"]) for s in steps
                 if s.get("device_ts") is not None and s.get("device_dur") is not None)
    wins = []
    for i, (lo, step, last_end) in enumerate(dev):
        hi = dev[i + 1][0] if i + 1 < len(dev) else last_end
        if hi > lo:
            wins.append((step, lo, hi))
    return wins


def _windows(store: RunStore, rank: int, rank_row: dict[str, Any], busy_bounds: tuple[int, int] | None,
             gpu: bool = False) -> tuple[list[tuple[int | None, int, int]], str, str]:
    """(windows, window source, step rule). The step rule says how the steps were found (`steps.rule`:
    profiler_step, or iterations where a trace without ProfilerStep repeats: optimizer_step |
    graph_launch | repeated_ops); without steps, a GPU rank is one window from its first to its last
    device event (`device_span`: host-only time outside it is not idle) and a CPU rank one from its
    first to its last event (`trace`)."""
    have = set(store.columns("steps"))
    cols = ["step", "ts", "dur"] + [c for c in ("device_ts", "device_dur", "rule") if c in have]
    steps = store.rank_table("steps", rank, cols).to_pylist()
    rule = next((s.get("rule") for s in steps if s.get("rule")), "profiler_step")
    if gpu:
        wins = gpu_step_windows(steps)
        if wins:
            return wins, "gpu_steps", rule
        if busy_bounds is not None and not steps:
            lo, hi = busy_bounds  # first to last device event (carry-over excluded, as from the busy sets)
            return ([(None, int(lo), int(hi))] if hi > lo else []), "device_span", "device_span"
    wins = [(s["step"], s["ts"], s["ts"] + s["dur"]) for s in steps if s["dur"] and s["dur"] > 0]
    if wins:
        return sorted(wins, key=lambda w: w[1]), "steps", rule
    lo, hi = rank_row.get("first_ts"), rank_row.get("last_ts")
    if lo is None or hi is None:
        if busy_bounds is None:
            return [], "none", "none"
        lo, hi = busy_bounds
    return ([(None, int(lo), int(hi))] if hi > lo else []), "trace", "trace"


def gpu_activity(kernels: pa.Table, dims: dict[str, str] | None = None
                 ) -> tuple[iv.IntervalSet, iv.IntervalSet, iv.IntervalSet, dict[str, iv.IntervalSet]]:
    """compute / comm / other (memcpy+memset) sets and comm per lane from kernel rows (ts, dur, kind, pg_name)."""
    dims = dims or {}
    kind = kernels.column("kind").cast(pa.string())
    sel = lambda m: kernels.filter(pc.fill_null(m, False))  # noqa: E731
    compute = iv.union(*_starts_ends(sel(pc.equal(kind, "compute"))))
    comm_rows = sel(pc.equal(kind, "comm"))
    comm_rows = comm_rows.filter(pc.is_valid(comm_rows["dur"]))
    comm = iv.union(*_starts_ends(comm_rows))
    other = iv.union(*_starts_ends(sel(pc.is_in(kind, pa.array(["memcpy", "memset"])))))
    comm_by_group: dict[str, iv.IntervalSet] = {}
    if comm_rows.num_rows:
        s, e = _starts_ends(comm_rows)
        keys = np.array([_lane_key(g, dims) for g in comm_rows.column("pg_name").to_pylist()], dtype=object)
        for key in sorted(set(keys.tolist())):
            m = keys == key
            comm_by_group[key] = iv.union(s[m], e[m])
    return compute, comm, other, comm_by_group


def cpu_activity(store: RunStore, rank: int, dims: dict[str, str]
                 ) -> tuple[iv.IntervalSet, iv.IntervalSet, iv.IntervalSet, dict[str, iv.IntervalSet], str]:
    """A CPU rank's compute / comm / other intervals, comm per lane, and where comm came from."""
    comm_by_group: dict[str, iv.IntervalSet] = {}
    ev = store.rank_table("events", rank, ["cat", "ts", "dur", "tid", "stream", "role", "lane"])
    ev = ev.filter(pc.and_(pc.is_valid(ev["dur"]), pc.is_null(ev["stream"])))
    on_comm_thread = _is(ev, "lane", "comm_thread")
    issue = _is(ev, "role", "comm")  # ops that issue or wait for communication (c10d::, comm:, ...)
    train = pc.invert(on_comm_thread)
    ops = ev.filter(pc.and_(_is(ev, "cat", "cpu_op"), train))
    leaf = _leaf_mask(ops)
    # a step annotation, data loading or tracekit's own work is never compute
    not_issue = _is(ops, "role", "compute").to_numpy(zero_copy_only=False)
    s_ops, e_ops = _starts_ends(ops)
    compute_all = iv.union(s_ops[not_issue], e_ops[not_issue])
    compute_leaf = iv.union(s_ops[not_issue & leaf], e_ops[not_issue & leaf])
    other_all = iv.union(*_starts_ends(ev.filter(pc.and_(train, issue))))
    coll = store.rank_table("collectives", rank, ["source", "pg_name", "ts", "dur"])
    coll = coll.filter(pc.and_(pc.fill_null(pc.equal(coll["source"].cast(pa.string()), "kineto"), False),
                               pc.is_valid(coll["dur"])))
    if coll.num_rows:
        s, e = _starts_ends(coll)
        comm = iv.union(s, e)
        keys = np.array([_lane_key(g, dims) for g in coll.column("pg_name").to_pylist()], dtype=object)
        for key in sorted(set(keys.tolist())):
            m = keys == key
            comm_by_group[key] = iv.union(s[m], e[m])
        comm_source = "collectives(kineto)"
    else:
        s, e = _starts_ends(ev.filter(on_comm_thread))
        comm = iv.union(s, e)
        if s.size:
            comm_by_group["comm"] = comm
        comm_source = "comm-thread events" if s.size else "none"
    # the training thread inside a communication call (issuing it, or blocked in a synchronous
    # one before/while the worker runs it) is communicating too; CPU traces have no "other" work
    calls = iv.subtract(other_all, comm)
    if calls[0].size:
        comm_by_group["comm:calls"] = calls
        comm_source += " + comm calls on training threads"
    comm = iv.merge(comm, other_all)
    other = iv.empty()
    # inside an op that issues/waits for communication only leaf ops count as compute: the ops
    # enclosing it (e.g. an autograd node running a synchronous comm hook) span a blocked wait
    compute = iv.merge(iv.subtract(compute_all, other_all), iv.intersect(compute_leaf, other_all))
    return compute, comm, other, comm_by_group, comm_source


def load_rank_activity(store: RunStore, rank: int, rank_row: dict[str, Any],
                       dims: dict[str, str] | None = None) -> RankActivity:
    """Read one rank's tables and build its compute / comm / other interval sets."""
    dims = dims or {}
    kcols = set(store.columns("kernels"))
    kernels = store.rank_table("kernels", rank, ["ts", "dur", "kind", "pg_name"]
                               + (["carry_over"] if "carry_over" in kcols else []))
    comm_by_group: dict[str, iv.IntervalSet] = {}
    carry_ns = 0
    if kernels.num_rows:
        if "carry_over" in kernels.column_names:
            carry = pc.fill_null(kernels["carry_over"], False)
            carried = kernels.filter(carry)
            carry_ns = iv.total(iv.union(*_starts_ends(carried)))
            kernels = kernels.filter(pc.invert(carry))
        compute, comm, other, comm_by_group = gpu_activity(kernels, dims)
        trace_kind, comm_source = "gpu", "kernels"
    else:
        trace_kind = "cpu"
        compute, comm, other, comm_by_group, comm_source = cpu_activity(store, rank, dims)
    bounds = None
    allb = iv.merge(compute, comm, other)
    if allb[0].size:
        bounds = (int(allb[0][0]), int(allb[1][-1]))
    windows, wsrc, rule = _windows(store, rank, rank_row, bounds, gpu=trace_kind == "gpu")
    return RankActivity(rank=rank, trace_kind=trace_kind, windows=windows, window_source=wsrc,
                        compute=compute, comm=comm, other=other, comm_by_group=comm_by_group,
                        comm_source=comm_source, carry_over_ns=carry_ns, step_rule=rule)


def _lane_key(pg_name: str | None, dims: dict[str, str]) -> str:
    if pg_name is None:
        return "comm"
    dim = dims.get(pg_name)
    if dim and dim != "unknown":
        return f"comm:{dim}"
    return f"comm:{pg_name}"


def rank_rows(store: RunStore) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r for r in store.table("ranks").to_pylist()}


@dataclass(frozen=True)
class RankActivities(AnalyzerResult):
    """Every rank's activity, on demand: those computed ahead (an engine's prefetch) are held, the
    others are loaded from the store when asked for and kept while the run is small enough."""

    store: RunStore | None = None
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    """The `ranks` table row of each rank."""
    dims: dict[str, str] = field(default_factory=dict)
    """pg_name -> dim (from the layout)."""
    held: dict[int, RankActivity] = field(default_factory=dict)
    max_held: int = ACTIVITY_CACHE_MAX_RANKS

    def get(self, rank: int) -> RankActivity:
        if rank in self.held:
            return self.held[rank]
        act = load_rank_activity(self.store, rank, self.rows.get(rank, {}), self.dims)
        if len(self.held) < self.max_held:
            self.held[rank] = act
        return act


def rank_activities(store: RunStore, layout: LayoutResult | None) -> RankActivities:
    """The `activity` analyzer: ranks' activities, computed when first asked for (no section)."""
    return RankActivities(store=store, rows=rank_rows(store), dims=dims_of(layout))


def activities_of(store: RunStore, activity: RankActivities | None) -> RankActivities:
    """`activity`, or an on-demand one without the layout's group names when it is missing."""
    return activity if activity is not None else rank_activities(store, None)


@dataclass
class WindowBreakdown:
    compute_ns: int
    comm_ns: int
    overlapped_ns: int
    exposed_comm_ns: int
    other_ns: int
    idle_ns: int
    span_ns: int
    sync_wait_ns: int = 0
    """Part of exposed_comm_ns spent waiting for late peers (before the group's last arrival)."""

    @property
    def exposed_transfer_ns(self) -> int:
        return self.exposed_comm_ns - self.sync_wait_ns


def window_breakdown(act: RankActivity, lo: int, hi: int, wait: iv.IntervalSet | None = None) -> WindowBreakdown:
    """The exclusive breakdown of one window [lo, hi); `wait`: the rank's waiting-for-peers intervals
    (matching.py), which split exposed communication into sync wait and transfer."""
    c = iv.clip(act.compute, lo, hi)
    m = iv.clip(act.comm, lo, hi)
    o = iv.clip(act.other, lo, hi)
    compute_ns = iv.total(c)
    comm_ns = iv.total(m)
    overlapped = iv.total(iv.intersect(m, c))
    exposed = comm_ns - overlapped
    other_ns = iv.total(iv.subtract(o, iv.merge(c, m)))
    span = hi - lo
    idle = span - compute_ns - exposed - other_ns
    sync = 0
    if wait is not None and wait[0].size:
        sync = iv.total(iv.intersect(iv.subtract(m, c), iv.clip(wait, lo, hi)))
    return WindowBreakdown(compute_ns, comm_ns, overlapped, exposed, other_ns, max(idle, 0), span, sync)


def window_waited_for(act: RankActivity, lo: int, hi: int, by_peer: dict[int, iv.IntervalSet] | None
                      ) -> dict[int, int]:
    """The window's sync wait split by whom the rank waited for (matching.py `wait_by_peer`: disjoint
    sets, so the parts sum to `window_breakdown`'s `sync_wait_ns`)."""
    if not by_peer:
        return {}
    exposed = iv.subtract(iv.clip(act.comm, lo, hi), iv.clip(act.compute, lo, hi))
    out = {peer: iv.total(iv.intersect(exposed, iv.clip(w, lo, hi))) for peer, w in by_peer.items()}
    return {peer: int(ns) for peer, ns in out.items() if ns > 0}


def owed_wait(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank that others waited for: the wait it caused on them (their `waited_for` entries naming it),
    in total over each waiter's analyzed steps, per step (each waiter's total / its steps, summed) and by
    waiter; most owed first."""
    owed: dict[int, dict[int, int]] = {}
    per_step: dict[int, float] = {}
    for row in ranks:
        for peer, ns in (row.get("waited_for") or {}).items():
            owed.setdefault(int(peer), {})[row["rank"]] = int(ns)
            per_step[int(peer)] = per_step.get(int(peer), 0.0) + ns / max(row["steps"], 1)
    out = [{"rank": late, "owed_ns": sum(by.values()), "owed_ns_per_step": int(per_step[late]),
            "by_rank": {str(w): ns for w, ns in sorted(by.items())}} for late, by in owed.items()]
    return sorted(out, key=lambda x: (-x["owed_ns"], x["rank"]))


def verdict(compute_ns: int, exposed_ns: int, other_ns: int, idle_ns: int,
            sync_wait_ns: int = 0) -> tuple[str, str]:
    """compute- / communication- / sync_wait- / idle-bound: the largest of compute (+ other device work),
    exposed transfer (exposed comm less the wait for late peers), sync wait, idle. A rank waiting for a
    late peer is not communication-bound: the peer is the cause (see `straggler`)."""
    busy = compute_ns + other_ns
    parts = {"compute": busy, "communication": exposed_ns - sync_wait_ns, "sync_wait": sync_wait_ns,
             "idle": idle_ns}
    bound = max(parts, key=lambda k: (parts[k], k == "compute"))
    total = max(busy + exposed_ns + idle_ns, 1)
    ev = ", ".join(f"{k} {100.0 * v / total:.1f}%" for k, v in parts.items())
    return bound, f"largest share is {bound} ({ev} of step time)"


def _row(rank: int, nsteps: int, w: WindowBreakdown) -> dict[str, Any]:
    bound, _ = verdict(w.compute_ns, w.exposed_comm_ns, w.other_ns, w.idle_ns, w.sync_wait_ns)
    return {
        "rank": rank, "steps": nsteps, "step_ns": int(w.span_ns), "compute_ns": int(w.compute_ns),
        "comm_ns": int(w.comm_ns), "exposed_comm_ns": int(w.exposed_comm_ns), "other_ns": int(w.other_ns),
        "idle_ns": int(w.idle_ns),
        "overlap_ratio": (round(w.overlapped_ns / w.comm_ns, 6) if w.comm_ns else None),
        "bound": bound,
        "sync_wait_ns": int(w.sync_wait_ns), "exposed_transfer_ns": int(w.exposed_transfer_ns),
    }


def _close_gaps(a: iv.IntervalSet, gap_ns: int) -> iv.IntervalSet:
    s, e = a
    if s.size < 2:
        return a
    keep = (s[1:] - e[:-1]) >= gap_ns
    starts = np.concatenate(([s[0]], s[1:][keep]))
    ends = np.concatenate((e[:-1][keep], [e[-1]]))
    return starts, ends


def _timeline(lanes_by_rank: dict[int, dict[str, iv.IntervalSet]], budget: int) -> dict[str, Any]:
    gap = 0
    count = lambda: sum(a[0].size for lanes in lanes_by_rank.values() for a in lanes.values())  # noqa: E731
    span = 1
    for lanes in lanes_by_rank.values():
        for a in lanes.values():
            if a[0].size:
                span = max(span, int(a[1][-1] - a[0][0]))
    while count() > budget and gap <= span:
        gap = 1000 if gap == 0 else gap * 4
        lanes_by_rank = {r: {k: _close_gaps(a, gap) for k, a in lanes.items()}
                         for r, lanes in lanes_by_rank.items()}
    truncated: list[int] = []
    kept: dict[int, dict[str, iv.IntervalSet]] = {}
    used = 0
    for r in sorted(lanes_by_rank):
        n = sum(a[0].size for a in lanes_by_rank[r].values())
        if used + n > budget:
            truncated.append(r)
            continue
        kept[r] = lanes_by_rank[r]
        used += n
    lane_names = sorted({k for lanes in kept.values() for k in lanes},
                        key=lambda k: (k != "compute", k == "idle", k == "other", k))
    out = []
    for r, lanes in kept.items():
        for k, (s, e) in lanes.items():
            out.extend([r, k, int(a), int(b)] for a, b in zip(s.tolist(), e.tolist()))
    out.sort(key=lambda x: (x[0], x[2]))
    return {"lanes": lane_names, "intervals": out, "max_intervals": budget, "min_gap_ns": gap,
            "truncated_ranks": truncated}


@dataclass(frozen=True)
class BreakdownResult(AnalyzerResult):
    @property
    def ranks(self) -> list[dict[str, Any]]:
        """analysis.json's `ranks` rows (totals over each rank's analyzed steps)."""
        return (self.section or {}).get("ranks", [])


def breakdown_ranks(breakdown: BreakdownResult | None) -> list[dict[str, Any]]:
    return breakdown.ranks if breakdown is not None else []


def analyze_breakdown(store: RunStore, activity: RankActivities | None, matching: MatchingResult | None,
                      config: AnalysisConfig) -> BreakdownResult:
    activity = activities_of(store, activity)
    ranks_out, details, step_rows, unanalyzed = [], [], [], []
    lanes_by_rank: dict[int, dict[str, iv.IntervalSet]] = {}
    matched = matched_of(matching)
    waits = matched.wait_intervals if matched is not None else {}
    by_peer = matched.wait_by_peer if matched is not None else {}
    for rank in store.ranks():
        act = activity.get(rank)
        if not act.windows:
            unanalyzed.append({"rank": rank, "reason": "no events with durations in the trace"})
            continue
        tot = WindowBreakdown(0, 0, 0, 0, 0, 0, 0)
        waited: dict[int, int] = {}
        for step, lo, hi in act.windows:
            w = window_breakdown(act, lo, hi, waits.get(rank))
            for peer, ns in window_waited_for(act, lo, hi, by_peer.get(rank)).items():
                waited[peer] = waited.get(peer, 0) + ns
            row = _row(rank, 1, w)
            del row["steps"]
            step_rows.append({"rank": rank, "step": step, "ts": int(lo), **{k: v for k, v in row.items() if k != "rank"}})
            tot = WindowBreakdown(*(a + b for a, b in zip(vars(tot).values(), vars(w).values())))
        ranks_out.append({**_row(rank, len(act.windows), tot), "carry_over_ns": int(act.carry_over_ns),
                          "waited_for": {str(p): ns for p, ns in sorted(waited.items())}})
        span = max(tot.span_ns, 1)
        bound, why = verdict(tot.compute_ns, tot.exposed_comm_ns, tot.other_ns, tot.idle_ns, tot.sync_wait_ns)
        details.append({
            "rank": rank, "trace_kind": act.trace_kind, "comm_source": act.comm_source,
            "windows": act.window_source, "step_rule": act.step_rule,
            "shares": {"compute": tot.compute_ns / span, "exposed_comm": tot.exposed_comm_ns / span,
                       "exposed_transfer": tot.exposed_transfer_ns / span, "sync_wait": tot.sync_wait_ns / span,
                       "other": tot.other_ns / span, "idle": tot.idle_ns / span},
            "verdict_evidence": why,
        })
        lanes_by_rank[rank] = _rank_lanes(act)
    section = {
        "ranks": ranks_out,
        "owed_wait": owed_wait(ranks_out),
        "rank_details": details,
        "steps": step_rows,
        "unanalyzed_ranks": unanalyzed,
        "timeline": _timeline(lanes_by_rank, config.max_timeline_intervals),
    }
    return BreakdownResult(findings=[], section=section)


def _rank_lanes(act: RankActivity) -> dict[str, iv.IntervalSet]:
    win = iv.union([w[1] for w in act.windows], [w[2] for w in act.windows])
    compute = iv.intersect(act.compute, win)
    lanes = {"compute": compute}
    busy = [compute]
    for key, a in act.comm_by_group.items():
        a = iv.intersect(a, win)
        lanes[key] = a
        busy.append(a)
    other = iv.subtract(iv.intersect(act.other, win), iv.merge(*busy))
    lanes["other"] = other
    busy.append(other)
    lanes["idle"] = iv.subtract(win, iv.merge(*busy))
    return {k: v for k, v in lanes.items() if v[0].size}
