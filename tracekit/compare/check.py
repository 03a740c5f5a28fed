"""Threshold checks over an analysis, for CI gates (`tracekit check`): which limits a run breaches.

Every check reads numbers analysis.json already holds; a check whose number the run lacks (e.g.
`max_bubble` without pipeline parallelism) is reported as not measured and never fails the gate.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

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


def _worst_rank_fraction(analysis: dict[str, Any], key: str) -> tuple[float | None, str]:
    best: tuple[float, int] | None = None
    for r in analysis.get("ranks") or []:
        if _num(r.get(key)) and _num(r.get("step_ns")) and r["step_ns"] > 0:
            frac = r[key] / r["step_ns"]
            if best is None or frac > best[0]:
                best = (frac, r["rank"])
    return (None, "no per-rank breakdown") if best is None else (best[0], f"rank {best[1]}")


def _exposed_transfer(analysis: dict[str, Any]) -> tuple[float | None, str]:
    """Exposed transfer share, worst rank (exposed comm when the analysis predates the split)."""
    ranks = analysis.get("ranks") or []
    split = bool(ranks) and all(_num(r.get("exposed_transfer_ns")) for r in ranks)
    value, where = _worst_rank_fraction(analysis, "exposed_transfer_ns" if split else "exposed_comm_ns")
    if value is None or not split:
        return value, where
    return value, f"{where} (exposed transfer; waiting for late peers excluded)"


def _slowest_step_ms(analysis: dict[str, Any]) -> tuple[float | None, str]:
    best: tuple[float, int] | None = None
    for r in analysis.get("ranks") or []:
        if _num(r.get("step_ns")) and _num(r.get("steps")) and r["steps"] > 0:
            v = r["step_ns"] / r["steps"] / 1e6
            if best is None or v > best[0]:
                best = (v, r["rank"])
    return (None, "no per-rank breakdown") if best is None else (best[0], f"rank {best[1]}")


def _section(analysis: dict[str, Any], name: str) -> dict[str, Any]:
    sec = (analysis.get("sections") or {}).get(name)
    return sec if isinstance(sec, dict) else {}


def _bubble(analysis: dict[str, Any]) -> tuple[float | None, str]:
    sec = _section(analysis, "pipeline")
    v = sec.get("measured_bubble")
    if not _num(v):
        return None, "no pipeline parallelism found"
    return float(v), f"{sec.get('schedule') or 'pipeline'}, theoretical {sec.get('theoretical_bubble')}"


def _worst(rows: Any, key: str, label: str, none_reason: str) -> tuple[float | None, str]:
    """The largest numeric `key` among the section's rows, named by the row's `label` field."""
    rows = [r for r in rows or [] if isinstance(r, dict) and _num(r.get(key))]
    if not rows:
        return None, none_reason
    worst = max(rows, key=lambda r: r[key])
    return float(worst[key]), f"{label} {worst.get(label)}"


def _skew(analysis: dict[str, Any]) -> tuple[float | None, str]:
    return _worst(_section(analysis, "stragglers").get("ranks"), "delay_fraction", "rank", "no matched collectives")


def _routing_skew(analysis: dict[str, Any]) -> tuple[float | None, str]:
    return _worst(_section(analysis, "experts").get("layers"), "skew", "layer", "no expert routing recorded")


def evaluate(analysis: dict[str, Any], thresholds: Thresholds) -> list[CheckResult]:
    """One result per threshold given, in option order."""
    measures = {
        "max_exposed_comm": lambda: _exposed_transfer(analysis),
        "max_bubble": lambda: _bubble(analysis),
        "max_idle": lambda: _worst_rank_fraction(analysis, "idle_ns"),
        "max_step_ms": lambda: _slowest_step_ms(analysis),
        "max_skew": lambda: _skew(analysis),
        "max_routing_skew": lambda: _routing_skew(analysis),
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
        at_level = [f for f in analysis.get("findings") or []
                    if f.get("severity") in {s.value for s in Severity} and Severity(f["severity"]).order >= level]
        hits = [f for f in at_level if f.get("kind") not in NOT_GATED]
        detail = "; ".join(f"{f['severity']} {f['kind']}: {f.get('summary', '')}" for f in hits[:5]) or "none"
        noise = sorted({f["kind"] for f in at_level if f.get("kind") in NOT_GATED})
        if noise:
            detail += f" ({', '.join(noise)} not gated: noise in the recording, not a fault of the run)"
        out.append(CheckResult("fail_on", Severity(thresholds.fail_on).value, float(len(hits)), bool(hits), detail))
    return out
