"""Unlabelled pipelines on GPU traces: 4 stages over the default NCCL group, no pp group, no labels.

The answers come from the generator's own kernel intervals (pipeline_gen.py), with integer arithmetic:
per step the window runs from the first kernel start to the last kernel end over the pipeline's ranks,
a stage is busy while its compute kernels run, and the bubble is the mean over stages of idle/window.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from tests.gpu_semantics import pipeline_gen as gen
from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run

MS = gen.MS

CASES = {
    # schedule, m, rank of each stage, forward ns per stage, host lead
    "gpipe_m2": ("gpipe", 2, [0, 1, 2, 3], [2 * MS] * 4, 5 * MS),
    "gpipe_m8_reversed_ranks": ("gpipe", 8, [3, 2, 1, 0], [2 * MS] * 4, 30 * MS),
    "1f1b_m4": ("1f1b", 4, [0, 1, 2, 3], [2 * MS] * 4, 5 * MS),
    "1f1b_m8_shuffled_ranks_uneven": ("1f1b", 8, [2, 0, 3, 1], [2 * MS, 3 * MS, 2 * MS, 2 * MS], 30 * MS),
}


def expected(tr: gen.PipelineTrace) -> tuple[Fraction, Fraction]:
    """(bubble, imbalance) from the generator's intervals."""
    bubbles, busy_by_rank = [], {r: 0 for r in tr.stage_ranks}
    steps = sorted({k.step for k in tr.kernels})
    for step in steps:
        ks = [k for k in tr.kernels if k.step == step]
        window = max(k.end for k in ks) - min(k.start for k in ks)
        idle = []
        for r in tr.stage_ranks:
            busy = sum(k.end - k.start for k in ks if k.rank == r and k.kind == "compute")
            busy_by_rank[r] += busy
            idle.append(Fraction(window - busy, window))
        bubbles.append(sum(idle) / len(idle))
    mean_busy = Fraction(sum(busy_by_rank.values()), len(busy_by_rank))
    return sum(bubbles) / len(bubbles), Fraction(max(busy_by_rank.values())) / mean_busy


@pytest.fixture(scope="module")
def analyses(tmp_path_factory):
    out = {}
    for name, (schedule, m, ranks, fwd, lead) in CASES.items():
        tr = gen.generate(4, m, schedule, fwd_ns=fwd, bwd_ns=[2 * f for f in fwd], stage_ranks=ranks)
        base = tmp_path_factory.mktemp(name)
        gen.write(tr, base / "traces", host_lead_ns=lead)
        store = parse_run(base / "traces", base / "store", progress=False).store
        out[name] = (tr, analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False)))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_pipeline_inferred_from_p2p_alone(analyses, name):
    schedule, m, ranks, _, _ = CASES[name]
    tr, analysis = analyses[name]
    sec = analysis["sections"]["pipeline"]
    assert sec["source"] == "p2p"
    assert [p["ranks"] for p in sec["pipelines"]] == [ranks]
    assert sec["num_stages"] == 4 and sec["num_microbatches"] == m
    assert sec["schedule_detected"] == schedule
    assert sec["theoretical_bubble"] == pytest.approx((4 - 1) / (m + 4 - 1))
    bubble, imbalance = expected(tr)
    print(f"\n{name}: bubble measured {sec['measured_bubble']:.4f}, generator {float(bubble):.4f}, "
          f"theory {sec['theoretical_bubble']:.4f}")
    assert abs(sec["measured_bubble"] - float(bubble)) <= 0.05
    assert sec["imbalance"] == pytest.approx(float(imbalance), rel=1e-6)
    # the schedule diagram of the last step: each stage's busy time is its compute kernels' (ProfilerStep#k+1)
    d = sec["diagram"]
    step = d["step"] - 1
    for stage, rank in enumerate(ranks):
        drawn = sum(x["dur_ns"] for x in d["intervals"] if x["stage"] == stage)
        assert drawn == sum(k.end - k.start for k in tr.kernels if k.rank == rank and k.step == step
                            and k.kind == "compute")


def test_bubble_finding_names_the_pipeline(analyses):
    _, analysis = analyses["gpipe_m2"]
    (f,) = [f for f in analysis["findings"] if f["kind"] == "pipeline_bubble"]
    assert f["severity"] in ("warning", "critical") and f["dim"] == "pp" and f["ranks"] == [0, 1, 2, 3]
    assert f["evidence"]["num_stages"] == 4 and f["evidence"]["num_microbatches"] == 2


def test_more_microbatches_shrink_the_bubble(analyses):
    small = analyses["gpipe_m2"][1]["sections"]["pipeline"]["measured_bubble"]
    large = analyses["gpipe_m8_reversed_ranks"][1]["sections"]["pipeline"]["measured_bubble"]
    assert large < small


def test_reference_orders_come_from_torch_schedules():
    """The generator's orders are torch.distributed.pipelining's (where torch 2.13's are consistent)."""
    gp = gen.reference_order("gpipe", 4, 3)
    assert all(seq == [("fwd", i) for i in range(3)] + [("bwd", i) for i in range(3)] for seq in gp.values())
    ob = gen.reference_order("1f1b", 4, 8)
    # 1F1B: stage s runs p−s forwards before its first backward
    assert [next(i for i, (ph, _) in enumerate(seq) if ph == "bwd") for _, seq in sorted(ob.items())] == [4, 3, 2, 1]


@pytest.mark.parametrize("schedule,v", [("interleaved", 2), ("1f1b", 1)])
def test_simulated_replicas_and_interleaving(tmp_path, schedule, v):
    """tracekit.simulate's NCCL traces (pp=4 × dp=2, m=8): one pipeline per data-parallel replica, in the
    simulator's own pp groups' order, and v chunks per rank from the ring's lighter wrap link."""
    from tracekit.derive.pipeline_graph import infer_pipelines, load_p2p
    from tracekit.simulate import ClusterSpec, ModelSpec, ParallelLayout, simulate, write_traces

    layout = ParallelLayout(pp=4, dp=2, schedule=schedule, microbatches=8, virtual_stages=v)
    res = simulate(ModelSpec.preset("tiny"), ClusterSpec.preset("1x8-h100"), layout, steps=2, without=False)
    write_traces(res, tmp_path / "t")
    store = parse_run(tmp_path / "t", tmp_path / "s", progress=False).store
    want = sorted(list(g.ranks) for g in res.world.topo.groups.values() if g.dim == "pp")
    found = infer_pipelines(load_p2p(store))
    assert [x.ranks for x in found] == want
    assert all(x.chunks == v and x.microbatches == 8 and x.schedule == schedule for x in found)
