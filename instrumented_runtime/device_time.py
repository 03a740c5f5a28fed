"""Simulated accelerator time (ModelConfig.device_us_per_token): a wait per token, spent the way a host
waits on its GPU, so pipeline stages and expert-parallel ranks can work side by side on a box with fewer
cores than ranks. Used by the blocks (`model.py`) and the experts (`moe.py`).

The wait is recorded as an op (`device:wait`, a `cpu_op` through `_RecordFunctionFast`), not as a
`record_function` label: it stands in for a kernel, i.e. work (on a CPU trace the host is the device),
while a label is never work by itself to tracekit (a sleep inside a label is a host gap)."""

from __future__ import annotations

import time

import torch
from torch._C._profiler import _RecordFunctionFast


DEVICE_WAIT = "device:wait"


class DeviceWait(torch.autograd.Function):
    """Identity that waits `seconds` in forward and twice that in backward: simulated accelerator time
    (ModelConfig.device_us_per_token), spent like a host waiting on a kernel, not on a core."""

    @staticmethod
    def forward(ctx, x, seconds):  # type: ignore[override]
        ctx.seconds = seconds
        with _RecordFunctionFast(DEVICE_WAIT):
            time.sleep(seconds)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        with _RecordFunctionFast(DEVICE_WAIT):
            time.sleep(2 * ctx.seconds)
        return g, None


def device_wait(x: torch.Tensor, tokens: int, us_per_token: float) -> torch.Tensor:
    """`x` after the simulated device time of `tokens` tokens (nothing when the knob is off)."""
    if us_per_token <= 0 or tokens <= 0:
        return x
    return DeviceWait.apply(x, tokens * us_per_token * 1e-6)
