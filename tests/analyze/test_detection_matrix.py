"""Detection matrix: runs of the reference runtime with one injected fault each, analyzed end to end.

For every knob the top finding (sorted by estimated saving; the first at warning or above) must have the kind, ranks, dim and
layer/expert or stage that `ground_truth.json` names; a clean run has nothing at warning or above.
Also: the measured pipeline bubble against (p−1)/(m+p−1) for m = 2, 4, 8, and the bubble and
routing-skew recommendations against re-runs with the change applied (those runs simulate device time:
the step can only show a pipeline's or an expert's saving when stages and ranks can work side by side).

Runs are tiny (2–4 gloo ranks, 3 steps of which 2 profiled) and shared through one session fixture
that starts each run the first time a test asks for it. Timing figures go to stdout (`pytest -s`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracekit.analyze.engine import analyze_store
from tracekit.parse.run import parse_run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

# a dense model with enough work per micro-batch that stage compute, not p2p latency, sets the pipeline
PP_MODEL = ["--pp", "2", "--global-batch-size", "16", "--moe-every", "0", "--d-model", "128", "--d-ff", "512"]
# eight experts, every block MoE, no capacity cap: a biased router really loads one expert-parallel rank
MOE_MODEL = ["--dp", "2", "--ep", "2", "--num-experts", "8", "--capacity-factor", "4", "--d-ff", "512",
             "--moe-every", "1"]

PP_DEVICE = ["--device-us-per-token", "40"]
MOE_DEVICE = ["--device-us-per-token", "100"]

RUNS: dict[str, list[str]] = {
    "clean": ["--dp", "2"],
    # 5 of 6 layers on stage 0: each stage's fixed work (embedding/head, loss, per-micro-batch overheads)
    # is ~1.5 layers' worth, so 3 of 4 gave only 1.21-1.28x (at the 1.2x warning line under load);
    # 5 of 6 gives ~1.5x on CPU time alone. With simulated device time per block the stages' times follow
    # their layers even when the box preempts one stage's process (a clean-clone CI run once timed the
    # 5-layer stage of an m=1 run shorter than the 1-layer one)
    "stage_imbalance": PP_MODEL + PP_DEVICE + ["--microbatches", "4", "--num-layers", "6", "--stage-layers", "5,1"],
    "router_skew": MOE_MODEL + ["--router-bias", "3=2.0"],
    "too_few_microbatches": PP_MODEL + ["--schedule", "gpipe", "--microbatches", "1"],
    # the re-run pairs: with simulated device time (ModelConfig.device_us_per_token, a sleep as a host
    # waits on its GPU), because two pipeline stages computing on this 2-vCPU VM's cores slow each other
    # 1.2-1.6x and the step cannot show a shorter bubble; expert time is per routed token there too
    "rerun_gpipe_m1": PP_MODEL + PP_DEVICE + ["--schedule", "gpipe", "--microbatches", "1"],
    "rerun_gpipe_m4": PP_MODEL + PP_DEVICE + ["--schedule", "gpipe", "--microbatches", "4"],
    "rerun_router_skew": MOE_MODEL + MOE_DEVICE + ["--router-bias", "3=2.0"],
    "rerun_router_balanced": MOE_MODEL + MOE_DEVICE,
    "slow_link": ["--dp", "2", "--tp", "2", "--slow-link", "tp=0.005"],
    "host_stall": ["--dp", "2", "--host-stall-rank", "1", "--host-stall-ms", "50"],
    # 4x the sequence length (2x held rank 1 back ~8 ms a step, less than another rank's preemption can)
    "uneven_sequence_length": ["--dp", "2", "--uneven-seq-rank", "1", "--uneven-seq-factor", "4"],
    "tp_across_hosts": ["--tp", "2", "--ranks-per-host", "1"],
    "slow_rank": ["--dp", "2", "--slow-rank", "1", "--slow-factor", "3"],
    "no_overlap": ["--dp", "2", "--no-overlap"],
    # the bubble against theory, with device time: two CPU stages side by side slow each other here
    "1f1b_m2": PP_MODEL + PP_DEVICE + ["--microbatches", "2"],
    "1f1b_m4": PP_MODEL + PP_DEVICE + ["--microbatches", "4"],
    "1f1b_m8": PP_MODEL + PP_DEVICE + ["--microbatches", "8"],
}
# second runs of the re-run pairs, taken in A, B, A, B order so a load change on the shared box hits both
for _name in ("rerun_gpipe_m1", "rerun_gpipe_m4", "rerun_router_skew", "rerun_router_balanced"):
    RUNS[_name + "#2"] = RUNS[_name]


@dataclass
class Run:
    name: str
    dir: Path
    ground_truth: dict[str, Any]
    analysis: dict[str, Any]

    def fault(self, kind: str) -> dict[str, Any]:
        (f,) = [f for f in self.ground_truth["faults"] if f["kind"] == kind]
        return f

    def section(self, name: str) -> dict[str, Any]:
        return self.analysis["sections"][name]

    store: Any = None

    @property
    def step_times_ns(self) -> list[int]:
        """Per profiled step, the slowest rank's ProfilerStep duration."""
        per: dict[int, int] = {}
        for r in self.store.table("steps", ["step", "dur"]).to_pylist():
            per[r["step"]] = max(per.get(r["step"], 0), r["dur"])
        return sorted(per.values())


