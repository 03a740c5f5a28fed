"""Clock anchors, so traces from ranks on different hosts can be put on one time axis later.

Three kinds, all stored in `record.rank{R}.json` and merged into manifest.json:
- `sample()`: a (wall, monotonic) pair taken locally (start and end of the process's recording);
- `barrier_samples()`: wall times read right after each of a few barriers on the default group —
  every rank leaves a barrier at about the same instant, so the spread of these readings across
  ranks estimates the clock offset between hosts (take the minimum over samples);
- `trace_anchor()`: a `tracekit::clock_anchor` event emitted inside the profiled window whose args
  carry the wall/monotonic ns read just before it, tying Kineto's clock to the wall clock.
"""

from __future__ import annotations

import time
from typing import Any

ANCHOR_EVENT = "tracekit::clock_anchor"


def sample() -> dict[str, int]:
    return {"wall_ns": time.time_ns(), "monotonic_ns": time.monotonic_ns()}


def barrier_samples(num_samples: int = 3) -> list[dict[str, int]]:
    """Barrier on the default process group `num_samples` times; every rank must call this."""
    import torch.distributed as dist

    out = []
    for _ in range(num_samples):
        dist.barrier()
        out.append(sample())
    return out


def trace_anchor(step: int) -> dict[str, Any]:
    """Emit one anchor event into the running profiler (args need record_shapes) and return it."""
    import torch

    s = sample()
    args = {"wall_ns": str(s["wall_ns"]), "monotonic_ns": str(s["monotonic_ns"]), "step": step}
    with torch._C._profiler._RecordFunctionFast(ANCHOR_EVENT, [], args):
        pass
    return {"step": step, **s}
