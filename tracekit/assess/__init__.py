"""The assessment: what happens after measurement, in this order and no other.

1. `advice` (assess/advice.py): the layout advisor run on the measured layout, breakdown, pipeline,
   bandwidth, placement and memory, when the run allows it.
2. `recommendations` (assess/reconcile.py): every measured finding, reconciled — symptoms whose cause
   another finding names are marked explained, not counted twice.
3. `critical_path` (assess/critical_path.py): the cross-rank dependency graph replayed; each reconciled
   finding's fix replayed on it, its saving and severity rescored.

The document's findings are those of the last step that ran (critical_path, else recommendations, else
the measured findings as they came). Each step is isolated like an analyzer: one that fails is listed in
`analyzer_errors` and the next steps receive None for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from tracekit.assess.advice import analyze_advice
from tracekit.assess.critical_path import analyze_critical_path
from tracekit.assess.reconcile import analyze_recommendations
from tracekit.config import AnalysisConfig
from tracekit.findings.finding import Finding
from tracekit.findings.result import AnalyzerResult
from tracekit.process_env import release_memory
from tracekit.tables.store import RunStore

__all__ = ["ASSESSMENT", "Assessed", "AssessmentStep", "assess"]


@dataclass(frozen=True)
class AssessmentStep:
    name: str
    """Its section in analysis.json."""
    consumes: str
    """What it reads, in words (`tracekit analyze --explain-plan`)."""
    final: bool
    """Its findings, when it ran, are the document's (the last such step that ran wins)."""


ASSESSMENT = (
    AssessmentStep("advice", "layout, breakdown, pipeline, bandwidth, placement, memory", final=False),
    AssessmentStep("recommendations", "findings of every analyzer, pipeline, breakdown, unoverlapped, trace_kind",
                   final=True),
    AssessmentStep("critical_path", "layout, matching, pipeline, trace_kind, host_bound, recommendations, findings "
                   "of every analyzer",
                   final=True),
)


@dataclass
class Assessed:
    results: dict[str, AnalyzerResult | None] = field(default_factory=dict)
    """Each step's result (None: it failed), in ASSESSMENT order."""
    findings: list[Finding] = field(default_factory=list)
    """The document's findings."""
    errors: list[dict[str, str]] = field(default_factory=list)


def _steps(store: RunStore, config: AnalysisConfig, m: dict[str, AnalyzerResult | None],
           measured: list[Finding], done: dict[str, AnalyzerResult | None]) -> dict[str, Callable[[], Any]]:
    """Each step's call, reading the measured results `m` and the earlier steps' results `done`."""
    return {
        "advice": lambda: analyze_advice(store, m.get("layout"), m.get("breakdown"), m.get("pipeline"),
                                         m.get("bandwidth"), m.get("placement"), m.get("memory"), config),
        "recommendations": lambda: analyze_recommendations(measured, m.get("pipeline"), m.get("breakdown"),
                                                           m.get("unoverlapped"), m.get("trace_kind")),
        "critical_path": lambda: analyze_critical_path(store, m.get("layout"), m.get("matching"), m.get("pipeline"),
                                                       done.get("recommendations"), measured, config,
                                                       m.get("trace_kind"), m.get("host_bound")),
    }


def assess(store: RunStore, config: AnalysisConfig, measured_results: dict[str, AnalyzerResult | None],
           measured: list[Finding]) -> Assessed:
    """Run the assessment on the measured results and their findings (`measured`, in plan order)."""
    measured = list(measured)
    out = Assessed(findings=measured)
    calls = _steps(store, config, measured_results, measured, out.results)
    for step in ASSESSMENT:
        release_memory()
        try:
            out.results[step.name] = calls[step.name]()
            if not step.final:  # a step that does not reconcile adds its findings to what the next ones read
                measured.extend(out.results[step.name].findings)
        except Exception as exc:  # one step failing on odd input must not lose the others' results
            if not config.isolate_analyzer_errors:
                raise
            out.errors.append({"analyzer": step.name, "error": f"{type(exc).__name__}: {exc}"})
            out.results[step.name] = None
    final = next((out.results[s.name] for s in reversed(ASSESSMENT)
                  if s.final and out.results.get(s.name) is not None), None)
    out.findings = final.findings if final is not None else measured
    return out
