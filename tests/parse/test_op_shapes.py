"""Each FLOP / byte formula of parse/op_shapes.py against an independent computation (brute-force counts
written out here), and the device peak table's matching of real deviceProperties names."""

from __future__ import annotations

import itertools

import pytest

from tracekit.analyze.hardware import device_peaks
from tracekit.parse.op_shapes import causal_pairs, op_cost

BF16 = "c10::BFloat16"


def _cost(name, dims, types, concrete=None, kinds=("compute",), kernels=("k",)):
    return op_cost(name, dims, types, concrete or [""] * len(dims), set(kinds), list(kernels))


def _brute_matmul_flops(a, b):
    """Multiply-adds of a broadcast matmul counted element by element of the output."""
    batch_a, batch_b = a[:-2], b[:-2]
    n = max(len(batch_a), len(batch_b))
    ba = (1,) * (n - len(batch_a)) + tuple(batch_a)
    bb = (1,) * (n - len(batch_b)) + tuple(batch_b)
    outputs = 1
    for x, y in zip(ba, bb):
        outputs *= max(x, y)
    outputs *= a[-2] * b[-1]
    return 2 * outputs * a[-1]


@pytest.mark.parametrize("a,b", [((4, 8, 16), (16, 32)), ((2, 1, 5, 7), (3, 7, 9)), ((6, 3), (3, 2))])
def test_matmul_broadcast(a, b):
    c = _cost("aten::matmul", [list(a), list(b)], [BF16, BF16])
    assert c.category == "gemm" and c.flops == _brute_matmul_flops(a, b)


def test_mm_addmm_bmm_baddbmm_linear():
    assert _cost("aten::mm", [[3, 5], [5, 7]], [BF16] * 2).flops == 2 * 3 * 5 * 7
    assert _cost("aten::addmm", [[7], [3, 5], [5, 7], [], []], [BF16] * 3 + ["Scalar"] * 2).flops == 2 * 105 + 21
    assert _cost("aten::bmm", [[2, 3, 5], [2, 5, 7]], [BF16] * 2).flops == 2 * 2 * 105
    assert _cost("aten::baddbmm", [[2, 3, 7], [2, 3, 5], [2, 5, 7]], [BF16] * 3).flops == 2 * 2 * 105 + 2 * 21
    lin = _cost("aten::linear", [[4, 3, 5], [7, 5], [7]], [BF16] * 3)
    assert lin.flops == 2 * 12 * 7 * 5 + 12 * 7 and lin.gemm == (1, 12, 7, 5)
    assert _cost("aten::mm", [[3, 5], [5, 7]], [BF16] * 2).bytes == (15 + 35 + 21) * 2


@pytest.mark.parametrize("sq,sk", [(5, 5), (3, 8), (8, 3), (1, 1)])
def test_causal_pairs_top_left(sq, sk):
    assert causal_pairs(sq, sk) == sum(1 for i, j in itertools.product(range(sq), range(sk)) if j <= i)


def test_attention_forward_backward_causal_flags():
    q = [2, 4, 6, 8]  # SDPA layout [B, H, S, D]
    fwd = _cost("aten::_scaled_dot_product_flash_attention", [q, q, q, [], [], [], []], [BF16] * 3 + ["Scalar"] * 4,
                ["", "", "", "0.", "True", "False", ""])
    assert fwd.flops == 2 * 2 * 4 * causal_pairs(6, 6) * (8 + 8) and fwd.formula == "attention_fwd_causal"
    plain = _cost("aten::_scaled_dot_product_flash_attention", [q, q, q, [], [], [], []],
                  [BF16] * 3 + ["Scalar"] * 4, ["", "", "", "0.", "False", "False", ""])
    assert plain.flops == 2 * 2 * 4 * 36 * 16
    grads = [q] * 6 + [[]] * 9
    bwd = _cost("aten::_scaled_dot_product_flash_attention_backward", grads, [BF16] * 6 + ["Scalar"] * 9,
                [""] * 11 + ["True"] + [""] * 3)
    assert bwd.flops == 2 * 2 * 4 * causal_pairs(6, 6) * (3 * 8 + 2 * 8)
    bshd = [2, 6, 4, 8]  # the flash kernel's own entry point: [B, S, H, D]
    raw = _cost("aten::_flash_attention_forward", [bshd] * 3 + [[]] * 12, [BF16] * 3 + [""] * 12,
                ["", "", "", "", "", "6", "6", "0.", "True", "False", "", "", "", "", ""])
    assert raw.flops == fwd.flops


