"""Device copies on the critical path (`memcpy_on_critical_path`), on hand-built one-step H100 traces: a GEMM,
then a blocking device-to-host copy the host waits for (`cudaMemcpy`), then an add the host launches only
after it — the step runs through the copy; the same copy made asynchronous on a side stream, overlapped with
the GEMM and waited for by nobody — it does not. Expected values from the trace's own numbers: the copy's
time on the path is its duration, and with the copy hidden the step is the GEMM, the host's gap after the
copy returns and the add (docs/metrics.md, critical path)."""

from __future__ import annotations

import json

import pytest

import tracekit

GEMM_US, COPY_US, ADD_US = 1000, 500, 400
BF16 = "c10::BFloat16"


def _trace(blocking: bool) -> dict:
    ev: list[dict] = []

    def x(cat, name, ts, dur, tid, args=None, pid=1):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
                   "args": args or {}})

    def kernel(cat, name, ts, dur, ext, stream):
        x(cat, name, ts, dur, stream, {"External id": ext, "correlation": ext, "device": 0, "stream": stream}, pid=0)

    x("user_annotation", "ProfilerStep#1", 1000, 3000, 1)
    x("cpu_op", "aten::mm", 1010, 10, 1, {"External id": 1, "Input Dims": [[1024, 1024], [1024, 1024]],
                                          "Input type": [BF16] * 2, "Concrete Inputs": ["", ""]})
    x("cuda_runtime", "cudaLaunchKernel", 1012, 5, 1, {"External id": 1, "correlation": 1})
    kernel("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", 1020, GEMM_US, 1, 7)
    copy = {"External id": 2, "Input Dims": [[1024, 1024], [1024, 1024], []],
            "Input type": ["float", BF16, "Scalar"], "Concrete Inputs": ["", "", "False"]}
    if blocking:  # after the GEMM on its stream; the host waits in cudaMemcpy until the copy ends
        copy_start = 1020 + GEMM_US
        copy_end = copy_start + COPY_US
        x("cpu_op", "aten::copy_", 1030, copy_end + 2 - 1030, 1, copy)
        x("cuda_runtime", "cudaMemcpy", 1032, copy_end + 1 - 1032, 1, {"External id": 2, "correlation": 2})
        kernel("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", copy_start, COPY_US, 2, 7)
        t = copy_end + 10
    else:  # asynchronous on a side stream, overlapped with the GEMM; nobody waits for it
        x("cpu_op", "aten::copy_", 1030, 10, 1, copy)
        x("cuda_runtime", "cudaMemcpyAsync", 1032, 5, 1, {"External id": 2, "correlation": 2})
        kernel("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 1040, COPY_US, 2, 8)
        t = 1050
    x("cpu_op", "aten::add", t, 10, 1, {"External id": 3, "Input Dims": [[1024, 1024], [1024, 1024], []],
                                        "Input type": [BF16, BF16, "Scalar"], "Concrete Inputs": ["", "", "1"]})
    x("cuda_runtime", "cudaLaunchKernel", t + 2, 5, 1, {"External id": 3, "correlation": 3})
    kernel("kernel", "void at::native::vectorized_elementwise_kernel<4, add>", max(t + 10, 1020 + GEMM_US),
           ADD_US, 3, 7)
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, "traceEvents": ev}


def _analyze(tmp_path, blocking: bool) -> dict:
    (tmp_path / "trace").mkdir()
    (tmp_path / "trace" / "rank0.json").write_text(json.dumps(_trace(blocking)))
    return tracekit.analyze_run(tmp_path / "trace", tmp_path / "out").analysis


def test_a_blocking_copy_on_the_path_is_found_with_its_replayed_saving(tmp_path):
    a = _analyze(tmp_path, True)
    (f,) = [f for f in a["findings"] if f["kind"] == "memcpy_on_critical_path"]
    step_us = GEMM_US + COPY_US + 10 + 10 + ADD_US  # first kernel start to last kernel end
    assert a["sections"]["critical_path"]["steps"][0]["measured_ns"] == step_us * 1000
    ev = f["evidence"]
    assert ev["on_path_ns_per_step"] == COPY_US * 1000 and ev["by_direction_ns_per_step"] == {"DtoH": COPY_US * 1000}
    assert ev["share_of_step"] == pytest.approx(COPY_US / step_us)
    assert f["severity"] == "critical"  # 26% of the step: ≥ 25%
    # replayed with the copy hidden: the GEMM, the host's 10 µs after the copy returned, the launch, the add
    assert ev["replayed_step_ns"] == (step_us - COPY_US) * 1000
    assert f["est_saving_ns"] == ev["replayed_saving_ns"] == COPY_US * 1000
    assert "DtoH 0.50 ms" in f["summary"] and "non_blocking" in f["recommendation"]


def test_an_overlapped_copy_is_not_on_the_path(tmp_path):
    a = _analyze(tmp_path, False)
    assert not [f for f in a["findings"] if f["kind"] == "memcpy_on_critical_path"]
