"""Each rank's activity: its compute, communication and other device work as interval sets, and its
step windows — the derived fact the breakdown, stragglers, unoverlapped, recording and throughput
analyzers all read (the `activity` step of the analyzer plan; no section).

What counts as compute / comm / other on GPU and CPU ranks, and how the windows are chosen, is written
in analyze/breakdown.py's docstring (the definitions the breakdown publishes) and docs/metrics.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.derive import intervals as iv
from tracekit.derive.topology import LayoutResult, dims_of
from tracekit.findings.result import AnalyzerResult
from tracekit.parse.dict_columns import text_test
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
    return pc.fill_null(text_test(table.column(col), pc.equal, value), False)


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


STEPLESS_RULES = ("device_span", "trace")
"""The step rules of a rank analysed without steps: one window, its first to last device event (GPU) or event (CPU)."""


def stepless_window(act: RankActivity) -> tuple[int, int] | None:
    """(start, end) of the one window a rank without steps is analysed over (`STEPLESS_RULES`), the breakdown's;
    None on a rank with steps (or without a window). The analyzers that measure per step (host stalls, host-bound
    launch waits, stragglers' first collective) take this window as the step, so that a trace without ProfilerStep
    is analysed over the same window everywhere."""
    if act.step_rule not in STEPLESS_RULES or not act.windows:
        return None
    return int(act.windows[0][1]), int(act.windows[0][2])


def stepless_windows(store: RunStore, activity: "RankActivities | None", ranks: list[int] | None = None
                     ) -> dict[int, tuple[int, int]]:
    """`stepless_window` of each rank (of `ranks`, default every rank) without a row in the steps table; the
    activity is asked only of those (a run with steps loads none)."""
    stepped = set(store.table("steps", ["rank"]).column("rank").to_pylist()) if store.has("steps") else set()
    acts = None
    out = {}
    for r in store.ranks() if ranks is None else ranks:
        if int(r) in stepped:
            continue
        acts = activities_of(store, activity) if acts is None else acts
        w = stepless_window(acts.get(int(r)))
        if w is not None:
            out[int(r)] = w
    return out


def gpu_activity(kernels: pa.Table, dims: dict[str, str] | None = None
                 ) -> tuple[iv.IntervalSet, iv.IntervalSet, iv.IntervalSet, dict[str, iv.IntervalSet]]:
    """compute / comm / other (memcpy+memset) sets and comm per lane from kernel rows (ts, dur, kind, pg_name)."""
    dims = dims or {}
    kind = kernels.column("kind")
    sel = lambda m: kernels.filter(pc.fill_null(m, False))  # noqa: E731
    compute = iv.union(*_starts_ends(sel(text_test(kind, pc.equal, "compute"))))
    comm_rows = sel(text_test(kind, pc.equal, "comm"))
    comm_rows = comm_rows.filter(pc.is_valid(comm_rows["dur"]))
    comm = iv.union(*_starts_ends(comm_rows))
    other = iv.union(*_starts_ends(sel(text_test(kind, pc.is_in, pa.array(["memcpy", "memset"])))))
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
    coll = coll.filter(pc.and_(pc.fill_null(text_test(coll["source"], pc.equal, "kineto"), False),
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


@dataclass(frozen=True)
class SteplessResult(AnalyzerResult):
    """`stepless_window` of every rank without steps (no section): the one window the per-step analyzers take as
    its step. A few bytes a rank, so the analyzers that need nothing else of the activity run on an engine's
    workers with it (analyze/runner.py `SHIPPED_INPUTS`)."""

    by_rank: dict[int, tuple[int, int]] = field(default_factory=dict)


def analyze_stepless(store: RunStore, activity: RankActivities | None) -> SteplessResult:
    """The `stepless` derived fact: `stepless_windows` of every rank (none is loaded in a run with steps)."""
    return SteplessResult(by_rank=stepless_windows(store, activity))


def windows_of(store: RunStore, stepless: SteplessResult | None) -> dict[int, tuple[int, int]]:
    """`stepless`'s windows, or computed from the store when it is missing (its step failed or was not given)."""
    return stepless.by_rank if stepless is not None else stepless_windows(store, None)