class Runs:
    """Runs the reference runtime on demand, once per configuration per session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache: dict[str, Run] = {}

    def get(self, name: str) -> Run:
        if name not in self.cache:
            out = self.root / name.replace("#", "_")
            cmd = [sys.executable, "-m", "instrumented_runtime", "--steps", "3", *RUNS[name], "--out", str(out)]
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
            if proc.returncode != 0:
                raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
            store = parse_run(out, Path(f"{out}.store"), progress=False).store
            analysis = json.loads(json.dumps(analyze_store(store), default=str))
            gt = json.loads((out / "ground_truth.json").read_text())
            self.cache[name] = Run(name, out, gt, analysis, store)
        return self.cache[name]


@pytest.fixture(scope="session")
def runtime_runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("runtime_runs"))


def _top(run: Run) -> dict[str, Any]:
    """The first finding at warning or above (findings come sorted by estimated saving): info findings
    are context, e.g. a rank slowed by CPU contention on the shared box."""
    loud = [f for f in run.analysis["findings"] if f["severity"] in ("warning", "critical")]
    assert loud, f"{run.name}: nothing at warning or above: {[f['summary'] for f in run.analysis['findings']]}"
    top = loud[0]
    print(f"\n[{run.name}] top: {top['kind']} {top['severity']} ranks={top['ranks']} dim={top['dim']} "
          f"saving={top['est_saving_ns'] / 1e6:.1f} ms — {top['summary']}")
    return top


# knob (run name, ground-truth fault kind) -> the finding kinds that correctly report it
MATRIX = [
    ("stage_imbalance", "stage_imbalance", {"pipeline_imbalance"}),
    ("router_skew", "router_skew", {"expert_routing_skew"}),
    ("too_few_microbatches", "too_few_microbatches", {"pipeline_bubble"}),
    ("slow_link", "slow_link", {"low_bus_bandwidth", "communication_bound"}),
    ("host_stall", "host_stall", {"idle_host_bound", "straggler"}),
    ("uneven_sequence_length", "uneven_sequence_length", {"straggler"}),
    ("tp_across_hosts", "groups_span_hosts", {"placement_mismatch"}),
    ("slow_rank", "slow_rank", {"straggler"}),
    ("no_overlap", "no_overlap", {"unoverlapped_collective", "communication_bound"}),
]


def _id(m) -> str:
    return m.values[0] if hasattr(m, "values") else m[0]


@pytest.mark.parametrize("name,fault_kind,kinds", MATRIX, ids=[_id(m) for m in MATRIX])
def test_top_finding_names_the_injected_fault(runtime_runs, name, fault_kind, kinds):
    run = runtime_runs.get(name)
    fault = run.fault(fault_kind)
    top = _top(run)
    assert top["kind"] in kinds, f"top finding {top['kind']} ({top['summary']}); expected one of {kinds}"
    assert top["ranks"] and set(top["ranks"]) <= set(fault["ranks"]), (top["ranks"], fault["ranks"])
    if fault_kind == "stage_imbalance":
        assert top["dim"] == "pp" and top["evidence"]["slowest_stage"] in fault["stages"]
        assert set(top["ranks"]) == set(fault["ranks"])
    elif fault_kind == "router_skew":
        assert top["dim"] == "ep"
        assert top["evidence"]["expert"] in fault["experts"] and top["evidence"]["layer"] in fault["layers"]
    elif fault_kind == "too_few_microbatches":
        assert top["dim"] == "pp" and top["evidence"]["theoretical_bubble"] == pytest.approx(fault["theoretical_bubble"])
    elif fault_kind == "groups_span_hosts":
        assert top["dim"] == "tp"
    elif fault_kind in ("host_stall", "slow_rank"):
        assert top["ranks"] == fault["ranks"]
    elif "dim" in fault and top["dim"] is not None:
        assert top["dim"] == fault["dim"]


def test_clean_run_has_nothing_at_warning(runtime_runs):
    run = runtime_runs.get("clean")
    assert run.ground_truth["faults"] == []
    loud = [f"{f['kind']} {f['severity']} {f['summary']}" for f in run.analysis["findings"]
            if f["severity"] in ("warning", "critical")]
    assert not loud, loud


MAX_LOAD_PER_CORE = 1.5
"""Timing-accuracy checks mean nothing on a box other jobs saturate (measured: at 4-5 runnable jobs per
core the 1F1B m=8 bubble reads 0.29-0.32 instead of 0.24): they skip above this 1-minute load per core."""

BUBBLE_TOLERANCE = (-0.05, 0.20)
"""Measured minus theoretical bubble, on the least-disturbed profiled step of each run: p2p latency and
CPU sharing only ever add idle time (other engineers' jobs share the 2 cores: the mean over steps can
carry a 20-point load spike)."""


def _skip_if_saturated() -> None:
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    if load > MAX_LOAD_PER_CORE:
        pytest.skip(f"load average {load:.1f} per core: other jobs would dominate the timings")


def test_bubble_tracks_theory_and_falls_with_microbatches(runtime_runs):
    _skip_if_saturated()
    measured = {}
    for m in (2, 4, 8):
        sec = runtime_runs.get(f"1f1b_m{m}").section("pipeline")
        theory = (2 - 1) / (m + 2 - 1)
        assert sec["schedule_detected"] == "1f1b" and sec["num_microbatches"] == m
        assert sec["theoretical_bubble"] == pytest.approx(theory)
        steps = [st["bubble"] for pipe in sec["pipelines"] for st in pipe["steps"]]
        assert min(steps) <= sec["measured_bubble"] <= max(steps)
        measured[m] = min(steps)
        print(f"\n1F1B p=2 m={m}: measured bubble {measured[m]:.3f}, theory {theory:.3f}")
        lo, hi = BUBBLE_TOLERANCE
        assert theory + lo <= measured[m] <= theory + hi
    assert measured[2] > measured[8]


RERUN_UPPER = 1.25
"""The prediction is an upper bound (it ignores the per-micro-batch, resp. per-token, overheads that
the change adds): the measured saving must be positive and at most RERUN_UPPER × predicted, plus the
run-to-run noise of the step (the spread of two identical runs). Measured on the least-disturbed step of
two interleaved runs per configuration (before, after, before, after)."""


def _best_step_ns(*runs: Run) -> float:
    return float(min(t for r in runs for t in r.step_times_ns))


def _rerun(runs: Runs, before: str, after: str) -> tuple[Run, float, float]:
    _skip_if_saturated()
    order = [runs.get(before), runs.get(after), runs.get(before + "#2"), runs.get(after + "#2")]
    return order[0], _best_step_ns(order[0], order[2]), _best_step_ns(order[1], order[3])


def _skip_unless_resolvable(runs: Runs, names: tuple[str, ...], predicted: float, other: str) -> float:
    """Each configuration ran twice: how far apart its best steps land is the noise the step time can
    resolve; a predicted saving under twice that cannot be told from it."""
    noise = max(abs(_best_step_ns(runs.get(n)) - _best_step_ns(runs.get(n + "#2"))) for n in names)
    print(f"\nbest-step noise between identical runs: {noise / 1e6:.1f} ms")
    if predicted < 2 * noise:
        pytest.skip(f"predicted saving {predicted / 1e6:.1f} ms is within twice the run-to-run noise "
                    f"({noise / 1e6:.1f} ms) of the step time here (the {other} test still runs)")
    return noise


def _check(label: str, t_before: float, t_after: float, predicted: float, noise: float = 0.0) -> None:
    measured = t_before - t_after
    print(f"\n{label}: {t_before / 1e6:.1f} ms → {t_after / 1e6:.1f} ms, measured saving "
          f"{measured / 1e6:.1f} ms, predicted {predicted / 1e6:.1f} ms (ratio {measured / predicted:.2f})")
    assert 0 < measured <= RERUN_UPPER * predicted + noise


CONCURRENT_COMPUTE_INFLATION = 1.15
"""Stage compute of the same work, pipelined (m=4) over sequential (m=1), above which the box cannot run
the two stages side by side at full speed: measured 1.49x on this 2-vCPU VM while idle (the vCPUs share
a physical core), so there a shorter bubble cannot shorten the step and only the idle time is compared."""


def _pipeline_idle_ns(run: Run) -> float:
    """Least-disturbed step's schedule idle: window × bubble (window − mean busy stage time)."""
    sec = run.section("pipeline")
    return min(st["window_ns"] * st["bubble"] for pipe in sec["pipelines"] for st in pipe["steps"])


