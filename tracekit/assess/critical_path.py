"""Critical path across ranks and what-if replay of each finding's fix (DESIGN §3 "Estimated saving").

Per analyzed step: the cross-rank dependency graph (tracekit/whatif/build.py), replayed unchanged
(it reproduces the measured step: `replay_error`), the critical path through it and its composition by
category, rank and dim. Each finding with a fix the graph can apply (straggler → rank's host stalls
removed and its compute at its peers' median where the trace shows it computing more, `backed_fixes`;
unoverlapped/communication-bound → the dim's collectives overlapped; low bus bandwidth → the dim at the
reference bandwidth; pipeline imbalance → stages re-split; bubble → more micro-batches;
routing skew → expert load even; host-bound → host stalls removed) gets `est_saving_ns` = measured −
replayed step with that fix alone, mean over the steps, and the closed-form bound it had before stays in
its evidence (`closed_form_saving_ns`). One more replay applies every fix together (`all_fixes`), so the
savings never double count.

The steps are the breakdown's windows (whatif/steps.py `analysed_steps`): ProfilerStep windows; on a trace
without them, the iterations found where it repeats (optimizer steps, graph launches, repeated top-level op
sequences), or else each rank's one window as one step (`step` null): a GPU rank's first to last device event
(`device_span`), a CPU rank's first to last event (`trace`); `step_rule` says which rule made them (absent when
they are ProfilerStep's). A host-bound verdict names the host finding that says what the host did, with its
replayed saving (`verdict.host_cause`), or says the cause is not visible in the trace.

Section `critical_path`:
    {"steps": [{"step": int | null, "measured_ns", "replayed_ns", "replay_error", "nodes", "edges", "slowest_rank",
                "composition": {"step_ns", "by_category": {name: ns}, "by_rank": {rank: ns}, "by_dim": {dim: ns}},
                "path": [{"rank", "lane", "category", "name", "start_ns", "end_ns", "ops", "dim"}],
                "timeline": {"lanes", "intervals": [[rank, lane index, start_ns, end_ns]], "t0_ns",
                             "min_gap_ns", "max_intervals", "truncated_ranks"}}],   # slowest step only
     "whatif": [{"finding": index in the document's findings (sorted), "kind", "fix": label, "step_ns", "saving_ns"}],
     "all_fixes": {"fixes": [label], "step_ns": int, "saving_ns": int} | null,
     "measured_step_ns": int | null,
     "skipped": str | null,             # why there is nothing (no steps, no device work...)
     "step_rule": str}                  # only where a step rule other than ProfilerStep made the windows
    verdict: {"bound", "lane_shares", "path_ranks", "text",
              "host_cause": {"finding": index | null, "kind": str | null, "saving_ns": int | null, "text"}}  # host-bound only
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracekit.analyze.host_bound import HostBoundResult
from tracekit.analyze.pipeline import PipelineResult
from tracekit.analyze.recording import TIE_SHARE, Z
from tracekit.analyze.stragglers import StragglerConfig
from tracekit.analyze.trace_kind import TraceKindResult
from tracekit.assess.reconcile import RecommendationsResult, fit_trace_kind
from tracekit.config import AnalysisConfig
from tracekit.derive.matching import MatchingResult, gpu_ranks
from tracekit.derive.topology import LayoutResult
from tracekit.process_env import large_blocks, release_memory
from tracekit.findings.evidence import (BandwidthEvidence, BubbleEvidence, CollectiveEvidence, HostBoundEvidence,
                                        StragglerEvidence)
from tracekit.findings.evidence import Evidence
from tracekit.findings.finding import Finding, FindingKind, Severity, severity_by_share, sort_findings
from tracekit.findings.result import AnalyzerResult
from tracekit.tables.store import RunStore
from tracekit.whatif.build import reported_step
from tracekit.whatif.fixes import P2P_OPS, Fix, RunFacts, copy_direction, memcpy_nodes, replayable
from tracekit.whatif.graph import Category, StepGraph, measured_step_ns
from tracekit.whatif.replay import StepResult, composition, path_of, path_rows, predict_all, predict_ns, timeline_json
from tracekit.whatif.steps import replay_steps, run_layout, step_input

MAX_PATH_ROWS = 400
LARGE_BLOCK_BYTES = 1 << 20
"""Under a memory budget, blocks over this are mmapped from the critical path on (`process_env.large_blocks`): a
what-if's freed node-sized temporaries do not stay resident in the heap."""


