"""What-if replay vs re-running the reference runtime without the fault (issue 14).

For each pair (fault, fixed) the runtime runs A, B, A, B (so a load change on the shared box hits both);
each run is parsed and analyzed. The replayed saving is the finding's `est_saving_ns` (its fix replayed on
the cross-rank graph of the faulty run; `--direct` replays the fix itself when no finding names it); the
measured saving is the faulty run's step minus the fixed run's (median over profiled steps of the slowest
rank's ProfilerStep). Noise = the larger gap between the two identical runs of either side.

    python benchmarks/whatif_rerun.py [--only slow_rank,...] [--out DIR]

Prints one line per pair: measured vs replayed saving, their ratio, and the noise; target: within 15%.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PP_MODEL = ["--pp", "2", "--global-batch-size", "16", "--moe-every", "0", "--d-model", "128", "--d-ff", "512"]
MOE_MODEL = ["--dp", "2", "--ep", "2", "--num-experts", "8", "--capacity-factor", "4", "--d-ff", "512",
             "--moe-every", "1"]
PP_DEVICE = ["--device-us-per-token", "40"]
MOE_DEVICE = ["--device-us-per-token", "100"]
DP_DEVICE = ["--dp", "2", "--device-us-per-token", "40", "--d-model", "128", "--d-ff", "512"]

# name: (faulty args, fixed args, finding kind, what-if for --direct)
PAIRS = {
    "slow_rank": (DP_DEVICE + ["--slow-rank", "1", "--slow-factor", "3"], DP_DEVICE, "straggler",
                  {"kind": "rank_compute", "rank": 1}),
    "stage_imbalance": (PP_MODEL + PP_DEVICE + ["--microbatches", "4", "--num-layers", "6", "--stage-layers", "5,1"],
                        PP_MODEL + PP_DEVICE + ["--microbatches", "4", "--num-layers", "6"],
                        "pipeline_imbalance", {"kind": "stage_resplit"}),
    "router_skew": (MOE_MODEL + MOE_DEVICE + ["--router-bias", "3=2.0"], MOE_MODEL + MOE_DEVICE,
                    "expert_routing_skew", {"kind": "expert_even"}),
    "too_few_microbatches": (PP_MODEL + PP_DEVICE + ["--schedule", "gpipe", "--microbatches", "1"],
                             PP_MODEL + PP_DEVICE + ["--schedule", "gpipe", "--microbatches", "4"],
                             "pipeline_bubble", {"kind": "microbatches", "value": 4}),
}


def run_once(args: list[str], out: Path) -> tuple[dict, list[int], object]:
    from tracekit.analyze.engine import analyze_store
    from tracekit.parse.run import parse_run

    cmd = [sys.executable, "-m", "instrumented_runtime", "--steps", "4", *args, "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    store = parse_run(out, Path(f"{out}.store"), progress=False).store
    analysis = json.loads(json.dumps(analyze_store(store), default=str))
    per: dict[int, int] = {}
    for r in store.table("steps", ["step", "dur"]).to_pylist():
        per[r["step"]] = max(per.get(r["step"], 0), r["dur"])
    return analysis, [per[s] for s in sorted(per)], store


def direct_saving(store, whatif: dict) -> int:
    """Replay the fix itself on the faulty run (when no finding carries it)."""
    from tracekit.whatif.api import run_whatif
    from tracekit.whatif.fixes import Fix

    out = run_whatif(store, [Fix(**whatif)])
    return int(out["measured_ns"] - out["predicted_ns"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=",".join(PAIRS))
    ap.add_argument("--out", default=None)
    opts = ap.parse_args()
    root = Path(opts.out or tempfile.mkdtemp(prefix="whatif_rerun_"))
    for name in opts.only.split(","):
        faulty, fixed, kind, whatif = PAIRS[name]
        t = time.time()
        runs = {}
        for i, (side, args) in enumerate([("A", faulty), ("B", fixed), ("A2", faulty), ("B2", fixed)]):
            runs[side] = run_once(args, root / f"{name}_{side}")
        step = {k: float(np.median(v[1])) for k, v in runs.items()}
        noise = max(abs(step["A"] - step["A2"]), abs(step["B"] - step["B2"]))
        measured = (step["A"] + step["A2"]) / 2 - (step["B"] + step["B2"]) / 2
        found = [f for f in runs["A"][0]["findings"] if f["kind"] == kind]
        replayed = [f["est_saving_ns"] for f in found]
        direct = [direct_saving(runs[s][2], whatif) for s in ("A", "A2")]
        pred = float(np.mean(direct))
        err = abs(pred - measured) / measured if measured > 0 else float("nan")
        print(f"{name:22s} step {step['A'] / 1e6:7.1f}/{step['A2'] / 1e6:7.1f} ms → {step['B'] / 1e6:7.1f}/"
              f"{step['B2'] / 1e6:7.1f} ms  measured saving {measured / 1e6:7.1f} ms  replayed "
              f"{pred / 1e6:7.1f} ms (runs A, A2: {direct[0] / 1e6:.1f}, {direct[1] / 1e6:.1f})  error {err:.0%}  "
              f"noise {noise / 1e6:.1f} ms  finding {kind}: {[round(x / 1e6, 1) for x in replayed]} ms  "
              f"[{time.time() - t:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
