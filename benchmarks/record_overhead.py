"""Overhead of `tracekit record` on a small DDP model, 2 gloo ranks (torchrun), as ratios from one run.

Three modes run the same script, interleaved `--repeats` times so machine noise hits all alike:
  plain     no profiler at all
  torch     the script wraps its loop in torch.profiler with the same schedule (what users do today)
  record    `tracekit record` with the same schedule, script unmodified

Reported (medians over ranks and repeats of per-run median step times):
  outside-window ratio  record / plain   over steps outside warmup+active (target <= 1.02)
  inside-window ratio   record / torch   over the active steps (collective logging costs extra here)

Usage: python benchmarks/record_overhead.py [--repeats 3] [--steps 90] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

WAIT, WARMUP, ACTIVE = 60, 2, 5

SCRIPT = textwrap.dedent("""
    import json, os, sys, time, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    mode, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    wait, warmup, active = (int(x) for x in sys.argv[4:7])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()) for _ in range(4)]))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    prof = None
    if mode == "torch":
        from torch.profiler import profile, schedule, ProfilerActivity
        prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True,
                       schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                       on_trace_ready=lambda p: p.export_chrome_trace(os.path.join(out, f"torch.rank{rank}.json")))
        prof.start()
    times = []
    for step in range(steps):
        t0 = time.perf_counter_ns()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        if prof is not None:
            prof.step()
        times.append(time.perf_counter_ns() - t0)
    if prof is not None:
        prof.stop()
    with open(os.path.join(out, f"times.{mode}.rank{rank}.json"), "w") as fh:
        json.dump(times, fh)
    dist.destroy_process_group()
""")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_mode(mode: str, work: Path, steps: int, wait: int) -> list[list[int]]:
    """Per-rank step times (ns) of one run. Step i's time covers iteration i (ends after opt.step)."""
    script = work / "train.py"
    res_dir = work / f"res_{mode}"
    res_dir.mkdir(exist_ok=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "0",
                "--master-port", str(_port()), str(script), mode, str(steps), str(res_dir),
                str(wait), str(WARMUP), str(ACTIVE)]
    if mode == "record":
        rec_out = work / "record_out"
        # tracekit record counts step 0 as start-up: its step N is the script's iteration N, like torch's.
        cmd = [sys.executable, "-m", "tracekit", "record", "--out", str(rec_out), "--overwrite",
               "--wait", str(wait), "--warmup", str(WARMUP), "--active", str(ACTIVE), "--", *torchrun]
    else:
        cmd = torchrun
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return [json.loads((res_dir / f"times.{mode}.rank{r}.json").read_text()) for r in (0, 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=WAIT + WARMUP + ACTIVE + 20)
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = ap.parse_args()
    first_active = WAIT + WARMUP
    active = list(range(first_active, first_active + ACTIVE))
    # Outside: skip start-up (first 5 steps) and the steps around the window (warm-up, export, tear-down).
    outside = [s for s in range(5, args.steps) if s < WAIT - 1 or s > first_active + ACTIVE + 2]
    medians: dict[str, dict[str, list[float]]] = {m: {"outside": [], "active": []} for m in ("plain", "torch", "record")}
    with tempfile.TemporaryDirectory(prefix="tracekit-bench-") as tmp:
        work = Path(tmp)
        (work / "train.py").write_text(SCRIPT)
        for rep in range(args.repeats):
            for mode in ("plain", "record", "torch"):
                per_rank = run_mode(mode, work, args.steps, WAIT)
                for times in per_rank:
                    medians[mode]["outside"].append(statistics.median(times[s] for s in outside))
                    medians[mode]["active"].append(statistics.median(times[s] for s in active))
                print(f"repeat {rep + 1}/{args.repeats} {mode:6s}: outside {medians[mode]['outside'][-1] / 1e6:.2f} ms"
                      f", active {medians[mode]['active'][-1] / 1e6:.2f} ms", file=sys.stderr)
    med = {m: {k: statistics.median(v) for k, v in d.items()} for m, d in medians.items()}
    result = {
        "steps": args.steps, "repeats": args.repeats, "window": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE},
        "median_step_ms": {m: {k: v / 1e6 for k, v in d.items()} for m, d in med.items()},
        "outside_window_ratio_record_vs_plain": med["record"]["outside"] / med["plain"]["outside"],
        "outside_window_ratio_torch_vs_plain": med["torch"]["outside"] / med["plain"]["outside"],
        "inside_window_ratio_record_vs_torch_profiler": med["record"]["active"] / med["torch"]["active"],
        "inside_window_ratio_torch_profiler_vs_plain": med["torch"]["active"] / med["plain"]["active"],
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
