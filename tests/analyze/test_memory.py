"""Memory analysis on reference-runtime runs: peaks equal the profiler's own counter (read independently
from the JSON), 1F1B stages hold the activations of p − s micro-batches, activation checkpointing lowers
them and shows up as recomputation; traces without memory events are reported, not fatal."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from tests.runtime._runs import RunConfig, run_job, small_model
from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run

P, M = 4, 8
pytestmark = pytest.mark.slow


def _analyze(trace: Path, store: Path) -> dict:
    res = parse_run(trace, store, progress=False)
    analysis = analyze_store(res.store, AnalysisConfig())
    assert not [e for e in analysis["analyzer_errors"] if e["analyzer"] in ("memory", "pipeline", "layout")], \
        analysis["analyzer_errors"]
    return analysis


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("mem")
    out = {}
    for name, ckpt in (("plain", False), ("ckpt", True)):
        # dense blocks, one per stage: the stages differ only by what the schedule keeps in flight
        cfg = RunConfig.build(pp=P, microbatches=M, schedule="1f1b", steps=2, profile_steps=1, seq_len=32,
                        global_batch_size=M * 2, model=small_model(moe_every=0), activation_checkpointing=ckpt,
                        out=str(base / name))
        trace = run_job(cfg)
        out[name] = {"trace": trace, "analysis": _analyze(trace, base / f"{name}.store")}
    return out


def _main(section: dict) -> dict[int, dict]:
    main: dict[int, dict] = {}
    for r in section["ranks"]:
        main.setdefault(r["rank"], r)
    return main


def test_peak_per_rank_is_the_profilers_total_allocated_maximum(runs):
    for run in runs.values():
        main = _main(run["analysis"]["sections"]["memory"])
        for rank in range(P):
            with gzip.open(run["trace"] / f"rank{rank}.pt.trace.json.gz", "rt") as fh:
                events = json.load(fh)["traceEvents"]
            expected = max(e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]")
            assert main[rank]["peak_allocated"] == expected


def test_1f1b_stages_hold_the_microbatches_the_schedule_implies(runs):
    stages = {s["stage"]: s for s in runs["plain"]["analysis"]["sections"]["memory"]["stages"]}
    assert sorted(stages) == list(range(P))
    for s, st in stages.items():
        assert st["in_flight_schedule"] == min(P - s, M)
    first, last = stages[0], stages[P - 1]
    assert first["activation_held_bytes"] > last["activation_held_bytes"]
    measured = first["in_flight_measured"] / last["in_flight_measured"]
    assert abs(measured / (P / 1) - 1) <= 0.20, (measured, stages)


def test_activation_checkpointing_lowers_activations_and_shows_recompute(runs):
    plain = _main(runs["plain"]["analysis"]["sections"]["memory"])
    ckpt = _main(runs["ckpt"]["analysis"]["sections"]["memory"])
    for rank in range(P):
        assert ckpt[rank]["activation_held_bytes"] < plain[rank]["activation_held_bytes"]
    assert ckpt[0]["peak_allocated"] < plain[0]["peak_allocated"]
    kinds = lambda a: {f["kind"]: f for f in a["findings"]}  # noqa: E731
    assert "recompute" not in kinds(runs["plain"]["analysis"])
    rec = kinds(runs["ckpt"]["analysis"])["recompute"]
    assert rec["est_saving_ns"] > 0 and set(rec["ranks"]) == set(range(P))
    assert "aten::linear" in rec["evidence"]["ops"]


def test_traces_without_memory_events_are_reported_and_analysis_goes_on(runs, tmp_path):
    src = tmp_path / "nomem"
    src.mkdir()
    for rank in (0, 1):
        with gzip.open(runs["plain"]["trace"] / f"rank{rank}.pt.trace.json.gz", "rt") as fh:
            doc = json.load(fh)
        if rank == 1:
            doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "[memory]"]
        (src / f"rank{rank}.pt.trace.json").write_text(json.dumps(doc))
    analysis = _analyze(src, tmp_path / "store")
    mem = analysis["sections"]["memory"]
    assert mem["ranks_without_memory_events"] == [1]
    assert [r["rank"] for r in mem["ranks"]] == [0]
    assert analysis["ranks"]


def test_model_calibrated_on_the_plain_run_predicts_the_checkpointed_run(runs):
    from tracekit.layout import ParallelLayout
    from tracekit.model.memory import ModelShape, calibrate_from_analysis, predict

    shape = ModelShape(num_layers=4, d_model=32, d_ff=64, num_heads=4, vocab_size=128, seq_len=32,
                       microbatch_size=2, max_seq_len=128)
    layout = ParallelLayout(pp=P, schedule="1f1b", microbatches=M)
    calib = calibrate_from_analysis(shape, layout, runs["plain"]["analysis"]["sections"]["memory"])
    assert not calib.counts_static  # CPU: the profiler's counter started with the window
    predicted = predict(shape, ParallelLayout(pp=P, schedule="1f1b", microbatches=M, activation_checkpointing=True), calib)
    for st in runs["ckpt"]["analysis"]["sections"]["memory"]["stages"]:
        measured = st["peak_allocated"]
        assert abs(predicted[st["stage"]].peak - measured) / measured <= 0.15, (st, predicted[st["stage"]])


def test_real_h100_trace_peak_split_and_headroom(tmp_path):
    src = Path(__file__).resolve().parents[2] / "fixtures" / "gpu_h100"
    with gzip.open(src / "rank0.pt.trace.json.gz", "rt") as fh:
        doc = json.load(fh)
    cuda = [e["args"] for e in doc["traceEvents"] if e.get("name") == "[memory]" and e["args"]["Device Type"] == 1]
    capacity = doc["deviceProperties"][0]["totalGlobalMem"]
    analysis = _analyze(src, tmp_path / "store")
    mem = analysis["sections"]["memory"]
    gpu = next(r for r in mem["ranks"] if r["device_type"] == 1)
    assert mem["counter"] == "absolute"
    assert gpu["peak_allocated"] == max(a["Total Allocated"] for a in cuda)
    assert gpu["peak_reserved"] == max(a["Total Reserved"] for a in cuda)
    assert gpu["split"]["static_bytes"] + gpu["split"]["activation_bytes"] == gpu["peak_allocated"]
    assert 0 < gpu["activation_held_bytes"] <= gpu["activation_peak_bytes"]  # unlabelled: autograd phases
    head = {f["kind"]: f for f in analysis["findings"]}["memory_headroom"]
    assert head["evidence"]["capacity_bytes"] == capacity


def test_simulated_gpu_pipeline_peaks_are_the_answer_keys(tmp_path):
    from tracekit.simulate.api import simulate
    from tracekit.layout import ParallelLayout
    from tracekit.simulate.specs import ClusterSpec, ModelSpec
    from tracekit.simulate.writer import write_traces

    res = simulate(ModelSpec.preset("tiny"), ClusterSpec.preset("1x8-h100"),
                   ParallelLayout(pp=4, schedule="1f1b", microbatches=8), steps=2, seed=3, without=False)
    write_traces(res, tmp_path / "sim")
    truth = json.loads((tmp_path / "sim" / ".ground_truth.json").read_text())["memory"]["peak_allocated_bytes"]
    mem = _analyze(tmp_path / "sim", tmp_path / "store")["sections"]["memory"]
    main = _main(mem)
    assert {str(r): main[r]["peak_allocated"] for r in main} == truth
    assert mem["counter"] == "absolute"
    stages = {s["stage"]: s for s in mem["stages"]}
    assert [stages[s]["in_flight_schedule"] for s in range(4)] == [4, 3, 2, 1]
    assert stages[0]["peak_allocated"] > stages[3]["peak_allocated"]


def _stack_nesting(ts, end, tid):
    """The call-stack walk `_nesting` replaced: per thread in (start, longest first) order, pop the rows that
    end before this one; the top left is its parent."""
    order = np.lexsort((-(end - ts), ts, tid)).tolist()
    parent, stack, last = [-1] * len(ts), [], None
    for i in order:
        if tid[i] != last:
            stack, last = [], tid[i]
        while stack and end[stack[-1]] < end[i]:
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    return parent, order


def test_nesting_equals_the_call_stack_walk():
    """Each op's parent (recomputation's op tree) is the one a call-stack walk finds, on random nested, overlapping,
    equal-ending and zero-length intervals over several threads."""
    from tracekit.analyze.memory import _nesting

    rng = np.random.default_rng(3)
    for n in (0, 1, 7, 300, 2000):
        ts = rng.integers(0, 200, n).astype(np.int64) * 10
        end = ts + rng.choice([0, 5, 10, 40, 400, 3000], n)
        tid = rng.integers(0, 3, n).astype(np.int64)
        parent, order = _nesting(ts, end, tid)
        want_parent, want_order = _stack_nesting(ts, end, tid)
        assert parent.tolist() == want_parent and order == want_order, n
