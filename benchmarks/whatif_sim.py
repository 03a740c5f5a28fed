"""Fault-removed replay vs re-simulation, one simulated run per fault kind (issue 14; target: within 3%).

Each run is simulated with one fault, written as Kineto traces, parsed, and its steps replayed with the
fault's fix (the fix a finding of that kind recommends, tracekit.assess.critical_path.fix_for's mapping,
applied directly here); the answer key's `step_ns_without` is the simulator re-run without the fault.

    python benchmarks/whatif_sim.py [--only slow_gpu,...] [--small]

`--small` runs the cheap layouts tests/analyze/test_whatif_sim.py checks (4-layer models, 2 steps).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracekit.simulate import ClusterSpec, Faults, ParallelLayout, ModelSpec, simulate, write_traces  # noqa: E402

BASE = ParallelLayout(dp=2, tp=2, pp=2, microbatches=4)
CASES = {
    "slow_gpu": ("tiny", BASE, Faults(slow_gpu={3: 1.5})),
    "slow_link": ("tiny", BASE, Faults(slow_link={"tp": 4.0})),
    "stage_imbalance": ("tiny", BASE, Faults(stage_layers=(6, 2))),
    "router_skew": ("tiny-moe", ParallelLayout(dp=4, ep=4, tp=2), Faults(router_bias={0: 3.0})),
    "host_stall": ("tiny", BASE, Faults(host_stall=(5, 20.0, 1))),
    "slow_data_loading": ("tiny", BASE, Faults(slow_data=(2, 20.0))),
    "uneven_sequence_length": ("tiny", ParallelLayout(dp=4, tp=2), Faults(uneven_seq=(1, 2.0))),
    "no_overlap": ("tiny", ParallelLayout(dp=8, tp=2), Faults(no_overlap=True)),
    "too_few_microbatches": ("tiny", ParallelLayout(dp=2, tp=2, pp=4, microbatches=2), Faults()),
}


MODEL_CHANGES = {"too_few_microbatches": {"packed_attention": False}}
"""Per-sample attention for the micro-batch case: the re-run splits the batch into more, smaller micro-batches
(samples, not sequences), and with the simulator's default packed attention (a micro-batch's samples attend
as one sequence) that also cuts attention per token, which no trace of the run can show."""


def small(case: tuple) -> tuple:
    """The same fault on a cheaper run: 4 layers (4 stages' worth for pp 4), shorter sequences."""
    model, layout, faults = case
    spec = dataclasses.replace(ModelSpec.preset(model), layers=4, seq=2048)
    if faults.stage_layers:
        faults = dataclasses.replace(faults, stage_layers=(3, 1))
    return spec, layout, faults


def fixes_for(truth: dict, layout: ParallelLayout):
    from tracekit.whatif.fixes import Fix

    k = truth["kind"]
    if k in ("slow_gpu", "uneven_sequence_length"):
        return [Fix("rank_compute", rank=r) for r in truth["ranks"][:1]] if k == "slow_gpu" else \
            [Fix("rank_compute", rank=r) for r in truth["ranks"]]
    return {"slow_link": [Fix("slow_link", dim=truth.get("dim"))],
            "stage_imbalance": [Fix("stage_resplit")], "router_skew": [Fix("expert_even")],
            "host_stall": [Fix("host_stalls", rank=truth["ranks"][0])],
            "slow_data_loading": [Fix("host_stalls", rank=truth["ranks"][0])],
            "no_overlap": [Fix("dim_overlap", dim="dp")],
            "too_few_microbatches": [Fix("microbatches", value=float(max(layout.pp, layout.microbatches)))]}.get(k, [])


def run_case(name: str, root: Path, cheap: bool = False) -> dict:
    from tracekit.parse.run import parse_run
    from tracekit.assess.whatif import prepare, run_whatif

    model, layout, faults = small(CASES[name]) if cheap else (ModelSpec.preset(CASES[name][0]), *CASES[name][1:])
    model = dataclasses.replace(model, **MODEL_CHANGES.get(name, {}))
    t = time.time()
    res = simulate(model, ClusterSpec.preset("2x8-h100"), layout, faults, steps=2 if cheap else 3)
    write_traces(res, root / name / "traces")
    store = parse_run(root / name / "traces", root / name / "store", progress=False).store
    inputs = prepare(store)
    truth = [f for f in res.faults_truth if f["kind"] == name]
    if not truth:
        return {"name": name, "error": f"the simulator reported no {name} fault"}
    fixes = fixes_for(truth[0], layout)
    out = run_whatif(store, fixes, inputs)
    want = truth[0]["step_ns_without"]
    return {"name": name, "with": truth[0]["step_ns_with"], "measured": out["measured_ns"],
            "steps": [(st["replayed_ns"], key) for st, key in zip(out["steps"], res.key["step_ns"])],
            "replayed": out["replayed_ns"], "predicted": out["predicted_ns"], "without": want,
            "err": abs(out["predicted_ns"] - want) / want, "fixes": [f.label() for f in fixes],
            "seconds": time.time() - t}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=",".join(CASES))
    ap.add_argument("--small", action="store_true")
    opts = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="whatif_sim_"))
    rows = []
    for name in opts.only.split(","):
        r = run_case(name, root, opts.small)
        rows.append(r)
        if "error" not in r:
            print(f"{name:24s} {'; '.join(r['fixes'])} ({r['seconds']:.0f} s)", flush=True)
    print(f"\n{'fault kind':24s} {'step ms':>9s} {'replay ms':>9s} {'removed':>9s} {'re-sim':>9s} {'error':>6s}")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:24s} {r['error']}")
            continue
        print(f"{r['name']:24s} {r['measured'] / 1e6:9.2f} {r['replayed'] / 1e6:9.2f} {r['predicted'] / 1e6:9.2f} "
              f"{r['without'] / 1e6:9.2f} {r['err']:6.1%}")


if __name__ == "__main__":
    main()
