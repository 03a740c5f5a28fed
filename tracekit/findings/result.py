"""The result every analyzer (and every derived fact and assessment step) returns: findings and a section.

An analyzer is a function `analyze_x(store, <inputs>, config) -> XResult` (see analyze/runner.py): its
result type is a frozen dataclass deriving from `AnalyzerResult` that adds the typed data later
analyzers consume; `section` is its JSON-ready part of analysis.json, `findings` its conclusions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from tracekit.findings.finding import Finding


@dataclass(frozen=True)
class AnalyzerResult:
    """Base of every analyzer's result: its findings and its section of analysis.json (None: none)."""

    findings: list[Finding] = field(default_factory=list)
    section: dict[str, Any] | None = None
    travels: ClassVar[bool] = False
    """Besides its findings and section the result holds only a small summary (a few bytes a rank), so an engine
    may compute it on a worker and send it back (analyze/runner.py `_plain_result`); a result carrying tables
    or per-rank arrays stays False."""

    def section_or_empty(self) -> dict[str, Any]:
        return self.section or {}


def section_of(result: AnalyzerResult | None) -> dict[str, Any]:
    """The section of an input that may be missing (its analyzer failed or was not given): {} then."""
    return (result.section or {}) if result is not None else {}
