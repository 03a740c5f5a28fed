"""Cost of `tracekit record --hang-timeout`'s per-call log (record/hang_monitor.py) on a collective call.

One gloo rank (world size 1, so the collective itself is cheap and the wrapper's share is as large as it
gets) runs `dist.all_reduce` on 1024 floats in blocks of `--calls`; in the same process the hang log's
wrappers are switched on and off in alternating blocks (A/B/A/B...), so a slow phase of a shared machine
hits both alike. Printed: the median time per call with and without the log, their ratio, and the
difference (the wrapper's cost per call). The heartbeat thread (one pg_status read and a small file every
0.5 s) is not started here: its cost does not depend on the number of calls.

  python benchmarks/hang_monitor_overhead.py [--blocks 20] [--calls 500]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--calls", type=int, default=500)
    args = ap.parse_args()
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from tracekit.record import hang_monitor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()))
    plain = c10d.all_reduce
    with tempfile.TemporaryDirectory(prefix="tracekit-hang-bench-") as out:
        hang_monitor._wrap_calls(out)  # the wrappers alone (no heartbeat thread)
        logged = c10d.all_reduce
        dist.init_process_group("gloo", rank=0, world_size=1)
        t = torch.ones(1024)
        for _ in range(200):
            plain(t)
            logged(t)
        times: dict[str, list[float]] = {"plain": [], "logged": []}
        for b in range(2 * args.blocks):
            name, fn = ("plain", plain) if b % 2 == 0 else ("logged", logged)
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn(t)
            times[name].append((time.perf_counter() - t0) / args.calls)
        dist.destroy_process_group()
    p, l = statistics.median(times["plain"]), statistics.median(times["logged"])
    print(f"all_reduce(1024 floats), 1 gloo rank: {p * 1e6:.1f} us plain, {l * 1e6:.1f} us with the hang log; "
          f"ratio {l / p:.2f}, +{(l - p) * 1e6:.1f} us per call")


if __name__ == "__main__":
    main()
