"""Throughput analyzer: tokens/s from the manifest or config, achieved FLOP/s and MFU from op FLOPs."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tracekit.analyze.throughput import analyze_throughput, device_peak_tflops
from tracekit.config import AnalysisConfig

MS = 1_000_000


def _store(path, manifest, devices):
    from tracekit.tables.store import RunStoreWriter

    w = RunStoreWriter(path, meta={"manifest": manifest})
    w.append("ranks", pa.table({"rank": pa.array([0, 1], pa.int32()),
                                "device_names": pa.array(devices, pa.list_(pa.string()))}))
    for r, durs in ((0, [100 * MS, 120 * MS]), (1, [110 * MS, 100 * MS])):
        w.append("steps", pa.table({"rank": pa.array([r, r], pa.int32()), "step": pa.array([5, 6], pa.int32()),
                                    "ts": [0, 200 * MS], "dur": durs}))
        # 3 ops with flops per step, one event outside the steps (ignored), one without flops
        w.append("events", pa.table({"rank": pa.array([r] * 8, pa.int32()),
                                     "name": ["aten::mm"] * 8, "ts": list(range(8)), "dur": [1] * 8,
                                     "step": pa.array([5, 5, 5, 6, 6, 6, None, 6], pa.int32()),
                                     "flops": [1e12, 2e12, 3e12, 1e12, 1e12, 1e12, 9e15, None]}))
    return w.close()


def test_tokens_and_mfu(tmp_path):
    store = _store(tmp_path / "s", {"tokens_per_step": 4096, "config": {"dp": 2}},
                   [["NVIDIA A100-SXM4-80GB"], ["NVIDIA A100-SXM4-80GB"]])
    sec = analyze_throughput(store, None, AnalysisConfig()).section
    # slowest rank per step: 110 ms and 120 ms
    assert sec["step_ns_mean"] == pytest.approx(115 * MS)
    assert sec["tokens_per_s"] == pytest.approx(4096 / 0.115)
    assert sec["tokens_per_s_per_device"] == pytest.approx(4096 / 0.115 / 2)
    r0 = sec["ranks"][0]
    assert r0["flops_per_step"] == pytest.approx((6e12 + 3e12) / 2)
    assert r0["achieved_tflops"] == pytest.approx(9e12 / 0.220 / 1e12)
    assert r0["peak_tflops"] == 312.0 and r0["mfu"] == pytest.approx(9e12 / 0.220 / 312e12)
    assert r0["tokens_per_s"] == pytest.approx(2048 / 0.110)
    # user peak wins; per-replica tokens from config are scaled by dp
    sec = analyze_throughput(store, None, AnalysisConfig(peak_tflops=100.0, tokens_per_step=1000)).section
    assert sec["ranks"][1]["mfu"] == pytest.approx(9e12 / 0.210 / 100e12)
    assert sec["tokens_per_step"] == 2000 and sec["tokens_source"] == "config"


def test_cpu_has_no_peak(tmp_path):
    store = _store(tmp_path / "s", {}, [[], []])
    sec = analyze_throughput(store, None, AnalysisConfig()).section
    assert sec["tokens_per_s"] is None and sec["ranks"][0]["mfu"] is None
    assert sec["ranks"][0]["achieved_tflops"] is not None


def test_device_table():
    # dense bf16 (V100: fp16) tensor peaks from the vendors' data sheets, in TFLOP/s
    assert device_peak_tflops("NVIDIA H100 80GB HBM3") == pytest.approx(989.4, abs=0.5)
    assert device_peak_tflops("NVIDIA H100 PCIe") == pytest.approx(756.5, abs=0.5)
    assert device_peak_tflops("AMD Instinct MI250X") == pytest.approx(383.0, abs=0.5)
    assert device_peak_tflops("AMD Instinct MI300X") == pytest.approx(1307.4, abs=0.5)
    assert device_peak_tflops("Tesla V100-SXM2-16GB") == 125.0
    assert device_peak_tflops("cpu") is None
