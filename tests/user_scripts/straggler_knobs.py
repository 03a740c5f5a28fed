"""The straggler knobs the user scripts share (for tests; the analyzers never see them):
`--slow-rank R` with `--batch-mult K` (rank R's batch is K times larger) and/or `--sleep-ms MS`
(rank R sleeps MS ms in each step); `--sleep-log PATH`: the slow rank appends what it really slept
in each step (`<step> <ns>`, timed with perf_counter), the tests' independent truth for the delay."""

import argparse
import time


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--slow-rank", type=int, default=None)
    ap.add_argument("--batch-mult", type=int, default=1)
    ap.add_argument("--sleep-ms", type=float, default=0.0)
    ap.add_argument("--sleep-log", default=None)


def maybe_sleep(args: argparse.Namespace, rank: int, step: int) -> None:
    """On the slow rank, sleep `--sleep-ms` and log the measured sleep to `--sleep-log`."""
    if rank != args.slow_rank or not args.sleep_ms:
        return
    t0 = time.perf_counter_ns()
    time.sleep(args.sleep_ms / 1000)
    slept = time.perf_counter_ns() - t0
    if args.sleep_log:
        with open(args.sleep_log, "a") as fh:
            fh.write(f"{step} {slept}\n")
