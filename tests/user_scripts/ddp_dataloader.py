"""A user's DDP training loop fed by a real `torch.utils.data.DataLoader` over a map-style Dataset with a
`DistributedSampler`, in the style of PyTorch's DDP tutorial and its "Datasets & DataLoaders" tutorial: a toy
two-layer model, MSE loss, SGD. It knows nothing of tracekit; run it with
`torchrun --nproc-per-node 2 ddp_dataloader.py` (gloo on CPU).

Knobs that a test uses to make one rank's data loading slow (the analyzers never see them):
`--slow-rank R` with `--loader-sleep-ms MS` (rank R's DataLoader sleeps MS ms per batch in its
`collate_fn`, a slow decoder / augmentation), `--workers N` (DataLoader worker processes; 0 loads in the training
process), and the shared `--batch-mult` / `--sleep-ms` knobs (straggler_knobs.py).
"""

import argparse
import time

import straggler_knobs  # noqa: I001 (beside this script)
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, default_collate
from torch.utils.data.distributed import DistributedSampler


class RandomRegression(Dataset):
    """`size` (input, target) pairs."""

    def __init__(self, size: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 10, generator=g)
        self.y = torch.randn(size, 5, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class SlowCollate:
    """default_collate, after sleeping `sleep_s` (a slow decoder / augmentation on the batch)."""

    def __init__(self, sleep_s: float = 0.0):
        self.sleep_s = sleep_s

    def __call__(self, items):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return default_collate(items)


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
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--loader-sleep-ms", type=float, default=0.0)
    straggler_knobs.add_args(ap)
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    slow = rank == args.slow_rank
    batch = args.batch * (args.batch_mult if slow else 1)
    dataset = RandomRegression(batch * dist.get_world_size() * args.steps)
    sampler = DistributedSampler(dataset)
    collate = SlowCollate(args.loader_sleep_ms / 1000 if slow else 0.0)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=args.workers, collate_fn=collate)
    model = ToyModel(args.hidden)
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    sampler.set_epoch(0)
    for step, (inputs, labels) in enumerate(loader):
        if step >= args.steps:
            break
        optimizer.zero_grad()
        outputs = ddp_model(inputs)
        straggler_knobs.maybe_sleep(args, rank, step)
        loss_fn(outputs, labels).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
