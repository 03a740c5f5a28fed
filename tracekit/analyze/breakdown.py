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
                  "max_intervals": int, "min_gap_ns": int, "truncated_ranks": [int],
                  "expanded_ranks": [{"rank", "why"}], "summarised_ranks": [int], "chosen_by": "all|busiest|user",
                  "ranks_not_in_run": [int]}}
Lanes at scale: up to TIMELINE_ALL_LANES_MAX_RANKS ranks, every rank gets a lane per kind. Beyond, each rank
gets one row (lanes `summary:compute`, `summary:comm`, `summary:other`, `summary:idle`, exclusive by the
breakdown's priority: compute ▸ communication not under compute ▸ other ▸ idle) and up to TIMELINE_EXPANDED
ranks keep a lane per kind: the rank with the most compute, the most exposed communication, the most idle
time (each once, `why` says which), then the next by compute. `config.timeline_ranks`
(`analyze --timeline-ranks 0-7,12`) draws exactly those ranks, a lane per kind each (`chosen_by: user`).
The timeline is down-sampled to at most `config.max_timeline_intervals` intervals by closing gaps
shorter than `min_gap_ns` (so short idle gaps disappear from the drawing, never from the numbers);
if even one interval per lane per window is too many, whole ranks are left out (`truncated_ranks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.config import AnalysisConfig
from tracekit.derive import intervals as iv
from tracekit.derive.activity import RankActivities, RankActivity, activities_of
from tracekit.derive.matching import MatchingResult, matched_of
from tracekit.findings.result import AnalyzerResult
from tracekit.tables.store import RunStore

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


TIMELINE_ALL_LANES_MAX_RANKS = 8
"""Up to this many ranks, every rank's timeline has a lane per kind (8 ranks x ~6 lanes stay readable)."""
TIMELINE_EXPANDED = 4
"""Beyond that, how many ranks keep a lane per kind next to one summary row per rank."""


def _summary_lanes(lanes: dict[str, iv.IntervalSet]) -> dict[str, iv.IntervalSet]:
    """One row's lanes for a rank: compute, communication not under compute, other, idle (exclusive)."""
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    compute = lanes.get("compute", empty)
    comm = [a for k, a in lanes.items() if k.startswith("comm")]
    out = {"summary:compute": compute,
           "summary:comm": iv.subtract(iv.merge(*comm), compute) if comm else empty,
           "summary:other": lanes.get("other", empty), "summary:idle": lanes.get("idle", empty)}
    return {k: v for k, v in out.items() if v[0].size}


def _expanded_ranks(totals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ranks whose lanes are drawn in full at scale, each with why (see the module doc)."""
    picks: list[dict[str, Any]] = []
    for key, why in (("compute_ns", "most compute"), ("exposed_comm_ns", "most exposed communication"),
                     ("idle_ns", "most idle time")):
        if not totals:
            break
        best = max(totals, key=lambda r: (r[key] / max(r["steps"], 1), -r["rank"]))
        if best[key] > 0 and all(p["rank"] != best["rank"] for p in picks):
            picks.append({"rank": best["rank"], "why": why})
    for r in sorted(totals, key=lambda r: (-r["compute_ns"] / max(r["steps"], 1), r["rank"])):
        if len(picks) >= TIMELINE_EXPANDED:
            break
        if all(p["rank"] != r["rank"] for p in picks):
            picks.append({"rank": r["rank"], "why": "next by compute"})
    return picks[:TIMELINE_EXPANDED]


def _choose_lanes(lanes_by_rank: dict[int, dict[str, iv.IntervalSet]], totals: list[dict[str, Any]],
                  chosen: tuple[int, ...] | None) -> tuple[dict[int, dict[str, iv.IntervalSet]], dict[str, Any]]:
    """Which ranks the timeline draws and how (a lane per kind, or one summary row)."""
    if chosen is not None:
        want = sorted(set(chosen))
        keep = {r: lanes_by_rank[r] for r in want if r in lanes_by_rank}
        return keep, {"expanded_ranks": [{"rank": r, "why": "chosen"} for r in keep], "summarised_ranks": [],
                      "chosen_by": "user", "ranks_not_in_run": [r for r in want if r not in lanes_by_rank]}
    if len(lanes_by_rank) <= TIMELINE_ALL_LANES_MAX_RANKS:
        return lanes_by_rank, {"expanded_ranks": [{"rank": r, "why": "all"} for r in sorted(lanes_by_rank)],
                               "summarised_ranks": [], "chosen_by": "all", "ranks_not_in_run": []}
    picks = _expanded_ranks([t for t in totals if t["rank"] in lanes_by_rank])
    full = {p["rank"] for p in picks}
    out = {r: (lanes if r in full else _summary_lanes(lanes)) for r, lanes in lanes_by_rank.items()}
    return out, {"expanded_ranks": sorted(picks, key=lambda p: p["rank"]),
                 "summarised_ranks": sorted(r for r in lanes_by_rank if r not in full),
                 "chosen_by": "busiest", "ranks_not_in_run": []}


def _timeline(lanes_by_rank: dict[int, dict[str, iv.IntervalSet]], budget: int,
              totals: list[dict[str, Any]] | None = None, chosen: tuple[int, ...] | None = None) -> dict[str, Any]:
    lanes_by_rank, drawn = _choose_lanes(lanes_by_rank, totals or [], chosen)
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
                        key=lambda k: (k.startswith("summary:"), k.removeprefix("summary:") != "compute",
                                       k.endswith("idle"), k.endswith("other"), k))
    out = []
    for r, lanes in kept.items():
        for k, (s, e) in lanes.items():
            out.extend([r, k, int(a), int(b)] for a, b in zip(s.tolist(), e.tolist()))
    out.sort(key=lambda x: (x[0], x[2]))
    return {"lanes": lane_names, "intervals": out, "max_intervals": budget, "min_gap_ns": gap,
            "truncated_ranks": truncated, **drawn}


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
        "timeline": _timeline(lanes_by_rank, config.max_timeline_intervals, ranks_out, config.timeline_ranks),
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
