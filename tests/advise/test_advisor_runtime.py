"""The layout advisor against the reference runtime, small (issue 15; the full 8-rank comparison is
benchmarks/advisor_runtime_bench.py): one 4-rank layout is run with simulated device time, parsed and
analysed; calibrated from that analysis alone (compute, the gloo backend's per-op collective costs, the
residual), the advisor predicts three other 4-rank layouts, which are then run too.

The runs' own clocks are the independent truth (train_log.json: the slowest rank per profiled step,
median). This box is shared, so the mean absolute error (the issue's measure, ≤ 10%) may exceed 10% by the
runs' own mean measured spread (half the range of their profiled steps, relative, measured + predicted
layout); pairs whose measured steps differ by more than their spread must come out in the measured order."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.advise.runtime_layouts import RuntimeModel, layout_name, run_layout, step_times
from tracekit.advise.calibrate import calibrate, predicted_step_ns
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run
from tracekit.simulate import ClusterSpec, ParallelLayout

pytestmark = pytest.mark.slow

MODEL = RuntimeModel(global_batch=8, us_per_token=300.0)
MEASURED = ParallelLayout(dp=2, tp=2, ep=2)
OTHERS = [ParallelLayout(dp=4, ep=4), ParallelLayout(dp=2, pp=2, ep=2, schedule="1f1b", microbatches=2),
          ParallelLayout(tp=2, pp=2, schedule="gpipe", microbatches=4)]
STEPS, PROFILED = 4, 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("advrt")
    out = []
    for i, L in enumerate([MEASURED, *OTHERS]):
        d = run_layout(MODEL, L, root / f"run{i}", steps=STEPS, profile_steps=PROFILED)
        out.append((L, d, step_times(d, PROFILED)))
    return out


def _spread(steps: list[int]) -> float:
    return (max(steps) - min(steps)) / 2 / statistics.median(steps)


def test_predicted_steps_of_other_layouts_match_their_runs(runs, tmp_path):
    _, measured_dir, measured_steps = runs[0]
    store = parse_run(measured_dir, tmp_path / "store", workers=0, progress=False).store
    analysis = json.loads(json.dumps(analyze_store(store), default=str))
    cal = calibrate(analysis, MODEL.spec(MEASURED), ClusterSpec.preset("1x8-h100"))
    assert cal.measured.layout.tp == 2 and cal.measured.layout.dp == 2 and cal.measured.layout.ep == 2
    assert {op for _, op, _, _ in cal.cluster.coll_costs} >= {"all_gather", "reduce_scatter", "all_to_all"}
    assert cal.cluster.coll_lat_per_hop  # gloo on CPU: ring latency per hop (a GPU run keeps it per op)
    pred, meas, spread, errors, tols = [], [], [], [], []
    for L, _, steps in runs[1:]:
        p = predicted_step_ns(cal, L, MODEL.micro_batch(L))
        t = statistics.median(steps)
        errors.append(abs(p - t) / t)
        tols.append(_spread(measured_steps) + _spread(steps))
        print(f"{layout_name(L):36s} predicted {p / 1e6:7.1f} ms  measured {t / 1e6:7.1f} ms  "
              f"error {100 * (p - t) / t:+5.1f}%  runs' spread {100 * tols[-1]:.1f}%")
        pred.append(p)
        meas.append(t)
        spread.append(_spread(steps))
    # the issue's measure: mean absolute step-time error ≤ 10%, plus what the runs' own spread allows
    # (single layouts go further: the full benchmark's worst is FSDP at 8 ranks, -14% to -17%)
    mae = statistics.mean(errors)
    assert mae <= 0.10 + statistics.mean(tols), (mae, errors, tols)
    for i in range(len(pred)):
        for j in range(i + 1, len(pred)):
            if abs(meas[i] - meas[j]) > (spread[i] + spread[j]) * max(meas[i], meas[j]):
                assert (pred[i] - pred[j]) * (meas[i] - meas[j]) > 0, (layout_name(OTHERS[i]), layout_name(OTHERS[j]))