def _stage_compute_ns(*runs: Run) -> float:
    return float(np.mean([sum(s["compute_ns"] for s in r.section("pipeline")["stages"]) for r in runs]))


def _bubble_rerun(runs: Runs) -> tuple[dict[str, Any], list[Run], list[Run], float, float]:
    before, t0, t1 = _rerun(runs, "rerun_gpipe_m1", "rerun_gpipe_m4")
    (f,) = [f for f in before.analysis["findings"] if f["kind"] == "pipeline_bubble"]
    assert f["evidence"]["recommended_microbatches"] == 4  # what the re-run applies
    assert f["est_saving_ns"] > 0 and "saving_formula" in f["evidence"]
    b = [runs.get(n) for n in ("rerun_gpipe_m1", "rerun_gpipe_m1#2")]
    a = [runs.get(n) for n in ("rerun_gpipe_m4", "rerun_gpipe_m4#2")]
    return f, b, a, t0, t1


def test_bubble_advice_matches_rerun_idle_time(runtime_runs):
    # the formula predicts the fill/drain idle time removed at the same compute: compare idle with idle
    f, b, a, _, _ = _bubble_rerun(runtime_runs)
    _check("gpipe m=1 → m=4, pipeline idle per step", min(map(_pipeline_idle_ns, b)), min(map(_pipeline_idle_ns, a)),
           f["est_saving_ns"])


