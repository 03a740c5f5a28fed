"""Typed findings: what an analyzer concludes, with evidence numbers and an estimated saving."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


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


@dataclass(frozen=True)
class Finding:
    """One conclusion about the run; `est_saving_ns` is an upper bound on step time saved per step."""

    kind: FindingKind
    severity: Severity
    summary: str
    ranks: tuple[int, ...] = ()
    dim: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    recommendation: str = ""
    est_saving_ns: int = 0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind"] = self.kind.value
        d["severity"] = self.severity.value
        d["ranks"] = list(self.ranks)
        d["est_saving_ns"] = int(self.est_saving_ns)
        return d


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Order for reports: largest estimated saving first, then severity."""
    return sorted(findings, key=lambda f: (-int(f.est_saving_ns), -f.severity.order, f.kind.value))
