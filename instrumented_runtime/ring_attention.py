"""Ring attention for context parallelism: exact (causal) attention over a sequence sharded across `group`.

`context_parallel` has no CPU SDPA strategy on this torch (DESIGN §5), so the ring is written by hand. Each
rank holds its shard of the sequence in one of two layouts (`shard_sequence` cuts it):
- "contiguous": rank r holds chunk r of P, in rank order. Under a causal mask rank r attends to r+1 blocks,
  so the last rank does P× the work of the first: a real imbalance, visible in traces.
- "zigzag" (load-balanced, as in Megatron/TransformerEngine CP): the sequence is cut into 2P chunks and rank
  r holds chunks r and 2P-1-r; every rank then computes the same number of blocks.
Forward: K/V travel around the ring (P-1 hops of
`batch_isend_irecv`, overlapped with the block computation) and blocks merge with an online softmax
(log-sum-exp). Backward (flash-attention style, from the saved output and LSE): K/V travel again, and the
dK/dV accumulators travel with them, one more hop so each returns to its owner. Every rank takes part in
every hop, even where causality masks its whole block (DESIGN §5).

Profiler labels: `cp:ring_hop{k}` (forward hop k) and `cp:ring_hop{k}:bwd`; P2P ops carry the same caller.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function

from instrumented_runtime.comm import Comm, get_comm


LAYOUTS = ("contiguous", "zigzag")


def sequence_chunks(index: int, size: int, layout: str) -> tuple[list[int], int]:
    """(chunk ids held by group rank `index`, number of chunks the sequence is cut into)."""
    if layout == "contiguous":
        return [index], size
    if layout == "zigzag":
        return [index, 2 * size - 1 - index], 2 * size
    raise ValueError(f"ring_attention: layout must be one of {LAYOUTS}, got {layout!r}")


def sequence_positions(index: int, size: int, seq_local: int, layout: str) -> torch.Tensor:
    """Global positions (in the full sequence) of the `seq_local` rows group rank `index` holds."""
    chunks, _ = sequence_chunks(index, size, layout)
    if seq_local % len(chunks):
        raise ValueError(f"ring_attention: seq_local {seq_local} not divisible into {len(chunks)} {layout} chunks")
    n = seq_local // len(chunks)
    return torch.cat([torch.arange(c * n, (c + 1) * n) for c in chunks])


def shard_sequence(x: torch.Tensor, index: int, size: int, *, dim: int, layout: str = "contiguous") -> torch.Tensor:
    """The part of the full sequence `x` (along `dim`) that group rank `index` of `size` holds."""
    chunks, num = sequence_chunks(index, size, layout)
    if x.shape[dim] % num:
        raise ValueError(f"shard_sequence: length {x.shape[dim]} not divisible into {num} chunks")
    parts = x.chunk(num, dim=dim)
    return torch.cat([parts[c] for c in chunks], dim=dim)


def _block_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool) -> torch.Tensor | None | bool:
    """Causal mask of one block: None (nothing masked), False (everything masked: skip) or a bool mask."""
    if not causal:
        return None
    future = k_pos.unsqueeze(0) > q_pos.unsqueeze(1)
    if not future.any():
        return None
    if future.all():
        return False
    return future


def _block_scores(q: torch.Tensor, k: torch.Tensor, scale: float, mask: torch.Tensor | None) -> torch.Tensor:
    """Scaled scores q·kᵀ of one block, future keys set to -inf."""
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    return s if mask is None else s.masked_fill(mask, float("-inf"))


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


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, layout, comm):  # type: ignore[override]
        size, idx, nxt, prv = _ring_peers(group)
        scale = 1.0 / math.sqrt(q.shape[-1])
        seq_local = q.shape[-2]
        q_pos = sequence_positions(idx, size, seq_local, layout)
        kv = torch.stack([k, v]).contiguous()
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        for hop in range(size):
            label = f"cp:ring_hop{hop}"
            src = (idx - hop) % size
            with record_function(label):
                works, incoming = _shift(comm, kv, nxt, prv, group, label) if hop < size - 1 else ([], None)
                mask = _block_mask(q_pos, sequence_positions(src, size, seq_local, layout), causal)
                if mask is not False:
                    s = _block_scores(q, kv[0], scale, mask)
                    block_lse = torch.logsumexp(s, dim=-1)
                    # rows with every key masked (zigzag) have lse -inf: give them zero weight, not NaN
                    safe_lse = torch.where(torch.isinf(block_lse), torch.zeros_like(block_lse), block_lse)
                    block_out = torch.matmul(torch.exp(s - safe_lse.unsqueeze(-1)), kv[1])
                    new_lse = torch.logaddexp(lse, block_lse)
                    out = (out * torch.exp(lse - new_lse).unsqueeze(-1)
                           + block_out * torch.exp(block_lse - new_lse).unsqueeze(-1))
                    lse = new_lse
                for w in works:
                    w.wait()
                if incoming is not None:
                    kv = incoming
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.layout, ctx.comm, ctx.scale = group, causal, layout, comm, scale
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, layout, comm, scale = ctx.group, ctx.causal, ctx.layout, ctx.comm, ctx.scale
        size, idx, nxt, prv = _ring_peers(group)
        seq_local = q.shape[-2]
        q_pos = sequence_positions(idx, size, seq_local, layout)
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
                mask = _block_mask(q_pos, sequence_positions(src, size, seq_local, layout), causal)
                if mask is not False:
                    s = _block_scores(q, kv[0], scale, mask)
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
        return dq, dkv[0], dkv[1], None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any, *, causal: bool = True,
                   layout: str = "contiguous", comm: Comm | None = None) -> torch.Tensor:
    """Attention of local queries over the whole sequence; q, k, v: (batch, heads, seq_local, head_dim).

    The sequence is sharded over `group` as `shard_sequence(..., layout=layout)` cuts it, with the same
    `seq_local` on every rank. Equals `scaled_dot_product_attention(..., is_causal=causal)` on the full
    sequence, sharded the same way.
    """
    if q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"ring_attention: q, k, v must have one shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    sequence_chunks(0, 1, layout)  # validates the name
    return _RingAttention.apply(q, k, v, group, causal, layout, comm if comm is not None else get_comm())
