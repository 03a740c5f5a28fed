"""Collective sizes and bandwidth timing on real NCCL traces (../shared/traces and the H100 fixture).

Expected sizes are read here from the raw JSON with plain arithmetic: the old schema's `nccl:<op>`
annotation carries the call's `Input Dims`/`Input type` (its enclosing `c10d::allreduce_` over a
TensorList records none); the modern schema's `record_param_comms` carries In/Out msg nelems and dtype.
"""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

import pytest

from tracekit.analyze.bandwidth import analyze_bandwidth
from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run

from tests.gpu_semantics.generator import covered

REPO = Path(__file__).resolve().parents[2]
ELEMENT = {"float": 4, "int": 4, "long": 8, "double": 8, "c10::half": 2, "c10::bfloat16": 2,
           "signed char": 1, "unsigned char": 1, "bool": 1, "short": 2,
           "Float": 4, "Int": 4, "Long": 8, "BFloat16": 2, "Half": 2}
OLD_SCHEMA = {"hta_alltoall_a100_rank0of16": "rank0.json.gz", "hta_trace_diff_control": "control.json.gz",
              "hta_sampled_2rank": "sampled_rank-0.json.gz", "hta_allreduce_v100_rank1of2": "df_index_resolver.json.gz"}


@lru_cache(maxsize=4)
def _events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def nccl_annotations(path: Path, op: str) -> list[tuple[int | None, str | None]]:
    """(element count or None when no dims were recorded, element type) of every `nccl:<op>` call."""
    out = []
    for e in _events(path):
        if e.get("ph") != "X" or e.get("name") != f"nccl:{op}":
            continue
        a = e.get("args", {})
        dims, types = a.get("Input Dims"), a.get("Input type")
        if not dims or not dims[0]:
            out.append((None, None))
        else:
            out.append((math.prod(dims[0]), (types or [None])[0]))
    return out


@pytest.fixture(scope="module")
def stores(shared_traces, tmp_path_factory):
    out = {}
    for name in OLD_SCHEMA:
        out[name] = parse_run(shared_traces / name, tmp_path_factory.mktemp(name), progress=False).store
    out["gpu_h100"] = parse_run(REPO / "fixtures" / "gpu_h100", tmp_path_factory.mktemp("h100"), progress=False).store
    return out


def _rows(store, op: str, rank: int) -> list[dict]:
    t = store.table("collectives", ["rank", "op", "bytes", "dtype", "dur", "source"]).to_pylist()
    return [r for r in t if r["op"] == op and r["rank"] == rank and r["source"] == "kineto"]


@pytest.mark.parametrize("name", sorted(OLD_SCHEMA))
def test_bucketed_all_reduce_is_sized_from_its_nccl_call_or_unknown(shared_traces, stores, name):
    raw = nccl_annotations(shared_traces / name / OLD_SCHEMA[name], "all_reduce")
    expect = Counter(None if n is None else n * ELEMENT[t] for n, t in raw)
    store = stores[name]
    rank = min(store.ranks())
    got = Counter(r["bytes"] for r in _rows(store, "all_reduce", rank))
    assert got == expect
    # unknown stays unknown downstream: no bandwidth figure, counted with the reason
    bw = _bandwidth(store)
    assert sum(u["count"] for u in bw["unsized"] if u["op"] == "all_reduce") == expect[None]
    if len(store.ranks()) == 1:  # several ranks' calls are one instance each only once matched
        assert sum(r["count"] for r in bw["rows"] if r["op"] == "all_reduce") == len(raw) - expect[None]


@pytest.mark.parametrize("name", ["hta_alltoall_a100_rank0of16", "hta_trace_diff_control", "hta_sampled_2rank"])
def test_int32_all_to_alls_are_sized(shared_traces, stores, name):
    raw = [(n, t) for n, t in nccl_annotations(shared_traces / name / OLD_SCHEMA[name], "all_to_all") if t == "int"]
    assert raw, "the trace has int32 all_to_alls"
    store = stores[name]
    ints = [r for r in _rows(store, "all_to_all", min(store.ranks())) if (r["dtype"] or "").lower() == "int"]
    assert len(ints) == len(raw)
    # max(in, out) elements x 4 bytes: at least the input the nccl call recorded
    assert sorted(r["bytes"] for r in ints) >= sorted(n * 4 for n, _ in raw)
    assert all(r["bytes"] is not None and r["bytes"] % 4 == 0 for r in ints)


