"""A user's DDP loop with gradient accumulation, in the style of the DDP docs' `no_sync` example: the
gradients of all but the last micro-batch of a step accumulate locally inside `ddp.no_sync()`, and the
last micro-batch's backward all-reduces them. A toy two-layer model, MSE loss, SGD. It knows nothing of
tracekit; run it with `torchrun --nproc-per-node 2 ddp_no_sync.py` (gloo on CPU).

Knobs that a test uses to make one rank slow (the analyzers never see them): the shared `--slow-rank R`
with `--batch-mult K` (rank R's micro-batches are K times larger) and/or `--sleep-ms MS`
(straggler_knobs.py).
"""

import argparse
import contextlib

import straggler_knobs  # noqa: I001 (beside this script)
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self, hidden: int = 10):
        super().__init__()
        self.net1 = nn.Linear(10, hidden)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(hidden, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=10)
    ap.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    straggler_knobs.add_args(ap)
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = ToyModel(args.hidden)
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    slow = rank == args.slow_rank
    batch = args.batch * (args.batch_mult if slow else 1)
    for step in range(args.steps):
        optimizer.zero_grad()
        for micro in range(args.accum):
            last = micro == args.accum - 1
            with contextlib.nullcontext() if last else ddp_model.no_sync():
                outputs = ddp_model(torch.randn(batch, 10))
                labels = torch.randn(batch, 5)
                if last:
                    straggler_knobs.maybe_sleep(args, rank, step)
                loss_fn(outputs, labels).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
