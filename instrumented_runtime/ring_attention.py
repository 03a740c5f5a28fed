"""Ring attention for context parallelism: exact (causal) attention over a sequence sharded across `group`.

`context_parallel` has no CPU SDPA strategy on this torch (DESIGN §5), so the ring is written by hand. Each
rank holds a contiguous chunk of the sequence (rank order). Forward: K/V travel around the ring (P-1 hops of
`batch_isend_irecv`, overlapped with the block computation) and blocks merge with an online softmax
(log-sum-exp). Backward (flash-attention style, from the saved output and LSE): K/V travel again, and the
dK/dV accumulators travel with them, one more hop so each returns to its owner. Every rank takes part in
every hop, even where causality masks its whole block (DESIGN §5). Contiguous sharding leaves the last rank
with the most work: that imbalance is real and visible in traces.

Profiler labels: `cp:ring_hop{k}` (forward hop k) and `cp:ring_hop{k}:bwd`; P2P ops carry the same caller.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function

from instrumented_runtime.comm import Comm, get_comm


def _block_scores(q: torch.Tensor, k: torch.Tensor, scale: float, diagonal: bool) -> torch.Tensor:
    """Scaled scores q·kᵀ of one block; on the diagonal block, future keys are masked out."""
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if diagonal:
        n_q, n_k = s.shape[-2], s.shape[-1]
        future = torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
    return s


def _ring_peers(group: Any) -> tuple[int, int, int, int]:
    """(size, index in group, next global rank, previous global rank)."""
    ranks = dist.get_process_group_ranks(group)
    size, idx = len(ranks), dist.get_rank(group)
    return size, idx, ranks[(idx + 1) % size], ranks[(idx - 1) % size]


def _shift(comm: Comm, t: torch.Tensor, nxt: int, prv: int, group: Any, label: str) -> tuple[list, torch.Tensor]:
    """Post send of `t` to the next rank and receive of its replacement from the previous one."""
    incoming = torch.empty_like(t)
    works = comm.batch_isend_irecv([("send", t, nxt, group), ("recv", incoming, prv, group)], label=label)
    return works, incoming


def _computes(causal: bool, src: int, idx: int) -> bool:
    """Whether this rank's queries see any key of chunk `src` (contiguous sharding)."""
    return not causal or src <= idx


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, comm):  # type: ignore[override]
        size, idx, nxt, prv = _ring_peers(group)
        scale = 1.0 / math.sqrt(q.shape[-1])
        kv = torch.stack([k, v]).contiguous()
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        for hop in range(size):
            label = f"cp:ring_hop{hop}"
            src = (idx - hop) % size
            with record_function(label):
                works, incoming = _shift(comm, kv, nxt, prv, group, label) if hop < size - 1 else ([], None)
                if _computes(causal, src, idx):
                    s = _block_scores(q, kv[0], scale, diagonal=causal and src == idx)
                    block_lse = torch.logsumexp(s, dim=-1)
                    block_out = torch.matmul(torch.exp(s - block_lse.unsqueeze(-1)), kv[1])
                    new_lse = torch.logaddexp(lse, block_lse)
                    out = (out * torch.exp(lse - new_lse).unsqueeze(-1)
                           + block_out * torch.exp(block_lse - new_lse).unsqueeze(-1))
                    lse = new_lse
                for w in works:
                    w.wait()
                if incoming is not None:
                    kv = incoming
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.comm, ctx.scale = group, causal, comm, scale
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, comm, scale = ctx.group, ctx.causal, ctx.comm, ctx.scale
        size, idx, nxt, prv = _ring_peers(group)
        dout = dout.contiguous()
        delta = (dout * out).sum(dim=-1, keepdim=True)  # rowsum(dO ∘ O)
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros_like(kv)  # dK/dV of the chunk currently held; travels with it
        for hop in range(size):
            label = f"cp:ring_hop{hop}:bwd"
            src = (idx - hop) % size
            with record_function(label):
                works, incoming = _shift(comm, kv, nxt, prv, group, label) if hop < size - 1 else ([], None)
                if _computes(causal, src, idx):
                    s = _block_scores(q, kv[0], scale, diagonal=causal and src == idx)
                    p = torch.exp(s - lse.unsqueeze(-1))
                    dkv[1] += torch.matmul(p.transpose(-2, -1), dout)
                    ds = p * (torch.matmul(dout, kv[1].transpose(-2, -1)) - delta)
                    dq += torch.matmul(ds, kv[0]) * scale
                    dkv[0] += torch.matmul(ds.transpose(-2, -1), q) * scale
                if size > 1:  # hand the accumulated dK/dV on; after `size` hops they are back home
                    dworks, dincoming = _shift(comm, dkv, nxt, prv, group, label)
                    works = works + dworks
                for w in works:
                    w.wait()
                if incoming is not None:
                    kv = incoming
                if size > 1:
                    dkv = dincoming
        return dq, dkv[0], dkv[1], None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any, *, causal: bool = True,
                   comm: Comm | None = None) -> torch.Tensor:
    """Attention of local queries over the whole sequence; q, k, v: (batch, heads, seq_local, head_dim).

    The sequence is sharded contiguously over `group` in rank order, with the same `seq_local` on every rank.
    Equals `scaled_dot_product_attention(..., is_causal=causal)` on the gathered sequence, chunked back.
    """
    if q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"ring_attention: q, k, v must have one shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    return _RingAttention.apply(q, k, v, group, causal, comm if comm is not None else get_comm())
