"""Runs the measurement over a run store: the derived facts and the analyzers, in dependency order.

Each analyzer is one function that declares what it consumes in its signature and returns a typed
result (a frozen dataclass deriving from `findings.result.AnalyzerResult`):

    def analyze_stragglers(store: RunStore, matching: MatchingResult | None,
                           breakdown: BreakdownResult | None, activity: RankActivities | None,
                           config: AnalysisConfig) -> StragglersResult

- `store` is the run store and `config` the user's `AnalysisConfig` (both optional to declare);
- a parameter named after another step of `ANALYZERS` is that step's result, annotated with its result
  type (checked when the plan is built); None when that step failed on this input;
- any other parameter must have a default (tests and callers may pass it; the runner does not).

The first steps of `ANALYZERS` are derived facts (tracekit/derive: topology, activity, matching), run here
so that their sections and failures are reported like an analyzer's; the rest measure. The runner orders
the steps from these declarations (a topological sort that keeps the order of `ANALYZERS` where the
dependencies allow) and passes each one its inputs; analyzers share nothing else. After measurement,
the assessment (tracekit/assess: advice, the reconciled recommendations, the replayed critical path)
runs, and tracekit/flow.py assembles the document; `tracekit analyze --explain-plan` prints both.
A section is the JSON-ready data the report lays out (reports compute nothing): each analyzer module
documents its section in its docstring. New analyzers: write the function in this style and add a line
to `ANALYZERS`.
"""

from __future__ import annotations

import functools
import graphlib
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from tracekit.config import AnalysisConfig
from tracekit.findings.result import AnalyzerResult
from tracekit.process_env import release_memory
from tracekit.tables.store import RunStore

__all__ = ["ANALYZERS", "PlanStep", "build_plan", "measure"]

# (name, "module:function"). The name is the analyzer's section in analysis.json and the parameter
# name its consumers declare. The order here is the run order where dependencies allow: the steps an engine's
# workers can run (`_shippable`: host_stalls, host_bound, recording, trace_kind, throughput, ops, memory) come
# after those the main process runs, so that it reaches their results last.
ANALYZERS: list[tuple[str, str]] = [
    ("inputs", "tracekit.analyze.inputs:analyze_inputs"),
    ("hang", "tracekit.analyze.hang:analyze_hang"),
    ("layout", "tracekit.derive.topology:analyze_layout"),
    ("activity", "tracekit.derive.activity:rank_activities"),
    ("stepless", "tracekit.derive.activity:analyze_stepless"),
    ("matching", "tracekit.derive.matching:analyze_matching"),
    ("clocks", "tracekit.analyze.clocks:analyze_clocks"),
    ("breakdown", "tracekit.analyze.breakdown:analyze_breakdown"),
    ("stragglers", "tracekit.analyze.stragglers:analyze_stragglers"),
    ("unoverlapped", "tracekit.analyze.unoverlapped:analyze_unoverlapped"),
    ("pipeline", "tracekit.analyze.pipeline:analyze_pipeline"),
    ("experts", "tracekit.analyze.experts:analyze_experts"),
    ("bandwidth", "tracekit.analyze.bandwidth:analyze_bandwidth"),
    ("placement", "tracekit.analyze.placement:analyze_placement"),
    ("host_stalls", "tracekit.analyze.host_stalls:analyze_host_stalls"),
    ("host_bound", "tracekit.analyze.host_bound:analyze_host_bound"),
    ("recording", "tracekit.analyze.recording:analyze_recording"),
    ("trace_kind", "tracekit.analyze.trace_kind:analyze_trace_kind"),
    ("throughput", "tracekit.analyze.throughput:analyze_throughput"),
    ("ops", "tracekit.analyze.ops:analyze_ops"),
    ("memory", "tracekit.analyze.memory:analyze_memory"),
]
ENGINE_ARGS = ("store", "config")


