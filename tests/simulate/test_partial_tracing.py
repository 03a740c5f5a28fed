"""A simulated partial recording (`write_traces(trace_ranks=...)`, `tracekit simulate --trace-ranks`): full
traces on 8 of 64 ranks, collective logs on all 64, and a slow GPU on an untraced rank. The expected answer
comes from the simulator's answer key (`res.ground_truth()`: the fault's rank, the step with and without it),
never read by the analysis; the files are checked with plain json/gzip."""

from __future__ import annotations

import gzip
import json

import pytest

from tracekit.simulate import ClusterSpec, Faults, ModelSpec, ParallelLayout, simulate, write_traces
from tracekit.simulate.writer import spread_ranks

SLOW = 21


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory):
    res = simulate(ModelSpec.preset("tiny-moe"), ClusterSpec.preset("8x8-h100"),
                   ParallelLayout(pp=2, dp=4, cp=2, tp=4, ep=2, microbatches=4), Faults(slow_gpu={SLOW: 1.3}), steps=2, seed=0)
    out = tmp_path_factory.mktemp("partial") / "run"
    traced = spread_ranks(res.ranks, 8)
    write_traces(res, out, trace_ranks=traced)
    return res, out, traced


def test_spread_ranks():
    assert spread_ranks(64, 8) == [0, 8, 16, 24, 32, 40, 48, 56]
    assert spread_ranks(10_000, 32)[:3] == [0, 312, 625] and len(spread_ranks(10_000, 32)) == 32
    assert spread_ranks(4, 8) == [0, 1, 2, 3]


@pytest.mark.slow
def test_traces_on_some_ranks_logs_on_all(partial_run):
    res, out, traced = partial_run
    assert SLOW not in traced
    assert sorted(int(p.name[4:].split(".")[0]) for p in out.glob("rank*.pt.trace.json.gz")) == traced
    for r in (0, SLOW, 63):
        lines = [json.loads(x) for x in (out / f"comms.rank{r}.jsonl").read_text().splitlines()]
        assert lines[0]["type"] == "header" and lines[0]["rank"] == r and lines[-1]["type"] == "footer"
        assert len(lines) - 2 == sum(1 for o in res.programs[r] if o.kind == 1)  # one entry per collective op
    with gzip.open(out / "rank0.pt.trace.json.gz", "rt") as fh:
        assert json.load(fh)["traceEvents"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["traced_ranks"] == traced
    assert manifest["log_only_ranks"] == [r for r in range(64) if r not in traced]


@pytest.mark.slow
def test_slow_gpu_on_an_untraced_rank_named_from_the_logs_and_replayed(partial_run, tmp_path):
    """The slow GPU of a rank with no trace is named from the logs, and its saving is replayed: the rank is a
    chain of its logged collectives in the dependency graph (work between them at its peers' pace), within
    10% of the answer key's (the step re-simulated without the fault), not the closed-form hold-up."""
    from tracekit.analysis import analyze_run

    res, out, traced = partial_run
    fault = next(f for f in res.ground_truth()["faults"] if f["kind"] == "slow_gpu")
    saving = fault["step_ns_with"] - fault["step_ns_without"]
    analyze_run(out, tmp_path / "a")
    analysis = json.loads((tmp_path / "a" / "analysis.json").read_text())
    inputs = analysis["sections"]["inputs"]
    assert inputs["missing_ranks"] == [] and inputs["traced_ranks"] == traced
    assert SLOW in inputs["log_only_ranks"] and len(inputs["log_only_ranks"]) == 56
    stragglers = [f for f in analysis["findings"] if f["kind"] == "straggler"]
    top = stragglers[0]
    assert top["ranks"] == [SLOW] and top["severity"] in ("warning", "critical")
    replayed = top["evidence"]["replayed_saving_ns"]
    assert top["est_saving_ns"] == replayed and "rank 21 compute at peers median" in top["evidence"]["whatif"]
    assert abs(replayed - saving) <= 0.10 * saving, (replayed, saving)
    # the closed form (the hold-up it caused) was a bound, far above what fixing it saves
    assert top["evidence"]["closed_form_saving_ns"] > 2 * saving
    # the unchanged replay, log-only ranks included, gives back every measured step
    steps = analysis["sections"]["critical_path"]["steps"]
    assert steps and all(s["replay_error"] <= 0.01 for s in steps)
    assert not analysis.get("analyzer_errors")