def test_modern_schema_sizes_every_dtype_and_times_bandwidth_on_the_device(stores):
    expect: Counter = Counter()
    for e in _events(REPO / "fixtures" / "gpu_h100" / "rank0.pt.trace.json.gz"):
        a = e.get("args", {})
        if e.get("name") == "record_param_comms" and "In msg nelems" in a:
            expect[(a["Collective name"], max(a["In msg nelems"], a["Out msg nelems"]) * ELEMENT[a["dtype"]])] += 1
    store = stores["gpu_h100"]
    rows = store.table("collectives", ["op", "bytes", "dtype"]).to_pylist()
    assert Counter(r["bytes"] for r in rows) == Counter(b for (_, b) in expect.elements())
    assert {r["dtype"] for r in rows} >= {"Int", "Long", "BFloat16", "Float"}


def test_single_rank_bandwidth_is_timed_on_the_device(shared_traces, stores):
    # without a peer to match, an instance's time is its kernel's duration on the device, never its host
    # op's: the all_reduce rows' total time is the total of the all_reduce kernels' durations
    events = _events(shared_traces / "hta_trace_diff_control" / "control.json.gz")
    kernel_us = sum(e["dur"] for e in events if e.get("ph") == "X" and str(e.get("cat")).lower() == "kernel"
                    and e["name"].startswith("ncclKernel_AllReduce"))
    host_us = sum(e["dur"] for e in events if e.get("ph") == "X" and e.get("name") == "nccl:all_reduce")
    steps = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    rows = [r for r in _bandwidth(stores["hta_trace_diff_control"])["rows"] if r["op"] == "all_reduce"]
    total_ns = sum(r["time_ns_per_step"] for r in rows) * len(steps)
    assert total_ns == pytest.approx(kernel_us * 1000, rel=1e-9) and kernel_us != host_us
    for r in rows:
        assert r["algbw_gbps_p50"] == pytest.approx(r["bytes_p50"] / r["time_ns_p50"], rel=0.5)


def _bandwidth(store) -> dict:
    """The bandwidth analyzer alone (a single-rank trace has no cross-rank matching to wait for)."""
    return analyze_bandwidth(store, None, None, None, AnalysisConfig(isolate_analyzer_errors=False)).section


def _ns(v) -> int:
    return int(Decimal(str(v)) * 1000)


def test_real_h100_device_a_step_behind_is_binned_by_launch(stores):
    """The H100 fixture's host runs about a step ahead of its GPU. From the raw JSON: each kernel's step
    is the host ProfilerStep enclosing its launch (correlation); a GPU step spans from its first kernel
    to the next step's first kernel (the last: to its last kernel's end); compute = kernels, memcpy and
    memset = other device work."""
    doc = json.loads(gzip.decompress((REPO / "fixtures" / "gpu_h100" / "rank0.pt.trace.json.gz").read_bytes()),
                     parse_float=Decimal)
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    host_steps = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), int(e["name"].split("#")[1])) for e in ev
                  if e.get("cat") == "user_annotation" and str(e["name"]).startswith("ProfilerStep#")]
    launch_step = {}
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            t = _ns(e["ts"])
            launch_step[e["args"]["correlation"]] = next((s for lo, hi, s in host_steps if lo <= t < hi), None)
    device = [(e["cat"], _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), launch_step.get(e["args"].get("correlation")))
              for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    steps = sorted({s for *_, s in device if s is not None})
    first = {s: min(t for _, t, _, k in device if k == s) for s in steps}
    last_end = max(e for _, _, e, k in device if k == steps[-1])
    wins = {s: (first[s], first[steps[i + 1]] if i + 1 < len(steps) else last_end) for i, s in enumerate(steps)}
    # the device really lags: most of step N's kernel time comes after the host has left step N
    for lo, hi, s in host_steps:
        if s in first:
            mine = [(a, b) for _, a, b, k in device if k == s]
            assert covered(mine, hi, last_end) > covered(mine, lo, hi), s
    compute = [(a, b) for c, a, b, _ in device if c == "kernel"]
    other = [(a, b) for c, a, b, _ in device if c != "kernel"]
    a = analyze_store(stores["gpu_h100"], AnalysisConfig(isolate_analyzer_errors=False))
    rows = {r["step"]: r for r in a["sections"]["breakdown"]["steps"]}
    assert set(rows) == set(wins)
    for s, (lo, hi) in wins.items():
        assert (rows[s]["ts"], rows[s]["step_ns"]) == (lo, hi - lo)
        c = covered(compute, lo, hi)
        assert rows[s]["compute_ns"] == c
        assert rows[s]["other_ns"] == covered(compute + other, lo, hi) - c


