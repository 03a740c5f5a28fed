"""Timing checks of the detection matrix's runs (moved out of tests/: they measure time, and on a box other
jobs load they mean nothing): the measured 1F1B bubble against (p−1)/(m+p−1) for m = 2, 4, 8, and the
bubble and routing-skew advice's predicted savings against re-runs with the change applied (those runs
simulate device time: the step can only show a pipeline's or an expert's saving when stages and ranks
can work side by side). Same runs and configurations as tests/analyze/test_detection_matrix.py.

    python benchmarks/detection_matrix_timing.py [--out DIR]

Prints each check's figures and OK / SKIP (why) / FAIL; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.analyze.test_detection_matrix import Run, Runs  # noqa: E402


class Skip(Exception):
    """The box cannot resolve this check now (said why)."""


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
        raise Skip(f"load average {load:.1f} per core: other jobs would dominate the timings")


def check_bubble_tracks_theory_and_falls_with_microbatches(runtime_runs: Runs):
    _skip_if_saturated()
    measured = {}
    for m in (2, 4, 8):
        sec = runtime_runs.get(f"1f1b_m{m}").section("pipeline")
        theory = (2 - 1) / (m + 2 - 1)
        assert sec["schedule_detected"] == "1f1b" and sec["num_microbatches"] == m
        assert abs(sec["theoretical_bubble"] - theory) < 1e-9
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
        raise Skip(f"predicted saving {predicted / 1e6:.1f} ms is within twice the run-to-run noise "
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


def check_bubble_advice_matches_rerun_idle_time(runtime_runs: Runs):
    # the formula predicts the fill/drain idle time removed at the same compute: compare idle with idle
    f, b, a, _, _ = _bubble_rerun(runtime_runs)
    _check("gpipe m=1 → m=4, pipeline idle per step", min(map(_pipeline_idle_ns, b)), min(map(_pipeline_idle_ns, a)),
           f["est_saving_ns"])


def check_bubble_advice_matches_rerun_step_time(runtime_runs: Runs):
    f, b, a, t0, t1 = _bubble_rerun(runtime_runs)
    inflation = _stage_compute_ns(*a) / _stage_compute_ns(*b)
    print(f"\nstage compute of the same work pipelined vs sequential: {inflation:.2f}x")
    if inflation > CONCURRENT_COMPUTE_INFLATION:
        raise Skip(f"the two stages ran {inflation:.2f}x slower side by side than alone: this box cannot "
                    "pipeline, so a shorter bubble cannot shorten the step (the idle-time test still runs)")
    noise = _skip_unless_resolvable(runtime_runs, ("rerun_gpipe_m1", "rerun_gpipe_m4"), f["est_saving_ns"],
                                    "idle-time")
    _check("gpipe m=1 → m=4 (same global batch), best step", t0, t1, f["est_saving_ns"], noise)




def check_routing_skew_advice_matches_rerun_step_time(runtime_runs: Runs):
    before, t0, t1 = _rerun(runtime_runs, "rerun_router_skew", "rerun_router_balanced")
    (f,) = [f for f in before.analysis["findings"] if f["kind"] == "expert_routing_skew"]
    noise = _skip_unless_resolvable(runtime_runs, ("rerun_router_skew", "rerun_router_balanced"), f["est_saving_ns"],
                                    "token-load")
    _check("router bias 3=2.0 → balanced router, best step", t0, t1, f["est_saving_ns"], noise)


CHECKS = [check_bubble_tracks_theory_and_falls_with_microbatches, check_bubble_advice_matches_rerun_idle_time,
          check_bubble_advice_matches_rerun_step_time, check_routing_skew_advice_matches_rerun_step_time]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temp dir)")
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="tracekit-matrix-timing-"))
    root.mkdir(parents=True, exist_ok=True)
    runs, failed = Runs(root), 0
    for check in CHECKS:
        try:
            check(runs)
            print(f"OK   {check.__name__}")
        except Skip as exc:
            print(f"SKIP {check.__name__}: {exc}")
        except AssertionError as exc:
            failed += 1
            print(f"FAIL {check.__name__}: {exc}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
