"""Memory model vs measured peaks on reference-runtime runs: calibrate on one layout, predict the others.

Each layout is run with `python -m instrumented_runtime` (gloo, CPU), parsed and analyzed; the measured
number is each rank's peak allocated (the profiler's Total Allocated maximum, section `memory`). The
model (tracekit/model/memory.py) is calibrated on the first layout's per-stage peaks and predicts every
other layout's per-rank peak; the error is |predicted − measured| / measured (target: within 15%).

On CPU the profiler's counter only sees memory allocated while it records, so parameters and optimizer
state (built before the window) are not in the measured peak: the calibration says so
(`counts_static=False`) and the model predicts gradients + in-flight activations + transient.

Usage: python benchmarks/memory_model.py [--json out.json] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracekit.layout import ParallelLayout  # noqa: E402
from tracekit.model.memory import ModelShape, calibrate, predict  # noqa: E402

MODEL = ["--d-model", "64", "--num-heads", "4", "--num-layers", "4", "--d-ff", "256", "--vocab-size", "128",
         "--moe-every", "0"]
COMMON = ["--steps", "2", "--profile-steps", "1", "--seq-len", "64"]
# (name, runtime args); the first one calibrates the model
LAYOUTS = [
    ("pp4_1f1b_m8", ["--pp", "4", "--schedule", "1f1b", "--microbatches", "8", "--global-batch-size", "16"]),
    ("single_b4", ["--global-batch-size", "4"]),
    ("dp2_ddp", ["--dp", "2", "--global-batch-size", "8"]),
    ("dp2_fsdp", ["--dp", "2", "--dp-mode", "fsdp", "--global-batch-size", "8"]),
    ("tp2", ["--tp", "2", "--global-batch-size", "4"]),
    ("cp2", ["--cp", "2", "--global-batch-size", "4"]),
    ("pp2_1f1b_m4", ["--pp", "2", "--schedule", "1f1b", "--microbatches", "4", "--global-batch-size", "8"]),
    ("pp2_gpipe_m4", ["--pp", "2", "--schedule", "gpipe", "--microbatches", "4", "--global-batch-size", "8"]),
    ("pp4_1f1b_m8_b32", ["--pp", "4", "--schedule", "1f1b", "--microbatches", "8", "--global-batch-size", "32"]),
    ("pp2_1f1b_m4_ckpt", ["--pp", "2", "--schedule", "1f1b", "--microbatches", "4", "--global-batch-size", "8",
                          "--activation-checkpointing"]),
]


def _value(args: list[str], flag: str, default: str) -> str:
    return args[args.index(flag) + 1] if flag in args else default


def layout_of(args: list[str]) -> tuple[ModelShape, ParallelLayout]:
    dims = {d: int(_value(args, f"--{d}", "1")) for d in ("dp", "tp", "pp", "cp")}
    pp = dims["pp"]
    m = int(_value(args, "--microbatches", str(max(pp, 1))))
    gbs = int(_value(args, "--global-batch-size", str(dims["dp"] * m * 2)))
    shape = ModelShape(num_layers=4, d_model=64, d_ff=256, num_heads=4, vocab_size=128, seq_len=64,
                       microbatch_size=gbs // dims["dp"] // m, max_seq_len=256,
                       ring_attention_saves_probs=True)  # the runtime's hand-written ring (no flash kernel)
    layout = ParallelLayout(dp=dims["dp"], tp=dims["tp"], pp=pp, cp=dims["cp"], dp_mode=_value(args, "--dp-mode", "ddp"),
                    schedule=_value(args, "--schedule", "1f1b") if pp > 1 else "gpipe", microbatches=m,
                    activation_checkpointing="--activation-checkpointing" in args)
    return shape, layout


def measure(name: str, args: list[str], work: Path) -> dict[str, int]:
    """Per-rank peak allocated of one run, as the memory analysis reports it."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    trace, an = work / name, work / f"{name}.an"
    subprocess.run([sys.executable, "-m", "instrumented_runtime", *MODEL, *COMMON, *args, "--out", str(trace)],
                   cwd=REPO, env=env, check=True, capture_output=True, timeout=600)
    subprocess.run([sys.executable, "-m", "tracekit", "analyze", str(trace), "--out", str(an), "--quiet"],
                   cwd=REPO, env=env, check=True, capture_output=True, timeout=600)
    mem = json.loads((an / "analysis.json").read_text())["sections"]["memory"]
    peaks: dict[str, int] = {}
    for r in mem["ranks"]:
        peaks[str(r["rank"])] = max(peaks.get(str(r["rank"]), 0), r["peak_allocated"])
    per_mb = {str(r["rank"]): r["per_microbatch_bytes"] for r in mem["ranks"]}
    stage_of = {str(rk): s["stage"] for s in mem["stages"] for rk in s["ranks"]}
    return {"peaks": peaks, "per_microbatch": per_mb, "stage_of": stage_of}


def compare(measured: dict[str, dict]) -> list[dict]:
    """Calibrate on the first layout, predict every layout's per-rank peak (max over the rank's stages)."""
    first_name, first_args = LAYOUTS[0]
    shape, layout = layout_of(first_args)
    m0 = measured[first_name]
    stage_peaks, stage_mb = [0] * layout.num_stages, [None] * layout.num_stages
    for rank, peak in m0["peaks"].items():
        s = m0["stage_of"].get(rank, 0)
        stage_peaks[s] = max(stage_peaks[s], peak)
        stage_mb[s] = m0["per_microbatch"].get(rank)
    calib = calibrate(shape, layout, peaks=stage_peaks, per_microbatch=stage_mb, counts_static=False)
    print(calib)
    rows = []
    for name, args in LAYOUTS:
        shape, layout = layout_of(args)
        pred = predict(shape, layout, calib)
        meas = measured[name]
        for rank, peak in sorted(meas["peaks"].items(), key=lambda kv: int(kv[0])):
            s = meas["stage_of"].get(rank, 0)
            p = pred[s].peak
            rows.append({"layout": name, "rank": int(rank), "stage": s, "measured": peak, "predicted": p,
                         "error": round(abs(p - peak) / peak, 4), "calibration": name == first_name})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", type=Path, help="keep traces here (and reuse measurements found in it)")
    a = ap.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="memmodel-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "measured.json"
    measured = json.loads(cache.read_text()) if cache.exists() else {}
    for name, args in LAYOUTS:
        if name not in measured:
            measured[name] = measure(name, args, work)
            cache.write_text(json.dumps(measured))
    rows = compare(measured)
    for r in rows:
        print(f"{r['layout']:<20} rank {r['rank']} stage {r['stage']}  measured {r['measured'] / 2**20:7.3f} MiB  "
              f"predicted {r['predicted'] / 2**20:7.3f} MiB  error {r['error']:6.1%}{'  (calibration)' if r['calibration'] else ''}")
    others = {}
    for r in rows:
        if not r["calibration"]:
            others[r["layout"]] = max(others.get(r["layout"], 0.0), r["error"])
    ok = [n for n, e in others.items() if e <= 0.15]
    print(f"layouts predicted within 15% (worst rank): {len(ok)} of {len(others)}: {sorted(ok)}")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "worst_error_per_layout": others}, indent=1))


if __name__ == "__main__":
    main()
