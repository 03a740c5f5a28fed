"""The whole analysis of a run store, top to bottom: measure (tracekit/analyze/runner.py: derived facts
and analyzers), assess (tracekit/assess: advice, reconciled recommendations, the replayed critical path),
and assemble the analysis.json document from the results. `tracekit.analyze_run` (tracekit/analysis.py)
parses traces and writes the outputs around this.
"""

from __future__ import annotations

from typing import Any, Callable

from tracekit.analyze.runner import ANALYZERS, PlanStep, build_plan, measure
from tracekit.assess import ASSESSMENT, assess
from tracekit.config import AnalysisConfig
from tracekit.document.model import ANALYSIS_SCHEMA, SECTION_NAMES
from tracekit.findings.finding import sort_findings
from tracekit.findings.result import AnalyzerResult, section_of
from tracekit.tables.store import RunStore

__all__ = ["ANALYSIS_SCHEMA", "analyze_store", "explain_plan"]


def explain_plan(plan: list[PlanStep] | None = None) -> str:
    """The dependency graph as text: one line per step, in run order, with what it consumes; then the
    assessment's steps."""
    plan = plan if plan is not None else build_plan()
    width = max(len(s.name) for s in plan)
    lines = [f"{len(plan)} analyzers, in run order (<- consumes; => result type):"]
    for i, s in enumerate(plan, 1):
        lines.append(f"{i:>3}. {s.name:<{width}}  <- {', '.join(s.inputs) if s.inputs else '(the run store only)'}"
                     f"  => {s.result_type}")
    lines.append(f"then the assessment (tracekit/assess), in this order:")
    for i, a in enumerate(ASSESSMENT, len(plan) + 1):
        lines.append(f"{i:>3}. {a.name:<{width}}  <- {a.consumes}")
    lines.append(f"the document's findings: those of the first of {', '.join(a.name for a in ASSESSMENT if a.final)} "
                 "that ran")
    return "\n".join(lines)


def analyze_store(store: RunStore, config: AnalysisConfig | None = None,
                  command: str | None = None,
                  prefetch: Callable[..., AnalyzerResult] | None = None,
                  analyzers: list[tuple[str, Any]] | None = None,
                  submit: Callable[..., Any] | None = None,
                  measured: Callable[[], None] | None = None) -> dict[str, Any]:
    """Measure, assess, and return the analysis.json document.

    `prefetch` (tracekit.engines.rank_tasks.prefetch_rank_activity) stands in for the `activity`
    step: it computes the per-rank activities on an engine (process pool / Ray); when it fails,
    the error is listed as `prefetch` and the analyzers compute activities on demand.
    `submit` (tracekit.engines.rank_tasks.step_submitter) runs the steps that need only the store and the
    layout on the engine's workers while this process goes on (tracekit/analyze/runner.py `measure`).
    `analyzers`: (name, "module:function" or function) pairs to run instead of ANALYZERS; the assessment
    runs only with the default analyzers (it reads their results).
    `measured`: called once the analyzers are done, before the assessment (the engine's `release`: its workers,
    idle from then on, give their memory back before the critical path's peak).
    """
    from tracekit import __version__

    config = config or AnalysisConfig()
    custom = analyzers is not None
    analyzers = ANALYZERS if analyzers is None else analyzers
    results, errors = measure(store, config, analyzers, prefetch, submit)
    if measured is not None:
        measured()
    order = document_order([n for n, _ in analyzers])
    findings = [f for n in order if (r := results.get(n)) is not None for f in r.findings]
    if not custom:
        assessed = assess(store, config, results, findings)
        errors.extend(assessed.errors)
        findings = assessed.findings
        for name, res in assessed.results.items():
            results[name] = res
            order.append(name)
    return {
        "schema": ANALYSIS_SCHEMA,
        "tracekit_version": __version__,
        "command": command,
        "inputs": {"ranks": store.ranks(), "skipped": store.skipped,
                   "warnings": [*section_of(results.get("inputs")).get("warnings", []),
                                *section_of(results.get("matching")).get("warnings", [])]},
        "ranks": section_of(results.get("breakdown")).get("ranks", []),
        "findings": [f.to_json() for f in sort_findings(findings)],
        "sections": {n: results[n].section for n in order
                     if results.get(n) is not None and results[n].section is not None},
        "analyzer_errors": errors,
    }


def document_order(names: list[str]) -> list[str]:
    """`names` (analyzers) in the document's order (`SECTION_NAMES`: the report's reading order), the others
    after them as given: sections and findings come in this order whatever order the plan ran the analyzers in
    (analyze/runner.py puts the steps a worker can run last)."""
    rank = {n: i for i, n in enumerate(SECTION_NAMES)}
    return sorted(names, key=lambda n: rank.get(n, len(rank)))
