"""Host-side diagnosis on generated multi-rank GPU traces whose hosts are starved (generator.py,
`host_independent` + `host_stretch`): on every rank, ops of the host thread are stretched at random (an
`aten::view` that lost its core for 1-8 ms, as on an oversubscribed host), so devices wait for launches and
peers wait inside collectives for whichever host is slowest.

The generator's answer for "host repaired" is the same spec simulated without the stretches: the
difference of the two runs' last device end, per step. Every expected number is computed here from the
generator's own intervals with integer arithmetic, never read from tracekit.
"""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from tests.gpu_semantics.generator import Coll, Compute, Spec, covered, simulate
from tests.gpu_semantics.test_gpu_semantics import findings, run

MS = 1_000_000
STEP_OPS = [Compute(2 * MS), Compute(MS), Compute(2 * MS), Coll("all_reduce", 1 << 22, 1 << 22, MS // 2),
            Compute(3 * MS), Compute(MS), Coll("all_reduce", 1 << 22, 1 << 22, MS // 2), Compute(MS)]
WORLD, STEPS, FIRST = 4, 4, 10


def starved(seed: int, share: float = 0.4) -> dict:
    """(rank, step, op) -> ns added to that op's aten::view: about `share` of the ops, 1-8 ms each."""
    rng = random.Random(seed)
    return {(r, s, i): rng.randint(MS, 8 * MS) for r in range(WORLD) for s in range(FIRST, FIRST + STEPS)
            for i in range(len(STEP_OPS)) if rng.random() < share}


def _spec(**kw) -> Spec:
    return Spec(world=WORLD, steps=STEPS, step_ops=STEP_OPS, first_step=FIRST, host_independent=True, **kw)


def _last_end(trace) -> int:
    return max(k.end for k in trace.kernels)


def _launch_wait(trace, rank: int) -> dict[int, int]:
    """Per step: time the rank's device sat idle before a kernel while its launch had not returned
    (from the generator's kernels and the cudaLaunch* calls' ends, by correlation)."""
    ends = {e["args"]["correlation"]: int(e["ts"][6:]) + int(e["dur"][6:]) for e in trace.events[rank]
            if e.get("cat") == "cuda_runtime"}
    out: dict[int, int] = {}
    prev = None
    for k in sorted((k for k in trace.kernels if k.rank == rank), key=lambda k: k.ts):
        launch = ends.get(k.correlation)
        if prev is not None and launch is not None and launch > prev:
            out[k.step] = out.get(k.step, 0) + min(k.ts, launch) - prev
        prev = k.end if prev is None else max(prev, k.end)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_starved_hosts_are_the_top_finding_with_the_generators_saving(tmp_path, seed):
    stretch = starved(seed)
    trace, a = run(tmp_path, _spec(host_stretch=stretch))
    expect = Fraction(_last_end(trace) - _last_end(simulate(_spec())), STEPS)
    assert expect > MS
    top = a["findings"][0]
    assert top["kind"] == "host_bound" and top["severity"] in ("warning", "critical")
    assert top["est_saving_ns"] == pytest.approx(float(expect), rel=0.10)
    assert top["evidence"]["cause"] == "starved_host"
    assert top["evidence"]["slow_ops"][0]["name"] == "aten::view"
    # the critical path runs on host threads most of the step: the verdict says host-bound
    cp = a["sections"]["critical_path"]
    # the what-if rows number findings as the document lists them (host_bound came last before sorting)
    for w in cp["whatif"]:
        f = a["findings"][w["finding"]]
        assert f["kind"] == w["kind"] and f["evidence"]["whatif"] == w["fix"]
    assert cp["verdict"]["bound"] == "host-bound"
    shares = cp["verdict"]["lane_shares"]
    assert shares["host"] == max(shares.values())
    # per rank and step, against the generator's intervals (means per step, as the section reports them)
    rows = {r["rank"]: r for r in a["sections"]["host_bound"]["ranks"]}
    for r in range(WORLD):
        wait = _launch_wait(trace, r)
        assert rows[r]["launch_wait_ns"] == sum(wait.values()) // STEPS
        slow = sum(v for (rr, _s, _i), v in stretch.items() if rr == r)
        assert rows[r]["slow_ops_ns"] == slow // STEPS
        dev = 0
        for s in range(FIRST, FIRST + STEPS):
            ks = [(k.ts, k.end) for k in trace.kernels if k.rank == r and k.step == s]
            dev += covered(ks, min(a for a, _ in ks), max(b for _, b in ks))
        assert rows[r]["device_busy_ns"] == dev // STEPS


def test_a_clean_host_ahead_run_is_not_host_bound(tmp_path):
    trace, a = run(tmp_path, _spec(host_ahead_ns=5 * MS))
    assert not findings(a, "host_bound")
    assert a["sections"]["critical_path"]["verdict"]["bound"] == "compute-bound"
    assert not [f for f in a["findings"] if f["severity"] != "info"]
    assert all(r["launch_wait_ns"] == 0 and r["slow_ops_ns"] == 0 for r in a["sections"]["host_bound"]["ranks"])
