"""A user's 2-D (FSDP2 x tensor parallel) loop on a tiny llama-style model, in the style of the PyTorch
tutorial "Large Scale Transformer model training with Tensor Parallel" and torchtitan: a 2-D DeviceMesh
("dp", "tp"), each block's attention (wq/wk/wv column-wise, wo row-wise) and SwiGLU feed-forward (w1/w3
column-wise, w2 row-wise) parallelized with `parallelize_module`, then `fully_shard` on each block and the
root over the "dp" mesh; RMSNorm, causal attention, AdamW. It knows nothing of tracekit; run it with
`torchrun --nproc-per-node 4 fsdp2_tp_llama.py` (gloo on CPU, dp 2 x tp 2).

Straggler knobs (for tests; the analyzers never see them): those of straggler_knobs.py (`--slow-rank R`
with `--sleep-ms MS` and/or `--batch-mult K`; a bigger batch on one rank of a tp group would not fit its
peers' shapes, so `--batch-mult` only applies with tp 1).
"""

import argparse

import straggler_knobs  # noqa: I001 (beside this script)
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        # -1 heads: under TP each rank holds n_heads / tp of them (local tensors, as torchtitan does)
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.attention_norm, self.ffn_norm = RMSNorm(dim), RMSNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.feed_forward = FeedForward(dim, 4 * dim)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, vocab: int, dim: int, n_layers: int, n_heads: int):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads) for _ in range(n_layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=256)
    straggler_knobs.add_args(ap)
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Transformer(args.vocab, args.dim, args.layers, args.heads)
    for block in model.layers:
        parallelize_module(block, mesh["tp"], {
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    slow = rank == args.slow_rank
    batch = args.batch * (args.batch_mult if slow and args.tp == 1 else 1)
    torch.manual_seed(mesh["dp"].get_local_rank())  # the tp group shares its batch
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (batch, args.seq + 1))
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        straggler_knobs.maybe_sleep(args, rank, step)
        loss.backward()
        optim.step()
        optim.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
