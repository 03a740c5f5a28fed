"""Runs the analyzers over a run store, in dependency order, and assembles `analysis.json`.

Each analyzer is one function that declares what it consumes in its signature and returns a typed
result (a frozen dataclass deriving from `base.AnalyzerResult`):

    def analyze_stragglers(store: RunStore, matching: MatchingResult | None,
                           breakdown: BreakdownResult | None, activity: RankActivities | None,
                           config: AnalysisConfig) -> StragglersResult

- `store` is the run store and `config` the user's `AnalysisConfig` (both optional to declare);
- a parameter named after another analyzer of `ANALYZERS` is that analyzer's result, annotated with
  its result type (checked when the plan is built); None when that analyzer failed on this input;
- a parameter named `findings` (type `list[Finding]`) is every finding of the analyzers that do
  not take `findings` themselves — the recommendations pass reconciles them, critical_path
  rescores those, and its findings are the document's (`FINAL_FINDINGS`);
- any other parameter must have a default (tests and callers may pass it; the engine does not).

The engine orders the analyzers from these declarations (a topological sort that keeps the order of
`ANALYZERS` where the dependencies allow) and passes each one its inputs; analyzers share nothing
else. `tracekit analyze --explain-plan` prints the plan. A section is the JSON-ready data the report
lays out (reports compute nothing): each analyzer module documents its section in its docstring.
New analyzers: write the function in this style and add a line to `ANALYZERS`.
"""

from __future__ import annotations

import graphlib
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from tracekit.analyze.base import AnalysisConfig, AnalyzerResult, section_of
from tracekit.analyze.findings import Finding, sort_findings
from tracekit.tables.store import RunStore

__all__ = ["ANALYSIS_SCHEMA", "ANALYZERS", "AnalysisConfig", "AnalyzerResult", "PlanStep", "analyze_store",
           "build_plan", "explain_plan"]

ANALYSIS_SCHEMA = "tracekit.analysis/1"

# (name, "module:function"). The name is the analyzer's section in analysis.json and the parameter
# name its consumers declare. The order here is the run order where dependencies allow.
ANALYZERS: list[tuple[str, str]] = [
    ("inputs", "tracekit.analyze.inputs:analyze_inputs"),
    ("hang", "tracekit.analyze.hang:analyze_hang"),
    ("layout", "tracekit.analyze.layout:analyze_layout"),
    ("activity", "tracekit.analyze.breakdown:rank_activities"),
    ("matching", "tracekit.analyze.matching:analyze_matching"),
    ("clocks", "tracekit.analyze.clocks:analyze_clocks"),
    ("breakdown", "tracekit.analyze.breakdown:analyze_breakdown"),
    ("recording", "tracekit.analyze.recording:analyze_recording"),
    ("trace_kind", "tracekit.analyze.trace_kind:analyze_trace_kind"),
    ("stragglers", "tracekit.analyze.stragglers:analyze_stragglers"),
    ("unoverlapped", "tracekit.analyze.unoverlapped:analyze_unoverlapped"),
    ("pipeline", "tracekit.analyze.pipeline:analyze_pipeline"),
    ("host_stalls", "tracekit.analyze.host_stalls:analyze_host_stalls"),
    ("host_bound", "tracekit.analyze.host_bound:analyze_host_bound"),
    ("experts", "tracekit.analyze.experts:analyze_experts"),
    ("bandwidth", "tracekit.analyze.bandwidth:analyze_bandwidth"),
    ("throughput", "tracekit.analyze.throughput:analyze_throughput"),
    ("ops", "tracekit.analyze.ops:analyze_ops"),
    ("placement", "tracekit.analyze.placement:analyze_placement"),
    ("memory", "tracekit.analyze.memory:analyze_memory"),
    ("advice", "tracekit.analyze.advice:analyze_advice"),
    ("recommendations", "tracekit.analyze.reconcile:analyze_recommendations"),
    ("critical_path", "tracekit.analyze.critical_path:analyze_critical_path"),
]
FINAL_FINDINGS = ("critical_path", "recommendations")
"""Analyzers whose findings are the document's, the first of them that ran: critical_path rescores the
findings recommendations reconciled from every other one (when both fail, the document lists the
others' findings as they came)."""

