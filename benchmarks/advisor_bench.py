"""Layout advisor on simulated clusters (issue 15): prediction error against re-simulation, the seeds of
good practice, and the time to advise a 1,024-GPU layout space from a 64-rank trace.

    .venv/bin/python benchmarks/advisor_bench.py [--quick]

Each measured run is simulated on a "true" cluster whose GEMM efficiency and link speeds the advisor is
not told (it starts from the H100 preset), written as traces and analysed through the normal path.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from tracekit.advise.advisor import advise
from tracekit.advise.calibrate import calibrate
from tracekit.advise.predict import predict_step
from tracekit.analyze.engine import analyze_store
from tracekit.parse.run import parse_run
from tracekit.simulate import ClusterSpec, Layout, ModelSpec, simulate, step_time, write_traces


def measured(model: ModelSpec, cluster: ClusterSpec, layout: Layout, tmp: Path) -> dict:
    res = simulate(model, cluster, layout, steps=2, seed=0, without=False)
    write_traces(res, tmp / "traces")
    store = parse_run(tmp / "traces", tmp / "store", workers=0, progress=False).store
    return analyze_store(store)


def kendall_tau(a: list[float], b: list[float]) -> float:
    n, s = len(a), 0
    for i in range(n):
        for j in range(i + 1, n):
            s += (1 if (a[i] - a[j]) * (b[i] - b[j]) > 0 else -1)
    return 2 * s / (n * (n - 1))


def error_table(model, true, preset, measured_layout, others, hosts, gph) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        an = measured(model, true, measured_layout, Path(tmp))
        print(f"  measured run simulated + analysed in {time.perf_counter() - t0:.1f} s")
    cal = calibrate(an, model, preset)
    cl = dataclasses.replace(cal.cluster, hosts=hosts, gpus_per_host=gph)
    batch = measured_layout.dp * measured_layout.microbatches * model.micro_batch_size
    pred, truth = [], []
    print(f"  {'layout':44s} {'predicted':>10s} {'re-sim':>10s} {'error':>7s}")
    for L in others:
        m = dataclasses.replace(model, micro_batch_size=batch // (L.dp * L.microbatches))
        p = predict_step(m, cl, L).step_ns * cal.residual
        t = step_time(m, dataclasses.replace(true, hosts=hosts, gpus_per_host=gph), L, steps=2)
        pred.append(p)
        truth.append(t)
        name = f"dp{L.dp} tp{L.tp} pp{L.pp} cp{L.cp} ep{L.ep} m{L.microbatches} {L.schedule}{' fsdp' if L.fsdp else ''}"
        print(f"  {name:44s} {p / 1e6:9.2f}ms {t / 1e6:9.2f}ms {100 * (p - t) / t:+6.2f}%")
    mae = sum(abs(p - t) / t for p, t in zip(pred, truth)) / len(pred)
    print(f"  mean absolute error {100 * mae:.2f}%   Kendall tau {kendall_tau(pred, truth):.2f}")


def seeds(quick: bool) -> None:
    slow = dataclasses.replace(ClusterSpec.preset("4x8-h100"), inter_bw_gbs=12.0)
    cases = [("dense 70B-like, slow inter-host links", ModelSpec.preset("llama-70b-like"), Layout(dp=4, tp=8, pp=1)),
             ("long sequence (128k tokens)", dataclasses.replace(ModelSpec.preset("tiny"), seq=131072, micro_batch_size=1),
              Layout(dp=32)),
             ("skewed MoE", ModelSpec.preset("tiny-moe"), Layout(dp=8, tp=4, ep=8))]
    for title, model, L in cases[1:] if quick else cases:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            an = measured(model, slow, L, Path(tmp))
            adv = advise(an, model, ClusterSpec.preset("4x8-h100"), top=3, simulate_top=10)
            dt = time.perf_counter() - t0
        best = adv.ranked[0].layout
        print(f"  {title}: top layout dp{best.dp} tp{best.tp} pp{best.pp} cp{best.cp} ep{best.ep} "
              f"({adv.ranked[0].step_ns / 1e6:.1f} ms; current {adv.current.step_ns / 1e6 if adv.current else float('nan'):.1f} ms) "
              f"[{dt:.1f} s]")


def scale() -> None:
    model, cl = ModelSpec.preset("tiny"), ClusterSpec.preset("8x8-h100")
    with tempfile.TemporaryDirectory() as tmp:
        an = measured(model, cl, Layout(dp=8, tp=4, pp=2, microbatches=4), Path(tmp))
    t0 = time.perf_counter()
    c0 = time.process_time()
    adv = advise(an, model, cl, gpus=1024, hosts=128, gpus_per_host=8, global_batch=1024)
    print(f"  1,024-GPU space from a 64-rank run: {adv.layouts_considered} layouts, {adv.layouts_simulated} simulated, "
          f"{time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU; "
          f"top dp{adv.ranked[0].layout.dp} tp{adv.ranked[0].layout.tp} pp{adv.ranked[0].layout.pp} "
          f"cp{adv.ranked[0].layout.cp} {adv.ranked[0].step_ns / 1e6:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    model = ModelSpec.preset("tiny")
    preset = ClusterSpec.preset("8x8-h100")
    true = dataclasses.replace(preset, efficiency=0.33, intra_bw_gbs=250.0, inter_bw_gbs=30.0)
    print("64 GPUs: calibrated on dp8 tp4 pp2, predicting 8 other layouts")
    error_table(model, true, preset, Layout(dp=8, tp=4, pp=2, microbatches=4),
                [Layout(dp=16, tp=2, pp=2, microbatches=4), Layout(dp=8, tp=8, microbatches=2),
                 Layout(dp=4, tp=4, pp=4, microbatches=8), Layout(dp=8, tp=2, pp=2, cp=2, microbatches=4),
                 Layout(dp=16, tp=4, microbatches=1, fsdp=True), Layout(dp=8, tp=4, pp=2, microbatches=8, schedule="gpipe"),
                 Layout(dp=4, tp=4, pp=4, microbatches=8, schedule="interleaved", interleave=2),
                 Layout(dp=32, tp=2, microbatches=1)], hosts=8, gph=8)
    print("seeds of good practice (4 hosts x 8 GPUs, 12 GB/s inter-host):")
    seeds(args.quick)
    print("scale:")
    scale()


if __name__ == "__main__":
    main()