def test_the_critical_path_composition_sums_to_the_step_where_a_step_outlasts_its_window(shared_traces, stores):
    """HTA's 16-rank all_to_all trace (rank 0): from the raw JSON, a kernel launched inside ProfilerStep N ends
    after the first kernel launched inside step N+1 began (GPU step windows tile: first kernel to the next
    step's first kernel). The path to the step's last node then runs past its window; the verdict read
    "compute streams 120% of the step ... through rank 0 (152%)". Each step's composition now sums to the step
    (`by_lane`, `by_category`) and the verdict's lane shares to the whole."""
    name = "hta_alltoall_a100_rank0of16"
    ev = [e for e in _events(shared_traces / name / OLD_SCHEMA[name]) if e.get("ph") == "X"]
    host_steps = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), int(e["name"].split("#")[1])) for e in ev
                  if str(e.get("name", "")).startswith("ProfilerStep#")]
    launch_step = {}
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime") and "correlation" in e.get("args", {}):
            t = _ns(e["ts"])
            launch_step[e["args"]["correlation"]] = next((s for lo, hi, s in host_steps if lo <= t < hi), None)
    kern = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), launch_step.get(e["args"].get("correlation")))
            for e in ev if e.get("cat") in ("kernel", "Kernel")]
    steps = sorted({s for *_, s in kern if s is not None})
    first = {s: min(a for a, _, k in kern if k == s) for s in steps}
    past = [s for s, n in zip(steps, steps[1:]) if max(b for _, b, k in kern if k == s) > first[n]]
    assert past, "no step whose kernels outlast the next step's first kernel"
    a = analyze_store(stores[name], AnalysisConfig(isolate_analyzer_errors=False, advice=False))
    cp = a["sections"]["critical_path"]
    _parts_sum_to_the_step(cp)
    # the device idles 64% of the window (breakdown) with no launch, host op or dependency the trace shows
    # holding it: the path's gaps on device streams are device idle, not compute
    assert cp["verdict"]["bound"] == "device-idle-bound"


def _parts_sum_to_the_step(cp: dict) -> None:
    for st in cp["steps"]:
        c = st["composition"]
        assert sum(c["by_lane"].values()) == c["step_ns"] == sum(c["by_category"].values()), st["step"]
        assert min(list(c["by_lane"].values()) + list(c["by_category"].values())) >= 0, st["step"]
        assert all(v <= c["step_ns"] for v in c["by_rank"].values())
    assert sum(cp["verdict"]["lane_shares"].values()) == pytest.approx(1.0, abs=1e-3)


def test_a_kernel_that_starts_before_its_launch_returns_is_counted_once(shared_traces, tmp_path):
    """hta_triton: one ProfilerStep whose one kernel (from the raw JSON) starts before its launch call returns
    and ends first. The composition counted the launch and the kernel both, and a negative gap between:
    "host threads 133% of the step", the kernel -33%. Each instant of the step now counts once."""
    (path,) = sorted((shared_traces / "hta_triton").glob("*.json*"))
    ev = [e for e in _events(path) if e.get("ph") == "X"]
    kern = [e for e in ev if e.get("cat") == "kernel"]
    launch = {e["args"]["correlation"]: e for e in ev
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    early = [k for k in kern if k["args"].get("correlation") in launch
             and _ns(k["ts"]) < _ns(launch[k["args"]["correlation"]]["ts"]) + _ns(launch[k["args"]["correlation"]]["dur"])]
    assert early
    store = parse_run(shared_traces / "hta_triton", tmp_path / "s", progress=False).store
    a = analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False, advice=False))
    _parts_sum_to_the_step(a["sections"]["critical_path"])
