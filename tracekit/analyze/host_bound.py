"""Host-side diagnosis of GPU ranks (DESIGN §10 "Hosts starve"): is the device waiting for its host?

Per GPU rank and step (the kernels the step launched, `kernels.step`; a rank without steps: the breakdown's one
window, its first to last device event, as one step holding its kernels and the host ops overlapping it,
`span_as_step`):
- **device busy**: union of the step's kernels; **host busy**: union of the step's host ops and runtime
  calls (`cpu_op`, CUDA/HIP runtime and driver calls) on every host thread of the rank;
- **launch wait**: time the device sat idle waiting for a launch: for each kernel, the part of
  [end of all earlier device work, its launch call's end] before the kernel started (the device had
  finished everything launched so far and the next launch had not returned yet); of it, the part the
  host spent inside ops (**busy**): the rest is the host in a gap, a stall (`host_stalls`' finding);
- **slow host ops**: host ops whose own time (less their children) is far longer than the same op's
  (same name) median over every rank and step — at least `SLOW_FACTOR` times it and `SLOW_MIN_NS` more:
  a thread that lost its core inside a trivial call (a 29 ms `aten::view`: too few cores for the ranks,
  GIL contention). Calls that wait for the device (`*Synchronize*`, blocking memcpy, a launch blocked on
  a full launch queue, a call that returned when its own op ended) and communication calls are waits,
  never slow; nor is the first launch, in the rank's first step, of a kernel the trace had not run before
  (CUDA/HIP load its module then: a warm-up, counted apart as **first-launch** time);
- **data loading**: PyTorch's `enumerate(DataLoader)` ranges (the parser's `data_load` role);
- **what the launching thread did** while the device waited on a busy host (`wait_in_ops`): each kernel's busy
  launch wait on the thread of its launch call, given to the innermost op running there, by op name; of it,
  **host work** (`host_work_ns`): time inside ops that launch nothing on the device (no runtime launch call
  in or below them: CPU tensor ops, preprocessing).

Finding `host_bound` (one for the run, ranks = those whose device waited on a busy host's launches at
least `LAUNCH_INFO` of the step): severity from the worst rank's busy launch-wait share of its step (a step:
first kernel to the next step's first kernel, DESIGN §3). The cause is named only from what the trace
shows: "starved host thread" when the slow ops' excess (of the analysed steps) covers at least half the busy
launch wait, else "first launch" when first launches' excess does (a warm-up: info, no saving), else "host work"
when ops that launch nothing hold at least half of it, else "launch overhead" (host dispatch slower than the
kernels it launches). The summary names the top ops the launching thread was inside. Data loading is not busy: a device
waiting on it is `host_stalls`' `idle_host_bound`. The closed-form saving of a starved host or of launch
overhead is the worst rank's busy launch wait per step; the critical path replays the fix and re-grades the
finding by it: slow ops at their median on every rank (`whatif.fixes` `host_repair`), or the named ranks'
launches ahead of their devices as CUDA graphs keep them (`host_ahead`: launch calls and dispatch time
between them cost nothing; stalls, data loading and waits for the device stay), an upper bound of what
fewer, larger launches save; host work: the named ranks' host time between launches removed (`host_work`, an
upper bound: idle gaps there go too).

Section `host_bound`:
    {"ranks": [{"rank", "steps", "step_ns", "host_busy_ns", "device_busy_ns", "launch_wait_ns",
                "launch_wait_busy_ns", "slow_ops_ns", "first_launch_ns", "slow_ops", "data_load_ns",
                "host_work_ns", "wait_in_ops": {op name: ns}}],     # *_ns: means per step
     "slow_ops": [{"name", "count", "excess_ns", "median_ns", "longest_ns"}],   # over the run, worst first
     "thresholds": {"slow_factor", "slow_min_ns", "info", "warning", "critical"}}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.derive import intervals as iv
from tracekit.derive.activity import SteplessResult, windows_of
from tracekit.derive.host_ops import (SLOW_FACTOR, SLOW_MIN_NS, OpSummary, SlowOps, candidate_excess, device_ops,
                                      host_ops, innermost_time, launches_below, name_medians, slow_ops_from,
                                      summarize_ops)
from tracekit.findings.evidence import HostBoundEvidence
from tracekit.findings.finding import Finding, FindingKind, Severity, severity_by_share
from tracekit.findings.result import AnalyzerResult
from tracekit.parse.dict_columns import text_test
from tracekit.tables.columns import Columns, num_rows, sorted_codes, take
from tracekit.tables.store import RunStore
from tracekit.whatif.build import SPAN_STEP

NO_STEP = -1
"""The step of a row in no step (host_ops / device_ops fill a null step with it)."""

LAUNCH_INFO = 0.05
LAUNCH_WARNING = 0.10
LAUNCH_CRITICAL = 0.30
"""Launch wait / step for an info, warning and critical finding."""
WAIT_OPS_SHOWN = 5
"""Host ops named per rank in `wait_in_ops` (the most launch wait first)."""

def launch_wait(k_ts: np.ndarray, k_end: np.ndarray, launch_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel (any order): the interval [lo, hi) the device sat idle before it waiting for its launch to
    return: from the end of all device work that started earlier to min(its start, its launch's end);
    empty (lo = hi) where the launch is unknown (-1) or returned while the device was still busy."""
    o = np.argsort(k_ts, kind="stable")
    prev = np.r_[np.iinfo(np.int64).min, np.maximum.accumulate(k_end[o])[:-1]]
    wait = np.where((launch_end[o] >= 0) & (launch_end[o] > prev) & (prev > np.iinfo(np.int64).min),
                    np.minimum(k_ts[o], launch_end[o]) - prev, 0)
    lo, hi = np.zeros(k_ts.size, np.int64), np.zeros(k_ts.size, np.int64)
    lo[o] = np.where(wait > 0, prev, 0)
    hi[o] = lo[o] + np.maximum(wait, 0)
    return lo, hi