ENGINE_ARGS = ("store", "config")
ALL_FINDINGS = "findings"


@dataclass(frozen=True)
class PlanStep:
    name: str
    fn: Callable[..., AnalyzerResult]
    inputs: tuple[str, ...]
    """Analyzers whose results this one takes as arguments (parameter name = analyzer name)."""
    takes_findings: bool
    result_type: str
    params: tuple[str, ...]
    """The parameters the engine fills: `store`, `config`, inputs and `findings`, as declared."""
    load_error: str | None = None
    """Why the analyzer could not be loaded (isolated plans only): it is listed and not run."""


def _load(spec: str | Callable[..., AnalyzerResult]) -> Callable[..., AnalyzerResult]:
    if callable(spec):
        return spec
    mod, fn = spec.split(":")
    return getattr(importlib.import_module(mod), fn)


def _type_name(annotation: Any) -> str:
    if annotation is inspect.Signature.empty:
        return ""
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", str(annotation))


def _declare(name: str, fn: Callable[..., AnalyzerResult], names: set[str]) -> PlanStep:
    """A step from the analyzer's signature; ValueError for a parameter the engine cannot fill."""
    sig = inspect.signature(fn)
    inputs, params, takes = [], [], False
    for p in sig.parameters.values():
        if p.name in ENGINE_ARGS:
            params.append(p.name)
        elif p.name == ALL_FINDINGS:
            takes = True
            params.append(p.name)
        elif p.name in names and p.name != name:
            inputs.append(p.name)
            params.append(p.name)
        elif p.default is inspect.Parameter.empty:
            raise ValueError(f"analyzer {name}: parameter {p.name!r} is neither an analyzer's result, "
                             f"{', '.join(ENGINE_ARGS)} nor {ALL_FINDINGS!r}, and has no default")
    return PlanStep(name=name, fn=fn, inputs=tuple(inputs), takes_findings=takes,
                    result_type=_type_name(sig.return_annotation), params=tuple(params))


def _check_types(steps: dict[str, PlanStep]) -> None:
    """Each input's annotation names the result type of the analyzer it comes from (when that one
    declares its return type; a stand-in without annotations, e.g. a test's, is taken as it is)."""
    for step in steps.values():
        if step.fn is None:
            continue
        hints = inspect.signature(step.fn).parameters
        for dep in step.inputs:
            want = steps[dep].result_type
            if not want:
                continue
            got = _type_name(hints[dep].annotation)
            if want not in got.replace(" ", "").split("|"):
                raise TypeError(f"analyzer {step.name}: parameter {dep!r} is annotated {got!r}, "
                                f"but analyzer {dep} returns {want!r}")


def _dependencies(steps: dict[str, PlanStep]) -> dict[str, list[str]]:
    gatherers = {n for n, s in steps.items() if s.takes_findings}
    return {n: list(s.inputs) + ([m for m in steps if m not in gatherers] if s.takes_findings else [])
            for n, s in steps.items()}


def _loaded(analyzers: list[tuple[str, Any]], isolate: bool) -> dict[str, PlanStep]:
    """Each analyzer's step; with `isolate`, one whose module fails to import becomes a step that
    only carries the error (its consumers then receive None, as when it fails at run time)."""
    names = {n for n, _ in analyzers}
    steps = {}
    for n, spec in analyzers:
        try:
            steps[n] = _declare(n, _load(spec), names)
        except ImportError as exc:
            if not isolate:
                raise
            steps[n] = PlanStep(name=n, fn=None, inputs=(), takes_findings=False, result_type="", params=(),
                                load_error=f"{type(exc).__name__}: {exc}")
    return steps


