"""HFU beside MFU on a hand-built GPU training step with activation checkpointing (H100, bf16): the
checkpointed block's forward (a `linear` and a `matmul`) runs once in forward and again inside backward
(under the autograd engine's CheckpointFunctionBackward), then its backward GEMMs run. MFU counts the model's
FLOPs (the recomputed forward left out); HFU counts every FLOP the device ran. Expected values from the
trace's own numbers and the documented GEMM formulas (docs/metrics.md §11), computed here."""

from __future__ import annotations

import json

import pytest

import tracekit

PEAK_BF16 = 989.4  # H100 SXM dense bf16, TFLOP/s (data sheet)
M, N, K = 2048, 4096, 1024
BF16 = "c10::BFloat16"


def _trace(checkpointed: bool, node: str = "CheckpointFunction") -> dict:
    ev: list[dict] = []
    ids = {"ext": 1, "dev": 1_000_100}

    def op(name, ts, dur, tid, children=(), dims=None, kernel_us=None):
        """A CPU op; a leaf with `kernel_us` launches one kernel (External id / correlation joined)."""
        args = {}
        if kernel_us is not None:
            e = ids["ext"]
            ids["ext"] += 1
            args = {"External id": e, "Input Dims": dims, "Input type": [BF16] * len(dims),
                    "Concrete Inputs": [""] * len(dims)}
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid,
                       "ts": ts + 1, "dur": 1, "args": {"External id": e, "correlation": e}})
            ev.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "pid": 0, "tid": 7,
                       "ts": ids["dev"], "dur": kernel_us,
                       "args": {"External id": e, "correlation": e, "device": 0, "stream": 7}})
            ids["dev"] += kernel_us + 1
        ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
                   "args": args})
        for c in children:
            c()

    def block(t0, tid):
        """The block's forward: linear (→ addmm with bias) then matmul (→ mm)."""
        op("aten::linear", t0, 10, tid,
           [lambda: op("aten::t", t0 + 1, 1, tid),
            lambda: op("aten::addmm", t0 + 3, 5, tid, dims=[[N], [M, K], [K, N]], kernel_us=100)])
        op("aten::matmul", t0 + 12, 10, tid,
           [lambda: op("aten::mm", t0 + 14, 5, tid, dims=[[M, N], [N, K]], kernel_us=100)])

    ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1_000_000,
               "dur": 2_000, "args": {}})
    block(1_000_010, 1)
    # backward on the autograd thread: the checkpoint's node re-runs the forward, then each GEMM's backward
    bt = 1_000_100
    if checkpointed:
        op(f"autograd::engine::evaluate_function: {node}Backward", bt, 40, 2,
           [lambda: op(f"{node}Backward", bt + 1, 38, 2, [lambda: block(bt + 2, 2)])])
    bt += 50
    op("autograd::engine::evaluate_function: MmBackward0", bt, 30, 2,
       [lambda: op("MmBackward0", bt + 1, 28, 2,
                   [lambda: op("aten::mm", bt + 2, 5, 2, dims=[[M, K], [K, N]], kernel_us=100),
                    lambda: op("aten::mm", bt + 10, 5, 2, dims=[[N, M], [M, K]], kernel_us=100)])])
    bt += 40
    op("autograd::engine::evaluate_function: AddmmBackward0", bt, 30, 2,
       [lambda: op("AddmmBackward0", bt + 1, 28, 2,
                   [lambda: op("aten::mm", bt + 2, 5, 2, dims=[[M, N], [N, K]], kernel_us=100),
                    lambda: op("aten::mm", bt + 10, 5, 2, dims=[[K, M], [M, N]], kernel_us=100)])])
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, "traceEvents": ev}


def _analyze(tmp_path_factory, checkpointed: bool, node: str = "CheckpointFunction"):
    d = tmp_path_factory.mktemp("hfu")
    (d / "trace").mkdir()
    (d / "trace" / "rank0.json").write_text(json.dumps(_trace(checkpointed, node)))
    return tracekit.analyze_run(d / "trace", d / "out")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {c: _analyze(tmp_path_factory, c) for c in (True, False)}


def test_hfu_counts_the_recomputed_forward_and_mfu_does_not(runs):
    (r,) = runs[True].analysis["sections"]["ops"]["ranks"]
    forward = (2 * M * N * K + M * N) + 2 * M * K * N  # addmm (with its bias add) + mm
    backward = 4 * 2 * M * N * K  # four GEMMs of the same size
    assert r["recompute_flops"] == forward and r["recompute_ops"] == 2
    assert r["model_flops"] == forward + backward
    assert r["hardware_flops"] == 2 * forward + backward
    step = r["step_ns"]
    assert r["mfu"] == pytest.approx((forward + backward) / step / 1e3 / PEAK_BF16)
    assert r["hfu"] == pytest.approx((2 * forward + backward) / step / 1e3 / PEAK_BF16)
    assert r["hfu"] > r["mfu"]


def test_without_recompute_hfu_equals_mfu(runs):
    (r,) = runs[False].analysis["sections"]["ops"]["ranks"]
    assert r["recompute_flops"] == 0 and r["recompute_ops"] == 0
    assert r["hfu"] == r["mfu"] and r["model_flops"] == r["hardware_flops"]


def test_a_custom_functions_own_backward_is_not_a_recompute(runs, tmp_path_factory):
    """The same forward-named ops inside a custom autograd Function's backward (ring attention's
    `_RingAttentionBackward` runs matmuls of its own; no checkpointing in this run): that Function's
    backward formula, not a re-run forward (the runtime demo, cp=2 without --activation-checkpointing,
    reported a `recompute` finding)."""
    run = _analyze(tmp_path_factory, True, node="_RingAttention")
    (r,) = run.analysis["sections"]["ops"]["ranks"]
    assert r["recompute_flops"] == 0 and r["recompute_ops"] == 0 and r["hfu"] == r["mfu"]
    assert "recompute" not in {f["kind"] for f in run.analysis["findings"]}
    assert "recompute" in {f["kind"] for f in runs[True].analysis["findings"]}  # the checkpoint's re-run is one


def test_the_report_shows_hfu_beside_mfu(runs):
    html = (runs[True].out / "report.html").read_text()
    assert "HFU" in html and "MFU" in html
    md = (runs[True].out / "summary.md").read_text()
    assert "HFU" in md
