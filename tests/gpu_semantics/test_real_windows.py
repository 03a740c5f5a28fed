"""The breakdown of every single-GPU trace in ../shared/traces against an independent first-to-last
device event computation (TraceLens's window), and the rule tracekit says it used.

Expected numbers are computed here from the raw JSON (plain `json`, `Decimal` µs → integer ns): the window
runs from the first device event's start to the last one's end (kernel / memcpy / memset, any spelling of
the category); busy = the union of device events; compute = kernels that are not NCCL/RCCL kernels.
tracekit bins device work by step where the trace has steps (and leaves out kernels launched before
profiling), so its shares, not its spans, are compared: within 1 percentage point.
"""

from __future__ import annotations

import functools
import gzip
import json
from decimal import Decimal
from pathlib import Path

import pytest

from tracekit.analyze.breakdown import analyze_breakdown
from tracekit.config import AnalysisConfig
from tracekit.parse.run import parse_run

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
SINGLE_GPU = {  # folder -> its one Kineto trace with device events
    "hta_allreduce_v100_rank1of2": "df_index_resolver.json.gz",
    "hta_alltoall_a100_rank0of16": "rank0.json.gz",
    "hta_amd_mi250": "mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta_critical_path_alexnet": "benchmark_result_2869224_1695835535_trace.json.gz",
    "hta_cuda_event_sync_multi_stream": "event_sync_trace.json.gz",
    "hta_mixed_et_and_kineto": "benchmark_simple_add_trace.json.gz",
    "hta_nccl_a100_rank0of2": "nccl_data.json.gz",
    "hta_trace_diff_control": "control.json.gz",
    "hta_trace_diff_test": "test.json.gz",
    "hta_triton": "triton_example.json.gz",
    "kineto_resnet50_2021_workers0": "worker0.1623143089861.pt.trace.json.gz",
    "kineto_resnet50_2021_workers4": "worker0.1623212756351.pt.trace.json.gz",
    "tl_compile_triton": "trace.json.gz",
    "tl_h100_qwen": "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tl_sglang_bs32": "bs_32_rank0.json.gz",
    "tl_sglang_dsr1_decode_b300_1gpu": "1782843274.7730265-TP-0-DECODE.trace.json.gz",
    "tl_sglang_dsr1_decode_mi300_1gpu": "1782841132.2905657-TP-0-DECODE.trace.json.gz",
    "tl_sglang_qwen3moe_decode_b300_1gpu": "1782799835.6885648-TP-0-DECODE.trace.json.gz",
    "tl_sglang_qwen3moe_decode_mi300_1gpu": "1782859605.7198358-TP-0-DECODE.trace.json.gz",
    "tl_vllm_graph_capture": "graph_capture_rank_0.1773709742341309550.pt.trace.json.gz",
}


def _ns(v) -> int:
    return int(Decimal(str(v)) * 1000)


def _doc(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)


def _device_events(doc: dict) -> list[tuple[int, int, bool]]:
    """(start ns, end ns, is compute) of every device event with a duration."""
    out = []
    for e in doc.get("traceEvents", []):
        if not isinstance(e, dict) or e.get("ph") != "X" or str(e.get("cat", "")).lower() not in DEVICE_CATS:
            continue
        if e.get("dur") is None or Decimal(str(e["dur"])) < 0:
            continue
        comm = str(e.get("name", "")).lower().startswith(("nccl", "rccl"))
        out.append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), str(e["cat"]).lower() == "kernel" and not comm))
    return out


@functools.lru_cache(maxsize=None)
def _facts(path: Path) -> tuple[bool, tuple[tuple[int, int, bool], ...], bool]:
    """Whether the file is a JSON object, its device events (`_device_events`) and whether it has a
    ProfilerStep: each file read once for the module (the list test reads them all, each folder's test its one)."""
    doc = _doc(path)
    if not isinstance(doc, dict):
        return False, (), False
    dev = tuple(_device_events(doc))
    return True, dev, bool(dev) and _has_profiler_step(doc)  # a file with device events has traceEvents


def _covered(iv: list[tuple[int, int]]) -> int:
    total, cur = 0, None
    for a, b in sorted(iv):
        if cur is None or a > cur:
            total += b - a
            cur = b
        elif b > cur:
            total += b - cur
            cur = b
    return total


def _has_profiler_step(doc: dict) -> bool:
    return any(isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep#") for e in doc["traceEvents"])


def test_the_list_is_every_single_gpu_set(shared_traces):
    """Every folder whose Kineto traces hold device events in exactly one file is in SINGLE_GPU."""
    found = {}
    for d in sorted(p for p in shared_traces.iterdir() if p.is_dir()):
        gpu = []
        for f in sorted(d.glob("*.json.gz")):
            is_dict, dev, _ = _facts(f)
            if is_dict and dev:
                gpu.append(f.name)
        if len(gpu) == 1 and not d.name.endswith("_merged"):
            found[d.name] = gpu[0]
    assert found == SINGLE_GPU


@pytest.mark.parametrize("folder", sorted(SINGLE_GPU))
def test_breakdown_within_1pp_of_first_to_last_device_event(shared_traces, tmp_path, folder):
    _, dev, has_profiler_step = _facts(shared_traces / folder / SINGLE_GPU[folder])
    lo, hi = min(a for a, _, _ in dev), max(b for _, b, _ in dev)
    span = hi - lo
    busy = _covered([(a, b) for a, b, _ in dev])
    compute = _covered([(a, b) for a, b, c in dev if c])
    store = parse_run(shared_traces / folder, tmp_path / "store", progress=False).store
    bd = analyze_breakdown(store, None, None, AnalysisConfig(isolate_analyzer_errors=False)).section
    (row,) = bd["ranks"]
    (detail,) = bd["rank_details"]
    assert abs(row["idle_ns"] / row["step_ns"] - (span - busy) / span) < 0.01
    assert abs(row["compute_ns"] / row["step_ns"] - compute / span) < 0.01
    # the rule is said, and is the one the trace supports
    if has_profiler_step:
        assert detail["step_rule"] == "profiler_step"
    else:
        assert detail["step_rule"] in ("device_span", "optimizer_step", "graph_launch", "repeated_ops")
        if detail["step_rule"] == "device_span":  # one window: exactly first to last device event
            assert (row["step_ns"], bd["steps"][0]["ts"]) == (span, lo)
        else:
            assert row["steps"] >= 2
