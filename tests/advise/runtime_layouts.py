"""Runs of the reference runtime (`python -m instrumented_runtime`) at a given layout, with simulated device
time (`--device-us-per-token`: a per-token wait per block and per routed token in each expert, spent like a
host waiting on its GPU, so ranks run side by side on few cores), and their measured step times.

Shared by tests/advise/test_advise_cli_runtime.py and benchmarks/advisor_runtime_bench.py (the full comparison; the
4-rank test that predicted three hand-picked layouts within 10% moved there: the benchmark holds that target).
The measured step of a run is the runtime's own clock (train_log.json), not tracekit's: the slowest rank's
step, per profiled step."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tracekit.simulate import ParallelLayout, ModelSpec

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RuntimeModel:
    """The runtime's model flags and the same model described to the advisor (`--model`)."""

    layers: int = 4
    d_model: int = 64
    heads: int = 4
    d_ff: int = 128
    seq: int = 64
    vocab: int = 256
    experts: int = 4
    top_k: int = 2
    global_batch: int = 16
    """Sequences per step over all replicas (kept for every layout)."""
    us_per_token: float = 600.0
    """Large enough that the waits dominate the ranks' CPU work even when a busy 2-core box slows it."""

    def args(self) -> list[str]:
        return ["--num-layers", str(self.layers), "--d-model", str(self.d_model), "--num-heads", str(self.heads),
                "--d-ff", str(self.d_ff), "--seq-len", str(self.seq), "--vocab-size", str(self.vocab),
                "--moe-every", "1", "--num-experts", str(self.experts), "--top-k", str(self.top_k),
                "--global-batch-size", str(self.global_batch), "--device-us-per-token", str(self.us_per_token)]

    def spec(self, layout: ParallelLayout) -> ModelSpec:
        """The model as the advisor sees it, at the micro-batch size `layout` runs (global batch kept);
        float32 like the runtime's default dtype, a two-matrix MLP of d_ff (the simulator's three-matrix
        MLP at 2/3 of the width has its FLOPs), the runtime's default expert capacity factor, attention
        within each sequence."""
        return ModelSpec("runtime", layers=self.layers, hidden=self.d_model, heads=self.heads,
                         ffn=self.d_ff * 2 // 3, seq=self.seq, vocab=self.vocab, experts=self.experts,
                         top_k=self.top_k, moe_every=1, dtype_bytes=4, capacity_factor=1.25, packed_attention=False,
                         micro_batch_size=self.micro_batch(layout))

    def micro_batch(self, layout: ParallelLayout) -> int:
        return self.global_batch // (layout.dp * layout.microbatches)


def layout_args(layout: ParallelLayout) -> list[str]:
    out = ["--dp", str(layout.dp), "--tp", str(layout.tp), "--pp", str(layout.pp), "--cp", str(layout.cp),
           "--ep", str(layout.ep), "--microbatches", str(layout.microbatches),
           "--dp-mode", "fsdp" if layout.fsdp else "ddp"]
    if layout.pp > 1:
        out += ["--schedule", layout.schedule]
        if layout.stages_per_rank > 1:
            out += ["--virtual-stages", str(layout.stages_per_rank)]
    if layout.activation_checkpointing:
        out.append("--activation-checkpointing")
    return out


def layout_name(layout: ParallelLayout) -> str:
    s = f"dp{layout.dp} tp{layout.tp} pp{layout.pp} cp{layout.cp} ep{layout.ep}"
    if layout.pp > 1:
        s += f" {layout.schedule}{'/v' + str(layout.stages_per_rank) if layout.stages_per_rank > 1 else ''} m{layout.microbatches}"
    return s + (" fsdp" if layout.fsdp else "")


def run_layout(model: RuntimeModel, layout: ParallelLayout, out: Path, *, steps: int, profile_steps: int) -> Path:
    """Run the runtime at `layout` into `out` (traces, logs, train_log.json); raise with its stderr on failure."""
    cmd = [sys.executable, "-m", "instrumented_runtime", *layout_args(layout), *model.args(),
           "--steps", str(steps), "--profile-steps", str(profile_steps), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return out


def step_times(out: Path, profile_steps: int) -> list[int]:
    """The slowest rank's step time (ns) of each profiled step (the run's last `profile_steps`)."""
    per_rank = json.loads((out / "train_log.json").read_text())["step_ns"]
    steps = zip(*per_rank.values())
    return [max(s) for s in list(steps)[-profile_steps:]]


def layout_from_json(lay: dict) -> ParallelLayout:
    """An advice.json layout (tracekit/advise/advisor.py layout_json) as a layout the runtime can run."""
    return ParallelLayout(dp=lay["dp"], tp=lay["tp"], pp=lay["pp"], cp=lay["cp"], ep=lay["ep"],
                          dp_mode="fsdp" if lay["fsdp"] else "ddp", schedule=lay["schedule"] or "1f1b",
                          microbatches=lay["microbatches"], virtual_stages=lay["interleave"],
                          activation_checkpointing=lay["activation_checkpointing"])


def advise_cli(run: Path, out: Path, *extra: str) -> tuple[dict, str]:
    """`tracekit advise RUN --out OUT` as a user runs it (no --model: the model comes from the run); the advice
    document and what the command printed."""
    from typer.testing import CliRunner

    from tracekit.cli.main import app

    res = CliRunner().invoke(app, ["advise", str(run), "--out", str(out), "-q", *extra])
    if res.exit_code != 0:
        raise RuntimeError(f"tracekit advise {run} exited {res.exit_code}:\n{res.output}")
    return json.loads((out / "advice.json").read_text()), res.output
