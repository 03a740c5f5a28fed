"""One `apply_*` per parallel dimension, applied to a whole-built model (torchtitan's parallelize_* shape).

Order (as in `parallelize_model`): tensor (slice weights) -> context (ring attention) -> expert (ep group
to each MoE) -> data (DDP or FSDP2 over the flattened dp x cp ranks). Pipeline splitting happens before,
in pipeline.py. Gradients the data-parallel wrapper does not sync are synced by `sync_extra_grads`:
- parameters replicated over tp but fed different sequence shards (norms, embeddings, head, router,
  experts) are summed over tp (Megatron's sequence-parallel gradient all-reduce);
- expert parameters are summed over their expert-data-parallel (edp) group and divided by dp*cp, the
  same average DDP/FSDP apply to the dense parameters.
Every collective goes through B2's `Comm`, including DDP's (comm hook) and FSDP2's (custom all-gather /
reduce-scatter), so `comms.rank{R}.jsonl` sees them all.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.autograd.profiler import record_function

from .comm import Comm
from .model import Block, Transformer
from .parallel_dims import ParallelDims

TP_SHARDED = "_tp_sharded"
EXPERT = "_is_expert"


def _shard_rows(lin: nn.Linear, idx: int, n: int) -> None:
    rows = lin.weight.shape[0] // n
    lin.weight = nn.Parameter(lin.weight.detach()[idx * rows:(idx + 1) * rows].clone())
    setattr(lin.weight, TP_SHARDED, True)


def _shard_cols(lin: nn.Linear, idx: int, n: int) -> None:
    cols = lin.weight.shape[1] // n
    lin.weight = nn.Parameter(lin.weight.detach()[:, idx * cols:(idx + 1) * cols].clone())
    setattr(lin.weight, TP_SHARDED, True)


def blocks(model: Transformer) -> list[Block]:
    return list(model.layers.values())  # type: ignore[arg-type]


def apply_tp(model: Transformer, pd: ParallelDims, tp_rank: int) -> None:
    """Megatron column/row parallel attention and MLP, with sequence parallelism around them."""
    n = pd.layout.tp
    for b in blocks(model):
        for lin in (b.attn.wq, b.attn.wk, b.attn.wv):
            _shard_rows(lin, tp_rank, n)      # column parallel: this rank's heads
        _shard_cols(b.attn.wo, tp_rank, n)    # row parallel
        b.attn.num_heads //= n
        if not b.is_moe:
            _shard_rows(b.mlp.fc1, tp_rank, n)
            _shard_cols(b.mlp.fc2, tp_rank, n)
    model.par.tp = n
    model.par.tp_group = pd.get_group("tp")


def apply_cp(model: Transformer, pd: ParallelDims) -> None:
    """Context parallelism: attention becomes B2's ring attention over the cp group."""
    model.par.cp = pd.layout.cp
    model.par.cp_group = pd.get_group("cp")


def apply_ep(model: Transformer, pd: ParallelDims) -> None:
    """Expert parallelism: each MoE keeps only its ep rank's experts and dispatches over the ep group."""
    group = pd.get_group("ep")
    model.par.ep_group = group
    for b in blocks(model):
        if b.is_moe:
            b.moe.shard_experts(group)


def mark_expert_params(model: nn.Module) -> list[nn.Parameter]:
    """Expert weights (not router) — synced over edp by hand, ignored by DDP/FSDP."""
    out = []
    for b in model.modules():
        if isinstance(b, Block) and b.is_moe:
            for p in b.moe.expert_parameters():
                setattr(p, EXPERT, True)
                out.append(p)
    return out


def set_aux_loss_scale(model: Transformer, pd: ParallelDims, microbatches: int) -> None:
    """Each MoE's aux loss is computed per routing call; weight it so the calls of one step average to one."""
    for b in blocks(model):
        # DDP/FSDP divide gradients by dp*cp, so the dp*cp factor cancels; tp ranks and micro-batches remain.
        b.aux_loss_scale = 1.0 / (pd.layout.tp * microbatches)


# ---- data parallel ---------------------------------------------------------------------------------

def _ddp_hook(state, bucket):  # no annotations: DDP insists that `bucket` be annotated dist.GradBucket or not at all
    """All-reduce one gradient bucket through Comm (so it is logged), averaging over the group."""
    comm, group, size, synchronous = state
    buf = bucket.buffer()
    buf.div_(size)
    work = comm.all_reduce(buf, group, label="dp:grad_all_reduce", async_op=not synchronous)
    if synchronous:
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(buf)
        return fut
    return work.get_future().then(lambda f: f.value()[0])


