"""A user's tensor + sequence parallel loop in the style of pytorch/examples
`distributed/tensor_parallelism/sequence_parallel_example.py`: a toy MLP whose first Linear is
column-wise and second row-wise parallel with sequence-sharded inputs and outputs (DTensor), AdamW.
It knows nothing of tracekit; run it with `torchrun --nproc-per-node 2 tp_sp_loop.py` (gloo on CPU).

Straggler knobs (for tests; the analyzers never see them): `--slow-rank R` with `--sleep-ms MS`.
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class ToyModel(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.in_proj = nn.Linear(10, hidden)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(hidden, 5)

    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seq", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--slow-rank", type=int, default=None)
    ap.add_argument("--sleep-ms", type=float, default=0.0)
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = parallelize_module(
        ToyModel(args.hidden), mesh,
        {"in_proj": ColwiseParallel(input_layouts=Shard(0)), "out_proj": RowwiseParallel(output_layouts=Shard(0))},
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.25, foreach=True)
    for _ in range(args.steps):
        torch.manual_seed(rank)  # each rank's sequence shard
        inp = torch.rand(args.seq, 10)
        output = model(inp)
        if rank == args.slow_rank and args.sleep_ms:
            time.sleep(args.sleep_ms / 1000)
        output.sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
