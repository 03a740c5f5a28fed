"""The critical path and its replay on real traces without ProfilerStep (issue 32: "iterations found ... and
analysed as steps", every analysis): the breakdown's windows are the critical path's, and it says which rule
made them.

Expected values are computed here from the raw JSON (plain `json`, `Decimal` µs → integer ns): the device
span runs from the first device event's start to the last one's end (kernel / memcpy / memset), its device
idle is the span less the union of device events. A generated multi-rank run (generator.py, ProfilerStep
taken out) checks the span's collectives and a what-if against the generator's own answer. Before, the critical path of these traces was skipped ("no
profiled step with a step window (ProfilerStep) in any rank") and `tracekit whatif` replayed nothing.
"""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from tests.gpu_semantics.generator import Coll, Compute, Spec, covered, simulate, write
from tests.gpu_semantics.test_real_traces import _parts_sum_to_the_step
from tests.gpu_semantics.test_real_windows import SINGLE_GPU, _device_events, _doc, _facts
from tracekit.assess.whatif import parse_fixes, run_whatif
from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run

REPLAY_TOLERANCE = 0.02
"""The unchanged replay reproduces the measured window within 2% (the assignment's bound)."""


def _span(shared_traces: Path, folder: str) -> tuple[int, int, int, bool]:
    """(first device event start, last device event end, device busy ns, has a ProfilerStep) from the raw JSON."""
    _, dev, has_profiler_step = _facts(shared_traces / folder / SINGLE_GPU[folder])
    lo, hi = min(a for a, _, _ in dev), max(b for _, b, _ in dev)
    return lo, hi, covered([(a, b) for a, b, _ in dev], lo, hi), has_profiler_step


def _analyze(shared_traces: Path, folder: str, tmp_path: Path) -> dict:
    store = parse_run(shared_traces / folder, tmp_path / "store", progress=False).store
    return analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False, advice=False))


@pytest.mark.parametrize("folder", ["tl_compile_triton", "tl_sglang_dsr1_decode_b300_1gpu",
                                    "hta_critical_path_alexnet", "hta_mixed_et_and_kineto"])
def test_device_span_is_one_replayed_step(shared_traces, tmp_path, folder):
    """No ProfilerStep and no repeat: one step from the first to the last device event, replayed, its path's
    lanes summing to it, with a verdict from the path and the rule said."""
    lo, hi, _, has_profiler_step = _span(shared_traces, folder)
    assert not has_profiler_step
    a = _analyze(shared_traces, folder, tmp_path)
    cp = a["sections"]["critical_path"]
    assert cp["skipped"] is None and cp["step_rule"] == "device_span"
    (step,) = cp["steps"]
    assert step["step"] is None  # the span has no step number (as in the breakdown)
    assert step["measured_ns"] == hi - lo
    assert abs(step["replayed_ns"] - (hi - lo)) <= REPLAY_TOLERANCE * (hi - lo)
    assert step["composition"]["step_ns"] == hi - lo
    _parts_sum_to_the_step(cp)
    assert cp["verdict"] is not None and cp["measured_step_ns"] == hi - lo
    # one window for the whole report: the breakdown's
    (bd,) = a["sections"]["breakdown"]["ranks"]
    assert bd["step_ns"] == step["measured_ns"]


def test_repeated_ops_iterations_are_the_replayed_steps(shared_traces, tmp_path):
    """hta_cuda_event_sync_multi_stream: no ProfilerStep; its iterations are found where its top-level host ops
    repeat. They tile the device span (GPU step windows: a step runs to the next one's first kernel), so the
    replayed steps' measured lengths add up to the first-to-last device event span."""
    folder = "hta_cuda_event_sync_multi_stream"
    lo, hi, _, has_profiler_step = _span(shared_traces, folder)
    assert not has_profiler_step
    a = _analyze(shared_traces, folder, tmp_path)
    cp = a["sections"]["critical_path"]
    assert cp["step_rule"] == "repeated_ops" == a["sections"]["breakdown"]["rank_details"][0]["step_rule"]
    assert 2 <= len(cp["steps"]) <= 8  # every iteration analysed (the replay takes the last 8)
    assert sum(s["measured_ns"] for s in cp["steps"]) == hi - lo
    assert abs(sum(s["replayed_ns"] for s in cp["steps"]) - (hi - lo)) <= REPLAY_TOLERANCE * (hi - lo)
    _parts_sum_to_the_step(cp)


