"""A hand-written GPipe pipeline over plain torch.distributed point-to-point calls.

Written the way tutorials and forum answers build pipeline parallelism before reaching for
`torch.distributed.pipelining`: one `nn.Sequential` slice per rank, the batch cut into
micro-batches, every micro-batch's forward first (activations sent rank i → i+1), then every
backward (gradients sent i+1 → i), then the optimizer step. Default process group, no labels, no
record_function annotations, nothing that knows about tracekit.

`--compute-ms` stands in for accelerator time per micro-batch and pass (a sleep: on a GPU the
stage's kernels run on the device while the host waits; here it keeps four stages on a 2-core box
working side by side instead of competing for the cores). Backward takes twice the forward time.

    torchrun --nproc-per-node 4 gpipe_p2p.py --microbatches 8 --steps 4
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn


def build_stage(rank: int, world: int, hidden: int) -> nn.Module:
    torch.manual_seed(1234 + rank)
    layers: list[nn.Module] = [nn.Linear(hidden, hidden), nn.ReLU()]
    if rank == world - 1:
        layers.append(nn.Linear(hidden, 1))
    return nn.Sequential(*layers)


def train_step(stage: nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor, target: torch.Tensor,
               args: argparse.Namespace, rank: int, world: int) -> None:
    opt.zero_grad()
    first, last = rank == 0, rank == world - 1
    micro_in = batch.chunk(args.microbatches)
    micro_tgt = target.chunk(args.microbatches)
    mb_rows = micro_in[0].shape[0]
    inputs, outputs, pending = [], [], []
    for i in range(args.microbatches):  # forward of every micro-batch
        if first:
            x = micro_in[i]
        else:
            x = torch.empty(mb_rows, args.hidden)
            dist.irecv(x, src=rank - 1).wait()
            x.requires_grad_()
        y = stage(x)
        time.sleep(args.compute_ms / 1e3)
        if not last:
            pending.append(dist.isend(y.detach(), dst=rank + 1))
        inputs.append(x)
        outputs.append(y)
    for i in range(args.microbatches):  # backward of every micro-batch
        if last:
            loss = nn.functional.mse_loss(outputs[i], micro_tgt[i])
            loss.backward()
        else:
            grad = torch.empty_like(outputs[i])
            dist.irecv(grad, src=rank + 1).wait()
            outputs[i].backward(grad)
        time.sleep(2 * args.compute_ms / 1e3)
        if not first:
            pending.append(dist.isend(inputs[i].grad, dst=rank - 1))
    for work in pending:
        work.wait()
    opt.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--compute-ms", type=float, default=20.0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    stage = build_stage(rank, world, args.hidden)
    opt = torch.optim.SGD(stage.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    for _ in range(args.steps):
        batch = torch.randn(args.batch, args.hidden, generator=gen)
        target = torch.randn(args.batch, 1, generator=gen)
        train_step(stage, opt, batch, target, args, rank, world)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