def _launch_rows(kern: Columns, ops: Columns) -> np.ndarray:
    """Per kernel: the row of `ops` of the runtime call that launched it (same correlation id), -1 if none."""
    rt = np.flatnonzero(ops["runtime"] & (ops["corr"] >= 0))
    o = rt[np.argsort(ops["corr"][rt], kind="stable")]
    j = np.clip(np.searchsorted(ops["corr"][o], kern["corr"]), 0, max(o.size - 1, 0))
    hit = (o.size > 0) & (kern["corr"] >= 0) & (ops["corr"][o[j]] == kern["corr"]) if o.size else np.zeros(
        kern["corr"].size, bool)
    return np.where(hit, o[j] if o.size else 0, -1)


def _wait_in_ops(ops: Columns, launch: np.ndarray, lo: np.ndarray, hi: np.ndarray, busy: iv.IntervalSet,
                 steps: list[int], kstep: np.ndarray) -> dict[int, tuple[dict[str, int], int]]:
    """Per step (`steps`; `kstep`: each kernel's): what the launching threads did while the device waited on a
    busy host: each kernel's busy launch wait on the thread of the call that launched it, given to the innermost
    host op running there (`innermost_time`), summed by op name; and the part of it inside ops that launch no
    device work (`launches_below`: host work such as CPU tensor ops, not launch dispatch). The call stacks are
    found once per rank, and only where the device waited at all."""
    waited = (hi > lo) & (launch >= 0)
    if not waited.any():
        return {}
    parent = ops["parent"]
    work_op = ~ops["runtime"] & ~launches_below(ops, parent)
    out = {}
    for s in steps:
        w = np.flatnonzero(waited & (kstep == s))
        if not w.size:
            continue
        tids = ops["tid"][launch[w]]
        spans = {int(t): iv.intersect(iv.union(lo[w][tids == t], hi[w][tids == t]), busy)
                 for t in np.unique(tids).tolist()}
        own = innermost_time(ops, parent, spans)
        held = np.flatnonzero(own > 0)
        code, uniq = sorted_codes(ops["name"][held])
        ns = np.zeros(len(uniq), np.int64)
        np.add.at(ns, code, own[held])
        out[s] = ({str(n): int(v) for n, v in zip(uniq, ns.tolist())}, int(own[held[work_op[held]]].sum()))
    return out