@pytest.mark.parametrize("folder,fixes", [("tl_sglang_dsr1_decode_b300_1gpu", {"launches_ahead": True}),
                                          ("hta_mixed_et_and_kineto", {"no_host_stalls": True})])
def test_host_fix_on_the_device_span_saves_at_most_the_device_idle(shared_traces, tmp_path, folder, fixes):
    """A what-if that only repairs the host (launches ahead of the device, host gaps removed) cannot make the
    device finish before it has run its work back to back: the saving is positive (the host holds the path)
    and at most the span's device idle."""
    lo, hi, busy, _ = _span(shared_traces, folder)
    store = parse_run(shared_traces / folder, tmp_path / "store", progress=False).store
    out = run_whatif(store, parse_fixes(**fixes))
    (step,) = out["steps"]
    assert step["step"] is None and step["measured_ns"] == hi - lo
    saving = step["measured_ns"] - step["predicted_ns"]
    assert 0 < saving <= (hi - lo) - busy


def _twice(doc: dict) -> dict:
    """The trace run twice: every timed event again, shifted past the first run's last event by 1 ms, its
    correlation / external / flow ids offset past the first run's (a decode step replayed twice)."""
    timed = [e for e in doc["traceEvents"] if isinstance(e, dict) and "ts" in e]
    lo = min(Decimal(str(e["ts"])) for e in timed)
    hi = max(Decimal(str(e["ts"])) + Decimal(str(e.get("dur", 0))) for e in timed)
    ids = [v for e in timed for v in [*(e.get("args") or {}).values(), e.get("id")] if isinstance(v, int)]
    off = max(ids) + 1
    again = []
    for e in timed:
        c = copy.deepcopy(e)
        c["ts"] = Decimal(str(e["ts"])) + (hi - lo) + 1000
        args = c.get("args") or {}
        for k in ("correlation", "External id"):
            if isinstance(args.get(k), int):
                args[k] += off
        if isinstance(c.get("id"), int):
            c["id"] += off
        again.append(c)
    return {**doc, "traceEvents": doc["traceEvents"] + again}


def test_graph_launch_iterations_are_the_replayed_steps(shared_traces, tmp_path):
    """An SGLang decode trace (one cudaGraphLaunch) run twice: two graph launches, so two iterations, one
    starting at each launch (`graph_launch`); their windows tile the device span of the doubled trace."""
    folder = "tl_sglang_dsr1_decode_b300_1gpu"
    doc = _twice(_doc(shared_traces / folder / SINGLE_GPU[folder]))
    assert sum(1 for e in doc["traceEvents"] if e.get("name") == "cudaGraphLaunch") == 2
    dev = _device_events(doc)
    lo, hi = min(a for a, _, _ in dev), max(b for _, b, _ in dev)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "trace.json").write_text(json.dumps(doc, default=float))
    a = _analyze(tmp_path, "run", tmp_path)
    cp = a["sections"]["critical_path"]
    assert cp["step_rule"] == "graph_launch" == a["sections"]["breakdown"]["rank_details"][0]["step_rule"]
    assert [s["step"] for s in cp["steps"]] == [0, 1]
    assert sum(s["measured_ns"] for s in cp["steps"]) == hi - lo
    assert abs(sum(s["replayed_ns"] for s in cp["steps"]) - (hi - lo)) <= REPLAY_TOLERANCE * (hi - lo)
    _parts_sum_to_the_step(cp)


MS = 1_000_000


def _span_of_slowest_rank(trace) -> int:
    """The generator's measured window: the largest of the ranks' first-to-last kernel spans."""
    ranks = {k.rank for k in trace.kernels}
    return max(max(k.end for k in trace.kernels if k.rank == r) - min(k.ts for k in trace.kernels if k.rank == r)
               for r in ranks)