def fix_for(f: Finding, lay: RunFacts) -> list[Fix]:
    """The fix a finding recommends, as the graph can apply it ([] when it cannot)."""
    ev = f.evidence
    if isinstance(ev, StragglerEvidence) and f.ranks:
        if ev.cause == "data_load":
            # measured on the rank, not guessed from timings: its time inside PyTorch's DataLoader ranges
            # beyond its peers'. Its fix (workers, prefetching) brings its loading (and host gaps) to their
            # pace and leaves its compute as it ran: a rank computing while its peer waited inside gloo ran
            # its ops at a pace of its own (a hand-built run's 3 ms of such noise replayed as saving, 43 for
            # 40 ms of loading beyond the peer's; a recorded one 47.9 ms for 41.9 ms; docs/metrics.md §8)
            return [Fix("host_stalls", rank=int(r)) for r in f.ranks]
        # the rank at its peers' pace, whatever stragglers.py named as the cause: its compute at their
        # median and its host stalls / data loading down to theirs. The cause is a guess from timings a
        # busy host distorts (under CI load a 50 ms sleep got a compute-only fix); the fix must not hang on it.
        # The idle_host_bound finding of the same stalls is then its symptom (`_absorbed`)
        return [x for r in f.ranks for x in (Fix("rank_compute", rank=int(r)), Fix("host_stalls", rank=int(r)))]
    if isinstance(ev, CollectiveEvidence) and f.kind == FindingKind.UNOVERLAPPED_COLLECTIVE:
        # one op of the dim: its own transfers (the dim's other ops have their own findings, each its own saving)
        return [Fix("dim_overlap", dim=f.dim, op="send" if ev.op in P2P_OPS else ev.op)]  # P2P: both sides
    if f.kind in (FindingKind.UNOVERLAPPED_COLLECTIVE, FindingKind.COMMUNICATION_BOUND):
        return [Fix("dim_overlap", dim=f.dim)]
    if isinstance(ev, BandwidthEvidence):
        if ev.host and ev.slow_dims:  # a slow host NIC: each dim it slows at the speed of the dim's other groups
            return [Fix("slow_link", dim=d) for d in ev.slow_dims]
        ref = ev.reference_gbps
        return [Fix("dim_bandwidth", dim=f.dim, value=float(ref))] if ref else [Fix("slow_link", dim=f.dim)]
    if f.kind == FindingKind.PLACEMENT_MISMATCH and f.dim:  # the heavy dim's groups moved inside a host
        # unless that pushes another heavy dim across hosts (`displaced_dims`): a trade the graph cannot price
        return [] if f.evidence.details.get("displaced_dims") else [Fix("dim_inside_host", dim=f.dim)]
    if f.kind == FindingKind.PIPELINE_IMBALANCE:
        return [Fix("stage_resplit")]
    if isinstance(ev, BubbleEvidence) and lay.microbatches:
        m = ev.recommended_microbatches or 2 * int(lay.microbatches)
        return [Fix("microbatches", value=float(m))]
    if f.kind == FindingKind.EXPERT_ROUTING_SKEW:
        return [Fix("expert_even")]
    if isinstance(ev, HostBoundEvidence):  # the run's starved host threads repaired; launch overhead: the
        if ev.cause == "starved_host":     # named ranks' launches ahead of their devices (an upper bound)
            return [Fix("host_repair")]
        if ev.cause == "host_work":  # the named ranks' host time between launches removed (an upper bound)
            return [Fix("host_work", ranks=tuple(sorted(int(r) for r in f.ranks)))] if f.ranks else [Fix("host_work")]
        return [Fix("host_ahead", rank=int(r)) for r in f.ranks] if ev.cause == "launch_overhead" else []
    if f.kind == FindingKind.MEMCPY_ON_CRITICAL_PATH:
        return [Fix("memcpy_overlap")]
    if f.kind == FindingKind.IDLE_HOST_BOUND:  # the stall of the rank the finding names, or of the ranks that
        if len(f.ranks) > 1:  # stall alike (host_stalls.group_alike): removed on all of them together
            return [Fix("host_stalls", ranks=tuple(sorted(int(r) for r in f.ranks)))]
        return [Fix("host_stalls", rank=int(r)) for r in f.ranks] if f.ranks else [Fix("host_stalls")]
    return []


COUNTED = StragglerConfig()
"""The ratios stragglers.py calls more work when it counts it (ops, FLOPs: not timed, so no busy host fakes it)."""


def backed_fixes(f: Finding, lay: RunFacts, results: list[StepResult]) -> list[Fix]:
    """`fix_for`, less a straggler's compute part where the trace shows no more compute on the rank: neither
    counted (more ops or FLOPs than its peers', as stragglers.py counts them) nor timed (`computes_slower`
    over the steps of the one graph every step replays). The rank's compute then stays as it ran and its
    host stalls go: a sleeper's replay was the sleep plus the op-by-op minimum of two noisy ranks."""
    fixes = fix_for(f, lay)
    ev, one = f.evidence, _one_graph(results)
    if not isinstance(ev, StragglerEvidence) or one is None:
        return fixes
    d = ev.details
    if ((d.get("op_count_ratio") or 0.0) >= COUNTED.more_work_ratio
            or (d.get("work_ratio") or 0.0) >= COUNTED.uneven_work_ratio):
        return fixes
    return [x for x in fixes if x.kind != "rank_compute" or computes_slower(one[0], int(x.rank), lay)]


