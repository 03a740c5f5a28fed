"""Layout advice inside `analyze`: the layout advisor (tracekit/advise) run on this analysis, when the run
allows it — several ranks, a model description (`AnalysisConfig.advice_model`, `tracekit analyze
--model`: a trace does not state layer count and widths), and a layout the advisor can calibrate.

The advisor is bounded here (`ADVICE_SIMULATED`: the closed form's best degree combinations and a few
variants of the best three are simulated), so analyze stays cheap; `tracekit advise` searches wider.

Section `advice`:
  {"available": bool, "reason": str | null,     # reason: one line saying why there is no advice
   "advice": {...} | null}                      # the advice.json document (tracekit/schemas/advice.schema.json)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracekit.analyze.bandwidth import BandwidthResult
from tracekit.analyze.breakdown import BreakdownResult
from tracekit.analyze.memory import MemoryResult
from tracekit.analyze.pipeline import PipelineResult
from tracekit.analyze.placement import PlacementResult
from tracekit.config import AnalysisConfig
from tracekit.derive.topology import LayoutResult
from tracekit.findings.result import AnalyzerResult, section_of
from tracekit.tables.store import RunStore

ADVICE_SIMULATED = (6, 3, 2)
"""(closed form's best degree combinations, more near the current layout, variants of each of the best
three) the analyze-time advisor simulates."""
ADVICE_TOP = 8


@dataclass(frozen=True)
class AdviceResult(AnalyzerResult):
    pass


def _unavailable(reason: str) -> AdviceResult:
    return AdviceResult(section={"available": False, "reason": reason, "advice": None})


def analyze_advice(store: RunStore, layout: LayoutResult | None, breakdown: BreakdownResult | None,
                   pipeline: PipelineResult | None, bandwidth: BandwidthResult | None,
                   placement: PlacementResult | None, memory: MemoryResult | None,
                   config: AnalysisConfig) -> AdviceResult:
    if not config.advice:
        return _unavailable("turned off (--no-advice)")
    ranks = section_of(breakdown).get("ranks", [])
    if len(ranks) < 2:
        return _unavailable("a single-rank run: the advisor calibrates links and layouts from several ranks")
    if config.advice_model is None:
        return _unavailable("the trace does not state the model's shape: pass --model (a preset of "
                            "`tracekit advise`) to rank other layouts")
    analysis: dict[str, Any] = {"ranks": ranks, "sections": {
        "layout": section_of(layout), "pipeline": section_of(pipeline), "bandwidth": section_of(bandwidth),
        "placement": section_of(placement), "memory": section_of(memory)}}
    from tracekit.advise.advisor import advice_json, advise
    from tracekit.advise.schema import validate_advice
    from tracekit.simulate import ClusterSpec
    from tracekit.simulate.executor import Deadlock

    import dataclasses

    from tracekit.simulate.model_file import run_batch

    model, sources = config.advice_model, {"model": "from --model"}
    batch = run_batch(store.manifest)
    if batch is not None:  # the batch the run trained with, not the preset's
        model = dataclasses.replace(model, micro_batch_size=batch[0])
        sources["batch"] = f"micro-batch {batch[0]} sequences from {batch[2]}"
    shortlist, near, variants = ADVICE_SIMULATED
    try:
        adv = advise(analysis, model, ClusterSpec.preset(config.advice_cluster), top=ADVICE_TOP,
                     simulate_top=shortlist, near_current=near, variants_per_layout=variants, sources=sources)
    except (ValueError, KeyError, Deadlock) as exc:
        return _unavailable(f"the measured layout cannot be calibrated: {exc}")
    doc = advice_json(adv)
    validate_advice(doc)
    return AdviceResult(section={"available": True, "reason": None, "advice": doc})
