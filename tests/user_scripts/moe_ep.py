"""A user's expert-parallel MoE loop in the style of public examples (DeepSpeed-MoE / Tutel / the
"MoE from scratch" all_to_all tutorials): per MoE layer a top-k softmax router, tokens sorted by expert
and dispatched with `dist.all_to_all_single` using per-peer input/output split sizes (the counts are
exchanged first with an all_to_all of one int per expert), the experts (small MLPs, E / world of them
per rank) run on the tokens they received, and a second all_to_all brings the outputs back (combine).
The token all_to_alls are an autograd Function, so backward sends the gradients the other way.
2 MoE layers (each a dense pre-projection, then a pre-norm MoE), 8 experts, gloo on CPU, one thread per rank.
It knows nothing of tracekit; run it with `torchrun --nproc-per-node 2 moe_ep.py`.

Knobs for tests (the analyzers never see them): `--hot-expert E --hot-frac F` biases every router so
that a fraction F of the tokens chooses expert E first (a collapsed router); the straggler knobs of
straggler_knobs.py (`--slow-rank R --sleep-ms MS` / `--batch-mult K`).
"""

import argparse

import straggler_knobs  # noqa: I001 (beside this script)
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class AllToAll(torch.autograd.Function):
    """all_to_all_single with split sizes; backward sends the gradients back with the splits swapped."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits):
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty((sum(out_splits), x.shape[1]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), grad.shape[1]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
        return back, None, None


class Expert(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class MoELayer(nn.Module):
    def __init__(self, dim, hidden, num_experts, top_k, world, rank, hot_expert=None, hot_frac=0.0, noise=1.0):
        super().__init__()
        self.num_experts, self.top_k, self.world, self.rank = num_experts, top_k, world, rank
        self.local = num_experts // world
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(dim, hidden) for _ in range(self.local))
        self.hot_expert, self.hot_frac, self.noise = hot_expert, hot_frac, noise

    def forward(self, x):
        logits = self.gate(x)
        if self.training and self.noise:  # noisy top-k gating (Shazeer et al. 2017): spreads a fresh router's load
            logits = logits + self.noise * torch.randn_like(logits)
        if self.hot_expert is not None and self.hot_frac > 0:
            hot = torch.rand(x.shape[0]) < self.hot_frac
            bias = torch.zeros_like(logits)
            bias[hot, self.hot_expert] = 1e4
            logits = logits + bias
        probs = logits.softmax(dim=-1)
        weight, expert = probs.topk(self.top_k, dim=-1)  # [T, k]
        flat_expert = expert.reshape(-1)
        order = flat_expert.argsort(stable=True)
        token_of = order // self.top_k
        per_expert = torch.bincount(flat_expert, minlength=self.num_experts)
        # exchange the counts: how many tokens this rank gets for each of its local experts from each peer
        recv_counts = torch.empty_like(per_expert)
        dist.all_to_all_single(recv_counts, per_expert)
        in_splits = per_expert.view(self.world, self.local).sum(dim=1).tolist()
        recv = recv_counts.view(self.world, self.local)
        out_splits = recv.sum(dim=1).tolist()
        tokens = AllToAll.apply(x[token_of], out_splits, in_splits)
        # the received tokens are grouped by source rank, then by local expert
        chunks = tokens.split(recv.reshape(-1).tolist())
        outs = []
        for i, chunk in enumerate(chunks):
            outs.append(self.experts[i % self.local](chunk))
        y = AllToAll.apply(torch.cat(outs), in_splits, out_splits)
        out = torch.zeros_like(x)
        out.index_add_(0, token_of, y * weight.reshape(-1)[order].unsqueeze(1))
        return out


class Model(nn.Module):
    def __init__(self, args, world, rank):
        super().__init__()
        self.embed = nn.Linear(args.dim, args.dim)
        self.blocks = nn.ModuleList()
        for _ in range(args.moe_layers):
            self.blocks.append(nn.ModuleDict({
                "dense": nn.Linear(args.dim, args.dim), "norm": nn.LayerNorm(args.dim),
                "moe": MoELayer(args.dim, args.hidden, args.experts, args.top_k, world, rank,
                                args.hot_expert, args.hot_frac, args.router_noise)}))
        self.head = nn.Linear(args.dim, 1)

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = h + b["dense"](h).relu()
            h = h + b["moe"](b["norm"](h))  # pre-norm, as transformer blocks do
        return self.head(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per rank per step")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--moe-layers", type=int, default=2)
    ap.add_argument("--hot-expert", type=int, default=None)
    ap.add_argument("--hot-frac", type=float, default=0.0)
    ap.add_argument("--router-noise", type=float, default=1.0)
    straggler_knobs.add_args(ap)
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert args.experts % world == 0
    torch.manual_seed(0)  # same dense weights on every rank
    model = Model(args, world, rank)
    torch.manual_seed(1 + rank)  # own data and routing noise
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    dense = [p for n, p in model.named_parameters() if ".experts." not in n]
    slow = rank == args.slow_rank
    tokens = args.tokens * (args.batch_mult if slow else 1)
    for step in range(args.steps):
        opt.zero_grad()
        x = torch.randn(tokens, args.dim)
        loss = model(x).pow(2).mean()
        straggler_knobs.maybe_sleep(args, rank, step)
        loss.backward()
        # data parallel over the dense weights (experts are sharded): one flat all-reduce
        flat = torch.cat([p.grad.reshape(-1) for p in dense])
        dist.all_reduce(flat)
        flat /= world
        off = 0
        for p in dense:
            n = p.numel()
            p.grad.copy_(flat[off:off + n].view_as(p))
            off += n
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
