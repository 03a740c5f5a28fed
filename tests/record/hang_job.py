"""A small gloo job that hangs in a chosen way (run under torchrun by tests/record/test_hang_record.py).

python hang_job.py SCENARIO, with SCENARIO one of:
  healthy   every rank runs STEPS all_reduces (and the pipeline's sends), then exits
  sleep     rank 1 sleeps forever before the all_reduce of step BAD
  desync    rank 3 skips the all_reduce of step BAD (its later calls pair with the others' earlier ones)
  mismatch  rank 2 calls the all_reduce of step BAD with twice the elements
  die       rank 2 is killed (SIGKILL) before the all_reduce of step BAD
  pipeline  ranks 0, 2 (stage 0) send 3 micro-batches a step to ranks 1, 3 (stage 1); in step BAD rank 0
            never sends micro-batch 1; every step ends with an all_reduce over all ranks
  train     a tiny training loop (optimizer steps, so `tracekit record` profiles steps 2-3 with
            --wait 1 --warmup 1 --active 2); rank 1 sleeps forever before the gradient all_reduce of
            step TRAIN_BAD, after the profiled window
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

STEPS, BAD, MICRO = 5, 2, 3
TRAIN_STEPS, TRAIN_BAD = 8, 6


def train() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(TRAIN_STEPS):
        loss = model(torch.randn(16, 32)).square().mean()
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        if rank == 1 and step == TRAIN_BAD:
            time.sleep(10 ** 6)
        dist.all_reduce(grads)
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


def main(scenario: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(STEPS):
        time.sleep(0.4)  # the step's compute: the hang monitor beats meanwhile
        if scenario in ("pipeline", "healthy"):
            for mb in range(MICRO):
                act = torch.full((8,), float(mb))
                if rank % 2 == 0:
                    if not (scenario == "pipeline" and rank == 0 and step == BAD and mb == 1):
                        dist.send(act, rank + 1)
                else:
                    dist.recv(act, rank - 1)
        t = torch.ones(16)
        if step == BAD:
            if scenario == "sleep" and rank == 1:
                time.sleep(10 ** 6)
            if scenario == "desync" and rank == 3:
                continue
            if scenario == "mismatch" and rank == 2:
                t = torch.ones(32)
            if scenario == "die" and rank == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(t)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    train() if sys.argv[1] == "train" else main(sys.argv[1])
