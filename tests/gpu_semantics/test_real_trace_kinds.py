"""Trace kinds recognised and said, on the real corpus (../shared/traces) and on small hand-written traces.

Expected values are counted here from the raw JSON (plain `json`): graph capture calls and the launches
inside them, device rows run, autograd backward / optimizer names, kernels without a launch before the
first launched one (carry-over), ProfilerStep counts.
"""

from __future__ import annotations

import gzip
import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)["traceEvents"]


def _analyze(folder: Path, tmp_path: Path) -> dict:
    store = parse_run(folder, tmp_path / "store", progress=False).store
    return analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False, advice=False))


def _ns(v) -> int:
    return int(Decimal(str(v)) * 1000)


def _capture_counts(ev: list[dict]) -> tuple[int, int]:
    """(launches inside BeginCapture..EndCapture, device rows run)."""
    begin = [_ns(e["ts"]) for e in ev if re.match(r"(cuda|hip)StreamBeginCapture", str(e.get("name")))]
    end = [_ns(e["ts"]) + _ns(e["dur"]) for e in ev if re.match(r"(cuda|hip)StreamEndCapture", str(e.get("name")))]
    spans = list(zip(sorted(begin), sorted(end)))
    launches = [_ns(e["ts"]) for e in ev if e.get("cat") == "cuda_runtime"
                and re.match(r"(cuda|hip|cu)\w*Launch\w*Kernel", str(e.get("name")))]
    captured = sum(1 for t in launches if any(a <= t <= b for a, b in spans))
    run = sum(1 for e in ev if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS)
    return captured, run


@pytest.mark.parametrize("folder", ["tl_vllm_graph_capture", "tl_sglang_bs32"])
def test_graph_capture_traces_get_no_verdict(shared_traces, tmp_path, folder):
    (path,) = (shared_traces / folder).glob("*.json.gz")
    captured, run = _capture_counts(_events(path))
    assert captured > 10 * run > 0  # what makes it a capture: hundreds captured, a handful ran
    a = _analyze(shared_traces / folder, tmp_path)
    tk = a["sections"]["trace_kind"]
    (rank,) = tk["ranks"]
    assert rank["graph"]["mode"] == "capture_only"
    assert (rank["graph"]["captured_launches"], rank["graph"]["kernels_run"]) == (captured, run)
    assert tk["verdict"] is None and "capture" in tk["no_verdict_reason"]
    assert a["findings"] == []  # no verdict, so no finding on its timing either
    assert a["sections"]["critical_path"]["verdict"] is None  # nor one from the path: the document agrees
    from reports.html_report import Page, verdict_text
    assert verdict_text(Page(a, None))[1].startswith("No verdict: CUDA-graph capture trace")


@pytest.mark.parametrize("folder", ["tl_sglang_dsr1_decode_b300_1gpu", "tl_sglang_qwen3moe_decode_mi300_1gpu"])
def test_graph_replay_is_said_and_judged(shared_traces, tmp_path, folder):
    (path,) = (shared_traces / folder).glob("*.json.gz")
    ev = _events(path)
    launches = sum(1 for e in ev if e.get("name") in ("cudaGraphLaunch", "hipGraphLaunch"))
    a = _analyze(shared_traces / folder, tmp_path)
    (rank,) = a["sections"]["trace_kind"]["ranks"]
    assert rank["graph"]["mode"] == "graph_replay" and rank["graph"]["graph_launches"] == launches
    assert a["sections"]["trace_kind"]["verdict"] == "given"
    assert rank["workload"] == "inference"
    assert rank["accelerator"] == ("rocm" if "mi300" in folder else "cuda")


