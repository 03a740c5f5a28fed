"""A 4-stage pipeline with `torch.distributed.pipelining`, the way its tutorial builds one.

A tiny MLP of `--layers` blocks is cut into one `nn.Sequential` per rank (`--split` gives each stage's
block count; default: as even as it goes), wrapped in a `PipelineStage`, and trained with
`Schedule1F1B` (or `ScheduleGPipe` with `--schedule gpipe`) over `--microbatches` micro-batches.
Default process group, gloo, no labels, no record_function annotations, nothing that knows about tracekit.

`--block-ms` stands in for accelerator time per block and micro-batch (an operator that sleeps in the
block's forward, twice that in its backward: on a GPU the stage's kernels run on the device while the host waits; here it
keeps four stages on a 2-core box working side by side instead of competing for the cores), so a stage's
time is proportional to the blocks it holds.

    torchrun --nproc-per-node 4 pipelining_1f1b.py --layers 12 --split 2,6,2,2 --steps 5
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe


@torch.library.custom_op("userpipe::device_time", mutates_args=())
def device_time(x: torch.Tensor, ms: float) -> torch.Tensor:
    """Identity that takes `ms` (the block's device time; an operator, as a kernel launch would be)."""
    time.sleep(ms / 1e3)
    return x.clone()


@device_time.register_fake
def _(x: torch.Tensor, ms: float) -> torch.Tensor:
    return torch.empty_like(x)


def _backward(ctx, grad: torch.Tensor):
    return device_time(grad, 2 * ctx.ms), None  # backward twice the forward


def _setup(ctx, inputs, output) -> None:
    ctx.ms = inputs[1]


device_time.register_autograd(_backward, setup_context=_setup)


class Block(nn.Module):
    def __init__(self, hidden: int, ms: float) -> None:
        super().__init__()
        self.lin = nn.Linear(hidden, hidden)
        self.ms = ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return device_time(torch.relu(self.lin(x)), self.ms)


def split_of(args: argparse.Namespace, world: int) -> list[int]:
    if args.split:
        split = [int(s) for s in args.split.split(",")]
        assert len(split) == world and sum(split) == args.layers, (split, args.layers)
        return split
    return [args.layers // world + (1 if i < args.layers % world else 0) for i in range(world)]


def build_stage(rank: int, world: int, args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(1234)
    blocks = [Block(args.hidden, args.block_ms) for _ in range(args.layers)]
    split = split_of(args, world)
    first = sum(split[:rank])
    layers: list[nn.Module] = blocks[first:first + split[rank]]
    if rank == world - 1:
        layers.append(nn.Linear(args.hidden, 1))
    return nn.Sequential(*layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--split", default="", help="blocks per stage, comma separated (default: even)")
    parser.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--block-ms", type=float, default=5.0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    module = build_stage(rank, world, args)
    stage = PipelineStage(module, stage_index=rank, num_stages=world, device=torch.device("cpu"))
    loss_fn = nn.MSELoss()
    kind = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    schedule = kind(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.hidden, generator=gen)
        y = torch.randn(args.batch, 1, generator=gen)
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            losses: list[torch.Tensor] = []
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
