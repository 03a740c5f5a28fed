"""The user's analysis settings: what `tracekit analyze` flags set, read by analyzers and assessment steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True)
class AnalysisConfig:
    """User-tunable analysis settings (CLI flags map onto these)."""

    peak_gbps: dict[str, float] = field(default_factory=dict)
    """Bus-bandwidth peak per group name or dim (e.g. {"tp": 150.0}); empty = best seen in the run."""
    peak_tflops: float | None = None
    """Per-device peak for MFU; None = from deviceProperties when known."""
    peak_bandwidth_tbps: float | None = None
    """Per-device memory bandwidth for the roofline, TB/s; None = the device table (analyze/hardware.py)."""
    tokens_per_step: int | None = None
    """Tokens processed per step per data-parallel replica (overrides the manifest)."""
    max_timeline_intervals: int = 20000
    """Down-sampling budget for the timeline section."""
    timeline_ranks: tuple[int, ...] | None = None
    """Ranks the step timeline draws, a lane per kind each (`--timeline-ranks 0-7,12`); None: every rank, one
    summary row each beyond 8 ranks with the busiest ranks in full (analyze/breakdown.py)."""
    advice: bool = True
    """Rank other parallel layouts (the layout advisor) when the run allows it (`--no-advice`: off)."""
    advice_model: Any = None
    """The model the advisor predicts with (a tracekit.simulate.ModelSpec, `--model`); None: no advice,
    since a trace does not state layer count and widths."""
    advice_cluster: str = "1x8-h100"
    """Cluster preset the advisor's calibration starts from (its links and GEMM efficiency are measured)."""
    isolate_analyzer_errors: bool = True
    """An analyzer that fails on odd input is listed in `analyzer_errors` and the others still run
    (False: the exception propagates, for debugging)."""
