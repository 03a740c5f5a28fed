"""GPU-correct replay: the device queue, not the host's clock, decides when a kernel starts.

Hand-built traces (generator.py, `host_independent`): each rank's host launches ~30 ms ahead of a device
that runs its ops back to back; rank 2's kernels are 1.4x slower. The generator's answer for "rank 2 at
its peers' pace" is the same spec simulated without the slow rank: the difference of the two runs' last
device end, per step (integer ns, from the generator's own intervals). The replayed saving of the
straggler finding must be within 5% of it, and the unchanged replay must give back each measured step.

`launch_queue`: CUDA blocks a launch while the device holds its maximum of pending work, which keeps a
host that runs ahead a bounded lead ahead (its launch calls then last until a device op ends). Such a
call waited for the device: with its measured length kept the replay held the device to the slow rank's
pace (0.67 ms replayed of 14 ms).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from tests.gpu_semantics.generator import Coll, Compute, Spec, simulate
from tests.gpu_semantics.test_gpu_semantics import findings, run

MS = 1_000_000
STEP_OPS = [Compute(20 * MS), Compute(10 * MS), Coll("all_reduce", 1 << 24, 1 << 24, 2 * MS), Compute(5 * MS)]
STEPS = 4


def _last_end(trace) -> int:
    return max(k.end for k in trace.kernels)


@pytest.mark.parametrize("queue", [0, 2, 3])
def test_host_ahead_straggler_replays_to_the_generators_saving(tmp_path, queue):
    kw = dict(world=4, steps=STEPS, step_ops=STEP_OPS, host_ahead_ns=30 * MS, host_independent=True,
              launch_queue=queue)
    spec = Spec(slow={2: Fraction(7, 5)}, **kw)
    trace, a = run(tmp_path, spec)
    expect = Fraction(_last_end(trace) - _last_end(simulate(Spec(**kw))), STEPS)
    assert expect > 10 * MS
    # the host really runs ahead: every kernel of rank 0 starts at least 1 ms after its launch returned
    launch_end = {e["args"]["correlation"]: e for e in trace.events[0] if e.get("cat") == "cuda_runtime"}
    assert launch_end and all(k.ts - _end_ns(launch_end[k.correlation]) >= MS
                              for k in trace.kernels if k.rank == 0 and k.correlation in launch_end)
    (f,) = findings(a, "straggler")
    assert f["ranks"] == [2]
    assert f["evidence"]["replayed_saving_ns"] == pytest.approx(float(expect), rel=0.05)
    assert f["est_saving_ns"] == pytest.approx(float(expect), rel=0.05)
    for s in a["sections"]["critical_path"]["steps"]:  # the unchanged replay gives back the measured step
        assert s["replayed_ns"] == pytest.approx(s["measured_ns"], rel=0.02)


def _end_ns(ev: dict) -> int:
    return int(ev["ts"].removeprefix("__NS__")) + int(ev["dur"].removeprefix("__NS__"))
