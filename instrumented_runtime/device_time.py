"""Simulated accelerator time (ModelConfig.device_us_per_token): a wait per token, spent the way a host
waits on its GPU, so pipeline stages and expert-parallel ranks can work side by side on a box with fewer
cores than ranks. Used by the blocks (`model.py`) and the experts (`moe.py`)."""

from __future__ import annotations

import time

import torch
from torch.profiler import record_function


class DeviceWait(torch.autograd.Function):
    """Identity that waits `seconds` in forward and twice that in backward: simulated accelerator time
    (ModelConfig.device_us_per_token), spent like a host waiting on a kernel, not on a core."""

    @staticmethod
    def forward(ctx, x, seconds):  # type: ignore[override]
        ctx.seconds = seconds
        with record_function("device:wait"):
            time.sleep(seconds)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        with record_function("device:wait"):
            time.sleep(2 * ctx.seconds)
        return g, None


def device_wait(x: torch.Tensor, tokens: int, us_per_token: float) -> torch.Tensor:
    """`x` after the simulated device time of `tokens` tokens (nothing when the knob is off)."""
    if us_per_token <= 0 or tokens <= 0:
        return x
    return DeviceWait.apply(x, tokens * us_per_token * 1e-6)
