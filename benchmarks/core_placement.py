"""The same work, beside the same number of runnable threads, on a box with fewer cores than threads: how its
pace varies from run to run (issue 32's user-script matrix; docs/metrics.md §8).

Process A runs the DDP user script's toy model (tests/user_scripts/ddp_loop.py: Linear(10, H), ReLU, Linear(H, 5),
MSE, SGD; one intra-op thread) for N iterations at batch B and prints the median CPU and wall milliseconds of an
iteration. Beside it, in each setting: nothing; a peer process running the same model at batch B or 2B without
end; either with or without an always-runnable busy process (`python -c "while True: pass"`, the matrix's busy
process). Each setting runs `--repeat` times, each a fresh set of processes (the scheduler places them anew).

What it shows on this 2-core box: A's CPU time per iteration is the same beside a 1x and a 2x peer (the peer's
larger batch does not slow A's work through shared caches); with the busy process beside them (3 runnable
threads on 2 cores, always), A's wall time per iteration is either close to its CPU time or ~2x it, run by run,
whichever peer it has: which thread shares a core is the scheduler's placement, drawn anew in each run and held
for seconds. A trace shows the op taking longer and the recorder's schedstat the wait, but not which placement
a fixed run would draw.

    python benchmarks/core_placement.py [--hidden 2048] [--batch 1024] [--iters 60] [--repeat 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def work(batch: int, hidden: int, iters: int, report: bool) -> None:
    """The toy model's training iterations (`iters` < 0: without end); prints the medians when `report`."""
    import torch
    import torch.nn as nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, hidden), nn.ReLU(), nn.Linear(hidden, 5))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = nn.MSELoss()
    cpu, wall = [], []
    i = 0
    while iters < 0 or i < iters:
        c0, w0 = time.thread_time(), time.perf_counter()
        opt.zero_grad()
        loss_fn(model(torch.randn(batch, 10)), torch.randn(batch, 5)).backward()
        opt.step()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
        i += 1
    if report:
        warm = 5
        print(f"{statistics.median(cpu[warm:]) * 1e3:.2f} {statistics.median(wall[warm:]) * 1e3:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--work", nargs=4, metavar=("BATCH", "HIDDEN", "ITERS", "REPORT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.work:
        b, h, n, r = args.work
        work(int(b), int(h), int(n), r == "1")
        return
    py, me = sys.executable, __file__
    settings = [("alone", 0, False), ("peer 1x", args.batch, False), ("peer 2x", 2 * args.batch, False),
                ("alone + busy", 0, True), ("peer 1x + busy", args.batch, True), ("peer 2x + busy", 2 * args.batch, True)]
    print(f"A: batch {args.batch}, hidden {args.hidden}, {args.iters} iterations; median ms per iteration")
    print(f"{'setting':16s} {'run':>3s} {'cpu_ms':>8s} {'wall_ms':>8s} {'wall/cpu':>8s}")
    for r in range(args.repeat):
        for label, peer_batch, busy in settings:
            others = []
            if peer_batch:
                others.append(subprocess.Popen([py, me, "--work", str(peer_batch), str(args.hidden), "-1", "0"]))
            if busy:
                others.append(subprocess.Popen([py, "-c", "while True: pass"]))
            time.sleep(2.5)  # the peer past its imports and computing
            out = subprocess.run([py, me, "--work", str(args.batch), str(args.hidden), str(args.iters), "1"],
                                 capture_output=True, text=True, check=True).stdout.split()
            for p in others:
                p.kill()
                p.wait()
            cpu, wall = float(out[0]), float(out[1])
            print(f"{label:16s} {r:>3d} {cpu:8.2f} {wall:8.2f} {wall / cpu:8.2f}", flush=True)


if __name__ == "__main__":
    main()
