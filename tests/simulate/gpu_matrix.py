"""Detection matrix at GPU semantics: simulated NCCL clusters with one injected fault (or a combination),
written as Kineto traces, parsed and analyzed by the normal path.

For every fault kind × layout (8-rank dp4×tp2, 8-rank pp2×dp4, both with ep4, and a 64-rank 5-D pp2 × dp8 ×
cp2 × tp2 with ep4 over dp × cp on 8 hosts of 8 GPUs) × seeds (`seeds_of`), the top finding at warning or above
must have a kind that `.ground_truth.json` expects for the fault and name the right ranks / dim / stage / expert
(a slow NIC: the ranks of its host); a clean run has no warning-level finding of a kind that names a fault.

Seeds: 3 on the 8-rank layouts (a seed moves the fault to another rank / dim / stage / expert / host and
changes the noise). On the 64-rank layout, 3 seeds of the faults only it can have (a slow NIC, tp groups across
hosts), seed 0 of every other fault plus seed 2 of a slow link (its cp link: no 8-rank layout has cp), and
seed 0 of the clean run: its other seeds re-checked, at 8x the cost, what the 8-rank layouts check at 3 seeds
(`SWEEP_ONLY`). `benchmarks/detection_matrix_gpu_sweep.py` runs every layout at every seed and prints the table.

Every injected fault costs real step time: the answer key's step without it (re-simulated) is at least
MIN_COST shorter, asserted per cell. Fault sizes: host stall / slow data = 25% of the clean step, a GPU 1.3x
slower, a NIC at 1/4 of its bandwidth, a slowed dim's links at 1/SLOW_LINK_FACTOR (4 for tp/dp, 8 for ep, 16
for cp: ring-attention P2P hides a cp link at 1/8 entirely), sequences 1.5x longer, router bias +2.0 logits on
one of 4 experts (~2.8x the mean tokens). Faults of the dp gradient sync (no overlap, a slow dp link) run on
the configuration where that sync matters (DP_SYNC: dp across hosts, one sequence per micro-batch).
Each run is simulated, written, parsed and analyzed once. Cost, measured on the shared 2-core box: ~1 s
CPU per 8-rank run and ~6-8 s per 64-rank run (parse + analysis of 64 files dominate): 78 runs, ~185 s CPU
(all seeds: 99 runs, ~325 s); the marker `slow` selects it.

This module holds the matrix (cells, runs, checks); the suite runs its cells from two files, so that the two
pytest-xdist workers (`--dist loadfile`: a file per worker) share them: tests/simulate/test_detection_matrix_gpu.py
(the 8-rank layouts) and tests/simulate/test_detection_matrix_gpu_64.py (the 64-rank layout). No run is shared
between cells, so the split changes no cell.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tracekit.simulate import ClusterSpec, Faults, ParallelLayout, ModelSpec, simulate, step_time, write_traces

# Switch-style top-1 MoE with one expert per expert-parallel rank, so an all_to_all's split sizes name the
# expert; 2 layers (1 per pipeline stage) keep the 64-rank runs small
MODEL = ModelSpec("matrix-moe", layers=2, hidden=2048, heads=16, seq=4096, vocab=8192, experts=4, top_k=1,
                  micro_batch_size=8)
LAYOUTS: dict[str, tuple[ParallelLayout, str, ModelSpec]] = {
    "dp4xtp2": (ParallelLayout(dp=4, tp=2, ep=4), "1x8-h100", MODEL),
    "pp2xdp4": (ParallelLayout(pp=2, dp=4, ep=4, microbatches=4), "1x8-h100", MODEL),
    "5d-64": (ParallelLayout(pp=2, dp=8, cp=2, tp=2, ep=4, microbatches=4), "8x8-h100", MODEL),
}
SEEDS = (0, 1, 2)
FAULT_KINDS = ("slow_gpu", "slow_link", "slow_nic", "stage_imbalance", "router_skew", "host_stall",
               "slow_data_loading", "uneven_sequence_length", "no_overlap", "too_few_microbatches",
               "groups_span_hosts", "combination")
# every finding kind that names a fault (a clean run must have none of these at warning or above)
FAULT_FINDINGS = {"straggler", "low_bus_bandwidth", "communication_bound", "pipeline_imbalance",
                  "expert_routing_skew", "idle_host_bound", "unoverlapped_collective", "pipeline_bubble",
                  "placement_mismatch", "data_loading"}


SLOW_LINK_FACTOR = {"tp": 4.0, "dp": 4.0, "ep": 8.0, "cp": 16.0}
"""Bandwidth divisor of a slowed dim, the smallest of 4, 8, 16 at which the fault costs ≥ MIN_COST of the step
on every layout (the key's step time without it says so; ring-attention P2P hides a cp link at 1/8 entirely)."""
MIN_COST = 0.05
"""Every injected fault must cost at least this share of the step (answer key: step with / without − 1)."""
DP_SYNC = {"dp4xtp2": ("2x4-h100", {"ep": 1}, {"experts": 0, "micro_batch_size": 1}),
           "pp2xdp4": ("4x2-h100", {"ep": 1}, {"experts": 0, "micro_batch_size": 1, "layers": 16}),
           "5d-64": ("8x8-h100", {}, {"micro_batch_size": 1, "layers": 4})}
"""Faults of the dp gradient sync (no overlap, a slow dp link) on the run where that sync matters: one
sequence per micro-batch (the all-reduce a real share of the step) and dp across hosts (on one NVLink host
it costs < 1% however it runs), ep kept inside a host; the pipeline needs several layers per stage for DDP
to overlap anything."""


def _dims(layout: ParallelLayout) -> list[str]:
    return [d for d in ("tp", "dp", "cp", "ep") if getattr(layout, d) > 1]


def _with_dp_sync(layout_name: str, made: tuple[ParallelLayout, Faults, ModelSpec]) -> tuple[ParallelLayout, Faults, ModelSpec, str]:
    layout, faults, model = made
    cluster_name = LAYOUTS[layout_name][1]
    if faults.no_overlap or "dp" in faults.slow_link:
        cluster_name, layout_changes, model_changes = DP_SYNC[layout_name]
        layout = dataclasses.replace(layout, **layout_changes)
        model = dataclasses.replace(model, **model_changes)
    return layout, faults, model, cluster_name


STEPS = 2
_CLEAN_STEP: dict[tuple[str, int], int] = {}


def _clean_step_ns(layout_name: str, seed: int) -> int:
    """The clean run's step time (simulated once per layout and seed): host stalls are sized from it."""
    if (layout_name, seed) not in _CLEAN_STEP:
        layout, cluster_name, model = LAYOUTS[layout_name]
        _CLEAN_STEP[(layout_name, seed)] = step_time(model, ClusterSpec.preset(cluster_name), layout, Faults(),
                                                     steps=STEPS, seed=seed)
    return _CLEAN_STEP[(layout_name, seed)]


def fault_for(kind: str, layout_name: str, seed: int) -> tuple[ParallelLayout, Faults, ModelSpec, str] | None:
    """The fault of this kind for a layout and seed (layout, faults, model, cluster preset), or None where
    the layout cannot have it."""
    made = _fault(kind, layout_name, seed)
    return None if made is None else _with_dp_sync(layout_name, made)


def _fault(kind: str, layout_name: str, seed: int) -> tuple[ParallelLayout, Faults, ModelSpec] | None:
    layout, cluster_name, model = LAYOUTS[layout_name]
    cluster = ClusterSpec.preset(cluster_name)
    world = layout.world_size
    rank = (5 + 11 * seed) % world
    hosts = -(-world // cluster.gpus_per_host)
    dims = _dims(layout)
    if kind == "slow_gpu":
        return layout, Faults(slow_gpu={rank: 1.3}), model
    if kind == "slow_link":
        dim = dims[seed % len(dims)]
        return layout, Faults(slow_link={dim: SLOW_LINK_FACTOR[dim]}), model
    if kind == "slow_nic":
        return (layout, Faults(slow_nic={(seed + 1) % hosts: 4.0}), model) if hosts > 1 else None
    if kind == "stage_imbalance":
        if layout.pp < 2:
            return None
        model = dataclasses.replace(model, layers=2 * layout.pp)  # 2 per stage; one stage 3, its neighbour 1
        counts = [2] * layout.pp
        heavy = seed % layout.pp
        counts[heavy] += 1
        counts[(heavy + 1) % layout.pp] -= 1
        return layout, Faults(stage_layers=tuple(counts)), model
    if kind == "router_skew":
        return layout, Faults(router_bias={(1 + seed) % model.experts: 2.0}), model
    if kind == "host_stall":
        return layout, Faults(host_stall=(rank, 0.25 * _clean_step_ns(layout_name, seed) / 1e6, 1)), model
    if kind == "slow_data_loading":
        return layout, Faults(slow_data=(rank, 0.25 * _clean_step_ns(layout_name, seed) / 1e6)), model
    if kind == "uneven_sequence_length":
        return layout, Faults(uneven_seq=(seed % layout.dp, 1.5)), model
    if kind == "no_overlap":
        return layout, Faults(no_overlap=True), model
    if kind == "too_few_microbatches":
        return (dataclasses.replace(layout, microbatches=max(1, layout.pp // 2)), Faults(), model) \
            if layout.pp > 1 else None
    if kind == "groups_span_hosts":
        return (layout, Faults(tp_across_hosts=True), model) if layout.tp > 1 and hosts > 1 else None
    if kind == "combination":  # a link whose collectives block compute: a slow dp / cp link would hide the GPU
        blocking = [d for d in dims if d in ("tp", "ep")]
        dim = blocking[(seed + 1) % len(blocking)]
        return layout, Faults(slow_gpu={rank: 1.3}, slow_link={dim: SLOW_LINK_FACTOR[dim]}), model
    raise AssertionError(kind)


def _possible(kind: str, layout_name: str) -> bool:
    """Whether the layout can have this fault (decided without simulating anything)."""
    layout, cluster_name, _ = LAYOUTS[layout_name]
    multi_host = layout.world_size > ClusterSpec.preset(cluster_name).gpus_per_host
    return {"slow_nic": multi_host, "stage_imbalance": layout.pp > 1, "too_few_microbatches": layout.pp > 1,
            "groups_span_hosts": layout.tp > 1 and multi_host}.get(kind, True)


SWEEP_ONLY: dict[str, dict[str, tuple[int, ...]]] = {
    "5d-64": {kind: (0,) for kind in (*FAULT_KINDS, "clean")} | {
        "slow_nic": SEEDS, "groups_span_hosts": SEEDS,  # no 8-rank layout has several hosts for them
        "slow_link": (0, 2)}}  # seed 2 slows the cp link (seed 1 the dp link: dp4xtp2 seed 1, pp2xdp4 seeds 0, 2)
"""layout -> fault kind (or "clean") -> the seeds the suite runs there; the other seeds of SEEDS run only in
benchmarks/detection_matrix_gpu_sweep.py. On the 64-rank layout seeds 1 and 2 of a fault an 8-rank layout
also has move it to another rank / stage / expert / dp index (or change only the noise), which the 8-rank
layouts check at 3 seeds each; they cost ~10 s of CPU a run there."""


def seeds_of(layout_name: str, kind: str, *, sweep: bool = False) -> tuple[int, ...]:
    """The seeds a layout runs a fault kind (or "clean") at: all of SEEDS with `sweep`."""
    return SEEDS if sweep else SWEEP_ONLY.get(layout_name, {}).get(kind, SEEDS)


def cases(*, sweep: bool = False) -> list[tuple[str, str, int]]:
    return [(lay, kind, seed) for lay in LAYOUTS for kind in FAULT_KINDS if _possible(kind, lay)
            for seed in seeds_of(lay, kind, sweep=sweep)]


def clean_cases(*, sweep: bool = False) -> list[tuple[str, int]]:
    return [(lay, seed) for lay in LAYOUTS for seed in seeds_of(lay, "clean", sweep=sweep)]


CASES = cases()


class Runs:
    def __init__(self, root: Path):
        self.root = root
        self.cache: dict[tuple, dict[str, Any]] = {}

    def get(self, layout_name: str, kind: str, seed: int) -> dict[str, Any]:
        key = (layout_name, kind, seed)
        if key not in self.cache:
            from tracekit.flow import analyze_store
            from tracekit.parse.run import parse_run

            if kind == "clean":
                layout, cluster_name, model = LAYOUTS[layout_name]
                faults = Faults()
            else:
                layout, faults, model, cluster_name = fault_for(kind, layout_name, seed)
            res = simulate(model, ClusterSpec.preset(cluster_name), layout, faults, steps=STEPS, seed=seed,
                           without=kind != "clean")
            out = self.root / f"{layout_name}-{kind}-{seed}"
            write_traces(res, out)
            store = parse_run(out, Path(f"{out}.store"), progress=False).store
            analysis = json.loads(json.dumps(analyze_store(store), default=str))
            self.cache[key] = {"truth": res.faults_truth, "analysis": analysis}
        return self.cache[key]


# findings about the analysis itself, not a cause (e.g. the verdict may flip between steps): never the top cause
META_FINDINGS = {"unstable_verdict"}


def _loud(analysis: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in analysis["findings"] if f["severity"] in ("warning", "critical") and f["kind"] not in META_FINDINGS]


def _names(top: dict[str, Any], fault: dict[str, Any]) -> str | None:
    """None if the finding names this fault correctly, else why not."""
    if top["kind"] not in fault["expected_findings"]:
        return f"kind {top['kind']} not in {fault['expected_findings']}"
    ranks, want = set(top["ranks"] or []), set(fault["ranks"])
    kind = fault["kind"]
    if kind in ("slow_gpu", "host_stall", "slow_data_loading"):
        if ranks != want:
            return f"ranks {sorted(ranks)} != {sorted(want)}"
        cause = (top.get("evidence") or {}).get("cause")
        if kind == "slow_gpu" and top["kind"] == "straggler" and cause not in ("compute", "contention"):
            # the same kernels running longer on one GPU: its compute before each late arrival is longer
            return f"cause {cause!r}: a slower GPU computes longer before its late arrivals"
        return None
    if not ranks or not ranks <= want:
        return f"ranks {sorted(ranks)[:12]} not within {sorted(want)[:12]}"
    ev = top.get("evidence") or {}
    if kind == "stage_imbalance":
        if top["dim"] != "pp" or ev.get("slowest_stage") not in fault["stages"]:
            return f"dim {top['dim']} stage {ev.get('slowest_stage')} vs {fault['stages']}"
    elif kind == "router_skew":
        if top["dim"] != "ep" or ev.get("expert") not in fault["experts"]:
            return f"dim {top['dim']} expert {ev.get('expert')} vs {fault['experts']}"
    elif kind == "too_few_microbatches":
        if top["dim"] != "pp" or ev.get("theoretical_bubble") != pytest.approx(fault["theoretical_bubble"]):
            return f"dim {top['dim']} theoretical bubble {ev.get('theoretical_bubble')}"
    elif "dim" in fault and top["dim"] not in (fault["dim"], "dp_cp" if fault["dim"] == "dp" else None):
        return f"dim {top['dim']} != {fault['dim']}"
    return None


def _record(layout_name: str, kind: str, seed: int, top: dict[str, Any] | None, ok: bool) -> None:
    """With TRACEKIT_MATRIX_TABLE set, append the cell's top finding there (a JSON line) for the report."""
    path = os.environ.get("TRACEKIT_MATRIX_TABLE")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"layout": layout_name, "fault": kind, "seed": seed, "pass": ok, "top": top and {
                k: top[k] for k in ("kind", "severity", "ranks", "dim")}}) + "\n")


def _cell(lay: str, kind: str, seed: int):
    return pytest.param(lay, kind, seed, id=f"{lay}-{kind}-{seed}")


def fault_cell_error(run: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """A fault cell's top finding at warning or above and what is wrong with the cell (None when nothing):
    every injected fault costs ≥ MIN_COST of the step, and the top finding names one of them."""
    faults = run["truth"]
    if not faults:
        return None, "the simulator recorded no fault"
    for f in faults:  # a fault a user would care about: the key's step without it is ≥ MIN_COST shorter
        if f["step_ns_with"] < (1 + MIN_COST) * f["step_ns_without"]:
            return None, f"{f['kind']} costs only {f['step_ns_with'] / f['step_ns_without'] - 1:.1%} of the step"
    loud = _loud(run["analysis"])
    if not loud:
        return None, f"nothing at warning or above: {[f['summary'] for f in run['analysis']['findings'][:5]]}"
    top = loud[0]
    why = {f["kind"]: _names(top, f) for f in faults}
    if any(v is None for v in why.values()):
        return top, None
    return top, f"top {top['kind']} {top['severity']} ranks={top['ranks'][:12]} dim={top['dim']}: {top['summary']}; {why}"


def clean_cell_loud(run: dict[str, Any]) -> list[str]:
    """A clean run's findings at warning or above of a kind that names a fault (none expected)."""
    assert run["truth"] == []
    return [f"{f['kind']} {f['severity']}: {f['summary']}" for f in _loud(run["analysis"]) if f["kind"] in FAULT_FINDINGS]


def suite_tests(layouts: tuple[str, ...]):
    """The suite's fixture and tests of these layouts' cells, for a test module to bind under these names:
    (sim_runs, test_top_finding_names_the_injected_fault, test_clean_run_has_no_fault_finding_at_warning)."""

    @pytest.fixture(scope="module")
    def sim_runs(tmp_path_factory) -> Runs:
        return Runs(tmp_path_factory.mktemp("sim_matrix"))

    @pytest.mark.parametrize("layout_name,kind,seed", [_cell(*c) for c in CASES if c[0] in layouts])
    def test_top_finding_names_the_injected_fault(sim_runs, layout_name, kind, seed):
        top, error = fault_cell_error(sim_runs.get(layout_name, kind, seed))
        _record(layout_name, kind, seed, top, error is None)
        assert error is None, error

    @pytest.mark.parametrize("layout_name,seed", [pytest.param(lay, seed, id=f"{seed}-{lay}")
                                                  for lay, seed in clean_cases() if lay in layouts])
    def test_clean_run_has_no_fault_finding_at_warning(sim_runs, layout_name, seed):
        loud = clean_cell_loud(sim_runs.get(layout_name, "clean", seed))
        assert not loud, loud

    return sim_runs, test_top_finding_names_the_injected_fault, test_clean_run_has_no_fault_finding_at_warning