def test_inference_gets_no_training_advice_and_carry_over_is_shown(shared_traces, tmp_path):
    """tl_h100_qwen: a forward-only run (no autograd backward node, no optimizer) whose first 30% of kernel
    time was launched before profiling began."""
    (path,) = (shared_traces / "tl_h100_qwen").glob("*.json.gz")
    ev = [e for e in _events(path) if e.get("ph") == "X"]
    assert not any(re.search(r"Backward\d*$", str(e.get("name"))) or str(e.get("name")).startswith("Optimizer.")
                   for e in ev)
    launched = {e["args"]["correlation"] for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})}
    dev = sorted((_ns(e["ts"]), _ns(e["dur"]), e["args"].get("correlation") in launched)
                 for e in ev if e.get("cat") in DEVICE_CATS)
    first_linked = min(t for t, _, linked in dev if linked)
    carry = [(t, d) for t, d, linked in dev if not linked and t < first_linked]
    kernel_ns = sum(_ns(e["dur"]) for e in ev if e.get("cat") in DEVICE_CATS)
    a = _analyze(shared_traces / "tl_h100_qwen", tmp_path)
    (rank,) = a["sections"]["trace_kind"]["ranks"]
    assert rank["workload"] == "inference"
    assert {f["kind"] for f in a["findings"]}.isdisjoint({"recompute", "activation_dominated_peak"})
    assert not any("checkpoint" in (f["recommendation"] or "") for f in a["findings"])
    assert rank["carry_over"]["kernels"] == len(carry)
    assert rank["carry_over"]["ns"] == a["ranks"][0]["carry_over_ns"]
    assert rank["carry_over"]["share_of_kernel_time"] == pytest.approx(a["ranks"][0]["carry_over_ns"] / kernel_ns,
                                                                        rel=1e-3)
    assert any("launched before profiling" in n for n in a["sections"]["trace_kind"]["notes"])


def test_training_trace_is_training(shared_traces, tmp_path):
    a = _analyze(shared_traces / "hta_amd_mi250", tmp_path)
    (rank,) = a["sections"]["trace_kind"]["ranks"]
    assert rank["workload"] == "training" and rank["optimizer_steps"] >= 1 and rank["accelerator"] == "rocm"


def test_host_only_trace_says_so(shared_traces, tmp_path):
    """hta_rank_non_gpu: host ops only (its NCCL annotations show a GPU job whose device activity was not
    recorded)."""
    ev = _events(next((shared_traces / "hta_rank_non_gpu").glob("*.json.gz")))
    assert not any(str(e.get("cat")).lower() in DEVICE_CATS for e in ev)
    a = _analyze(shared_traces / "hta_rank_non_gpu", tmp_path)
    (rank,) = a["sections"]["trace_kind"]["ranks"]
    assert rank["accelerator"] is None
    assert any("no device events" in n for n in rank["notes"])


def _write(path: Path, events: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 1}}))
    return path


def test_mtia_device_events_by_their_categories(tmp_path):
    """An MTIA trace: device work in Kineto's `mtia_ccp_events`, launches in `mtia_runtime`."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100}]
    for i in range(3):
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10 * i + 1, "dur": 5})
        ev.append({"ph": "X", "cat": "mtia_runtime", "name": "launch", "pid": 1, "tid": 1, "ts": 10 * i + 2,
                   "dur": 2, "args": {"correlation": 100 + i}})
        ev.append({"ph": "X", "cat": "mtia_ccp_events", "name": f"kernel_{i}", "pid": 7, "tid": 3, "ts": 40 + 20 * i,
                   "dur": 10, "args": {"correlation": 100 + i}})
    _write(tmp_path / "in" / "rank0.json", ev)
    a = _analyze(tmp_path / "in", tmp_path)
    (rank,) = a["sections"]["trace_kind"]["ranks"]
    assert rank["accelerator"] == "mtia"
    assert any("mtia" in n for n in rank["notes"])
    row = a["ranks"][0]
    assert (row["step_ns"], row["compute_ns"]) == (50_000, 30_000)  # first kernel start to last kernel end


def test_single_step_does_not_judge_stability(shared_traces, tmp_path):
    a = _analyze(shared_traces / "hta_amd_mi250", tmp_path)
    assert a["ranks"][0]["steps"] == 1
    (st,) = a["sections"]["recording"]["verdict_stability"]
    assert st["stable"] is None and st["note"] == "1 step: cannot judge stability"
    assert not [f for f in a["findings"] if f["kind"] == "unstable_verdict"]


def test_unstable_verdict_text_states_the_rule_that_decided():
    from tracekit.analyze.recording import _finding, _stability

    def row(c, i):
        return {"compute_ns": c, "other_ns": 0, "exposed_comm_ns": 0, "sync_wait_ns": 0, "idle_ns": i,
                "step_ns": c + i}
    # two steps: the mean margin is large, but step 2's lead is only 4% of its time
    s = _stability(0, [row(900, 100), row(520, 480)])
    assert s["stable"] is False
    (f,) = _finding([s])
    assert "smallest lead is 4.0%" in f.summary and "spread" not in f.summary
    # many steps, noisy: the mean margin is compared with its standard error, quoted as such
    s = _stability(1, [row(600, 400), row(400, 600), row(650, 350), row(380, 620)])
    (f,) = _finding([s])
    assert "standard errors" in f.summary


def test_throughput_and_breakdown_share_one_step_time(shared_traces, tmp_path):
    """The H100 fixture's host runs ahead of its device: the throughput's step time is the breakdown's
    step window, not the host's ProfilerStep annotation."""
    repo = Path(__file__).resolve().parents[2]
    a = _analyze(repo / "fixtures" / "gpu_h100", tmp_path)
    steps = a["sections"]["breakdown"]["steps"]
    mean = sum(r["step_ns"] for r in steps) / len(steps)
    assert a["sections"]["throughput"]["step_ns_mean"] == pytest.approx(mean)