def test_convolution_forward_and_backward():
    x, w = [2, 3, 10, 12], [8, 3, 3, 3]
    fwd = _cost("aten::cudnn_convolution", [x, w, [], [], [], [], [], [], []], [BF16] * 2 + ["ScalarList"] * 7,
                ["", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "False", "False", "True"])
    out_h, out_w = (10 + 2 - 2 - 1) // 2 + 1, (12 + 2 - 2 - 1) // 2 + 1
    macs = 2 * 8 * out_h * out_w * 3 * 3 * 3  # N · Cout · positions · Cin · kh · kw
    assert fwd.flops == 2 * macs
    go = [2, 8, out_h, out_w]
    bwd = _cost("aten::convolution_backward", [go, x, w] + [[]] * 8, [BF16] * 3 + ["Scalar"] * 8,
                ["", "", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[True, True, False]"])
    assert bwd.flops == 2 * fwd.flops


def test_elementwise_norm_softmax_reduce_embedding():
    mul = _cost("aten::mul", [[4, 1, 6], [5, 1]], [BF16, BF16], kernels=["elementwise_kernel"])
    assert mul.flops == 4 * 5 * 6 and mul.bytes == (24 + 5 + 120) * 2
    out = _cost("aten::mul", [[4, 6], [], [4, 6]], ["float", "Scalar", "float"], kernels=["elementwise_kernel"])
    assert (out.flops, out.bytes) == (24, 24 * 4 + 24 * 4)  # mul.out(self, 2.0, out=y): y written once
    add = _cost("aten::add", [[4, 6], [4, 6], []], ["float", "float", "Scalar"], kernels=["elementwise_kernel"])
    assert (add.flops, add.bytes) == (24, 3 * 24 * 4)
    copy = _cost("aten::copy_", [[4, 6], [4, 6], []], [BF16, "float", "Scalar"], kernels=["elementwise_kernel"])
    assert copy.flops == 0 and copy.bytes == 24 * 2 + 24 * 4
    norm = _cost("aten::native_layer_norm", [[4, 6], [], [6], [6], []], [BF16, "ScalarList", BF16, BF16, "Scalar"])
    assert (norm.category, norm.flops, norm.bytes) == ("norm", 5 * 24, 2 * 24 * 2)
    sm = _cost("aten::_softmax", [[4, 6], [], []], ["float", "Scalar", "Scalar"])
    assert (sm.flops, sm.bytes) == (5 * 24, 2 * 24 * 4)
    red = _cost("aten::sum", [[4, 6], [], [], []], ["float", "ScalarList", "Scalar", ""])
    assert (red.category, red.flops) == ("reduce", 24)
    emb = _cost("aten::embedding", [[100, 16], [3, 5], [], [], []], [BF16, "long int", "Scalar", "Scalar", "Scalar"])
    assert (emb.flops, emb.bytes) == (0, 2 * 15 * 16 * 2 + 15 * 8)


def test_tf32_gemm_and_foreach():
    tf32 = _cost("aten::mm", [[3, 5], [5, 7]], ["float"] * 2, kernels=["sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n"])
    assert tf32.dtype == "tf32" and _cost("aten::mm", [[3, 5], [5, 7]], ["float"] * 2).dtype == "fp32"
    fe = _cost("aten::_foreach_mul_", [[[4, 6], [6]], []], ["TensorList", "Scalar"], kernels=["multi_tensor_apply"])
    assert (fe.category, fe.flops, fe.bytes) == ("elementwise", 30, None)  # element size of a TensorList unknown


def test_unknown_ops_are_never_guessed():
    c = _cost("mylib::custom_op", [[4, 4]], [BF16], kernels=["my_kernel"])
    assert c.flops is None and c.bytes is None
    tri = _cost("triton_poi_fused_add_0", [[4, 4], [4, 4]], [BF16, BF16])
    assert (tri.category, tri.flops, tri.bytes) == ("elementwise", None, 64)


@pytest.mark.parametrize("name,want", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"), ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA H200", "NVIDIA H200"), ("NVIDIA B300 SXM6 AC", "NVIDIA B300"), ("NVIDIA B200", "NVIDIA B200"),
    ("NVIDIA GB200", "NVIDIA GB200"), ("AMD Instinct MI300X", "AMD Instinct MI300X"),
    ("AMD Instinct MI325X", "AMD Instinct MI325X"), ("AMD Instinct MI355X", "AMD Instinct MI355X"),
    ("AMD Instinct MI250X / MI250", "AMD Instinct MI250X"), ("AMD Instinct MI210", "AMD Instinct MI210"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM"), ("NVIDIA A100-PG509-200", "NVIDIA A100 40GB"),
    ("Tesla V100-SXM2-16GB", "NVIDIA V100 SXM2"), ("NVIDIA L40S", "NVIDIA L40S"), ("NVIDIA L4", "NVIDIA L4"),
    ("AMD Radeon Graphics", None), ("", None),
])
def test_device_table_matches_real_names(name, want):
    dev = device_peaks(name)
    assert (dev.name if dev else None) == want
