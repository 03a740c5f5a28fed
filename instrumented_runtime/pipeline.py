"""Pipeline parallelism with `torch.distributed.pipelining` (GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble).

The whole-built model is cut into `num_stages` contiguous layer ranges (even, or `--stage-layers`);
stage s lives on pp rank s % pp (loop placement, v = stages per rank). Each stage's micro-batch compute
is wrapped in `pp:stage{S}:mb{M}:fwd|bwd|bwd_input|bwd_weight` record_function labels by overriding the
stage's `forward_one_chunk` / `backward_one_chunk` / `backward_weight_one_chunk`, and the schedule's P2P
goes through B2's `Comm` (so it is logged) by replacing `schedules._batch_p2p`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as _schedules

from .comm import Comm
from .model import Transformer

SCHEDULE_CLASSES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "zb": "ScheduleInterleavedZeroBubble",
}


def stage_indices(pp_rank: int, pp: int, stages_per_rank: int) -> list[int]:
    return [pp_rank + k * pp for k in range(stages_per_rank)]


def build_stage_module(full: Transformer, layer_ids: range, is_first: bool, is_last: bool) -> Transformer:
    """A deep copy of the whole model keeping only `layer_ids` (and embeddings / head on the ends)."""
    m = copy.deepcopy(full)
    for lid in list(m.layers.keys()):
        if int(lid) not in layer_ids:
            del m.layers[lid]
    if not is_first:
        m.tok_emb = None
        m.pos_emb = None
    if not is_last:
        m.norm = None
        m.lm_head = None
    return m


class LabelledPipelineStage(PipelineStage):
    """PipelineStage whose micro-batch compute carries the `pp:stage{S}:mb{M}:<phase>` labels."""

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        with record_function(f"pp:stage{self.stage_index}:mb{fwd_chunk_id}:fwd"):
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(self, bwd_chunk_id: int, loss: Any = None, full_backward: bool = True,
                           last_backward: bool = False) -> Any:
        phase = "bwd" if full_backward else "bwd_input"
        with record_function(f"pp:stage{self.stage_index}:mb{bwd_chunk_id}:{phase}"):
            return super().backward_one_chunk(bwd_chunk_id, loss=loss, full_backward=full_backward,
                                              last_backward=last_backward)

    def backward_weight_one_chunk(self, bwd_chunk_id: int, last_backward: bool = False) -> Any:
        with record_function(f"pp:stage{self.stage_index}:mb{bwd_chunk_id}:bwd_weight"):
            return super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)


def route_pipeline_p2p_through(comm: Comm) -> None:
    """Make the pipelining schedules issue their P2P through `comm` (logged, slow-link aware)."""

    def _batch_p2p(p2p_ops: list[dist.P2POp], desc: str | None = None) -> list[Any]:
        ops = []
        for op in p2p_ops:
            kind = "send" if op.op in (dist.isend, dist.send) else "recv"
            peer = op.peer
            if peer is None:
                peer = dist.get_global_rank(op.group, op.group_peer)
            ops.append((kind, op.tensor, peer, op.group))
        return comm.batch_isend_irecv(ops, label=f"pp:{desc}" if desc else "pp:p2p")

    _schedules._batch_p2p = _batch_p2p


def effective_schedule(name: str, microbatches: int, pp: int) -> str:
    """torch's 1F1B refuses m < p; with so few micro-batches it has no steady state and runs exactly GPipe's
    order (all forwards, then all backwards), so that is what runs (and what the manifest says)."""
    if name == "1f1b" and microbatches < pp:
        return "gpipe"
    return name


def build_schedule(name: str, stages: list[PipelineStage], microbatches: int,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], pp: int) -> Any:
    name = effective_schedule(name, microbatches, pp)
    cls = getattr(_schedules, SCHEDULE_CLASSES[name])
    stage_arg: Any = stages if name in ("interleaved", "zb") else stages[0]
    # The loss is already a scaled sum (see train.py), so the schedule must not divide by microbatches.
    return cls(stage_arg, n_microbatches=microbatches, loss_fn=loss_fn, scale_grads=False)
