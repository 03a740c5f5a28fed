"""Run the reference runtime from tests: forked gloo ranks (B2's run_distributed) or the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from tests.runtime._dist import run_distributed

from instrumented_runtime.config import FaultConfig, ModelConfig, RunConfig

REPO = Path(__file__).resolve().parents[2]


def small_model(**kw: Any) -> ModelConfig:
    base = dict(d_model=32, num_heads=4, num_layers=4, d_ff=64, vocab_size=128, max_seq_len=128,
                num_experts=4, top_k=2)
    base.update(kw)
    return ModelConfig(**base)


def numerics_config(out: Path, **kw: Any) -> RunConfig:
    """float64, no token dropping (capacity >= all assignments) and no aux loss: a sharded run then computes
    exactly the single-process function, so losses agree to rounding (the aux loss is per routing call, i.e.
    per shard, and capacity is per routing call too; both legitimately differ from one process's)."""
    model = small_model(capacity_factor=4.0, aux_loss_weight=0.0)
    return RunConfig.build(model=model, dtype="float64", steps=3, profile_steps=0, seq_len=32, global_batch_size=8,
                     out=str(out), **kw)


def _rank_main(rank: int, world: int, cfg_dict: dict[str, Any]) -> int:
    from instrumented_runtime.train import train_rank

    warnings.simplefilter("ignore")
    train_rank(RunConfig.from_dict(cfg_dict), rank, world, command=["pytest"], launcher="test-fork")
    return rank


def _reference_main(rank: int, world: int, cfg_dict: dict[str, Any]) -> list[float]:
    from instrumented_runtime.train import run_reference

    return run_reference(RunConfig.from_dict(cfg_dict))


def run_job(cfg: RunConfig) -> Path:
    """Train `cfg` on cfg.world_size forked ranks; returns the output dir."""
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    run_distributed(cfg.world_size, _rank_main, cfg.to_dict(), timeout_s=240)
    return Path(cfg.out)


def reference_losses(cfg: RunConfig) -> list[float]:
    """The single-process losses of the same model/data/seed (computed in a forked child: no torch ops
    in the pytest process before later forks)."""
    return run_distributed(1, _reference_main, cfg.to_dict())[0]


def run_cli(args: list[str], timeout_s: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "instrumented_runtime", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout_s)


def train_log(out: Path) -> dict[str, Any]:
    return json.loads((Path(out) / "train_log.json").read_text())


__all__ = ["FaultConfig", "ModelConfig", "RunConfig", "numerics_config", "reference_losses", "run_cli", "run_job",
           "small_model", "train_log"]
