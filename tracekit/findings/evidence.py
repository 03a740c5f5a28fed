"""Typed evidence, one class per finding kind.

A finding's evidence is what a reader checks the conclusion against. The numbers that code reads back
(reconcile's "explained by", the critical path's fix for a finding, the saving's formula) are typed
fields of the kind's class, so nothing downstream guesses keys; the rest of what an analyzer measured
is `details`, shown to the reader (analysis.json, the report's evidence column) and read by no code.
Analyzers build the flat mapping they always wrote and hand it to `<Kind>Evidence.of(...)`, which
takes the typed fields out of it (a missing required one is an error at the analyzer, not a silent
None three modules later).

Fields set after the analyzer (reconcile, critical path) are `Annotations`: absent until set.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, TypeVar

E = TypeVar("E", bound="Evidence")

_OMIT_NONE = {"omit_none": True}


def _later(default: Any = None) -> Any:
    """A field that a later analyzer sets; left out of the JSON while unset."""
    return field(default=default, metadata=_OMIT_NONE)


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """Evidence every finding kind shares; kinds without typed numbers use it as it is."""

    saving_formula: str | None = _later()
    """How `est_saving_ns` was computed, with the numbers used (recommend.py's rules)."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """Everything else the analyzer measured, for the reader."""
    # -- set by the recommendations analyzer (reconcile.py)
    explained_by: str | None = _later()
    """The cause another finding names for this symptom (then severity info, saving 0)."""
    original_severity: str | None = _later()
    original_est_saving_ns: int | None = _later()
    # -- set by the critical-path analyzer (replay of the finding's fix)
    closed_form_saving_ns: int | None = _later()
    replayed_saving_ns: int | None = _later()
    replayed_step_ns: int | None = _later()
    whatif: str | None = _later()
    absorbed_by: Mapping[str, Any] | None = _later()
    joint_replayed_saving_ns: int | None = _later()
    """Replayed saving of this finding's fix together with those of every finding of its kind (critical path:
    ranks that share a cause and meet at collectives save nothing fixed one at a time)."""
    severity_regraded: Mapping[str, Any] | None = _later()
    """Set when the replayed saving lowered the analyzer's severity: {"from", "to", "reason"}
    (critical_path.regrade)."""

    @classmethod
    def of(cls: type[E], values: Mapping[str, Any]) -> E:
        """Split a flat mapping into this class's typed fields and `details`."""
        names = {f.name for f in fields(cls)} - {"details"}
        typed = {k: v for k, v in values.items() if k in names}
        return cls(**typed, details={k: v for k, v in values.items() if k not in names})

    @property
    def explained(self) -> bool:
        """Another finding names this one's cause (reconcile moved its saving to `original_est_saving_ns`)."""
        return self.original_est_saving_ns is not None

    def to_json(self) -> dict[str, Any]:
        """The flat mapping of analysis.json: typed fields (unset annotations left out), then details."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "details" and not (f.metadata.get("omit_none") and value is None):
                out[f.name] = value
        out.update(self.details)
        return out


@dataclass(frozen=True, kw_only=True)
class StragglerEvidence(Evidence):
    cause: str
    """compute | uneven_work | contention | data_load | host_idle | unknown (stragglers.py)."""
    delay_ns_per_step: int
    """Time the rank's groups wait for it per step."""


@dataclass(frozen=True, kw_only=True)
class HostStallEvidence(Evidence):
    cause: str
    """data_load (inside PyTorch's DataLoader ranges) or host_gap."""
    stall_ns: int
    """Per step: host time with nothing running and no device work queued."""


@dataclass(frozen=True, kw_only=True)
class HostBoundEvidence(Evidence):
    cause: str
    """starved_host (slow host ops explain the launch wait) | first_launch (a kernel's first launch in the
    trace: module loading, a warm-up) | launch_overhead (host_bound.py)."""
    launch_wait_ns: int
    """Per step, on the worst rank: time its device sat idle waiting for a launch to return."""


@dataclass(frozen=True, kw_only=True)
class CollectiveEvidence(Evidence):
    """An unoverlapped collective (one op on one dim)."""

    op: str
    transfer_exposed_ns_per_step: int
    share_of_step: float
    """Of the worst rank's step."""


@dataclass(frozen=True, kw_only=True)
class BandwidthEvidence(Evidence):
    op: str
    reference_gbps: float
    """The bus bandwidth the group is measured against (the run's best, or the user's peak)."""
    exposed_bound_ns_per_step: int | None
    """Exposed transfer time of the slow group's collectives (bounds the saving); None when unknown."""
    host: str | None = _later()
    """A slow host NIC: the host every low inter-host group runs through (bandwidth.slow_host)."""
    slow_dims: Mapping[str, int] | None = _later()
    """With `host`: each dim it slows → time lost per step against the reference."""


@dataclass(frozen=True, kw_only=True)
class BubbleEvidence(Evidence):
    measured_bubble: float
    recommended_microbatches: int | None = _later()
    """Set when the advice is more micro-batches (recommend.advise_bubble)."""


@dataclass(frozen=True, kw_only=True)
class StageImbalanceEvidence(Evidence):
    slowest_stage: int
    recommended_stage_layers: list[int] | None = _later()


@dataclass(frozen=True, kw_only=True)
class RoutingSkewEvidence(Evidence):
    layer: int
    expert: int
    skew: float


@dataclass(frozen=True, kw_only=True)
class PlacementEvidence(Evidence):
    exposed_ns_per_step: int
