"""Per-rank torch.profiler set-up: the last `profile_steps` steps are recorded, after one warm-up step.

Each rank writes `rank{R}.pt.trace.json.gz` from `on_trace_ready` (export happens inside `prof.step()`,
6-15 s at 16 ranks: DESIGN §8, hence the long process-group timeouts).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from .config import RunConfig


def trace_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"rank{rank}.pt.trace.json.gz"


def profiled_steps(cfg: RunConfig) -> list[int]:
    """0-based train steps inside the active window (the last profile_steps steps)."""
    return list(range(cfg.steps - cfg.profile_steps, cfg.steps))


def make_profiler(cfg: RunConfig, out_dir: str | Path, rank: int) -> profile | None:
    """The rank's profiler, or None when `profile_steps` is 0 (numerics-only runs)."""
    if cfg.profile_steps == 0:
        return None
    wait = cfg.steps - cfg.profile_steps - 1
    path = trace_path(out_dir, rank)
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)

    def _export(prof: profile) -> None:
        prof.export_chrome_trace(str(path))

    return profile(activities=activities,
                   schedule=schedule(wait=wait, warmup=1, active=cfg.profile_steps, repeat=1),
                   on_trace_ready=_export, record_shapes=True, with_flops=True, profile_memory=True)