def apply_ddp(module: nn.Module, pd: ParallelDims, comm: Comm, *, no_overlap: bool, bucket_mb: float) -> nn.Module:
    """DDP over dp x cp; experts are left out (synced over edp). no_overlap: one bucket, synchronous."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ignore = [n for n, p in module.named_parameters() if getattr(p, EXPERT, False)]
    DDP._set_params_and_buffers_to_ignore_for_model(module, ignore)
    group = pd.get_group("dp_cp")
    ddp = DDP(module, process_group=group,
              bucket_cap_mb=10_000 if no_overlap else bucket_mb)
    ddp.register_comm_hook((comm, group, pd.layout.dp_cp, no_overlap), _ddp_hook)
    return ddp


class _LoggedAllGather:
    """FSDP2 custom all-gather that goes through Comm."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 async_op: bool = False) -> Any:
        return self.comm.all_gather_into_tensor(output_tensor, input_tensor, group, label="dp:fsdp_all_gather",
                                                async_op=async_op)


class _LoggedReduceScatter(_LoggedAllGather):
    """FSDP2 custom reduce-scatter that goes through Comm."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,  # type: ignore[override]
                 op: Any, async_op: bool = False) -> Any:
        return self.comm.reduce_scatter_tensor(output_tensor, input_tensor, group, op,
                                               label="dp:fsdp_reduce_scatter", async_op=async_op)


def apply_fsdp(module: nn.Module, pd: ParallelDims, comm: Comm, *, no_overlap: bool,
               reshard_after_forward: bool) -> nn.Module:
    """FSDP2 fully_shard per block and root over dp x cp; experts ignored. Explicit prefetch unless no_overlap."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import AllGather, ReduceScatter

    mesh = pd.get_mesh("dp_cp")
    experts = {p for p in module.parameters() if getattr(p, EXPERT, False)}
    ag, rs = _LoggedAllGather(comm), _LoggedReduceScatter(comm)
    AllGather.register(_LoggedAllGather)
    ReduceScatter.register(_LoggedReduceScatter)
    inner = [b for b in module.modules() if isinstance(b, Block)]
    for b in inner:
        fully_shard(b, mesh=mesh, reshard_after_forward=reshard_after_forward,
                    ignored_params={p for p in b.parameters() if p in experts})
    fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward, ignored_params=experts)
    for m in inner + [module]:
        m.set_custom_all_gather(ag)          # type: ignore[attr-defined]
        m.set_custom_reduce_scatter(rs)      # type: ignore[attr-defined]
    if not no_overlap and len(inner) > 1:
        for i, b in enumerate(inner):
            if i + 1 < len(inner):
                b.set_modules_to_forward_prefetch([inner[i + 1]])    # type: ignore[attr-defined]
            if i > 0:
                b.set_modules_to_backward_prefetch([inner[i - 1]])   # type: ignore[attr-defined]
    return module


# ---- gradients nobody else syncs -------------------------------------------------------------------

def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if hasattr(t, "_local_tensor") else t  # FSDP2 grads are DTensors


def _flat_all_reduce(params: list[nn.Parameter], comm: Comm, group: Any, label: str, scale: float) -> None:
    """All-reduce the grads of `params` as one flat buffer (one collective), then scale, inside `label`."""
    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    with record_function(label):
        locals_ = [_local(p.grad) for p in params]
        flat = torch.cat([g.reshape(-1) for g in locals_])
        comm.all_reduce(flat, group, label=label)
        if scale != 1.0:
            flat.mul_(scale)
        off = 0
        for g in locals_:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()


def sync_extra_grads(params: list[nn.Parameter], pd: ParallelDims, comm: Comm) -> None:
    """tp-sum of sequence-parallel-replicated grads; edp-sum / (dp*cp) of expert grads."""
    if pd.world_size == 1:
        return
    if pd.layout.enabled("tp"):
        replicated = [p for p in params if not getattr(p, TP_SHARDED, False)]
        _flat_all_reduce(replicated, comm, pd.get_group("tp"), "tp:sp_grad_all_reduce", 1.0)
    experts = [p for p in params if getattr(p, EXPERT, False)]
    if pd.layout.edp > 1:
        _flat_all_reduce(experts, comm, pd.get_group("edp"), "ep:edp_grad_all_reduce", 1.0 / pd.layout.dp_cp)
    elif pd.layout.dp_cp > 1:
        for p in experts:
            if p.grad is not None:
                p.grad.div_(pd.layout.dp_cp)


def barrier_world(comm: Comm) -> None:
    comm.barrier(dist.group.WORLD, label="runtime:barrier")