@pytest.mark.parametrize("host_independent", [False, True])
def test_multi_rank_device_span_replays_the_generators_saving(tmp_path, host_independent):
    """Generated 4-rank GPU traces (generator.py) with their ProfilerStep annotations taken out and no op
    sequence repeating: each rank is one device-span step, held to its peers by an all_reduce whose members
    carry no step. Rank 2's kernels are 1.4x slower; the generator's answer for "rank 2 at its peers' pace"
    is the same spec simulated without it. The unchanged replay gives back the measured span and the what-if
    the generator's saving within 5%."""
    ops = [Compute(20 * MS), Compute(10 * MS, "aten::addmm"), Coll("all_reduce", 1 << 24, 1 << 24, 2 * MS),
           Compute(5 * MS, "aten::relu")]
    kw = dict(world=4, steps=1, step_ops=ops, host_ahead_ns=30 * MS, host_independent=host_independent)
    trace = simulate(Spec(slow={2: Fraction(7, 5)}, **kw))
    for r in trace.events:
        trace.events[r] = [e for e in trace.events[r] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    write(trace, tmp_path / "traces")
    expect = _span_of_slowest_rank(trace) - _span_of_slowest_rank(simulate(Spec(**kw)))
    assert expect > 10 * MS
    store = parse_run(tmp_path / "traces", tmp_path / "store", progress=False).store
    out = run_whatif(store, parse_fixes(rank_compute=["2=median"]))
    (step,) = out["steps"]
    assert step["step"] is None and step["measured_ns"] == _span_of_slowest_rank(trace)
    assert abs(step["replayed_ns"] - step["measured_ns"]) <= REPLAY_TOLERANCE * step["measured_ns"]
    assert step["measured_ns"] - step["predicted_ns"] == pytest.approx(expect, rel=0.05)


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("where", ["shared:hta_cuda_event_sync_multi_stream", "fixture:gpu_h100_hoststall"])
def test_the_path_runs_on_device_streams_no_longer_than_the_device_is_busy(shared_traces, tmp_path, where):
    """A step outlasts its last device work where the host has not begun the next one (hta_cuda_event_sync:
    18.4 ms of an iteration with no host op recorded before the next launch; the gpu_h100_hoststall fixture:
    a DataLoader whose dataset sleeps 15 ms a step). That stretch came after the path's last node and was
    counted on that node's lane, a kernel's: "compute-bound, compute streams 99.7%" with the device busy 2%
    of the span. The path's time on device streams can be no longer than the device's busy time (the union
    of every device event in the file, from the raw JSON), and the verdict is the host's."""
    kind, name = where.split(":")
    folder = shared_traces / name if kind == "shared" else REPO / "fixtures" / name
    (path,) = sorted(folder.glob("*.json.gz"))  # the fixture's capture.json is its recipe
    _, dev, _ = _facts(path)
    busy = covered([(a, b) for a, b, _ in dev], min(a for a, _, _ in dev), max(b for _, b, _ in dev))
    store = parse_run(folder, tmp_path / "store", progress=False).store
    cp = analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False, advice=False))["sections"]["critical_path"]
    _parts_sum_to_the_step(cp)
    on_device = sum(s["composition"]["by_lane"]["compute_stream"] + s["composition"]["by_lane"]["comm_stream"]
                    for s in cp["steps"])
    assert on_device <= busy
    assert busy < 0.2 * sum(s["composition"]["step_ns"] for s in cp["steps"])  # the device mostly idle
    assert cp["verdict"]["bound"] == "host-bound"


def test_a_step_with_no_path_to_follow_says_so(shared_traces, tmp_path):
    """hta_gloo_cpu_rank34of300: one CPU rank of 300, whose step (from the raw JSON) holds its gloo
    collectives and otherwise no more than empty allocations: its collectives' peers are not in the file, so the
    replay has no op of the rank's own to follow. The section replayed the step, gave no verdict and said
    nothing ("skipped": null, the whole step "not attributed"); it now says why there is no path."""
    folder = shared_traces / "hta_gloo_cpu_rank34of300"
    (path,) = sorted(folder.glob("*.json*"))
    ev = [e for e in _doc(path)["traceEvents"] if e.get("ph") == "X"]
    ops = {e["name"] for e in ev if e.get("cat") in ("cpu_op", "user_annotation")}
    assert {n for n in ops if not n.startswith(("gloo:", "ProfilerStep#"))} <= {"aten::empty"}
    assert not [e for e in ev if str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset")]
    cp = _analyze(shared_traces, "hta_gloo_cpu_rank34of300", tmp_path)["sections"]["critical_path"]
    assert cp["steps"] and not any(s["path"] for s in cp["steps"])
    assert cp["verdict"] is None
    assert cp["skipped"] and cp["skipped"].startswith("no path to follow")
