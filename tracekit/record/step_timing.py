"""What recording costs the user's job inside the profiled window, timed by the recorder at step boundaries.

Each step is timed from one step boundary to the next (`time.perf_counter_ns`, the recorder's own clock;
the boundary's own work — the log flush, `prof.step()` — falls in the step it opens, as it does in the
trace's `ProfilerStep#N`). A step is
- profiled: the profiler kept it (an active step of a profiled rank);
- unprofiled: neither it nor the step before it was profiled or logged (so the step that exports the
  trace, the first after a window, is left out), and it is not step 0 (start-up);
- neither (warmup steps, the export step): not timed.
At most `MAX_UNPROFILED` unprofiled steps are kept, those after the window first (the job at its steady
pace), else those before it. The overhead ratio is median(profiled) / median(unprofiled): the factor by which
the window's steps ran slower than the job's own steps. None when either side has no step.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

MAX_UNPROFILED = 8
"""Unprofiled steps kept per side of the window (before / after)."""


class StepTimer:
    def __init__(self) -> None:
        self._last_ns: int | None = None
        self.profiled_ns: list[int] = []
        self.before_ns: list[int] = []
        self.after_ns: list[int] = []
        self._window_seen = False

    def wants(self) -> bool:
        """Still timing (false once enough unprofiled steps after a window are kept: then it costs nothing)."""
        return len(self.after_ns) < MAX_UNPROFILED

    def boundary(self, kind: str) -> None:
        """A step boundary: the step that just ended was `kind` (profiled | unprofiled | other)."""
        now = time.perf_counter_ns()
        if self._last_ns is not None:
            dur = now - self._last_ns
            if kind == "profiled":
                self.profiled_ns.append(dur)
                self._window_seen = True
            elif kind == "unprofiled":
                side = self.after_ns if self._window_seen else self.before_ns
                if len(side) < MAX_UNPROFILED:
                    side.append(dur)
        self._last_ns = now

    def summary(self) -> dict[str, Any]:
        unprofiled = self.after_ns or self.before_ns
        ratio = None
        if self.profiled_ns and unprofiled:
            ratio = statistics.median(self.profiled_ns) / statistics.median(unprofiled)
        return {"profiled_ns": list(self.profiled_ns), "unprofiled_ns": list(unprofiled),
                "unprofiled_from": ("after_window" if self.after_ns else "before_window" if self.before_ns else None),
                "overhead_ratio": ratio}


def recording_overhead(records: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """Across ranks: each profiled rank's ratio and the median of them (the run's figure), or None."""
    by_rank = {r: rec["step_timing"]["overhead_ratio"] for r, rec in sorted(records.items())
               if isinstance(rec.get("step_timing"), dict) and rec["step_timing"].get("overhead_ratio")}
    if not by_rank:
        return None
    timed = [records[r]["step_timing"] for r in by_rank]
    return {"ratio": statistics.median(by_rank.values()),
            "by_rank": {str(r): v for r, v in by_rank.items()},
            "profiled_steps": min(len(t["profiled_ns"]) for t in timed),
            "unprofiled_steps": min(len(t["unprofiled_ns"]) for t in timed),
            "rule": "median over ranks of median(profiled step) / median(unprofiled step), steps timed by the "
                    "recorder between step boundaries"}
