"""Runs the analyzers over a run store and assembles `analysis.json` (schema tracekit.analysis/1).

Each analyzer is one module with one entry function `fn(store, ctx) -> AnalyzerResult`. They run in
the order of ANALYZERS; later ones may read earlier results from `ctx.results` (e.g. recommendations
read every finding, pipeline reads the layout). A section is the JSON-ready data the report lays out
(reports compute nothing): each analyzer module documents the shape of its section in its docstring.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from tracekit.analyze.findings import Finding, sort_findings
from tracekit.tables.store import RunStore

ANALYSIS_SCHEMA = "tracekit.analysis/1"


@dataclass(kw_only=True)
class AnalysisConfig:
    """User-tunable analysis settings (CLI flags map onto these)."""

    peak_gbps: dict[str, float] = field(default_factory=dict)
    """Bus-bandwidth peak per group name or dim (e.g. {"tp": 150.0}); empty = best seen in the run."""
    peak_tflops: float | None = None
    """Per-device peak for MFU; None = from deviceProperties when known."""
    tokens_per_step: int | None = None
    """Tokens processed per step per data-parallel replica (overrides the manifest)."""
    max_timeline_intervals: int = 20000
    """Down-sampling budget for the timeline section."""
    isolate_analyzer_errors: bool = True
    """An analyzer that fails on odd input is listed in `analyzer_errors` and the others still run
    (False: the exception propagates, for debugging)."""


@dataclass(frozen=True)
class AnalyzerResult:
    findings: list[Finding] = field(default_factory=list)
    section: dict[str, Any] | None = None


@dataclass
class AnalysisContext:
    config: AnalysisConfig
    results: dict[str, AnalyzerResult] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    """Intermediate, non-JSON data one analyzer leaves for later ones (e.g. per-rank busy intervals)."""

    def section(self, name: str) -> dict[str, Any] | None:
        res = self.results.get(name)
        return res.section if res else None


# (section name, "module:function"). Order matters: later analyzers may read earlier sections.
ANALYZERS: list[tuple[str, str]] = [
    ("inputs", "tracekit.analyze.inputs:analyze_inputs"),
    ("layout", "tracekit.analyze.layout:analyze_layout"),
    # matching before breakdown: the breakdown splits exposed comm into sync wait and transfer
    ("matching", "tracekit.analyze.matching:analyze_matching"),
    ("clocks", "tracekit.analyze.clocks:analyze_clocks"),
    ("breakdown", "tracekit.analyze.breakdown:analyze_breakdown"),
    ("recording", "tracekit.analyze.recording:analyze_recording"),
    ("stragglers", "tracekit.analyze.stragglers:analyze_stragglers"),
    ("unoverlapped", "tracekit.analyze.unoverlapped:analyze_unoverlapped"),
    ("pipeline", "tracekit.analyze.pipeline:analyze_pipeline"),
    ("host_stalls", "tracekit.analyze.host_stalls:analyze_host_stalls"),
    ("experts", "tracekit.analyze.experts:analyze_experts"),
    ("bandwidth", "tracekit.analyze.bandwidth:analyze_bandwidth"),
    ("throughput", "tracekit.analyze.throughput:analyze_throughput"),
    ("placement", "tracekit.analyze.placement:analyze_placement"),
    ("memory", "tracekit.analyze.memory:analyze_memory"),
    # keep last: lists every finding's advice
    ("recommendations", "tracekit.analyze.recommend:analyze_recommendations"),
    # after the findings are final: replaces each one's saving by the replayed one
    ("critical_path", "tracekit.analyze.critical_path:analyze_critical_path"),
]


def _load(spec: str) -> Callable[[RunStore, AnalysisContext], AnalyzerResult]:
    mod, fn = spec.split(":")
    return getattr(importlib.import_module(mod), fn)


def analyze_store(store: RunStore, config: AnalysisConfig | None = None,
                  command: str | None = None,
                  prefetch: Callable[[RunStore, AnalysisContext], None] | None = None) -> dict[str, Any]:
    """Run every analyzer and return the analysis.json document.

    `prefetch` (tracekit.engines.rank_tasks) runs after `layout`: it computes per-rank results on an
    engine (process pool / Ray) into ctx.cache, where the analyzers find them instead of recomputing.
    """
    from tracekit import __version__

    ctx = AnalysisContext(config=config or AnalysisConfig())
    findings: list[Finding] = []
    errors: list[dict[str, str]] = []
    for name, spec in ANALYZERS:
        try:
            if prefetch is not None and name == "breakdown":
                try:
                    prefetch(store, ctx)
                except Exception as exc:  # the analyzers compute what the prefetch would have
                    if not ctx.config.isolate_analyzer_errors:
                        raise
                    errors.append({"analyzer": "prefetch", "error": f"{type(exc).__name__}: {exc}"})
            result = _load(spec)(store, ctx)
        except Exception as exc:  # one analyzer failing on odd input must not lose the others' results
            if not ctx.config.isolate_analyzer_errors:
                raise
            errors.append({"analyzer": name, "error": f"{type(exc).__name__}: {exc}"})
            result = AnalyzerResult()
        ctx.results[name] = result
        findings.extend(result.findings)
    if ctx.cache.get("final_findings") is not None:
        # the recommendations pass (recommend.py) reconciles symptoms with causes and fills in advice
        findings = ctx.cache["final_findings"]
    breakdown = ctx.section("breakdown") or {}
    return {
        "schema": ANALYSIS_SCHEMA,
        "tracekit_version": __version__,
        "command": command,
        "inputs": {"ranks": store.ranks(), "skipped": store.skipped,
                   "warnings": [*(ctx.section("inputs") or {}).get("warnings", []),
                                *(ctx.section("matching") or {}).get("warnings", [])]},
        "ranks": breakdown.get("ranks", []),
        "findings": [f.to_json() for f in sort_findings(findings)],
        "sections": {name: res.section for name, res in ctx.results.items() if res.section is not None},
        "analyzer_errors": errors,
    }