@dataclass(frozen=True)
class PlanStep:
    name: str
    fn: Callable[..., AnalyzerResult]
    inputs: tuple[str, ...]
    """Analyzers whose results this one takes as arguments (parameter name = analyzer name)."""
    result_type: str
    params: tuple[str, ...]
    """The parameters the runner fills: `store`, `config` and inputs, as declared."""
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
    inputs, params = [], []
    for p in sig.parameters.values():
        if p.name in ENGINE_ARGS:
            params.append(p.name)
        elif p.name in names and p.name != name:
            inputs.append(p.name)
            params.append(p.name)
        elif p.default is inspect.Parameter.empty:
            raise ValueError(f"analyzer {name}: parameter {p.name!r} is neither an analyzer's result "
                             f"nor one of {', '.join(ENGINE_ARGS)}, and has no default")
    return PlanStep(name=name, fn=fn, inputs=tuple(inputs), result_type=_type_name(sig.return_annotation),
                    params=tuple(params))


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
    return {n: list(s.inputs) for n, s in steps.items()}


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
            steps[n] = PlanStep(name=n, fn=None, inputs=(), result_type="", params=(),
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


def _run_step(step: PlanStep, store: RunStore, config: AnalysisConfig,
              results: dict[str, AnalyzerResult | None]) -> AnalyzerResult:
    args: dict[str, Any] = {"store": store, "config": config}
    args.update({d: results.get(d) for d in step.inputs})
    return step.fn(**{p: args[p] for p in step.params})


SHIPPED_INPUTS = frozenset({"layout", "stepless", "breakdown", "pipeline"})
"""Results small enough to send to a worker process with a step that consumes them: the layout (groups and
their dims), the stepless ranks' windows (a few bytes a rank), the breakdown's and the pipeline's findings and
sections (JSON-ready data; 1.2 MB and 0.16 MB pickled at 1,024 simulated ranks). With these, host_stalls and
host_bound run on the engine's idle workers from the start of the measurement, ops, trace_kind, recording and
throughput once the breakdown is done, memory with the pipeline, beside the main process's stragglers and
exposure analyzers."""


@functools.lru_cache(maxsize=None)
def _plain_result(fn: Callable[..., AnalyzerResult]) -> bool:
    """The step's declared result holds only findings and a section (JSON-ready data), or declares itself a
    small summary (`AnalyzerResult.travels`): it comes back from a worker cheaply, unlike a result carrying
    tables (matching's, the activities). Read once per function."""
    import dataclasses
    import typing

    try:
        cls = typing.get_type_hints(fn).get("return")
    except Exception:  # an annotation that does not resolve: not known to be plain
        return False
    return (isinstance(cls, type) and dataclasses.is_dataclass(cls)
            and ({f.name for f in dataclasses.fields(cls)} <= {"findings", "section"}
                 or getattr(cls, "travels", False)))


def _shippable(step: PlanStep, results: dict[str, AnalyzerResult | None]) -> bool:
    """The step may run on a worker now: its inputs (all in SHIPPED_INPUTS) are ready and its result is plain."""
    return (step.fn is not None and step.load_error is None
            and all(d in SHIPPED_INPUTS and d in results for d in step.inputs) and _plain_result(step.fn))


def measure(store: RunStore, config: AnalysisConfig, analyzers: list[tuple[str, Any]],
            prefetch: Callable[..., AnalyzerResult] | None = None,
            submit: Callable[..., Any] | None = None
            ) -> tuple[dict[str, AnalyzerResult | None], list[dict[str, str]]]:
    """Every step of `analyzers` in plan order: (results by name, None where a step failed; the errors).

    `submit` (tracekit.engines.rank_tasks.step_submitter) runs a step on the engine's workers: after each
    step (after the `activity` prefetch, whose per-rank tasks need every worker), the later steps that need
    nothing but the store, the config and `SHIPPED_INPUTS` are handed to it (it returns a future, or None while
    the engine has no worker running), and their results are taken when the plan reaches them. A step whose
    remote run fails in any way is run here instead, so its result and its error are what running it here
    gives."""
    plan = build_plan(analyzers, isolate_import_errors=config.isolate_analyzer_errors)
    results: dict[str, AnalyzerResult | None] = {}
    errors: list[dict[str, str]] = []
    remote: dict[str, Any] = {}
    for i, step in enumerate(plan):
        release_memory()  # what the previous step freed back to the OS (a large run's peak is the sum otherwise)
        if step.load_error is not None:
            errors.append({"analyzer": step.name, "error": step.load_error})
            results[step.name] = None
            continue
        _run_here_or_there(step, store, config, results, errors, remote, prefetch, analyzers)
        if prefetch is None or "activity" in results:  # the prefetch's per-rank tasks need every worker first
            _hand_over(plan[i + 1:], submit, store, config, results, remote)
    for fut in remote.values():  # none is left unless a step was listed twice
        fut.cancel()
    return results, errors


def _run_here_or_there(step: PlanStep, store: RunStore, config: AnalysisConfig,
                       results: dict[str, AnalyzerResult | None], errors: list[dict[str, str]], remote: dict[str, Any],
                       prefetch: Callable[..., AnalyzerResult] | None, analyzers: list[tuple[str, Any]]) -> None:
    """The step's result into `results` (None where it failed, with its error in `errors`): from the worker
    it was handed to, from the prefetch for `activity`, else run here."""
    if step.name in remote:
        try:
            results[step.name] = _remote_result(step, remote.pop(step.name))
            return
        except Exception:  # the pool broke, or the step failed there: run it here, as without an engine
            pass
    elif prefetch is not None and step.name == "activity":
        try:
            results[step.name] = _run_step(
                _declare(step.name, prefetch, {n for n, _ in analyzers}), store, config, results)
            return
        except Exception as exc:  # the default `activity` computes what the prefetch would have
            if not config.isolate_analyzer_errors:
                raise
            errors.append({"analyzer": "prefetch", "error": f"{type(exc).__name__}: {exc}"})
    try:
        results[step.name] = _run_step(step, store, config, results)
    except Exception as exc:  # one analyzer failing on odd input must not lose the others' results
        if not config.isolate_analyzer_errors:
            raise
        errors.append({"analyzer": step.name, "error": f"{type(exc).__name__}: {exc}"})
        results[step.name] = None


def _remote_result(step: PlanStep, fut: Any) -> AnalyzerResult:
    """The step's result from the worker that ran it (waits for it; raises what the remote run raised)."""
    return fut.result()


def _hand_over(later: list[PlanStep], submit: Callable[..., Any] | None, store: RunStore, config: AnalysisConfig,
               results: dict[str, AnalyzerResult | None], remote: dict[str, Any]) -> None:
    """Submit the later steps that can run on a worker now (`_shippable`) and are not submitted yet."""
    if submit is None:
        return
    for step in later:
        if step.name in remote or not _shippable(step, results):
            continue
        fut = submit(step.fn, step.params, store, config, {d: results[d] for d in step.inputs})
        if fut is None:  # no worker running yet
            return
        remote[step.name] = fut
