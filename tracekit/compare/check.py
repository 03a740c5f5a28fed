"""Threshold checks over an analysis, for CI gates (`tracekit check`): which limits a run breaches.

Every check reads numbers analysis.json already holds; a check whose number the run lacks (e.g.
`max_bubble` without pipeline parallelism) is reported as not measured and never fails the gate.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from tracekit.document import AnalysisDocument, as_document
from tracekit.findings.finding import Severity


NOT_GATED = ("unstable_verdict",)
"""Finding kinds `fail_on` never fails on: they say the recorded steps vary too much to trust a verdict
(noise in the recording, not a fault of the run), so a gate on them fails clean runs at random."""


@dataclass(kw_only=True, frozen=True)
class Thresholds:
    """Limits; None = not checked. Fractions are of the step time (0.2 = 20%)."""

    max_exposed_comm: float | None = None
    """Exposed (unoverlapped) communication transfer / step time, worst rank. Waiting for a late peer
    (`sync_wait_ns`) is left out: it is the late rank's cost (see max_skew), not this rank's network."""
    max_bubble: float | None = None
    """Pipeline bubble (measured, mean over pipelines and steps)."""
    max_idle: float | None = None
    """Idle time / step time, worst rank."""
    max_step_ms: float | None = None
    """Step time in milliseconds, slowest rank (mean over its steps)."""
    max_skew: float | None = None
    """Straggler delay / step time: how long the groups waited for a rank, worst rank."""
    max_routing_skew: float | None = None
    """MoE routing skew (max / mean tokens per expert), worst layer."""
    fail_on: Severity | None = None
    """Fail when any finding has at least this severity (except the kinds in NOT_GATED)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "fail_on" and v is not None and (not isinstance(v, (int, float)) or v < 0):
                raise ValueError(f"{f.name} must be a non-negative number, got {v!r}")

    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))


@dataclass(frozen=True)
class CheckResult:
    name: str
    """The option name, e.g. max_exposed_comm."""
    limit: Any
    value: float | None
    """The measured value (None: the run does not have this number)."""
    breached: bool
    detail: str
    """Where the value comes from (which rank / layer / findings)."""

    @property
    def measured(self) -> bool:
        return self.value is not None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "limit": self.limit, "value": self.value, "breached": self.breached,
                "measured": self.measured, "detail": self.detail}


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _worst_rank_fraction(doc: AnalysisDocument, key: str) -> tuple[float | None, str]:
    best: tuple[float, int] | None = None
    for r in doc.ranks:
        value = getattr(r, key)
        if _num(value) and r.step_ns > 0:
            frac = value / r.step_ns
            if best is None or frac > best[0]:
                best = (frac, r.rank)
    return (None, "no per-rank breakdown") if best is None else (best[0], f"rank {best[1]}")


def _exposed_transfer(doc: AnalysisDocument) -> tuple[float | None, str]:
    """Exposed transfer share, worst rank (exposed comm when the analysis predates the split)."""
    split = bool(doc.ranks) and all(_num(r.exposed_transfer_ns) for r in doc.ranks)
    value, where = _worst_rank_fraction(doc, "exposed_transfer_ns" if split else "exposed_comm_ns")
    if value is None or not split:
        return value, where
    return value, f"{where} (exposed transfer; waiting for late peers excluded)"


def _slowest_step_ms(doc: AnalysisDocument) -> tuple[float | None, str]:
    best: tuple[float, int] | None = None
    for r in doc.ranks:
        if r.steps > 0:
            v = r.step_ns / r.steps / 1e6
            if best is None or v > best[0]:
                best = (v, r.rank)
    return (None, "no per-rank breakdown") if best is None else (best[0], f"rank {best[1]}")


def _bubble(doc: AnalysisDocument) -> tuple[float | None, str]:
    sec = doc.sections.pipeline
    if sec is None or not _num(sec.measured_bubble):
        return None, "no pipeline parallelism found"
    return float(sec.measured_bubble), f"{sec.schedule or 'pipeline'}, theoretical {sec.theoretical_bubble}"


def _worst(rows: list[tuple[Any, Any]], label: str, none_reason: str) -> tuple[float | None, str]:
    """The largest numeric value among (value, name) rows, named `label name`."""
    rows = [r for r in rows if _num(r[0])]
    if not rows:
        return None, none_reason
    worst = max(rows, key=lambda r: r[0])
    return float(worst[0]), f"{label} {worst[1]}"


def _skew(doc: AnalysisDocument) -> tuple[float | None, str]:
    sec = doc.sections.stragglers
    return _worst([(r.delay_fraction, r.rank) for r in (sec.ranks if sec else [])], "rank", "no matched collectives")


def _routing_skew(doc: AnalysisDocument) -> tuple[float | None, str]:
    sec = doc.sections.experts
    return _worst([(r.skew, r.layer) for r in (sec.layers if sec else [])], "layer", "no expert routing recorded")


def evaluate(analysis: AnalysisDocument | dict[str, Any], thresholds: Thresholds) -> list[CheckResult]:
    """One result per threshold given, in option order (`analysis`: the typed document, or a dict)."""
    doc = as_document(analysis)
    measures = {
        "max_exposed_comm": lambda: _exposed_transfer(doc),
        "max_bubble": lambda: _bubble(doc),
        "max_idle": lambda: _worst_rank_fraction(doc, "idle_ns"),
        "max_step_ms": lambda: _slowest_step_ms(doc),
        "max_skew": lambda: _skew(doc),
        "max_routing_skew": lambda: _routing_skew(doc),
    }
    out: list[CheckResult] = []
    for name, measure in measures.items():
        limit = getattr(thresholds, name)
        if limit is None:
            continue
        value, detail = measure()
        out.append(CheckResult(name, limit, value, value is not None and value > limit, detail))
    if thresholds.fail_on is not None:
        level = Severity(thresholds.fail_on).order
        at_level = [f for f in doc.findings
                    if f.severity in {s.value for s in Severity} and Severity(f.severity).order >= level]
        hits = [f for f in at_level if f.kind not in NOT_GATED]
        detail = "; ".join(f"{f.severity} {f.kind}: {f.summary}" for f in hits[:5]) or "none"
        noise = sorted({f.kind for f in at_level if f.kind in NOT_GATED})
        if noise:
            detail += f" ({', '.join(noise)} not gated: noise in the recording, not a fault of the run)"
        out.append(CheckResult("fail_on", Severity(thresholds.fail_on).value, float(len(hits)), bool(hits), detail))
    return out
