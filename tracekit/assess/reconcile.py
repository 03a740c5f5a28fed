"""The `recommendations` analyzer: the final word on the findings.

It takes every other analyzer's findings (the engine's `findings` argument) and
- marks symptoms whose cause another finding names (e.g. an unoverlapped collective whose exposure
  at the reference bandwidth of its slow link stays minor): info severity, no saving of their own, the
  cause in `explained_by` (the original severity and saving stay in the evidence), see `reconcile`;
Its findings are the document's when the critical path (the next step) does not run.

Section `recommendations` (JSON):
{"recommendations": [{"kind", "severity", "ranks": [..], "dim", "summary", "recommendation",
                      "est_saving_ns", "saving_formula", "explained_by": str | null}]}
                      # sorted by est_saving_ns, descending
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tracekit.analyze.breakdown import BreakdownResult, breakdown_ranks
from tracekit.analyze.pipeline import PipelineResult
from tracekit.analyze.trace_kind import TraceKindResult
from tracekit.analyze.unoverlapped import UnoverlappedConfig, UnoverlappedResult
from tracekit.findings.evidence import BandwidthEvidence, CollectiveEvidence, StragglerEvidence
from tracekit.findings.finding import Finding, FindingKind, Severity, sort_findings
from tracekit.findings.result import AnalyzerResult, section_of

MOSTLY = 0.5
"""A rank's exposed communication is "mostly" one cause's when that cause's share of its exposed
transfer time is at least this."""


@dataclass(frozen=True)
class RecommendationsResult(AnalyzerResult):
    """`findings` is the reconciled list of every finding (the document's)."""


@dataclass(frozen=True)
class _Causes:
    """What the findings and sections say about causes, for `_explained_by`."""

    labelled: bool
    """The pipeline analysis came from the runtime's stage labels."""
    pipe_ranks: set[int]
    """Ranks of a pipeline, labelled or inferred from the p2p graph (pipeline_graph.py)."""
    pp_share: dict[int, float]
    """Per pipeline rank: share of its exposed transfer time that is pipeline send/recv."""
    analyzed: set[int]
    hot_owners: set[int]
    """Ranks holding the hot expert of a routing skew (≥ warning)."""
    slow_stage: set[int]
    """Ranks of the slowest stage of a pipeline imbalance (≥ warning)."""
    misplaced: set[str | None]
    """Dims of placement mismatches (≥ warning)."""
    dim_share: dict[int, dict[str, float]]
    """Per rank and dim: share of the rank's exposed transfer time."""
    slow_link_lost: dict[str | None, int] = field(default_factory=dict)
    """Per dim of a low bus bandwidth (≥ warning): time lost per step against the reference bandwidth."""
    upstream: dict[int, int] = field(default_factory=dict)
    """Per downstream straggler (≥ warning): the straggler whose delay it inherits (`downstream_stragglers`)."""

    def mostly_pipeline(self, ranks: set[int]) -> bool:
        return bool(ranks) and all(self.pp_share.get(r, 0.0) >= MOSTLY for r in ranks)

    def mostly(self, ranks: set[int], dims: set[str | None] | set[str]) -> bool:
        return bool(ranks) and all(sum(self.dim_share.get(r, {}).get(d, 0.0) for d in dims) >= MOSTLY
                                   for r in ranks)


def _at_least_warning(f: Finding, kind: FindingKind) -> bool:
    return f.kind is kind and f.severity.order >= Severity.WARNING.order


def _causes(findings: list[Finding], pipeline: PipelineResult | None, breakdown: BreakdownResult | None,
            unoverlapped: UnoverlappedResult | None) -> _Causes:
    hot = {r for f in findings if _at_least_warning(f, FindingKind.EXPERT_ROUTING_SKEW) for r in f.ranks}
    slow = {r for f in findings if _at_least_warning(f, FindingKind.PIPELINE_IMBALANCE) for r in f.ranks}
    misplaced = {f.dim for f in findings if _at_least_warning(f, FindingKind.PLACEMENT_MISMATCH)}
    slow_links: dict[str | None, int] = {}
    for f in findings:
        if _at_least_warning(f, FindingKind.LOW_BUS_BANDWIDTH):  # a slow host's finding: every dim it slows
            ev = f.evidence
            slow_links.update(ev.slow_dims if isinstance(ev, BandwidthEvidence) and ev.slow_dims
                              else {f.dim: int(f.est_saving_ns)})
    pipe = section_of(pipeline)
    labelled = pipe.get("source") == "labels"
    pipe_ranks = ({r for pl in pipe.get("pipelines", []) for r in pl["ranks"]}
                  if pipe.get("source") in ("labels", "p2p") else set())
    return _Causes(labelled=labelled, pipe_ranks=pipe_ranks,
                   pp_share=pp_exposed_share(unoverlapped, pipe_ranks) if (labelled or pipe_ranks) else {},
                   analyzed={r["rank"] for r in breakdown_ranks(breakdown)},
                   hot_owners=hot, slow_stage=slow, misplaced=misplaced,
                   dim_share=(exposed_share_by_dim(unoverlapped) if (misplaced or hot) else {}),
                   slow_link_lost=slow_links, upstream=downstream_stragglers(findings, breakdown))


def _explained_by(f: Finding, c: _Causes) -> str | None:
    """The cause another finding names for this symptom, or None."""
    ranks = set(f.ranks)
    comm_bound = f.kind is FindingKind.COMMUNICATION_BOUND
    unoverlapped = f.kind is FindingKind.UNOVERLAPPED_COLLECTIVE
    straggler = f.kind is FindingKind.STRAGGLER and bool(ranks)
    if unoverlapped and ((f.dim == "pp" and c.labelled) or (
            ranks and ranks <= c.pipe_ranks and _op(f) in ("send", "recv"))):
        return "pipeline schedule (see pipeline_bubble / pipeline_imbalance)"
    if comm_bound and (c.labelled or c.pipe_ranks) and c.mostly_pipeline(ranks):
        return "pipeline schedule: the exposed communication is mostly stage-to-stage waiting"
    if unoverlapped and f.dim in c.slow_link_lost and _exposed_at_reference(f, c.slow_link_lost[f.dim]):
        return f"low_bus_bandwidth (the {f.dim} link is slow: at the reference bandwidth the exposure is minor)"
    if unoverlapped and f.dim in c.misplaced:
        return f"placement_mismatch (the {f.dim} group spans hosts)"
    if comm_bound and c.misplaced and c.mostly(ranks, c.misplaced):
        return "placement_mismatch: the exposed communication is mostly that of groups spanning hosts"
    if unoverlapped and c.hot_owners and _op(f) == "all_to_all" and ranks and not ranks & c.hot_owners:
        # a rank without the hot experts: its exposed all_to_all is mostly the wait for the rank that has them
        return "expert_routing_skew: the exposed all-to-all on this rank is mostly waiting on the hot experts' rank"
    if comm_bound and c.hot_owners and c.mostly(ranks, {"ep"}):
        return "expert_routing_skew: the exposed communication is mostly all-to-all waiting on the hot expert"
    if straggler and c.slow_stage and ranks <= c.slow_stage:
        return "pipeline_imbalance (the rank runs the slowest stage)"
    if (straggler and c.hot_owners and ranks <= c.hot_owners
            and (not c.analyzed or c.hot_owners < c.analyzed)):  # all ranks holding it (ep=1) explains nothing
        return "expert_routing_skew (the rank holds the hot expert)"
    if straggler and len(ranks) == 1 and next(iter(ranks)) in c.upstream:
        return (f"straggler rank {c.upstream[next(iter(ranks))]} (downstream: this rank arrives late because it "
                f"waits, directly or through its peers, for rank {c.upstream[next(iter(ranks))]}; nothing of its "
                "own sets it apart)")
    if straggler and c.labelled and f.dim == "pp":
        return "pipeline schedule (stages reach stage-to-stage transfers at different times)"
    return None


DOWNSTREAM_EDGE = 0.5
"""`downstream_stragglers` follows a rank's waits that are at least this share of its largest one."""


def waits_per_step(breakdown: BreakdownResult | None) -> dict[int, dict[int, float]]:
    """Per waiting rank: the sync wait it spends per step waiting for each late rank (breakdown.owed_wait
    turned around)."""
    out: dict[int, dict[int, float]] = {}
    for o in section_of(breakdown).get("owed_wait", []):
        per_step = o["owed_ns_per_step"] / o["owed_ns"] if o.get("owed_ns") else 0.0
        for waiter, ns in (o.get("by_rank") or {}).items():
            out.setdefault(int(waiter), {})[int(o["rank"])] = float(ns) * per_step
    return out


def downstream_stragglers(findings: list[Finding], breakdown: BreakdownResult | None) -> dict[int, int]:
    """Stragglers (≥ warning) late only because they waited for another straggler: per such rank, that one.

    A straggler is downstream when nothing of its own sets it apart (cause "unknown": no compute, data,
    idle or work excess before its late arrivals, stragglers.py), the sync wait it spends per step waiting
    for others is at least the delay it causes (its lateness is accounted for by waiting), and its waits
    lead to a root straggler (≥ warning, not downstream itself): followed breadth-first along each rank's
    waits of at least `DOWNSTREAM_EDGE` of its largest (a stage-1 rank waits for its stage-0 peer, which
    waits for the slow GPU in its tp group). One slow GPU then gives one warning, not one per rank that
    waited for it (the demo: rank 13's slow GPU made ranks 40-47 each a warning straggler)."""
    strag = {f.ranks[0]: f for f in findings
             if _at_least_warning(f, FindingKind.STRAGGLER) and len(f.ranks) == 1
             and isinstance(f.evidence, StragglerEvidence)}
    if len(strag) < 2:
        return {}
    waits = waits_per_step(breakdown)
    inherited = {r for r, f in strag.items() if f.evidence.cause == "unknown"
                 and sum(waits.get(r, {}).values()) >= f.evidence.delay_ns_per_step > 0}
    roots = set(strag) - inherited
    out: dict[int, int] = {}
    for r in sorted(inherited):
        seen, frontier, found = {r}, [r], None
        while frontier and found is None:
            nxt = []
            for x in frontier:
                w = waits.get(x, {})
                top = max(w.values(), default=0.0)
                for p, ns in sorted(w.items(), key=lambda kv: (-kv[1], kv[0])):
                    if ns <= 0 or ns < DOWNSTREAM_EDGE * top or p in seen:
                        continue
                    if p in roots:
                        found = p
                        break
                    seen.add(p)
                    nxt.append(p)
                if found is not None:
                    break
            frontier = nxt
        if found is not None:
            out[r] = found
    return out


def _op(f: Finding) -> str | None:
    return f.evidence.op if isinstance(f.evidence, CollectiveEvidence) else None


def _exposed_at_reference(f: Finding, lost_ns: int) -> bool:
    """An unoverlapped collective whose exposure, less the time its slow link loses against the reference
    bandwidth, would stay under the warning share of the step: the slow link is the cause."""
    ev = f.evidence
    if not isinstance(ev, CollectiveEvidence) or not ev.transfer_exposed_ns_per_step or not ev.share_of_step:
        return False
    exposed = ev.transfer_exposed_ns_per_step
    return (exposed - lost_ns) / (exposed / ev.share_of_step) < UnoverlappedConfig().warning_fraction


def _explained(f: Finding, cause: str | None) -> Finding:
    """The symptom at info severity with no saving of its own; its original ones stay in the evidence."""
    if cause is None or (f.severity is Severity.INFO and not f.est_saving_ns):
        return f
    ev = replace(f.evidence, explained_by=cause, original_severity=f.severity.value,
                 original_est_saving_ns=int(f.est_saving_ns))
    return replace(f, severity=Severity.INFO, est_saving_ns=0, evidence=ev)


def reconcile(findings: list[Finding], pipeline: PipelineResult | None = None,
              breakdown: BreakdownResult | None = None,
              unoverlapped: UnoverlappedResult | None = None) -> list[Finding]:
    """Symptoms explained by a cause another analyzer found: info severity, no saving of their own.

    - exposed send/recv of a pipeline (labelled, or inferred from the p2p graph) is its idle time, which
      `pipeline_bubble` / `pipeline_imbalance` already count (hiding it needs a schedule change);
    - a straggler that owns the hot expert of a routing skew (≥ warning) is late because of the skew;
    - a straggler late only because it waited for another straggler is that one's (`downstream_stragglers`);
    - exposed communication mostly of groups a placement mismatch names, or mostly all-to-all
      behind a routing skew, is that cause's.
    The original severity and saving stay in the evidence.
    """
    causes = _causes(findings, pipeline, breakdown, unoverlapped)
    return sort_findings([_explained(f, _explained_by(f, causes)) for f in findings])


def exposed_share_by_dim(unoverlapped: UnoverlappedResult | None) -> dict[int, dict[str, float]]:
    """Per rank and dim: share of the rank's exposed transfer time (unoverlapped section)."""
    per: dict[int, dict[str, float]] = {}
    for row in section_of(unoverlapped).get("by_rank_dim_op", []):
        d = per.setdefault(row["rank"], {})
        d[row.get("dim") or "unknown"] = d.get(row.get("dim") or "unknown", 0.0) + float(row.get("transfer_exposed_ns") or 0)
    out = {}
    for r, d in per.items():
        tot = sum(d.values())
        if tot > 0:
            out[r] = {k: v / tot for k, v in d.items()}
    return out


def pp_exposed_share(unoverlapped: UnoverlappedResult | None, pipe_ranks: set[int]) -> dict[int, float]:
    """Per pipeline rank: share of its exposed transfer time that is pipeline send/recv (a pp group's
    collectives, or send/recv on any group: a pipeline found from the p2p graph needs no pp group)."""
    tot: dict[int, float] = {}
    pp: dict[int, float] = {}
    for row in section_of(unoverlapped).get("by_rank_dim_op", []):
        r, t = row["rank"], float(row.get("transfer_exposed_ns") or 0)
        tot[r] = tot.get(r, 0.0) + t
        if row.get("dim") == "pp" or (r in pipe_ranks and row.get("op") in ("send", "recv")):
            pp[r] = pp.get(r, 0.0) + t
    return {r: pp.get(r, 0.0) / t for r, t in tot.items() if t > 0}


TRAINING_ONLY = (FindingKind.RECOMPUTE, FindingKind.ACTIVATION_DOMINATED_PEAK, FindingKind.MEMORY_HEADROOM)
"""Findings whose advice is for training (activation checkpointing, recompute, a larger micro-batch for the
memory left over): not given on inference ranks."""
OVERLAP_ADVICE = (FindingKind.UNOVERLAPPED_COLLECTIVE, FindingKind.COMMUNICATION_BOUND)
"""Findings whose advice is to overlap collectives with compute: none on communication-only ranks."""
INPUT_KINDS = (FindingKind.INPUT_SKIPPED, FindingKind.MISSING_RANKS, FindingKind.MIXED_RUNS,
               FindingKind.TIME_UNIT_MISMATCH)
"""Findings about the inputs themselves, kept on any trace kind."""


def fit_trace_kind(findings: list[Finding], trace_kind: TraceKindResult | None) -> list[Finding]:
    """Drop the findings a rank's trace kind rules out (trace_kind.py): any finding (but the inputs') that
    names only capture-only ranks, or every rank when all are capture-only (their timing is the capture's);
    training advice on ranks that are all inference."""
    if trace_kind is None:
        return findings
    capture, inference = trace_kind.capture_only(), trace_kind.inference()
    comm_only = trace_kind.communication_only()
    all_capture = trace_kind.section is not None and trace_kind.section.get("verdict") is None
    out = []
    for f in findings:
        ranks = set(f.ranks)
        if f.kind not in INPUT_KINDS and (all_capture or (ranks and ranks <= capture)):
            continue
        if f.kind in TRAINING_ONLY and inference and (ranks <= inference if ranks else True):
            continue
        if f.kind in OVERLAP_ADVICE and comm_only and (ranks <= comm_only if ranks else True):
            if f.kind is not FindingKind.COMMUNICATION_BOUND:
                continue
            f = replace(f, severity=Severity.INFO, est_saving_ns=0, summary=(
                f"{f.summary}; the steps have no compute (a communication-only loop): nothing to overlap it with"))
        out.append(f)
    return out


def analyze_recommendations(findings: list[Finding], pipeline: PipelineResult | None,
                            breakdown: BreakdownResult | None,
                            unoverlapped: UnoverlappedResult | None,
                            trace_kind: TraceKindResult | None = None) -> RecommendationsResult:
    """Every finding's advice in one list, largest estimated saving first (the document's findings)."""
    final = reconcile(fit_trace_kind(findings, trace_kind), pipeline, breakdown, unoverlapped)
    rows = [{"kind": f.kind.value, "severity": f.severity.value, "ranks": list(f.ranks), "dim": f.dim,
             "summary": f.summary, "recommendation": f.recommendation, "est_saving_ns": int(f.est_saving_ns),
             "saving_formula": f.evidence.saving_formula or "",
             "explained_by": f.evidence.explained_by} for f in final]
    return RecommendationsResult(findings=final, section={"recommendations": rows})
