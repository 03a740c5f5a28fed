"""`tracekit whatif` as a library call: replay a run's steps with fixes applied, and export one step.

`parse_fixes` reads the CLI's spelling (`5=median`, `tp=150GB/s`, ...); `run_whatif` runs the analyzers the
replay needs (inputs, layout, matching, pipeline), builds each step's graph and returns measured, unchanged
replay and predicted step times per step and on average.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tracekit.analyze.pipeline import analyze_pipeline
from tracekit.config import AnalysisConfig
from tracekit.derive.matching import analyze_matching
from tracekit.derive.topology import analyze_layout
from tracekit.tables.store import RunStore
from tracekit.whatif.build import reported_step
from tracekit.whatif.fixes import Fix
from tracekit.whatif.replay import predict_ns
from tracekit.whatif.steps import replay_steps, run_layout, step_input

if TYPE_CHECKING:
    from tracekit.derive.topology import LayoutResult
    from tracekit.derive.matching import MatchingResult
    from tracekit.analyze.pipeline import PipelineResult

_BW = re.compile(r"^\s*([0-9.]+)\s*(GB/s|GBps|Gbit/s|MB/s)?\s*$", re.IGNORECASE)


def parse_bandwidth_gbps(text: str) -> float:
    """'150GB/s' / '150' → 150.0 GB/s; 'MB/s' and 'Gbit/s' are converted."""
    m = _BW.match(text)
    if not m:
        raise ValueError(f"bandwidth {text!r}: expected a number with GB/s, MB/s or Gbit/s (e.g. 150GB/s)")
    value, unit = float(m.group(1)), (m.group(2) or "GB/s").lower()
    return value / 1000 if unit == "mb/s" else value / 8 if unit == "gbit/s" else value


def parse_fixes(*, rank_compute: list[str] = (), dim_bandwidth: list[str] = (), overlap: list[str] = (),
                slow_link: list[str] = (), stage_resplit: bool = False, expert_even: bool = False,
                microbatches: int | None = None, no_host_stalls: bool = False, launches_ahead: bool = False
                ) -> list[Fix]:
    fixes: list[Fix] = []
    for spec in rank_compute:
        rank, _, how = spec.partition("=")
        how = how.strip().lower() or "median"
        try:
            fixes.append(Fix("rank_compute", rank=int(rank), value=None if how == "median" else float(how.rstrip("x"))))
        except ValueError:
            raise ValueError(f"--rank-compute {spec!r}: expected RANK=median or RANK=FACTOR (e.g. 5=median, 5=0.5)") from None
    for spec in dim_bandwidth:
        dim, sep, bw = spec.partition("=")
        if not sep or not dim:
            raise ValueError(f"--dim-bandwidth {spec!r}: expected DIM=BANDWIDTH (e.g. tp=150GB/s)")
        fixes.append(Fix("dim_bandwidth", dim=dim.strip(), value=parse_bandwidth_gbps(bw)))
    fixes += [Fix("dim_overlap", dim=d) for d in overlap] + [Fix("slow_link", dim=d) for d in slow_link]
    if stage_resplit:
        fixes.append(Fix("stage_resplit"))
    if expert_even:
        fixes.append(Fix("expert_even"))
    if microbatches:
        fixes.append(Fix("microbatches", value=float(microbatches)))
    if no_host_stalls:
        fixes.append(Fix("host_stalls"))
    if launches_ahead:
        fixes.append(Fix("host_ahead"))
    return fixes


@dataclass(frozen=True)
class ReplayInputs:
    """The analyzer results the replay reads."""

    layout: LayoutResult
    matching: MatchingResult
    pipeline: PipelineResult


def prepare(store: RunStore) -> ReplayInputs:
    """The analyzers the replay reads, run once: layout, matching (arrival, clocks), pipeline (stages)."""
    layout = analyze_layout(store)
    return ReplayInputs(layout=layout, matching=analyze_matching(store, layout),
                        pipeline=analyze_pipeline(store, AnalysisConfig()))


def run_whatif(store: RunStore, fixes: list[Fix], inputs: ReplayInputs | None = None) -> dict[str, Any]:
    inputs = inputs or prepare(store)
    results = replay_steps(store, step_input(store, inputs.layout, inputs.matching))
    lay = run_layout(inputs.layout, inputs.pipeline, store)
    steps = []
    for r in results:
        steps.append({"step": reported_step(r.step), "measured_ns": r.measured_ns, "replayed_ns": r.replayed_ns,
                      "predicted_ns": predict_ns(r, fixes, lay) if fixes else r.replayed_ns})
    mean = lambda k: int(np.mean([s[k] for s in steps])) if steps else None  # noqa: E731
    return {"fixes": [f.label() for f in fixes], "steps": steps, "measured_ns": mean("measured_ns"),
            "replayed_ns": mean("replayed_ns"), "predicted_ns": mean("predicted_ns"), "results": results}