def _data_load(store: RunStore, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = store.rank_table("events", rank, ["ts", "dur", "role", "step"])
    t = t.filter(pc.and_(pc.fill_null(text_test(t["role"], pc.equal, "data_load"), False),
                         pc.is_valid(t["dur"])))
    ts = t.column("ts").to_numpy().astype(np.int64)
    return ts, ts + t.column("dur").to_numpy().astype(np.int64), t.column("step").fill_null(-1).to_numpy()


def span_as_step(cols: Columns, window: tuple[int, int]) -> Columns:
    """`cols` (kernels or host ops: step, ts, end) with every row without a step (-1) that overlaps `window` (a
    rank without steps: the breakdown's one window, derive/activity.py `stepless_window`) in the window's step,
    SPAN_STEP, as the critical path's device-span step holds them (whatif/build.py)."""
    lo, hi = window
    span = (cols["step"] == NO_STEP) & (cols["ts"] < hi) & (cols["end"] > lo)
    return {**cols, "step": np.where(span, SPAN_STEP, cols["step"])}


def rank_rows(store: RunStore, rank: int, kern: Columns, ops: Columns, excess: np.ndarray,
              first_excess: np.ndarray | None = None) -> dict[str, Any] | None:
    """Per-step means of one GPU rank (section row), None without a step."""
    steps = np.unique(kern["step"][kern["step"] != NO_STEP])
    if steps.size == 0:
        return None
    launch = _launch_rows(kern, ops)
    ends = ops["end"][np.maximum(launch, 0)] if ops["end"].size else np.zeros(launch.size, np.int64)
    lo, hi = launch_wait(kern["ts"], kern["end"], np.where(launch >= 0, ends, -1))
    dl_ts, dl_end, dl_step = _data_load(store, rank)
    busy = iv.subtract(iv.union(ops["ts"], ops["end"]), iv.union(dl_ts, dl_end))  # loading is idle_host_bound's
    first = {int(x): int(kern["ts"][kern["step"] == x].min()) for x in steps.tolist()}
    first_excess = np.zeros(excess.size, np.int64) if first_excess is None else first_excess
    tot = dict.fromkeys(("step_ns", "host_busy_ns", "device_busy_ns", "launch_wait_ns", "launch_wait_busy_ns",
                         "slow_ops_ns", "first_launch_ns", "data_load_ns", "host_work_ns"), 0)
    slow_count = 0
    in_ops: dict[str, int] = {}
    waits = _wait_in_ops(ops, launch, lo, hi, busy, steps.tolist(), kern["step"])
    for s in steps.tolist():
        k, h, d = kern["step"] == s, ops["step"] == s, dl_step == s
        nxt = [first[x] for x in first if x > s]  # DESIGN §3: to the next step's first kernel (the last: its end)
        end = min(nxt) if nxt else int(kern["end"][k].max())
        tot["step_ns"] += end - first[s]
        tot["device_busy_ns"] += iv.total(iv.union(kern["ts"][k], kern["end"][k]))
        held = iv.union(ops["ts"][h], ops["end"][h])
        # the device span's step holds the ops overlapping it (no step annotation bounds them): inside it only
        tot["host_busy_ns"] += iv.total(iv.clip(held, first[s], end) if s == SPAN_STEP else held)
        tot["launch_wait_ns"] += int((hi - lo)[k].sum())
        tot["launch_wait_busy_ns"] += iv.total(iv.intersect(iv.union(lo[k], hi[k]), busy))
        names, work = waits.get(s, ({}, 0))
        tot["host_work_ns"] += work
        for name, ns in names.items():
            in_ops[name] = in_ops.get(name, 0) + ns
        tot["slow_ops_ns"] += int(excess[h].sum())
        tot["first_launch_ns"] += int(first_excess[h].sum())
        slow_count += int((excess[h] > 0).sum())
        tot["data_load_ns"] += iv.total(iv.union(dl_ts[d], dl_end[d]))
    n = int(steps.size)
    top = sorted(in_ops.items(), key=lambda kv: (-kv[1], kv[0]))[:WAIT_OPS_SHOWN]
    return {"rank": rank, "steps": n, **{k: v // n for k, v in tot.items()}, "slow_ops": slow_count,
            "wait_in_ops": {name: ns // n for name, ns in top}}


def slow_op_table(ops_by_rank: dict[int, Columns], excess: dict[int, np.ndarray], limit: int = 10) -> list[dict]:
    """The slow ops by name over the run, most excess first."""
    rows: dict[str, dict[str, Any]] = {}
    for r, ops in ops_by_rank.items():
        for i in np.flatnonzero(excess[r] > 0).tolist():
            row = rows.setdefault(ops["name"][i], {"name": ops["name"][i], "count": 0, "excess_ns": 0,
                                                   "median_ns": int(ops["self_ns"][i] - excess[r][i]),
                                                   "longest_ns": 0})
            row["count"] += 1
            row["excess_ns"] += int(excess[r][i])
            row["longest_ns"] = max(row["longest_ns"], int(ops["self_ns"][i]))
    return sorted(rows.values(), key=lambda x: -x["excess_ns"])[:limit]


def _severity(share: float) -> Severity | None:
    return severity_by_share(share, LAUNCH_INFO, LAUNCH_WARNING, LAUNCH_CRITICAL)


def _finding(rows: list[dict[str, Any]], slow: list[dict], slow_run: list[dict] | None = None) -> Finding | None:
    """`slow`: the slow ops of the analysed steps (named), `slow_run`: the run's (evidence; default `slow`)."""
    slow_run = slow if slow_run is None else slow_run
    bound = [r for r in rows if r["step_ns"] and r["launch_wait_busy_ns"] >= LAUNCH_INFO * r["step_ns"]]
    if not bound:
        return None
    worst = max(bound, key=lambda r: r["launch_wait_busy_ns"] / r["step_ns"])
    share = worst["launch_wait_busy_ns"] / worst["step_ns"]
    wait = sum(r["launch_wait_busy_ns"] for r in bound)
    slow_ns = sum(r["slow_ops_ns"] for r in bound)
    first_ns = sum(r.get("first_launch_ns", 0) for r in bound)
    work_ns = sum(r.get("host_work_ns", 0) for r in bound)
    cause = ("starved_host" if 2 * slow_ns >= wait else "first_launch" if 2 * first_ns >= wait
             else "host_work" if 2 * work_ns >= wait else "launch_overhead")
    named = ", ".join(f"{s['name']} up to {s['longest_ns'] / 1e6:.1f} ms (median {s['median_ns'] / 1e3:.0f} µs)"
                      for s in slow[:2])
    # with one analysed step per rank, "elsewhere" is other calls of the same step: nothing tells a thread that
    # lost its core from one-off work inside those calls (allocation, initialisation) that recurs in no step
    once = all(r["steps"] == 1 for r in bound)
    why = {"starved_host": f"host ops far slower than the same op elsewhere ({named}): a starved host thread"
                           + (" or one-off work inside those calls (one step: nothing shows it recur)" if once else ""),
           "first_launch": (f"first launches of kernels the trace had not run before took "
                            f"{first_ns / 1e6:.2f} ms beyond a launch's median: the runtime loads a kernel's "
                            "module on its first launch, a warm-up cost that later steps do not pay"),
           "host_work": (f"the host runs work that launches nothing on the device ({work_ns / 1e6:.2f} ms per step "
                         "inside such ops) before the launches the device waits for"),
           "launch_overhead": "launching takes longer than the kernels run"}
    inside = ", ".join(f"{name} {ns / 1e6:.2f} ms" for name, ns in list(worst.get("wait_in_ops", {}).items())[:3])
    summary = (f"the device waits for its busy host's launches {worst['launch_wait_busy_ns'] / 1e6:.2f} ms per step on rank "
               f"{worst['rank']} ({share:.0%} of its step; {len(bound)} of {len(rows)} ranks): {why[cause]}"
               + (f"; meanwhile the launching thread is inside {inside}" if inside else ""))
    rec = {"starved_host": "Give each rank's host thread its own cores (fewer ranks or threads per node, "
                           "OMP_NUM_THREADS, CPU affinity / numactl), keep other work off them, and look for GIL "
                           "contention (data-loader threads, logging) in the training process.",
           "first_launch": "Profile steps after warm-up (the profiler schedule's wait/warmup steps), or load "
                           "modules eagerly (CUDA_MODULE_LOADING=EAGER; HIP_ENABLE_DEFERRED_LOADING=0 on ROCm).",
           "host_work": "Move the host's own work (CPU tensor ops, preprocessing, cache flushing) off the training "
                        "step, to DataLoader workers or another thread, or onto the device (the replayed saving is an "
                        "upper bound: the host's time between launches removed).",
           "launch_overhead": "Launch fewer, larger kernels: CUDA graphs, torch.compile, fused ops (the replayed "
                              "saving is their upper bound: launches that cost the host nothing)."}[cause]
    ev = {"cause": cause, "launch_wait_ns": int(worst["launch_wait_busy_ns"]), "share_of_step": round(share, 6),
          "slow_ops_ns_per_step": {str(r["rank"]): r["slow_ops_ns"] for r in bound}, "slow_ops": slow_run[:5],
          "data_load_ns_per_step": {str(r["rank"]): r["data_load_ns"] for r in bound},
          "host_busy_ns": {str(r["rank"]): r["host_busy_ns"] for r in bound},
          "device_busy_ns": {str(r["rank"]): r["device_busy_ns"] for r in bound},
          "host_work_ns": int(worst.get("host_work_ns", 0)), "wait_in_ops": dict(worst.get("wait_in_ops", {}))}
    # the busy launch wait in closed form; the critical path replays the fix (starved host: slow ops at their
    # median; launch overhead: launches ahead of the device, an upper bound) and re-grades by it. First
    # launches: a warm-up the run's later steps do not pay
    saving = 0 if cause == "first_launch" else int(worst["launch_wait_busy_ns"])
    sev = Severity.INFO if cause == "first_launch" else _severity(share)
    return Finding(kind=FindingKind.HOST_BOUND, severity=sev, summary=summary,
                   ranks=tuple(int(r["rank"]) for r in bound), evidence=HostBoundEvidence.of(ev),
                   recommendation=rec, est_saving_ns=saving)


@dataclass(frozen=True)
class HostBoundResult(AnalyzerResult):
    slow_ops: SlowOps | None = None
    """Each GPU rank's slow host ops (`excess_ns` over every GPU rank's medians), for the what-if build's slow
    host time (whatif/build.py `slow_host_ops`): a few ops a rank, so the result travels from a worker."""

    travels = True


def analyze_host_bound(store: RunStore, stepless: SteplessResult | None = None) -> HostBoundResult:
    """Section `host_bound` and the `host_bound` finding (GPU ranks only; a rank without steps over the
    breakdown's one window, `stepless`'s, as one step: `span_as_step`). One rank's kernels and host ops
    in memory at a time: each rank's row is measured as it is read, with the slow-op parts (which need every
    rank's medians) added once all are read, from a per-rank summary (`OpSummary`)."""
    summ: dict[int, OpSummary] = {}
    partial: dict[int, tuple[dict[str, Any], np.ndarray]] = {}
    windows = windows_of(store, stepless)
    for r in store.ranks():
        kern = device_ops(store, r)
        if kern is not None and r in windows:
            kern = span_as_step(kern, windows[r])
        ops = host_ops(store, r, kern) if kern is not None else None
        if ops is None:
            continue
        if r in windows:
            ops = span_as_step(ops, windows[r])
        summ[r] = summarize_ops(ops)
        row = rank_rows(store, r, kern, ops, np.zeros(num_rows(ops), np.int64))
        if row is not None:
            partial[r] = (row, np.unique(kern["step"][kern["step"] != NO_STEP]))
        del kern, ops
    med = name_medians(summ)
    excess = {r: candidate_excess(s, med[r]) for r, s in summ.items()}
    first = {r: candidate_excess(s, med[r], first_launch=True) for r, s in summ.items()}
    rows = []
    stepped: dict[int, np.ndarray] = {}
    for r, (row, steps) in partial.items():  # rank_rows' slow-op sums, from the candidates (0 elsewhere)
        in_steps = stepped[r] = np.isin(summ[r].cand["step"], steps)
        n = int(steps.size)
        row["slow_ops_ns"] = int(excess[r][in_steps].sum()) // n
        row["first_launch_ns"] = int(first[r][in_steps].sum()) // n
        row["slow_ops"] = int((excess[r][in_steps] > 0).sum())
        rows.append(row)
    slow = slow_op_table({r: s.cand for r, s in summ.items()}, excess)
    # the finding names the slow ops of the analysed steps (a rank's set-up before them is not its cause)
    finding = _finding(rows, slow_op_table({r: take(summ[r].cand, m) for r, m in stepped.items()},
                                           {r: excess[r][m] for r, m in stepped.items()}), slow)
    section = {"ranks": rows, "slow_ops": slow,
               "thresholds": {"slow_factor": SLOW_FACTOR, "slow_min_ns": SLOW_MIN_NS, "info": LAUNCH_INFO,
                              "warning": LAUNCH_WARNING, "critical": LAUNCH_CRITICAL}}
    return HostBoundResult(findings=[finding] if finding else [], section=section,
                           slow_ops=slow_ops_from(summ, excess))