def test_a_collective_loop_gets_no_overlap_advice(shared_traces, tmp_path):
    """hta_gloo_cpu_rank34of300: one rank of a 300-rank gloo job whose step holds collectives and allocations
    only (read here from the raw JSON): no compute to hide them behind, so no `unoverlapped_collective`, and
    `communication_bound` is info with nothing to save (it was critical)."""
    (path,) = sorted((shared_traces / "hta_gloo_cpu_rank34of300").glob("*.json.gz"))
    ev = [e for e in _events(path) if e.get("ph") == "X"]
    (step,) = [e for e in ev if str(e["name"]).startswith("ProfilerStep#")]
    inside = [e for e in ev if e is not step and _ns(step["ts"]) <= _ns(e["ts"]) <= _ns(step["ts"]) + _ns(step["dur"])]
    comm = [e for e in inside if str(e["name"]).startswith("gloo:")]
    assert comm and {e["name"] for e in inside if e not in comm} <= {"aten::empty"}  # nothing but collectives
    a = _analyze(shared_traces / "hta_gloo_cpu_rank34of300", tmp_path)
    (rank,) = a["sections"]["trace_kind"]["ranks"]
    assert rank["workload"] == "communication" and a["sections"]["trace_kind"]["communication_ranks"] == [34]
    assert not [f for f in a["findings"] if f["kind"] == "unoverlapped_collective"]
    (cb,) = [f for f in a["findings"] if f["kind"] == "communication_bound"]
    assert cb["severity"] == "info" and cb["est_saving_ns"] == 0 and "nothing to overlap" in cb["summary"]


def test_a_host_gap_the_graph_cannot_replay_keeps_its_closed_form(shared_traces, tmp_path):
    """hta_gloo_cpu_rank34of300's step holds two asynchronous gloo all-reduces on side threads and nothing on
    its training thread: the replay graph holds no work of the rank, so "host stalls removed" replayed to 0.00
    ms under a warning. The finding now keeps its closed form, the step's time with no collective in flight
    (from the raw JSON: the step window less the union of the collectives inside it), and no replayed saving."""
    (path,) = sorted((shared_traces / "hta_gloo_cpu_rank34of300").glob("*.json.gz"))
    ev = [e for e in _events(path) if e.get("ph") == "X"]
    (step,) = [e for e in ev if str(e["name"]).startswith("ProfilerStep#")]
    lo, hi = _ns(step["ts"]), _ns(step["ts"]) + _ns(step["dur"])
    spans = sorted((max(_ns(e["ts"]), lo), min(_ns(e["ts"]) + _ns(e["dur"]), hi)) for e in ev
                   if str(e["name"]).startswith("gloo:") and _ns(e["ts"]) < hi and _ns(e["ts"]) + _ns(e["dur"]) > lo)
    covered, end = 0, lo
    for a, b in spans:
        covered += max(0, b - max(a, end))
        end = max(end, b)
    gap = (hi - lo) - covered
    a = _analyze(shared_traces / "hta_gloo_cpu_rank34of300", tmp_path)
    (f,) = [f for f in a["findings"] if f["kind"] == "idle_host_bound"]
    assert f["ranks"] == [34] and abs(f["evidence"]["stall_ns"] - gap) <= 1
    assert "replayed_saving_ns" not in f["evidence"] and abs(f["est_saving_ns"] - gap) <= 1
