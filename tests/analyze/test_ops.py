"""Ops and kernels on real traces: shapes kept in the events table, the ops table's FLOPs and device time,
achieved TFLOP/s, MFU and the kernel summary, each against an independent computation from the raw JSON
(plain json/gzip, integer ns, the formulas of docs/metrics.md written out again here)."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pyarrow.compute as pc
import pytest

import tracekit
from tracekit.analyze.hardware import device_peaks
from tracekit.parse.kineto import parse_kineto

QWEN = "tl_h100_qwen"
COMPILE = "tl_compile_triton"


def _trace_file(shared: Path, name: str) -> Path:
    return next(p for p in sorted((shared / name).iterdir()) if ".json" in p.name)


def _raw(path: Path) -> dict:
    with gzip.open(path, "rt") as fh:
        return json.load(fh, parse_float=Decimal)


def _ns(v) -> int:
    return int((Decimal(v) * 1000).to_integral_value())


class Independent:
    """The trace read with plain json: CPU ops by External id, kernels grouped by their External id."""

    def __init__(self, path: Path) -> None:
        doc = _raw(path)
        self.events = doc["traceEvents"]
        self.ops = {e["args"]["External id"]: e for e in self.events
                    if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
        self.kernels: dict[int, list] = defaultdict(list)
        for e in self.events:
            if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and "External id" in e.get("args", {}):
                self.kernels[e["args"]["External id"]].append(e)
        self.device = doc["deviceProperties"][0]["name"]

    def launching_ops(self):
        for ext, ks in self.kernels.items():
            if ext in self.ops:
                yield ext, self.ops[ext], sum(_ns(k["dur"]) for k in ks)


def gemm_flops(name: str, dims: list) -> int | None:
    """2·M·N·K (+ M·N for addmm's bias add), written out from the Input Dims."""
    if name == "aten::mm":
        (m, k), (_, n) = dims[0], dims[1]
        return 2 * m * n * k
    if name == "aten::addmm":
        (m, k), (_, n) = dims[1], dims[2]
        return 2 * m * n * k + m * n
    if name == "aten::bmm":
        (b, m, k), (_, _, n) = dims[0], dims[1]
        return 2 * b * m * n * k
    return None


@pytest.fixture(scope="module")
def analyzed(shared_traces, tmp_path_factory):
    out = {}
    for name in (QWEN, COMPILE):
        run = tracekit.analyze_run(shared_traces / name, tmp_path_factory.mktemp(name) / "out")
        out[name] = (run, Independent(_trace_file(shared_traces, name)))
    return out


def test_shapes_of_every_cpu_op_are_kept(shared_traces):
    path = _trace_file(shared_traces, QWEN)
    events = parse_kineto(path).tables["events"]
    rows = events.filter(pc.equal(events["cat"].cast("string"), "cpu_op")).select(
        ["external_id", "input_dims", "input_types", "input_strides", "concrete_inputs"]).to_pylist()
    got = {r["external_id"]: r for r in rows}
    ind = Independent(path)
    checked = 0
    for ext, e in ind.ops.items():
        a = e["args"]
        if "Input Dims" not in a:
            continue
        r = got[ext]
        for col, key in (("input_dims", "Input Dims"), ("input_types", "Input type"),
                         ("input_strides", "Input Strides"), ("concrete_inputs", "Concrete Inputs")):
            assert json.loads(r[col]) == a[key], (ext, col)
        checked += 1
    assert checked == sum(1 for e in ind.ops.values() if "Input Dims" in e["args"]) > 4000


@pytest.mark.parametrize("trace", [QWEN, COMPILE])
def test_every_gemm_flops_and_device_time_match_the_shapes(analyzed, trace):
    run, ind = analyzed[trace]
    ops = {r["external_id"]: r for r in run.store.table("ops").to_pylist()}
    gemms = 0
    for ext, e, kernel_ns in ind.launching_ops():
        want = gemm_flops(e["name"], e["args"]["Input Dims"])
        if want is None:
            continue
        row = ops[ext]
        assert row["category"] == "gemm"
        assert row["flops"] == want, (e["name"], e["args"]["Input Dims"])
        assert row["kernel_ns"] == kernel_ns
        gemms += 1
    assert gemms == (169 if trace == QWEN else 7)


@pytest.mark.parametrize("trace", [QWEN, COMPILE])
def test_gemm_tflops_per_op_within_2_percent(analyzed, trace):
    run, ind = analyzed[trace]
    flops, ns = defaultdict(int), defaultdict(int)
    for _, e, kernel_ns in ind.launching_ops():
        want = gemm_flops(e["name"], e["args"]["Input Dims"])
        if want is not None:
            key = (e["name"], json.dumps(e["args"]["Input Dims"], separators=(",", ":")))
            flops[key] += want
            ns[key] += kernel_ns
    top = {(r["name"], r["input_dims"]): r for r in run.analysis["sections"]["ops"]["top_ops"]}
    for key in flops:
        want = flops[key] / ns[key] / 1e3
        assert top[key]["tflops"] == pytest.approx(want, rel=0.02)
    gemm = run.analysis["sections"]["ops"]["gemm"]
    assert gemm["shapes"] == len(flops)
    assert gemm["tflops"] == pytest.approx(sum(flops.values()) / sum(ns.values()) / 1e3, rel=0.02)


def test_attention_flops_causal_from_the_trace(analyzed):
    run, ind = analyzed[QWEN]
    ops = {r["external_id"]: r for r in run.store.table("ops").to_pylist()}
    n = 0
    for ext, e, _ in ind.launching_ops():
        if e["name"] != "aten::_flash_attention_forward":
            continue
        (b, s, h, d) = e["args"]["Input Dims"][0]
        causal = e["args"]["Concrete Inputs"][8] == "True"
        pairs = sum(min(i + 1, s) for i in range(s)) if causal else s * s
        assert ops[ext]["flops"] == 2 * b * h * pairs * (d + d)
        n += 1
    assert n == 24


def test_mfu_is_present_and_follows_its_definition(analyzed):
    run, ind = analyzed[QWEN]
    (rank,) = run.analysis["sections"]["ops"]["ranks"]
    peak = device_peaks(ind.device).tflops["bf16"]
    assert rank["peak_tflops"] == peak == 989.4
    gemm_flops_total = sum(gemm_flops(e["name"], e["args"]["Input Dims"]) or 0 for _, e, _ in ind.launching_ops())
    assert rank["model_flops"] >= gemm_flops_total
    assert rank["achieved_tflops"] == pytest.approx(rank["model_flops"] / rank["step_ns"] / 1e3)
    assert rank["mfu"] == pytest.approx(rank["achieved_tflops"] / peak)
    assert 0 < rank["mfu"] < 1


def test_kernel_summary_counts_every_kernel(analyzed):
    run, ind = analyzed[QWEN]
    want = defaultdict(lambda: [0, 0])
    for e in ind.events:
        if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"):
            w = want[e["name"]]
            w[0] += 1
            w[1] += _ns(e["dur"])
    got = defaultdict(lambda: [0, 0])
    for r in run.store.table("kernel_summary").to_pylist():
        got[r["name"]][0] += r["count"]
        got[r["name"]][1] += r["total_ns"]
    assert dict(got) == dict(want)


def test_ops_table_is_queryable(analyzed):
    run, _ = analyzed[COMPILE]
    t = run.store.sql("SELECT gemm_m, gemm_n, gemm_k, sum(kernel_ns) AS ns FROM ops WHERE category = 'gemm' "
                      "GROUP BY ALL ORDER BY ns DESC")
    assert t.column("gemm_m").to_pylist()[0] == 32768 and t.column("gemm_n").to_pylist()[0] == 8192