def build_plan(analyzers: list[tuple[str, Any]] | None = None, isolate_import_errors: bool = False
               ) -> list[PlanStep]:
    """The analyzers in run order; raises graphlib.CycleError on circular declarations."""
    analyzers = ANALYZERS if analyzers is None else analyzers
    steps = _loaded(analyzers, isolate_import_errors)
    _check_types(steps)
    deps = _dependencies(steps)
    graphlib.TopologicalSorter(deps).prepare()  # CycleError names the cycle
    order: list[str] = []

    def visit(n: str) -> None:  # depth-first in declaration order: the declared order where valid
        if n in order:
            return
        for d in deps[n]:
            visit(d)
        order.append(n)

    for n, _ in analyzers:
        visit(n)
    return [steps[n] for n in order]


def explain_plan(plan: list[PlanStep] | None = None) -> str:
    """The dependency graph as text: one line per analyzer, in run order, with what it consumes."""
    plan = plan if plan is not None else build_plan()
    width = max(len(s.name) for s in plan)
    lines = [f"{len(plan)} analyzers, in run order (<- consumes; => result type):"]
    for i, s in enumerate(plan, 1):
        ins = list(s.inputs)
        if s.takes_findings:
            ins.append("findings of every other analyzer")
        lines.append(f"{i:>3}. {s.name:<{width}}  <- {', '.join(ins) if ins else '(the run store only)'}"
                     f"  => {s.result_type}")
    lines.append(f"the document's findings: those of the first of {', '.join(FINAL_FINDINGS)} that ran")
    return "\n".join(lines)


def _gathered(plan: list[PlanStep], results: dict[str, AnalyzerResult | None]) -> list[Finding]:
    return [f for s in plan if not s.takes_findings and results.get(s.name) is not None
            for f in results[s.name].findings]


def _run_step(step: PlanStep, store: RunStore, config: AnalysisConfig, plan: list[PlanStep],
              results: dict[str, AnalyzerResult | None]) -> AnalyzerResult:
    args: dict[str, Any] = {"store": store, "config": config}
    args.update({d: results.get(d) for d in step.inputs})
    if step.takes_findings:
        args[ALL_FINDINGS] = _gathered(plan, results)
    return step.fn(**{p: args[p] for p in step.params})


def analyze_store(store: RunStore, config: AnalysisConfig | None = None,
                  command: str | None = None,
                  prefetch: Callable[..., AnalyzerResult] | None = None,
                  analyzers: list[tuple[str, Any]] | None = None) -> dict[str, Any]:
    """Run every analyzer and return the analysis.json document.

    `prefetch` (tracekit.engines.rank_tasks.prefetch_rank_activity) stands in for the `activity`
    analyzer: it computes the per-rank activities on an engine (process pool / Ray); when it fails,
    the error is listed as `prefetch` and the analyzers compute activities on demand.
    `analyzers`: (name, "module:function" or function) pairs to run instead of ANALYZERS.
    """
    from tracekit import __version__

    config = config or AnalysisConfig()
    analyzers = ANALYZERS if analyzers is None else analyzers
    plan = build_plan(analyzers, isolate_import_errors=config.isolate_analyzer_errors)
    results: dict[str, AnalyzerResult | None] = {}
    errors: list[dict[str, str]] = []
    for step in plan:
        if step.load_error is not None:
            errors.append({"analyzer": step.name, "error": step.load_error})
            results[step.name] = None
            continue
        if prefetch is not None and step.name == "activity":
            try:
                results[step.name] = _run_step(
                    _declare(step.name, prefetch, {n for n, _ in analyzers}), store, config, plan, results)
                continue
            except Exception as exc:  # the default `activity` computes what the prefetch would have
                if not config.isolate_analyzer_errors:
                    raise
                errors.append({"analyzer": "prefetch", "error": f"{type(exc).__name__}: {exc}"})
        try:
            results[step.name] = _run_step(step, store, config, plan, results)
        except Exception as exc:  # one analyzer failing on odd input must not lose the others' results
            if not config.isolate_analyzer_errors:
                raise
            errors.append({"analyzer": step.name, "error": f"{type(exc).__name__}: {exc}"})
            results[step.name] = None
    final = next((results[n] for n in FINAL_FINDINGS if results.get(n) is not None), None)
    findings = final.findings if final is not None else _gathered(plan, results)
    order = [n for n, _ in analyzers]
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