def computes_slower(g: StepGraph, rank: int, lay: RunFacts) -> bool:
    """Does the rank compute more than its peers (`RunFacts.peers`) beyond the step-to-step spread? Per
    profiled step the rank's measured compute (the sum of its compute nodes' durations) over its peers'
    median in the same step: the box's pace, which moves every rank of a step alike (a loaded 2-core box ran
    one run's steps at 250 to 880 ms of compute), cancels in the ratio. The mean ratio must exceed 1 by
    `recording.Z` standard errors of it, the bar the verdict's margin clears (analyze/recording.py). A rank
    that sleeps or stalls computes as much as its peers, each op a little faster or slower (a busy host); the
    op-by-op minimum of the two is below either's total, a saving no fix of the rank removes (docs/metrics.md
    §8 "Straggler / rank compute"). Fewer than two steps (no spread to judge by), or no peer computing in the
    rank's steps: True."""
    m = (g.category == Category.COMPUTE) & (g.rank >= 0) & (g.step >= 0)
    if not m.any():
        return True
    width = int(g.step[m].max()) + 1  # (rank, step) as one integer: a linear pass, not a sort of the graph
    key = g.rank[m].astype(np.int64) * width + g.step[m].astype(np.int64)
    sums, seen = np.bincount(key, weights=g.dur[m].astype(np.float64)), np.bincount(key)
    per: dict[int, dict[int, float]] = {}
    for k in np.flatnonzero(seen).tolist():
        per.setdefault(k // width, {})[k % width] = float(sums[k])
    peers = [int(p) for p in lay.peers(rank, np.unique(g.ranks)) if int(p) != rank and int(p) in per]
    steps = sorted(set(per.get(rank, {})).intersection(*(per[p] for p in peers))) if peers else []
    theirs = np.median([[per[p][s] for s in steps] for p in peers], axis=0) if steps else np.zeros(0)
    if len(steps) < 2 or not (theirs > 0).all():
        return True
    ratio = np.array([per[rank][s] for s in steps]) / theirs
    return float(ratio.mean()) - 1.0 > Z * float(ratio.std(ddof=1)) / np.sqrt(ratio.size)


PIPELINE_FIXES = ("stage_resplit",)
"""Fixes whose saving is averaged over the steps after the first (`steady_steps`). Not yet the micro-batch
fix: its replay has its own pipelined-part rules (docs/metrics.md §8), checked on multi-step graphs as is."""


def _mean_prediction(results: list[StepResult], fixes: list[Fix], lay: RunFacts) -> tuple[int, int]:
    """(predicted, measured) step time of the run: see `run_step_ns`; for a pipeline re-split over the steps
    after the first (`steady_steps`)."""
    results = steady_steps(results, fixes)
    one = _one_graph(results)
    if one is None:
        pred = [predict_ns(r, fixes, lay) for r in results]
        return int(np.mean(pred)), int(np.mean([r.measured_ns for r in results]))
    g, rows = one
    return run_step_ns(g, predict_all(g, fixes, lay), rows), run_step_ns(g, measured_step_ns(g), rows)


def _one_graph(results: list[StepResult]) -> tuple[StepGraph, np.ndarray] | None:
    """The graph every result replays (replay_steps builds one for all steps) and their windows."""
    if not results or any(r.graph is not results[0].graph or r.rows is None for r in results):
        return None
    return results[0].graph, np.concatenate([r.rows for r in results])


def run_step_ns(g: StepGraph, times: np.ndarray, rows: np.ndarray) -> int:
    """The run's step time from per-window step times: the slowest rank's mean step over the analyzed steps.
    A rank's windows tile its timeline, so its mean step is its time per step; the mean over steps of each
    step's slowest rank counts time twice where ranks' windows are offset (a host-starved rank begins a
    step late, its peers end theirs late): on a generated starved run 21.8 ms saved per step against the
    18.1 ms the run lost."""
    ranks = g.ranks[rows]
    if not np.issubdtype(times.dtype, np.integer):
        return int(max(float(np.mean(times[rows][ranks == r])) for r in np.unique(ranks)))
    ids, pos, count = np.unique(ranks, return_inverse=True, return_counts=True)
    # per rank the mean of its windows' (integer) step times: sums of integers below 2**53 are exact in
    # float64 in any order, so this is np.mean's value rank by rank, in one pass
    sums = np.bincount(pos.ravel(), weights=times[rows].astype(np.float64), minlength=ids.size)
    return int(max((sums / count).tolist()))


def steady_steps(results: list[StepResult], fixes: list[Fix]) -> list[StepResult]:
    """The steps a fix's saving is averaged over: all, but for a pipeline re-split the first of several. Its
    ranks begin staggered by the previous step's drain (the first stage, last to finish its backward, begins
    last; docs/metrics.md §8), a step outside the graph whose measured starts the replay keeps: that step's
    prediction carries the unfixed past, the later ones begin where the fixed graph lets them."""
    if len(results) > 1 and any(f.kind in PIPELINE_FIXES for f in fixes):
        return results[1:]
    return results


def rescore(findings: list[Finding], results: list[StepResult], lay: RunFacts, regrade_severity: bool = False
            ) -> tuple[list[Finding], list[dict[str, Any]], dict[str, Any] | None]:
    """Findings with replayed savings (closed form kept in evidence), the what-if rows, and all fixes together;
    `regrade_severity`: cap the severity of each finding whose fix removes its cause (`CAUSE_REMOVED`) by its
    replayed saving (`regrade`)."""
    out, rows, every = [], [], []
    held = worked_ranks(results[0].graph) if results else set()
    joint = _joint_savings(findings, results, lay, held) if regrade_severity else {}
    backed = [backed_fixes(f, lay, results) for f in findings]
    for i, (f, fixes) in enumerate(zip(findings, backed)):
        if (not fixes or not results or any(r not in held for x in fixes for r in x.touched_ranks())
                or not all(replayable(results[0].graph, x, lay) for x in fixes)):
            # a fix on a rank the graph holds no work of (a log-only rank of a partial recording: no trace to
            # replay; a rank whose only ops ran on threads the graph does not model), or on groups it does not
            # hold, keeps the finding's closed-form saving
            out.append(f)
            continue
        step_ns, meas = _mean_prediction(results, fixes, lay)
        saving = max(0, meas - step_ns)
        ev = dataclasses.replace(f.evidence, closed_form_saving_ns=int(f.est_saving_ns), replayed_saving_ns=saving,
                                 replayed_step_ns=step_ns, whatif="; ".join(x.label() for x in fixes))
        # a symptom explained by another finding, or a straggler the host's scheduler made, has no
        # saving of its own (recommend.reconcile, stragglers): the replay goes to the evidence only
        own = 0 if ev.explained else saving
        f = dataclasses.replace(f, evidence=ev, est_saving_ns=own)
        whole = all(x.kind in CAUSE_REMOVED for x in fixes) and not f.evidence.details.get("late_with")
        out.append(regrade(f, saving, meas, joint.get(f.kind)) if regrade_severity and whole else f)
        rows.append({"finding": i, "kind": f.kind.value, "fix": ev.whatif, "step_ns": step_ns,
                     "saving_ns": saving, "counted": own > 0 or saving == 0})
        if not ev.explained:
            every.extend(x for x in fixes if x not in every)
    out = _absorbed(out, rows, backed)
    together = None
    if every and results:
        step_ns, meas = _mean_prediction(results, every, lay)
        together = {"fixes": [x.label() for x in every], "step_ns": step_ns, "saving_ns": max(0, meas - step_ns)}
    return out, rows, together


def worked_ranks(g: StepGraph) -> set[int]:
    """Ranks with at least one node of work in the graph (not only their step-start marks): a fix on any other
    rank changes nothing the replay can see, so its replayed saving would read 0 without meaning it (a rank
    whose step holds only asynchronous collectives on side threads and nothing on its training thread)."""
    return {int(r) for r in np.unique(g.rank[(g.category != Category.MARK) & (g.rank >= 0)])}


REGRADE_INFO_SHARE = 0.01
"""A fix whose replay saves less than this share of the step is worth no more than info ..."""
REGRADE_WARNING_SHARE = 0.05
"""... and less than this share no more than a warning: the severity an analyzer gave from its closed form
(the wait a straggler causes, the launch wait a host causes) is capped by what removing the cause saves."""


CAUSE_REMOVED = ("rank_compute", "host_stalls", "host_repair", "host_ahead")
"""Fixes that undo exactly what their finding measured (a rank at its peers' pace, a host's lost time), so
their replay is the finding's cost and re-grades it. The others replay one remedy among several (overlap a
collective, more micro-batches): a small saving there says that remedy is weak, not that the cost is absent.
Nor does a straggler late together with other ranks (`late_with`: one slow replica's ranks): its fix speeds
up that rank alone, and the others still hold the group back."""
REGRADE_MAX_REPLAY_ERROR = 0.02
"""The unchanged replay must reproduce every measured step within this (DESIGN §6) to re-grade by it."""


def replay_trusted(store: RunStore, results: list[StepResult]) -> bool:
    """Severities are re-graded by replayed savings only on GPU runs (every rank has device work: the
    replay models the device queue, checked on generated, simulated and real GPU traces) whose unchanged
    replay reproduces each measured step within REGRADE_MAX_REPLAY_ERROR; on CPU runs the host is the
    device and hand-built or gloo steps replay only as well as their recorded ends allow."""
    ranks = set(store.ranks())
    if not results or not ranks or not ranks <= gpu_ranks(store):
        return False
    return all(r.measured_ns > 0 and abs(r.replayed_ns - r.measured_ns) <= REGRADE_MAX_REPLAY_ERROR * r.measured_ns
               for r in results)


def _joint_savings(findings: list[Finding], results: list[StepResult], lay: RunFacts, held: set[int]
                   ) -> dict[FindingKind, int]:
    """Per kind with several findings whose fixes remove their cause (other than stragglers, which are late
    against their peers by definition): the replayed saving of all their fixes together. Ranks that stall
    alike and meet at collectives each wait for the other: fixing one alone saves nothing, fixing the cause
    on all of them saves the step (HTA's sampled 2-rank run: rank 0's and rank 1's host stalls save 0 and
    4.2 ms alone, 187.8 ms with every fix). A finding's severity is capped by what fixing its cause saves."""
    by_kind: dict[FindingKind, list[Fix]] = {}
    count: dict[FindingKind, int] = {}
    for f in findings:
        fixes = fix_for(f, lay)
        if (f.kind is FindingKind.STRAGGLER or not fixes or not all(x.kind in CAUSE_REMOVED for x in fixes)
                or any(r not in held for x in fixes for r in x.touched_ranks())):
            continue
        count[f.kind] = count.get(f.kind, 0) + 1
        by_kind.setdefault(f.kind, []).extend(x for x in fixes if x not in by_kind.get(f.kind, []))
    out = {}
    for kind, fixes in by_kind.items():
        if count[kind] > 1 and results:
            step_ns, meas = _mean_prediction(results, fixes, lay)
            out[kind] = max(0, meas - step_ns)
    return out


def regrade(f: Finding, saving_ns: int, measured_ns: int, joint_ns: int | None = None) -> Finding:
    """`f` with its severity capped by its replayed saving's share of the measured step (the closed form
    can count time the step never loses: peers that wait for a late rank inside a collective would
    otherwise wait for their own hosts), the reason in `evidence.severity_regraded`. `joint_ns`: the saving
    of fixing this cause on every rank that has it (`_joint_savings`), which caps instead when larger."""
    if measured_ns <= 0:
        return f
    if joint_ns is not None and joint_ns > saving_ns:
        f = dataclasses.replace(f, evidence=dataclasses.replace(f.evidence, joint_replayed_saving_ns=joint_ns))
        saving_ns = joint_ns
    share = saving_ns / measured_ns
    cap = (Severity.INFO if share < REGRADE_INFO_SHARE else Severity.WARNING if share < REGRADE_WARNING_SHARE
           else Severity.CRITICAL)
    if f.severity.order <= cap.order:
        return f
    closed = f.evidence.closed_form_saving_ns
    what = "of fixing its cause on every rank that has it" if f.evidence.joint_replayed_saving_ns else "of its fix"
    reason = (f"the replayed saving {what} is {saving_ns / 1e6:.2f} ms per step ({100 * share:.1f}% of the "
              f"{measured_ns / 1e6:.2f} ms step)"
              + (f" against {closed / 1e6:.2f} ms in closed form" if closed else "")
              + f": below {100 * (REGRADE_INFO_SHARE if cap is Severity.INFO else REGRADE_WARNING_SHARE):.0f}% "
              f"of the step a finding is at most {cap.value}")
    ev = dataclasses.replace(f.evidence, severity_regraded={"from": f.severity.value, "to": cap.value,
                                                             "reason": reason})
    return dataclasses.replace(f, severity=cap, evidence=ev,
                               summary=f"{f.summary}; replayed, removing it saves {saving_ns / 1e6:.2f} ms per step")


def _absorbed(findings: list[Finding], rows: list[dict[str, Any]], fixes: list[list[Fix]]) -> list[Finding]:
    """A finding whose fix is part of a bigger finding's fix (idle_host_bound's "host stalls removed on
    rank 1" inside the straggler's "rank 1 at its peers' pace") and saves no more is that finding's symptom:
    its replayed saving stays in the evidence, its own saving is 0 (no double counting, the root first)."""
    saving = {r["finding"]: r["saving_ns"] for r in rows if r["counted"]}
    sets = {i: set(fixes[i]) for i in saving}
    out = list(findings)
    for i, a in saving.items():
        if a <= 0:  # nothing to absorb (a run of 1,024 ranks: a thousand findings that save nothing)
            continue
        for j, b in saving.items():
            # one replay is credited once: of two findings with the same fix (the all_gather and the
            # reduce_scatter of one tp group: "tp collectives overlapped"), the first listed keeps the saving
            same = sets[i] == sets[j] and _credit_order(findings[j], j) < _credit_order(findings[i], i)
            if i != j and (sets[i] < sets[j] or same) and a <= b:
                ev = dataclasses.replace(out[i].evidence, absorbed_by={"kind": findings[j].kind.value,
                                                                        "ranks": list(findings[j].ranks or [])})
                out[i] = dataclasses.replace(out[i], evidence=ev, est_saving_ns=0)
                out[j] = _at_least_as_severe(out[j], out[i])
                break
    return out


def _at_least_as_severe(root: Finding, symptom: Finding) -> Finding:
    """The root of an absorbed symptom at warning or above is at least a warning: its fix holds the
    symptom's and saves no less, so it is as actionable. (A 40 ms sleep on a rank sharing the box's cores:
    its idle_host_bound, measured on the rank itself, warned at 12% of the step in host gaps, and the
    straggler that absorbed it stayed info — the timing-noise guard of a late arrival, 25% for a host-side
    cause — on top of the list.) Only info is raised: warning and critical are judged on each kind's own
    scale (a stall's share of the step, a late arrival's), which one kind's finding does not set for another."""
    if root.severity is not Severity.INFO or symptom.severity is Severity.INFO:
        return root
    ev = dataclasses.replace(root.evidence, details={**root.evidence.details, "severity_from_absorbed": {
        "from": root.severity.value, "to": Severity.WARNING.value, "symptom": symptom.kind.value}})
    return dataclasses.replace(root, severity=Severity.WARNING, evidence=ev)


def _credit_order(f: Finding, i: int) -> tuple[int, int, int, int]:
    """Which of two findings with one fix keeps its saving: a straggler (the rank that holds its peers back
    is the root, its host stalls the symptom, as where its fix also sets its compute: `backed_fixes` leaves
    a sleeper only the stall fix its idle_host_bound finding has), then the more severe, then the larger
    closed form, then the first found."""
    return (f.kind is not FindingKind.STRAGGLER, -f.severity.order, -int(f.evidence.closed_form_saving_ns or 0), i)


def _step_json(res: StepResult, timeline_budget: int | None = None) -> dict[str, Any]:
    path, rank = path_of(res)
    err = abs(res.replayed_ns - res.measured_ns) / res.measured_ns if res.measured_ns else 0.0
    return {"step": reported_step(res.step), "measured_ns": res.measured_ns, "replayed_ns": res.replayed_ns,
            "replay_error": round(err, 6), "nodes": res.graph.num_nodes, "edges": int(len(res.graph.src)),
            "slowest_rank": rank, "composition": composition(res, path, rank),
            "path": path_rows(res, path, MAX_PATH_ROWS),
            **({"timeline": timeline_json(res, path, timeline_budget)} if timeline_budget else {})}


def _numbered_as_reported(findings: list[Finding], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What-if rows with `finding` = the finding's position in the document's order (`sort_findings`, as the
    engine writes them), not its position before the savings were replayed: the report's "#2 straggler"
    was finding #8 of its own list."""
    pos = {id(f): i for i, f in enumerate(sort_findings(findings))}
    return [{**r, "finding": pos[id(findings[r["finding"]])]} for r in rows]


def _measured_run_step(results: list[StepResult]) -> int | None:
    if not results:
        return None
    one = _one_graph(results)
    return int(np.mean([r.measured_ns for r in results])) if one is None else run_step_ns(one[0], measured_step_ns(one[0]), one[1])


BOUND_OF_LANE = {"host": "host-bound", "compute_stream": "compute-bound", "comm_stream": "communication-bound",
                 "waiting": "waiting-bound", "device_idle": "device-idle-bound"}
LANE_WORDS = {"host": "host threads (launching work, host ops, stalls)", "compute_stream": "compute streams",
              "comm_stream": "communication (collective transfers)", "waiting": "waiting for peers",
              "device_idle": "device idle (waiting for something the trace does not show: launched, ready, "
                             "yet not started)"}
PATH_RANK_SHARE = 0.10
"""A rank holding at least this share of the path is named as one the others wait for."""


def path_verdict(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's verdict from the critical path's lanes (composition `by_lane`, summed over the steps): the
    kind of lane holding most of the path, the ranks it runs through and, when there are several ranks,
    that the others wait for them; `tie_with`, the runner-up's bound where it holds the path within TIE_SHARE
    of the step of the top lane (a near tie: the text names both). None without a path."""
    lanes: dict[str, int] = {}
    ranks: dict[str, int] = {}
    total = 0
    for st in steps:
        comp = st.get("composition") or {}
        for k, v in (comp.get("by_lane") or {}).items():
            lanes[k] = lanes.get(k, 0) + int(v)
        for k, v in (comp.get("by_rank") or {}).items():
            ranks[k] = ranks.get(k, 0) + int(v)
        total += int(comp.get("step_ns") or 0)
    if not total or not any(lanes.values()):
        return None
    top = max(lanes, key=lambda k: lanes[k])
    share = {k: round(v / total, 4) for k, v in lanes.items()}
    held = sorted(((int(r), v / total) for r, v in ranks.items() if v >= PATH_RANK_SHARE * total), key=lambda x: -x[1])
    runner = max((k for k in lanes if k != top), key=lambda k: lanes[k], default=None)
    tie = runner if runner is not None and (lanes[top] - lanes[runner]) < TIE_SHARE * total else None
    others = ", ".join(f"{LANE_WORDS[k].split(' (')[0]} {share[k]:.0%}" for k in lanes
                       if k not in (top, tie) and share[k] >= 0.01)
    head = (f"{BOUND_OF_LANE[top]} and {BOUND_OF_LANE[tie]} alike (a near tie, within {TIE_SHARE:.0%} of the step)"
            if tie else BOUND_OF_LANE[top])
    text = (f"{head}: the critical path runs on {LANE_WORDS[top]} for {share[top]:.0%} of the step"
            + (f" and on {LANE_WORDS[tie]} for {share[tie]:.0%}" if tie else "")
            + (f" ({others})" if others else ""))
    if held:
        text += "; it runs through " + ", ".join(f"rank {r} ({x:.0%})" for r, x in held)
        if len(ranks) > 1 or len(steps[0].get("composition", {}).get("by_rank") or {}) > 1:
            text += ", whom the other ranks wait for"
    return {"bound": BOUND_OF_LANE[top], "lane_shares": share, "path_ranks": [r for r, _ in held],
            "tie_with": BOUND_OF_LANE[tie] if tie else None, "text": text + "."}


HOST_CAUSE_KINDS = (FindingKind.HOST_BOUND, FindingKind.IDLE_HOST_BOUND)
"""The findings that say what a host did while its device waited (host_bound: the ops its launching thread was
inside, slow or starved, or host work launching nothing; idle_host_bound: gaps with no op, data loading)."""
HOST_CAUSE_NONE = ("cause not visible in the trace: no host finding (slow or starved host ops, host work, "
                   "launch overhead, stalls, data loading) accounts for the host's time")


def with_host_cause(verdict: dict[str, Any] | None, findings: list[Finding]) -> dict[str, Any] | None:
    """A host-bound verdict (or one tied with host-bound) with what the host did (`host_cause`): the host finding (HOST_CAUSE_KINDS) with the
    largest saving, replayed where the graph could apply its fix, its summary's cause named in the text; with
    none, "cause not visible in the trace" (HOST_CAUSE_NONE). Other verdicts as they came."""
    if verdict is None or BOUND_OF_LANE["host"] not in (verdict["bound"], verdict.get("tie_with")):
        return verdict
    order = sort_findings(findings)
    host = [i for i, f in enumerate(order) if f.kind in HOST_CAUSE_KINDS]
    if not host:
        return {**verdict, "host_cause": {"finding": None, "kind": None, "saving_ns": None, "text": HOST_CAUSE_NONE},
                "text": f"{verdict['text'][:-1]}; {HOST_CAUSE_NONE}."}
    i = max(host, key=lambda j: (order[j].est_saving_ns, -j))
    f = order[i]
    replayed = f.evidence.replayed_saving_ns
    saving = f"; fixing it saves {(replayed if replayed is not None else f.est_saving_ns) / 1e6:.2f} ms per step" + (
        " (replayed)" if replayed is not None else " (closed form)")
    text = f"what the host did (finding #{i + 1}, {f.kind.value}): {f.summary}{saving}"
    return {**verdict, "host_cause": {"finding": i, "kind": f.kind.value,
                                      "saving_ns": int(replayed if replayed is not None else f.est_saving_ns),
                                      "text": text},
            "text": f"{verdict['text'][:-1]}; {text}."}


@dataclass(frozen=True)
class CriticalPathResult(AnalyzerResult):
    """`findings`: the reconciled findings with replayed savings (the document's)."""

    steps: list[StepResult] = field(default_factory=list)
    """Each replayed step (graph, replay, path)."""


MEMCPY_PATH_SHARE = (0.05, 0.10, 0.25)
"""Share of the step that device copies take on the critical path for an info / warning / critical finding."""


def memcpy_finding(results: list[StepResult]) -> Finding | None:
    """Device copies (memcpy H2D / D2H / D2D) the critical path runs through: their own time on the path of
    each step (the slowest rank's), mean over the steps, when it is at least 5% of the step. The saving is
    replayed by `rescore` with every copy overlapped (`memcpy_overlap`); the closed form is their path time."""
    if not results:
        return None
    per_dir: dict[str, float] = {}
    on_path, counts, ranks, shares = [], [], set(), []
    for res in results:
        path, rank = path_of(res)
        g = res.graph
        mc = path[memcpy_nodes(g)[path]] if path.size else path
        mc = mc[g.dur[mc] > 0]
        t = int(g.dur[mc].sum())
        on_path.append(t)
        counts.append(int(mc.size))
        shares.append(t / res.measured_ns if res.measured_ns else 0.0)
        if mc.size:
            ranks.add(rank)
        for i in mc.tolist():
            d = copy_direction(g.name[i])
            per_dir[d] = per_dir.get(d, 0) + int(g.dur[i]) / len(results)
    ns, share = int(np.mean(on_path)), float(np.mean(shares))
    sev = severity_by_share(share, *MEMCPY_PATH_SHARE)
    if sev is None or ns <= 0:
        return None
    parts = ", ".join(f"{d} {v / 1e6:.2f} ms" for d, v in sorted(per_dir.items(), key=lambda kv: -kv[1]))
    return Finding(
        kind=FindingKind.MEMCPY_ON_CRITICAL_PATH, severity=sev, ranks=tuple(sorted(ranks)),
        summary=f"device copies lie on the critical path: {ns / 1e6:.2f} ms per step ({share:.0%} of the step; "
                f"{parts}), on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, sorted(ranks)))}",
        evidence=Evidence(details={"on_path_ns_per_step": ns, "share_of_step": share,
                                   "copies_on_path_per_step": float(np.mean(counts)),
                                   "by_direction_ns_per_step": {d: int(v) for d, v in per_dir.items()}}),
        recommendation="Overlap the copies with compute instead of waiting for them: host-to-device from pinned "
                       "memory with non_blocking=True on a side stream, the next batch prefetched "
                       "(DataLoader(pin_memory=True)); no .item() / .cpu() / print of a device tensor inside the "
                       "step (each is a device-to-host copy the host waits for); device-to-device copies from "
                       ".contiguous() / clone() only where a view cannot serve.",
        est_saving_ns=ns)


NO_PATH = ("no path to follow: in every replayed step the slowest rank has no op of its own that the replay "
           "can place (nothing recorded on its training thread or device in the window but collectives whose "
           "peers are not in the trace); the step is replayed, its time not attributed")
NO_STEP = ("no step to replay: no profiled step (ProfilerStep), no repeated iteration and no rank with events to "
           "make one window of (a GPU rank's first to last device event, a CPU rank's first to last event)")


def analyze_critical_path(store: RunStore, layout: LayoutResult | None, matching: MatchingResult | None,
                          pipeline: PipelineResult | None, recommendations: RecommendationsResult | None,
                          findings: list[Finding], config: AnalysisConfig,
                          trace_kind: TraceKindResult | None = None, host_bound: HostBoundResult | None = None
                          ) -> CriticalPathResult:
    """`findings`: every other analyzer's, used as they came when `recommendations` did not run. Where the
    trace kind gives no verdict (every rank a CUDA-graph capture: the capture's timing, not the workload's),
    the path's verdict is withheld too and its own finding goes through the same trace-kind filter. The graph's
    slow host time is the host_bound analyzer's slow ops where it ran (derived again otherwise)."""
    release_memory()  # what the analyzers before freed given back
    with large_blocks(LARGE_BLOCK_BYTES):  # the graph's node arrays and each what-if's temporaries
        slow = host_bound.slow_ops if host_bound is not None else None
        results = replay_steps(store, step_input(store, layout, matching, slow))
        release_memory()  # the graph build's transients (members, step input) back to the OS before the what-ifs
        final = recommendations.findings if recommendations is not None else findings
        copies = memcpy_finding(results)
        final = final + fit_trace_kind([copies], trace_kind) if copies is not None else final
        rescored, rows, together = rescore(final, results, run_layout(layout, pipeline, store),
                                           regrade_severity=replay_trusted(store, results))
    rows = _numbered_as_reported(rescored, rows)
    slowest = int(np.argmax([r.measured_ns for r in results])) if results else -1
    budget = config.max_timeline_intervals
    steps = [_step_json(r, budget if i == slowest else None) for i, r in enumerate(results)]
    withheld = trace_kind is not None and trace_kind.section is not None and trace_kind.section.get("verdict") is None
    section = {"steps": steps, "whatif": rows, "all_fixes": together,
               "verdict": None if withheld else with_host_cause(path_verdict(steps), rescored),
               "measured_step_ns": _measured_run_step(results),
               "skipped": None if any(st["path"] for st in steps) else NO_PATH if results else NO_STEP}
    if results and results[0].rule != "profiler_step":  # the windows a step rule found (a ProfilerStep run: none)
        section["step_rule"] = results[0].rule
    return CriticalPathResult(findings=rescored, section=section, steps=results)
