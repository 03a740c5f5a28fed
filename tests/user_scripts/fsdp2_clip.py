"""A user's FSDP2 training loop in the style of pytorch/examples `distributed/FSDP2`: a small
transformer-like model, `fully_shard` on each block and on the root, AdamW, and gradient clipping
with `clip_grad_norm_` (whose total-norm all-reduce is a functional/DTensor collective). It knows
nothing of tracekit; run it with `torchrun --nproc-per-node 2 fsdp2_clip.py` (gloo on CPU).

Straggler knobs (for tests; the analyzers never see them): `--slow-rank R` with `--batch-mult K`
and/or `--sleep-ms MS`.
"""

import argparse

import straggler_knobs  # noqa: I001 (beside this script)
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff1 = nn.Linear(dim, 2 * dim)
        self.ff2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.ff2(torch.relu(self.ff1(self.norm(x))))


class Model(nn.Module):
    def __init__(self, vocab: int, dim: int, n_layers: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(n_layers))
        self.out = nn.Linear(dim, vocab)

    def forward(self, tokens):
        h = self.emb(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=64)
    straggler_knobs.add_args(ap)
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = Model(args.vocab, args.dim, args.layers)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    slow = rank == args.slow_rank
    batch = args.batch * (args.batch_mult if slow else 1)
    torch.manual_seed(rank)
    for step in range(args.steps):
        x = torch.randint(0, args.vocab, (batch, args.seq))
        loss = model(x).sum()
        straggler_knobs.maybe_sleep(args, rank, step)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optim.step()
        optim.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
