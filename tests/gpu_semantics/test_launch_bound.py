"""Launch overhead on generated multi-rank GPU traces (generator.py, `host_independent`): every kernel runs
10 µs while the host spends 28 µs dispatching each op (its `aten::view`, the launching op, the gap after it),
so each device waits on its host's launches most of the step — no op is slower than the same op elsewhere
(not a starved host): launch overhead, the device never ahead of its host.

The generator's answer for "launches ahead of the device" (CUDA graphs' upper bound: launching costs the
host nothing) is the same spec with the host a fixed lead ahead of each device op (`host_ahead_ns`), so every
device runs its ops back to back: the difference of the two runs' last device end, per step. Expected numbers
are computed here from the generator's intervals with integer arithmetic, never read from tracekit.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from tests.gpu_semantics.generator import Coll, Compute, Spec, simulate
from tests.gpu_semantics.test_gpu_semantics import run

US = 1_000
STEP_OPS = ([Compute(10 * US)] * 12 + [Coll("all_reduce", 1 << 20, 1 << 20, 60 * US)] + [Compute(10 * US)] * 8
            + [Coll("all_reduce", 1 << 20, 1 << 20, 60 * US)] + [Compute(10 * US)] * 4)
WORLD, STEPS, FIRST = 2, 4, 10


def _spec(**kw) -> Spec:
    return Spec(world=WORLD, steps=STEPS, step_ops=STEP_OPS, first_step=FIRST, **kw)


def _last_end(trace) -> int:
    return max(k.end for k in trace.kernels)


def test_launch_overhead_is_the_top_finding_with_the_generators_upper_bound(tmp_path):
    trace, a = run(tmp_path, _spec(host_independent=True))
    ahead = simulate(_spec(host_ahead_ns=200 * US))
    expect = Fraction(_last_end(trace) - _last_end(ahead), STEPS)
    # the device's own work per step against the step: launch-bound by construction
    busy = sum(k.end - k.ts for k in trace.kernels if k.rank == 0 and k.kind == "compute") // STEPS
    assert busy < expect
    top = a["findings"][0]
    assert top["kind"] == "host_bound" and top["evidence"]["cause"] == "launch_overhead", top["summary"]
    assert top["severity"] in ("warning", "critical") and sorted(top["ranks"]) == list(range(WORLD))
    assert top["est_saving_ns"] == pytest.approx(float(expect), rel=0.05)
    assert top["evidence"]["replayed_saving_ns"] == top["est_saving_ns"]
    assert "launches ahead of the device" in top["evidence"]["whatif"]


def test_a_host_ahead_of_its_device_has_no_launch_overhead(tmp_path):
    """The same ops with the host a lead ahead: the device never waits for a launch, no host_bound finding."""
    _, a = run(tmp_path, _spec(host_ahead_ns=200 * US))
    assert not [f for f in a["findings"] if f["kind"] == "host_bound"]


def test_whatif_launches_ahead_gives_the_generators_upper_bound(tmp_path):
    """`tracekit whatif TRACES --launches-ahead --json`: the run's predicted step against the measured one."""
    import json

    from typer.testing import CliRunner

    from tracekit.cli.main import app

    trace, _ = run(tmp_path, _spec(host_independent=True))
    ahead = simulate(_spec(host_ahead_ns=200 * US))
    expect = Fraction(_last_end(trace) - _last_end(ahead), STEPS)
    res = CliRunner().invoke(app, ["whatif", str(tmp_path / "store"), "--launches-ahead", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["fixes"] == ["launches ahead of the device (no launch cost) on every GPU rank"]
    assert out["measured_ns"] - out["predicted_ns"] == pytest.approx(float(expect), rel=0.05)
