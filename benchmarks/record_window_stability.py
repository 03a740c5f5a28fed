"""Does the default window give the same verdict every time? (issue 18)

Records the DDP tutorial loop (tests/user_scripts/ddp_loop.py, 2 gloo ranks, steps of a few ms)
`--repeats` times with `tracekit record`'s default window and, for contrast, with `--active 3`;
analyzes each recording and prints, per recording, the steps kept, the median step, each rank's
verdict (`bound`) and whether `analyze` called the verdict unstable. The claim to check: the
default window gives the same verdicts in every recording.

Measured on the shared 2-core box (load 14-25), DDP loop, steps 2.5-11 ms: before the window was chosen
from the fastest of two warmup steps, 3 of 5 and 5 of 5 (windows of 5 and 20 steps when the one warmup step
ran 20-40x slow); after, 5 of 5 'communication' (every window 100 steps) and 4 of 5 (windows 96-100 steps):
the odd one's rank 0 was idle a median 4.7 ms of every step (rank 1 waiting for it), the box starving that
process for the whole recording rather than a short window; analyze flagged it unstable_verdict.

Measured 2026-11-29 12:00-12:06 UTC: quiet box (load 1.3), default window 5 of 5 'communication' (100
steps each, medians 2.3-3.2 ms), `--active 3` 4 of 5 (one 'idle'), all five flagged unstable; beside a
busy process (`python -c "while True: pass"`), default 5 of 5 'communication' (medians 3.2-4.6 ms),
`--active 3` 2 of 5 (rank 0 or 1 'sync_wait' in three), all five flagged unstable.

Usage: python benchmarks/record_window_stability.py [--repeats 5] [--json out.json] [-- script args]
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
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "user_scripts" / "ddp_loop.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record_and_analyze(work: Path, tag: str, window_args: list[str], script_args: list[str]) -> dict:
    out, ana = work / f"rec_{tag}", work / f"ana_{tag}"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "0",
                "--master-port", str(_port()), str(SCRIPT), *script_args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rec = subprocess.run([sys.executable, "-m", "tracekit", "record", "--out", str(out), "--overwrite",
                          *window_args, "--", *torchrun], env=env, capture_output=True, text=True, timeout=900)
    if rec.returncode != 0:
        raise SystemExit(f"record failed:\n{rec.stderr[-3000:]}")
    res = subprocess.run([sys.executable, "-m", "tracekit", "analyze", str(out), "--out", str(ana), "-q"],
                         env=env, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise SystemExit(f"analyze failed:\n{res.stderr[-3000:]}")
    a = json.loads((ana / "analysis.json").read_text())
    steps = [r["step_ns"] for r in a["sections"]["breakdown"]["steps"]]
    chosen = [json.loads(p.read_text()).get("window_choice") for p in sorted(out.glob("record.rank*.json"))]
    return {"steps": a["ranks"][0]["steps"], "median_step_ms": statistics.median(steps) / 1e6,
            "warmup_step_ms": [c["warmup_step_ns"] / 1e6 for c in chosen if c],
            "bound": {r["rank"]: r["bound"] for r in a["ranks"]},
            "unstable": any(f["kind"] == "unstable_verdict" for f in a["findings"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-contrast", action="store_true", help="only the default window (not --active 3 too)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the recordings and analyses here")
    ap.add_argument("script_args", nargs="*", default=["--steps", "150", "--hidden", "256", "--batch", "64"])
    args = ap.parse_args()
    result: dict[str, list[dict]] = {"default": []} if args.no_contrast else {"default": [], "active3": []}
    windows = (("default", []),) if args.no_contrast else (("default", []), ("active3", ["--active", "3"]))
    with tempfile.TemporaryDirectory(prefix="tracekit-bench-window-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for i in range(args.repeats):
            for tag, wargs in windows:
                r = record_and_analyze(work, f"{tag}{i}", wargs, args.script_args)
                result[tag].append(r)
                print(f"{tag:8s} #{i + 1}: {r['steps']} steps (warmup step {r['warmup_step_ms']} ms), "
                      f"median step {r['median_step_ms']:.2f} ms, "
                      f"verdicts {r['bound']}, unstable finding: {r['unstable']}", file=sys.stderr)
    summary = {}
    for tag, runs in result.items():
        verdicts = [tuple(sorted(r["bound"].items())) for r in runs]
        common = max(set(verdicts), key=verdicts.count)
        summary[tag] = {"same_verdict": f"{verdicts.count(common)} of {len(runs)}", "verdict": dict(common),
                        "unstable_flagged": sum(r["unstable"] for r in runs)}
        print(f"{tag}: most common verdict {dict(common)} in {verdicts.count(common)} of {len(runs)}; "
              f"unstable_verdict raised in {summary[tag]['unstable_flagged']}", file=sys.stderr)
    out = {"runs": result, "summary": summary}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
