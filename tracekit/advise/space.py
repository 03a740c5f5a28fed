"""The layouts worth predicting for N GPUs: dp × tp × pp × cp = N (ep over dp × cp), micro-batches, schedule,
FSDP or DDP, activation checkpointing — keeping the global batch and the model's divisibility rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from tracekit.layout import ParallelLayout
from tracekit.simulate import ModelSpec


@dataclass(frozen=True)
class SearchSpace:
    gpus: int
    global_batch: int
    """Sequences per step over the whole job (kept constant across layouts)."""
    max_tp: int = 8
    max_cp: int = 16
    """Ring attention beyond this many ranks moves more than it saves on any sequence we model."""
    schedules: tuple[str, ...] = ("1f1b", "interleaved", "gpipe", "zb")
    microbatch_factors: tuple[int, ...] = (1, 2, 4)
    """Micro-batches tried per pipeline stage count (m = factor × pp)."""
    fsdp: tuple[bool, ...] = (False, True)
    checkpointing: tuple[bool, ...] = (False, True)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def degrees(model: ModelSpec, space: SearchSpace) -> Iterator[tuple[int, int, int, int]]:
    """(dp, tp, pp, cp) with the product N that the model's shape allows."""
    n = space.gpus
    for tp in _divisors(n):
        if tp > space.max_tp or model.heads % tp:
            continue
        for pp in _divisors(n // tp):
            if pp > model.layers:
                continue
            for cp in _divisors(n // (tp * pp)):
                if cp > space.max_cp or (cp > 1 and model.seq % (2 * cp)):
                    continue
                dp = n // (tp * pp * cp)
                if space.global_batch % dp:
                    continue
                yield dp, tp, pp, cp


def expert_degrees(model: ModelSpec, dp: int, cp: int) -> list[int]:
    if model.experts == 0:
        return [1]
    return [e for e in _divisors(dp * cp) if model.experts % e == 0]


def pipeline_options(space: SearchSpace, pp: int, per_replica: int) -> Iterator[tuple[str, int, int]]:
    """(schedule, micro-batches, interleave) for a pipeline of pp stages and `per_replica` sequences."""
    if pp == 1:
        yield "1f1b", 1, 1
        return
    for f in space.microbatch_factors:
        m = f * pp
        if per_replica % m:
            continue
        for s in space.schedules:
            yield s, m, (2 if s in ("interleaved", "zb") else 1)


def enumerate_layouts(model: ModelSpec, space: SearchSpace) -> Iterator[tuple[ParallelLayout, int]]:
    """Every valid (layout, micro-batch size in sequences) of the space."""
    for dp, tp, pp, cp in degrees(model, space):
        per_replica = space.global_batch // dp
        for ep in expert_degrees(model, dp, cp):
            for schedule, m, v in pipeline_options(space, pp, per_replica):
                if pp * v > model.layers:
                    continue
                for fsdp in space.fsdp:
                    if fsdp and dp * cp == 1:
                        continue
                    for ac in space.checkpointing:
                        yield ParallelLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, dp_mode="fsdp" if fsdp else "ddp",
                                             schedule=schedule, microbatches=m, virtual_stages=v,
                                             activation_checkpointing=ac), per_replica // m
