"""Layout advisor against the reference runtime (issue 15): measure one 8-rank layout, predict other
8-rank layouts from its trace alone, run them all, and compare step times.

    .venv/bin/python benchmarks/advisor_runtime_bench.py [--runs DIR] [--steps 8] [--profile-steps 5]

Every run uses simulated device time (`--device-us-per-token`, a per-token wait per block and per routed
token in each expert: ranks wait as a host waits on its GPU, so 8 ranks run side by side on 2 cores).
The measured run is parsed and analysed through the normal path; the advisor calibrates the simulator
from that analysis only (compute per token per layer, the backend's per-op collective latency and
bandwidth, the residual) and predicts the others. Measured step = median over the profiled steps of the
slowest rank's step (the runtime's own clock). Prints the table, the mean absolute error and Kendall's
tau of predicted vs measured order (targets: ≤ 10%, ≥ 0.8). `--runs DIR` keeps (and reuses) the runs.
`--from-advice N` does what a user does instead: `tracekit advise RUN` with no --model on the measured run (the
model and batch from its manifest), then runs the N best other layouts of the CLI's ranked list and prints
predicted vs measured (issue 29's target: mean absolute error ≤ 15%).

Measured 2026-11-25 on the shared 2-core box (load average 12-23), 600 µs/token, 7 steps of which 5
profiled, two independent runs of all 12 layouts: MAE 5.6% / 5.2%, tau 0.85 / 0.78 over 11 layouts.
Worst: dp8 FSDP -13.7% / -16.6% (its 8-member all-gathers / reduce-scatters priced at the latency the
measured run's 2-member groups showed: how gloo's latency grows with the group is not in that run), pp4
1f1b m8 +6.9% / +10.4%, cp2 -9.7% / -6.5%. Tau is held down by near-ties: four layouts within 10% of
3.4 s and three within 5% of 4.4 s, whose order the box's noise sets. At 200 µs/token the ranks' CPU
work (slowed 5-10x by the box's load, more when 8 ranks compute in lockstep) was a third of the step
and the same comparison gave MAE 13.8%, tau 0.22: the simulator models the devices, not the box's
contention, so the waits must dominate.

2026-11-29, collective latency per ring hop on CPU runs (ClusterSpec.coll_lat_per_hop: an 8-member gloo
all-gather pays 7 hop latencies where the measured 2-member groups paid 1), the same 12 runs predicted
before and after (`--runs` kept, 7 steps of which 5 profiled): MAE 4.8% -> 4.3%, tau 0.82 -> 0.85; dp8
FSDP -12.9% -> -10.0%, dp2 tp4 -6.4% -> -3.9%, dp8 DDP -4.9% -> -4.0%, pp4 1f1b m8 +8.8% -> +8.7%.
A second, independent set of 12 runs the same day: MAE 3.9%, tau 0.93 (worst pp4 1f1b m8 +8.8%, dp8 FSDP
-8.3%, cp2 -7.6%).

2026-12-06, `--from-advice 6` (what a user does: `tracekit advise RUN` with no --model, then its six best
other layouts run; 5 steps of which 3 profiled, load average 9-20): measured dp2 tp2 pp2 ep2 1f1b m4 4189 ms
(predicted 4149); dp2 cp4 2952 vs 3218 ms (-8.3%), dp8 2956 vs 2918 (+1.3%), dp4 cp2 2962 vs 3176 (-6.7%),
cp8 2969 vs 3368 (-11.8%), dp2 tp2 cp2 2993 vs 3122 (-4.1%), dp4 tp2 2993 vs 2987 (+0.2%): MAE 5.4%, every
one of the six faster than the measured layout as predicted (-20 to -30%), but tau -0.20 among them: the
advisor predicts them within 1.4% of each other where they ran 2918-3368 ms, and it under-predicts context
parallelism the more the wider it is (cp2 -4..-7%, cp4 -8%, cp8 -12%). The slow test
(tests/advise/test_advise_cli_runtime.py, the best three) measured MAE 4.2%.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.advisor_bench import kendall_tau  # noqa: E402
from tests.advise.runtime_layouts import RuntimeModel, layout_name, run_layout, step_times  # noqa: E402
from tracekit.simulate import ParallelLayout  # noqa: E402

MEASURED = ParallelLayout(dp=2, tp=2, pp=2, ep=2, schedule="1f1b", microbatches=4)
OTHERS = [
    ParallelLayout(dp=8, ep=4),
    ParallelLayout(dp=4, tp=2, ep=4),
    ParallelLayout(dp=2, tp=4, ep=2),
    ParallelLayout(dp=4, pp=2, ep=4, schedule="gpipe", microbatches=4),
    ParallelLayout(dp=4, pp=2, ep=2, schedule="1f1b", microbatches=2),
    ParallelLayout(dp=2, pp=4, ep=2, schedule="1f1b", microbatches=8),
    ParallelLayout(dp=2, tp=2, cp=2, ep=4),
    ParallelLayout(dp=2, tp=2, pp=2, ep=2, schedule="interleaved", microbatches=4, virtual_stages=2),
    ParallelLayout(dp=8, ep=4, dp_mode="fsdp"),
    ParallelLayout(dp=2, pp=4, ep=2, schedule="gpipe", microbatches=2),
    ParallelLayout(dp=4, pp=2, ep=4, schedule="gpipe", microbatches=1),
]


def analyse(run: Path) -> dict:
    from tracekit.flow import analyze_store
    from tracekit.parse.run import parse_run

    with tempfile.TemporaryDirectory() as tmp:
        store = parse_run(run, Path(tmp) / "store", workers=0, progress=False).store
        return json.loads(json.dumps(analyze_store(store), default=str))


def predictions(model: RuntimeModel, analysis: dict, layouts: list[ParallelLayout], spec=None) -> tuple[list[int], object]:
    """Each layout's predicted step (ns) from the calibration on `analysis`, and the calibration (`spec`: the
    model as the advisor is told it; default the hand-written RuntimeModel.spec)."""
    from tracekit.advise.calibrate import calibrate, predicted_step_ns
    from tracekit.simulate import ClusterSpec

    cal = calibrate(analysis, spec or model.spec(MEASURED), ClusterSpec.preset("1x8-h100"))
    return [predicted_step_ns(cal, L, model.micro_batch(L)) for L in layouts], cal


def compare(model: RuntimeModel, runs: list[Path], profile_steps: int, from_manifest: bool = False) -> None:
    t0 = time.perf_counter()
    analysis = analyse(runs[0])
    print(f"  measured run analysed in {time.perf_counter() - t0:.0f} s")
    spec = None
    if from_manifest:  # what `tracekit advise RUN` does without --model
        from tracekit.simulate.model_file import model_from_manifest

        spec, source = model_from_manifest(json.loads((runs[0] / "manifest.json").read_text()))
        print("  " + source)
    others = OTHERS[:len(runs) - 1]
    pred, cal = predictions(model, analysis, others, spec)
    for note in cal.notes:
        print("  calibration:", note)
    meas = [step_times(r, profile_steps) for r in runs]
    print(f"  {'layout':40s} {'predicted':>10s} {'measured':>10s} {'spread':>7s} {'error':>7s}")
    m0 = statistics.median(meas[0])
    print(f"  {layout_name(MEASURED) + ' (measured)':40s} {cal.measured.step_ns / 1e6:9.1f}ms {m0 / 1e6:9.1f}ms "
          f"{100 * (max(meas[0]) - min(meas[0])) / m0:6.1f}%")
    truth = []
    for L, p, ms in zip(others, pred, meas[1:]):
        t = statistics.median(ms)
        truth.append(t)
        print(f"  {layout_name(L):40s} {p / 1e6:9.1f}ms {t / 1e6:9.1f}ms {100 * (max(ms) - min(ms)) / t:6.1f}% "
              f"{100 * (p - t) / t:+6.1f}%")
    mae = statistics.mean(abs(p - t) / t for p, t in zip(pred, truth))
    print(f"  mean absolute error {100 * mae:.1f}% (target ≤ 10%)   Kendall tau {kendall_tau(pred, truth):.2f} "
          f"(target ≥ 0.8)   over {len(others)} predicted layouts")


def from_advice(model: RuntimeModel, root: Path, n: int, steps: int, profile_steps: int) -> None:
    """What a user does: `tracekit advise RUN` with no --model on the measured run, then run the best `n`
    layouts of its ranked list and compare its predictions with their measured steps."""
    from tests.advise.runtime_layouts import advise_cli, layout_from_json

    measured = ensure_run(model, MEASURED, root, steps, profile_steps)
    t0 = time.perf_counter()
    doc, printed = advise_cli(measured, root / "advice")
    print(f"  tracekit advise {measured} (no --model) in {time.perf_counter() - t0:.0f} s:")
    for line in printed.splitlines():
        if not line.startswith("advice:"):
            print("    " + line)
    picks = [r for r in doc["ranked"] if not r["is_current"]][:n]
    dirs = [ensure_run(model, layout_from_json(r["layout"]), root, steps, profile_steps) for r in picks]
    m0 = step_times(measured, profile_steps)
    print(f"  {'layout':40s} {'predicted':>10s} {'measured':>10s} {'spread':>7s} {'error':>7s}")
    print(f"  {layout_name(MEASURED) + ' (measured)':40s} {doc['current']['predicted_step_ns'] / 1e6:9.1f}ms "
          f"{statistics.median(m0) / 1e6:9.1f}ms {100 * (max(m0) - min(m0)) / statistics.median(m0):6.1f}%")
    pred, truth = [], []
    for r, d in zip(picks, dirs):
        ms = step_times(d, profile_steps)
        t, p = statistics.median(ms), r["predicted_step_ns"]
        pred.append(p)
        truth.append(t)
        print(f"  {layout_name(layout_from_json(r['layout'])):40s} {p / 1e6:9.1f}ms {t / 1e6:9.1f}ms "
              f"{100 * (max(ms) - min(ms)) / t:6.1f}% {100 * (p - t) / t:+6.1f}%")
    mae = statistics.mean(abs(p - t) / t for p, t in zip(pred, truth))
    print(f"  mean absolute error {100 * mae:.1f}% (target ≤ 15%)   Kendall tau {kendall_tau(pred, truth):.2f}   "
          f"over the advice's {len(picks)} best other layouts")


def ensure_run(model: RuntimeModel, layout: ParallelLayout, root: Path, steps: int, profile_steps: int) -> Path:
    out = root / layout_name(layout).replace(" ", "_").replace("/", "")
    if not (out / "train_log.json").exists():
        t0 = time.perf_counter()
        run_layout(model, layout, out, steps=steps, profile_steps=profile_steps)
        print(f"  ran {layout_name(layout)} in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--run-only", action="store_true")
    ap.add_argument("--model-from-manifest", action="store_true",
                    help="tell the advisor the model the measured run's manifest names (as `advise RUN` without --model)")
    ap.add_argument("--layouts", type=int, default=len(OTHERS), help="predict only the first N other layouts")
    ap.add_argument("--from-advice", type=int, default=0, metavar="N",
                    help="run `tracekit advise RUN` (no --model) on the measured run and compare its N best other "
                         "layouts with running them")
    args = ap.parse_args()
    model = RuntimeModel()
    root = args.runs or Path(tempfile.mkdtemp(prefix="advisor_runtime_"))
    if args.from_advice:
        from_advice(model, root, args.from_advice, args.steps, args.profile_steps)
        return
    dirs = [ensure_run(model, L, root, args.steps, args.profile_steps) for L in [MEASURED, *OTHERS[:args.layouts]]]
    if args.run_only:
        return
    compare(model, dirs, args.profile_steps, args.model_from_manifest)


if __name__ == "__main__":
    main()