def test_bubble_advice_matches_rerun_step_time(runtime_runs):
    f, b, a, t0, t1 = _bubble_rerun(runtime_runs)
    inflation = _stage_compute_ns(*a) / _stage_compute_ns(*b)
    print(f"\nstage compute of the same work pipelined vs sequential: {inflation:.2f}x")
    if inflation > CONCURRENT_COMPUTE_INFLATION:
        pytest.skip(f"the two stages ran {inflation:.2f}x slower side by side than alone: this box cannot "
                    "pipeline, so a shorter bubble cannot shorten the step (the idle-time test still runs)")
    noise = _skip_unless_resolvable(runtime_runs, ("rerun_gpipe_m1", "rerun_gpipe_m4"), f["est_saving_ns"],
                                    "idle-time")
    _check("gpipe m=1 → m=4 (same global batch), best step", t0, t1, f["est_saving_ns"], noise)


LOAD_TOLERANCE = 0.10


def test_routing_skew_advice_matches_rerun_load(runtime_runs):
    # tokens are counted, not timed: no load check (the box's load cannot change this comparison)
    before, after = runtime_runs.get("rerun_router_skew"), runtime_runs.get("rerun_router_balanced")
    (f,) = [f for f in before.analysis["findings"] if f["kind"] == "expert_routing_skew"]
    assert f["est_saving_ns"] > 0 and "aux-loss" in f["recommendation"]
    # a 3-step run cannot train the router back to balance, so the re-run applies the advice's outcome:
    # the same model and data with the router unbiased. The saving formula assumes the busiest expert-
    # parallel rank then receives the mean load (tokens counted, not timed: this holds on any box)
    recv = [r["tokens_received"] for r in before.section("experts")["ranks"]]
    recv_after = [r["tokens_received"] for r in after.section("experts")["ranks"]]
    assert "mean/max received" in f["evidence"]["saving_formula"]
    print(f"\nrouter bias 3=2.0 → balanced: busiest ep rank receives {max(recv):.0f} → {max(recv_after):.0f} "
          f"tokens per step; the formula assumed the mean, {np.mean(recv):.0f}")
    assert max(recv_after) == pytest.approx(np.mean(recv), rel=LOAD_TOLERANCE)
    assert sum(recv_after) == pytest.approx(sum(recv), rel=LOAD_TOLERANCE)  # same tokens, spread evenly


def test_routing_skew_advice_matches_rerun_step_time(runtime_runs):
    before, t0, t1 = _rerun(runtime_runs, "rerun_router_skew", "rerun_router_balanced")
    (f,) = [f for f in before.analysis["findings"] if f["kind"] == "expert_routing_skew"]
    noise = _skip_unless_resolvable(runtime_runs, ("rerun_router_skew", "rerun_router_balanced"), f["est_saving_ns"],
                                    "token-load")
    _check("router bias 3=2.0 → balanced router, best step", t0, t1, f["est_saving_ns"], noise)
