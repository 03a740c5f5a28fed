"""The ops analyzer's findings on a small hand-built GPU trace (H100): a GEMM far below its roof that
dominates the kernel time, and a kernel launched many times per step at a few µs each. Expected values
are computed here from the trace's own numbers and the documented thresholds (docs/metrics.md §11)."""

from __future__ import annotations

import json

import pytest

import tracekit

PEAK_BF16 = 989.4  # H100 SXM dense bf16, TFLOP/s (data sheet)
M = N = K = 4096
GEMM_US = 2000  # 2·4096³ FLOP in 2 ms: 68.7 TFLOP/s, 7% of the roof
TINY = 120  # tiny elementwise kernels per step
TINY_US = 2


def _trace() -> dict:
    ev, t, ext, corr = [], 1_000_000, 1, 1
    ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": t,
               "dur": 10_000, "args": {}})
    dev_t = t + 100

    def launch(name, dims, types, kernel, dur):
        nonlocal t, ext, corr, dev_t
        ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": t + 1, "dur": 5,
                   "args": {"External id": ext, "Input Dims": dims, "Input type": types,
                            "Concrete Inputs": [""] * len(dims)}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 2,
                   "dur": 2, "args": {"External id": ext, "correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": dev_t, "dur": dur,
                   "args": {"External id": ext, "correlation": corr, "device": 0, "stream": 7}})
        t, ext, corr, dev_t = t + 8, ext + 1, corr + 1, dev_t + dur + 1

    launch("aten::mm", [[M, K], [K, N]], ["c10::BFloat16"] * 2, "sm90_xmma_gemm_bf16bf16_bf16f32", GEMM_US)
    for _ in range(TINY):
        launch("aten::add", [[256], [256], []], ["c10::BFloat16", "c10::BFloat16", "Scalar"],
               "void at::native::vectorized_elementwise_kernel<4, add>", TINY_US)
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, "traceEvents": ev}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("ops_findings")
    (d / "trace").mkdir()
    (d / "trace" / "rank0.json").write_text(json.dumps(_trace()))
    return tracekit.analyze_run(d / "trace", d / "out")


def test_a_gemm_far_below_its_roof_is_found_with_its_saving(run):
    (f,) = [f for f in run.analysis["findings"] if f["kind"] == "low_op_efficiency"]
    flops = 2 * M * N * K
    tflops = flops / (GEMM_US * 1000) / 1e3
    assert f["evidence"]["tflops"] == pytest.approx(tflops)
    assert f["evidence"]["pct_of_roof"] == pytest.approx(tflops / PEAK_BF16)
    target_ns = flops / (0.7 * PEAK_BF16 * 1e3)  # its time at 70% of the roof
    closed_form = int(GEMM_US * 1000 - target_ns)
    saving = f["evidence"].get("closed_form_saving_ns", f["est_saving_ns"])
    assert saving == closed_form
    assert "4096,4096,4096" in f["summary"]


def test_many_tiny_launches_are_found(run):
    (f,) = [f for f in run.analysis["findings"] if f["kind"] == "launch_bound_kernels"]
    d = f["evidence"]
    assert d["count"] == TINY and d["mean_ns"] == TINY_US * 1000
    assert d["launch_share"] == pytest.approx(TINY / (TINY + 1))


def test_mfu_of_the_step(run):
    (r,) = run.analysis["sections"]["ops"]["ranks"]
    flops = 2 * M * N * K + TINY * 256  # the GEMM and one FLOP per element of each add
    assert r["model_flops"] == flops
    assert r["mfu"] == pytest.approx(flops / r["step_ns"] / 1e3 / PEAK_BF16)
