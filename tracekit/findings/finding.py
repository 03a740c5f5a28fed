"""Typed findings: what an analyzer concludes, with evidence numbers and an estimated saving."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tracekit.findings.evidence import (BandwidthEvidence, BubbleEvidence, CollectiveEvidence, Evidence,
                                        HostBoundEvidence, HostStallEvidence, PlacementEvidence, RoutingSkewEvidence,
                                        StageImbalanceEvidence, StragglerEvidence)


SHARED_HOST_CAVEAT = ("every rank runs on one host: CPU cores shared by several ranks (a preempted or "
                      "oversubscribed process) can make a rank late or leave gaps between its ops as well")
"""The caveat (never a cap) on a host-side cause seen on CPU ranks that share one host's cores."""


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def order(self) -> int:
        return {"info": 0, "warning": 1, "critical": 2}[self.value]


class FindingKind(str, Enum):
    COMMUNICATION_BOUND = "communication_bound"
    UNOVERLAPPED_COLLECTIVE = "unoverlapped_collective"
    PIPELINE_BUBBLE = "pipeline_bubble"
    PIPELINE_IMBALANCE = "pipeline_imbalance"
    EXPERT_ROUTING_SKEW = "expert_routing_skew"
    STRAGGLER = "straggler"
    IDLE_HOST_BOUND = "idle_host_bound"
    HOST_BOUND = "host_bound"
    LOW_BUS_BANDWIDTH = "low_bus_bandwidth"
    PLACEMENT_MISMATCH = "placement_mismatch"
    CLOCK_SKEW = "clock_skew"
    INPUT_SKIPPED = "input_skipped"
    MISSING_RANKS = "missing_ranks"
    MIXED_RUNS = "mixed_runs"
    TIME_UNIT_MISMATCH = "time_unit_mismatch"
    MEMORY_IMBALANCE = "memory_imbalance"
    ACTIVATION_DOMINATED_PEAK = "activation_dominated_peak"
    MEMORY_HEADROOM = "memory_headroom"
    RECOMPUTE = "recompute"
    UNSTABLE_VERDICT = "unstable_verdict"
    LOW_OP_EFFICIENCY = "low_op_efficiency"
    LAUNCH_BOUND_KERNELS = "launch_bound_kernels"
    MEMCPY_ON_CRITICAL_PATH = "memcpy_on_critical_path"
    HANG = "hang"


BLOCKING_KINDS = frozenset({FindingKind.HANG})
"""Findings about a job that stopped: they come before every step-time saving (a hung job has no step)."""

ANALYSIS_KINDS = frozenset({FindingKind.INPUT_SKIPPED, FindingKind.MISSING_RANKS, FindingKind.MIXED_RUNS,
                            FindingKind.TIME_UNIT_MISMATCH, FindingKind.CLOCK_SKEW, FindingKind.UNSTABLE_VERDICT})
"""Findings about the analysis itself (what it read, how far its verdict holds), not about the run: they follow the
run's findings, so the first finding is always about the run (a zero-saving "the verdict may not hold" warning
otherwise outranks every zero-saving cause). Reports show them as caveats beside the verdict
(`analysis_caveats`)."""


EVIDENCE_TYPES: dict[FindingKind, type[Evidence]] = {
    FindingKind.STRAGGLER: StragglerEvidence,
    FindingKind.IDLE_HOST_BOUND: HostStallEvidence,
    FindingKind.HOST_BOUND: HostBoundEvidence,
    FindingKind.UNOVERLAPPED_COLLECTIVE: CollectiveEvidence,
    FindingKind.LOW_BUS_BANDWIDTH: BandwidthEvidence,
    FindingKind.PIPELINE_BUBBLE: BubbleEvidence,
    FindingKind.PIPELINE_IMBALANCE: StageImbalanceEvidence,
    FindingKind.EXPERT_ROUTING_SKEW: RoutingSkewEvidence,
    FindingKind.PLACEMENT_MISMATCH: PlacementEvidence,
}
"""Each kind's evidence class (evidence.py); kinds not named here carry the plain `Evidence`."""


@dataclass(frozen=True)
class Finding:
    """One conclusion about the run; `est_saving_ns` is step time saved per step (a closed-form bound
    from the analyzer, replaced by the replayed saving where the critical path can replay the fix)."""

    kind: FindingKind
    severity: Severity
    summary: str
    ranks: tuple[int, ...] = ()
    dim: str | None = None
    evidence: Evidence = field(default_factory=Evidence)
    recommendation: str = ""
    est_saving_ns: int = 0

    def __post_init__(self) -> None:
        want = EVIDENCE_TYPES.get(self.kind, Evidence)
        if not isinstance(self.evidence, want):
            raise TypeError(f"a {self.kind.value} finding carries {want.__name__}, not {type(self.evidence).__name__}")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "severity": self.severity.value, "summary": self.summary,
                "ranks": list(self.ranks), "dim": self.dim, "evidence": self.evidence.to_json(),
                "recommendation": self.recommendation, "est_saving_ns": int(self.est_saving_ns)}


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Order for reports: a hung job first (BLOCKING_KINDS), then the run's findings by largest estimated saving,
    then severity, then the findings about the analysis (ANALYSIS_KINDS) in the same order."""
    return sorted(findings, key=lambda f: (f.kind not in BLOCKING_KINDS, f.kind in ANALYSIS_KINDS,
                                           -int(f.est_saving_ns), -f.severity.order, f.kind.value))


def severity_by_share(share: float, info: float, warning: float, critical: float) -> Severity | None:
    """The severity a share of the step earns against three ascending thresholds; None below `info`."""
    if share >= critical:
        return Severity.CRITICAL
    if share >= warning:
        return Severity.WARNING
    return Severity.INFO if share >= info else None
