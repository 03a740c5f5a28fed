"""A tiny real 2-rank gloo job profiled with torch.profiler, for the Kineto gloo-shape tests.

Run as a script (`python kineto_gloo_job.py OUT`): forks 2 ranks, profiles 2 steps (one warm-up) and
writes OUT/rank{R}.json plus OUT/issued.rank{R}.json, the ops each rank issued per profiled step,
in order: the independent reference for the parser.
"""

from __future__ import annotations

import json
import os
import sys

WORLD = 2
N = 1000  # all_reduce / all_gather input elements


def _splits(rank: int) -> tuple[list[int], list[int]]:
    """Uneven all_to_all: rank 0 sends [10, 30], rank 1 sends [20, 40] → rank r receives column r."""
    send = [[10, 30], [20, 40]]
    return send[rank], [send[0][rank], send[1][rank]]


def _rank_main(rank: int, out: str, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    tp = dist.new_group([0, 1], group_desc="mesh_tp")
    x = torch.ones(N)
    in_split, out_split = _splits(rank)
    a2a_in = torch.ones(sum(in_split))
    a2a_out = torch.empty(sum(out_split))
    issued: list[dict] = []

    def step_ops(record: bool) -> None:
        ops = []
        with record_function("ep:dispatch"):
            dist.all_to_all_single(a2a_out, a2a_in, output_split_sizes=out_split, input_split_sizes=in_split)
            ops.append({"op": "all_to_all", "in": sum(in_split), "out": sum(out_split), "in_split": in_split,
                        "out_split": out_split, "caller": "ep:dispatch"})
        with record_function("DistributedDataParallel.forward"):
            dist.all_reduce(x)
            ops.append({"op": "all_reduce", "in": N, "out": N, "caller": "DistributedDataParallel.forward"})
        dist.all_reduce(x, group=tp)
        ops.append({"op": "all_reduce", "in": N, "out": N, "caller": None})
        gathered = torch.empty(N * WORLD)
        dist.all_gather_into_tensor(gathered, x)
        ops.append({"op": "all_gather", "in": N, "out": N * WORLD, "caller": None})
        shard = torch.empty(N // WORLD)
        dist.reduce_scatter_tensor(shard, x)
        ops.append({"op": "reduce_scatter", "in": N, "out": N // WORLD, "caller": None})
        dist.broadcast(x, 0)
        ops.append({"op": "broadcast", "in": N, "out": N, "caller": None})
        y = torch.ones(64)
        if rank == 0:
            dist.send(y, 1)
            ops.append({"op": "send", "in": 64, "out": 64, "caller": None})
        else:
            dist.recv(y, 0)
            ops.append({"op": "recv", "in": 64, "out": 64, "caller": None})
        dist.barrier()
        ops.append({"op": "barrier", "in": None, "out": None, "caller": None})
        if record:
            issued.append(ops)

    def export(prof) -> None:
        prof.export_chrome_trace(f"{out}/rank{rank}.json")

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=2), on_trace_ready=export) as prof:
        for i in range(3):
            step_ops(record=i >= 1)
            prof.step()
    with open(f"{out}/issued.rank{rank}.json", "w") as f:
        json.dump(issued, f)
    dist.barrier()
    dist.destroy_process_group()


def main(out: str) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.makedirs(out, exist_ok=True)
    mp.start_processes(_rank_main, args=(out, port), nprocs=WORLD, start_method="fork")


if __name__ == "__main__":
    main(sys.argv[1])
