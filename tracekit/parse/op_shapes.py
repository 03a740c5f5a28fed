"""FLOPs and bytes of one CPU op from the shapes the profiler recorded (record_shapes), and its category.

Inputs are the op's name and its `Input Dims` / `Input type` / `Concrete Inputs` (decoded JSON lists).
Every formula is documented in docs/metrics.md ("Ops and kernels"); in short, with e the element size
of the op's first tensor input:

- GEMM: mm / addmm / _addmm_activation / _scaled_mm A[M,K]·B[K,N]: 2·M·N·K (+ M·N for addmm's bias add);
  bmm / baddbmm [b,M,K]·[b,K,N]: 2·b·M·N·K (+ b·M·N for baddbmm); matmul / linear: the same with the
  batch dimensions broadcast (linear: x[..., K]·W[N, K]ᵀ). Bytes: (A + B + C) elements · e.
- Attention (SDPA, flash, memory-efficient, cuDNN; forward and backward): with B batch, Hq query heads,
  Sq / Sk query / key lengths, Dqk / Dv head sizes and P the (query, key) pairs computed — Sq·Sk, or
  for causal attention (top-left aligned, as PyTorch's is_causal) Σᵢ min(i+1, Sk) —
  forward 2·B·Hq·P·(Dqk + Dv), backward 2·B·Hq·P·(3·Dqk + 2·Dv) (S recomputed, dV, dP, dQ, dK).
  Bytes: q, k, v and out (backward: also dout, dq, dk, dv).
- Convolution: 2·N·(output positions)·numel(weight) forward (transposed: input positions);
  convolution_backward: the forward count per gradient asked for (input, weight).
- Elementwise: one FLOP per output element (data movement — copy_, _to_copy, clone, cat, fill_ … —
  none); bytes: every tensor input plus the output.
- Normalization: 5 FLOPs per element forward, 10 backward; softmax 5 per element; reductions one per
  input element; embedding / index_select 0 FLOPs, bytes of the rows gathered (read and written) plus
  the indices.
- Triton / compiled kernels: categorised by the launching op's name (triton_poi → elementwise,
  triton_red / triton_per → reduce, triton_tem → gemm); FLOPs unknown, bytes of the tensors passed.
Unknown ops: FLOPs and bytes null (never guessed).
"""

from __future__ import annotations

import functools

import json
from dataclasses import dataclass, replace
from math import prod
from typing import Any

CATEGORIES = ("gemm", "attention", "conv", "elementwise", "norm", "reduce", "comm", "memcpy", "other")

ELEMENT_BYTES: dict[str, tuple[str, int]] = {
    "c10::BFloat16": ("bf16", 2), "c10::Half": ("fp16", 2), "float": ("fp32", 4), "double": ("fp64", 8),
    "c10::Float8_e4m3fn": ("fp8", 1), "c10::Float8_e5m2": ("fp8", 1), "c10::Float8_e4m3fnuz": ("fp8", 1),
    "c10::Float8_e5m2fnuz": ("fp8", 1), "c10::Float8_e8m0fnu": ("fp8", 1), "c10::Float4_e2m1fn_x2": ("fp4", 1),
    "long int": ("int64", 8), "int": ("int32", 4), "short int": ("int16", 2), "signed char": ("int8", 1),
    "unsigned char": ("uint8", 1), "bool": ("bool", 1), "c10::complex<float>": ("complex64", 8),
    "c10::complex<double>": ("complex128", 16),
}
"""Profiler `Input type` of a tensor → (short dtype, bytes per element)."""


@dataclass(frozen=True)
class OpCost:
    """What the shapes say about one op."""

    category: str
    dtype: str | None = None
    flops: int | None = None
    bytes: int | None = None
    gemm: tuple[int, int, int, int] | None = None
    """(batch, M, N, K) of a GEMM."""
    formula: str | None = None
    """The rule that gave flops/bytes (docs/metrics.md), e.g. 'gemm', 'attention_fwd_causal'."""


@dataclass(frozen=True)
class Tensors:
    """An op's tensor inputs: shapes (None for non-tensors and tensor lists), element sizes, dtypes."""

    shapes: list
    sizes: list
    dtypes: list
    concrete: list
    list_numels: list
    """Elements of each TensorList input (0 for other inputs)."""

    def shape(self, i: int) -> tuple[int, ...] | None:
        return self.shapes[i] if i < len(self.shapes) else None

    def flag(self, i: int) -> bool:
        """A concrete boolean argument (is_causal…): True only when the trace says so."""
        return i < len(self.concrete) and str(self.concrete[i]).strip() in ("True", "true", "1")

    def first(self) -> int | None:
        return next((i for i, s in enumerate(self.shapes) if s is not None), None)

    def elem(self) -> int:
        i = self.first()
        return self.sizes[i] if i is not None else 0

    def dtype(self) -> str | None:
        i = self.first()
        return self.dtypes[i] if i is not None else None


def load_json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def tensors(dims: Any, types: Any, concrete: Any) -> Tensors:
    """The tensor inputs of an op from its decoded shape lists (lists of lists of ints)."""
    dims = dims if isinstance(dims, list) else []
    types = types if isinstance(types, list) else []
    shapes, sizes, dtypes, lists = [], [], [], []
    for i, d in enumerate(dims):
        t = types[i] if i < len(types) else None
        known = ELEMENT_BYTES.get(t) if isinstance(t, str) else None
        ok = known is not None and _is_shape(d)
        shapes.append(tuple(d) if ok else None)
        sizes.append(known[1] if ok else 0)
        dtypes.append(known[0] if ok else None)
        is_list = not ok and isinstance(d, list) and bool(d) and all(_is_shape(x) for x in d)
        lists.append(sum(prod(x) for x in d) if is_list else 0)
    return Tensors(shapes, sizes, dtypes, concrete if isinstance(concrete, list) else [], lists)


def _is_shape(d: Any) -> bool:
    return isinstance(d, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d)


def _numel(shape: tuple[int, ...] | None) -> int:
    return prod(shape) if shape is not None else 0


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    return tuple(max(x, y) for x, y in zip(a, b))


def _gemm(batch: int, m: int, n: int, k: int, elem: int, dtype: str | None, bias: bool, extra_bytes: int = 0,
          formula: str = "gemm") -> OpCost:
    flops = 2 * batch * m * n * k + (batch * m * n if bias else 0)
    nbytes = batch * (m * k + k * n + m * n) * elem + extra_bytes
    return OpCost("gemm", dtype, flops, nbytes, (batch, m, n, k), formula)


def gemm_cost(name: str, t: Tensors) -> OpCost | None:
    """FLOPs of the GEMM ops (see the module docstring); None when the shapes do not fit."""
    base = name.split("::")[-1]
    if base in ("mm", "_scaled_mm", "_int_mm"):
        a, b = t.shape(0), t.shape(1)
        if a and b and len(a) == 2 and len(b) == 2:
            return _gemm(1, a[0], b[1], a[1], t.elem(), t.dtype(), False)
    elif base in ("addmm", "_addmm_activation"):
        c, a, b = t.shape(0), t.shape(1), t.shape(2)
        if a and b and len(a) == 2 and len(b) == 2:
            return _gemm(1, a[0], b[1], a[1], t.sizes[1], t.dtypes[1], True, _numel(c) * t.sizes[1])
    elif base in ("bmm", "baddbmm"):
        off = 1 if base == "baddbmm" else 0
        a, b = t.shape(off), t.shape(off + 1)
        if a and b and len(a) == 3 and len(b) == 3:
            return _gemm(a[0], a[1], b[2], a[2], t.sizes[off], t.dtypes[off], base == "baddbmm")
    elif base == "matmul":
        return _matmul(t)
    elif base == "linear":
        x, w = t.shape(0), t.shape(1)
        if x and w and len(w) == 2 and len(x) >= 1:
            return _gemm(1, _numel(x[:-1]), w[0], x[-1], t.elem(), t.dtype(), t.shape(2) is not None)
    return None


def _matmul(t: Tensors) -> OpCost | None:
    a, b = t.shape(0), t.shape(1)
    if not a or not b:
        return None
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    batch = _numel(_broadcast(a2[:-2], b2[:-2]))
    if a2[-1] != b2[-2]:
        return None
    return _gemm(batch, a2[-2], b2[-1], a2[-1], t.elem(), t.dtype(), False)


# name → (index of q, layout, index of the causal flag, backward). Layouts: bhsd = [..., H, S, D] (SDPA),
# bshd = [B, S, H, D] (flash / efficient kernels' own entry points). Argument order from
# aten/src/ATen/native/native_functions.yaml and flash_attn's custom ops.
ATTENTION_OPS: dict[str, tuple[int, str, int, bool]] = {
    "aten::scaled_dot_product_attention": (0, "bhsd", 5, False),
    "aten::_scaled_dot_product_attention_math": (0, "bhsd", 5, False),
    "aten::_scaled_dot_product_flash_attention": (0, "bhsd", 4, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (0, "bhsd", 4, False),
    "aten::_scaled_dot_product_efficient_attention": (0, "bhsd", 6, False),
    "aten::_scaled_dot_product_cudnn_attention": (0, "bhsd", 6, False),
    "aten::_flash_attention_forward": (0, "bshd", 8, False),
    "aten::_efficient_attention_forward": (0, "bshd", -9, False),
    "aten::_scaled_dot_product_flash_attention_backward": (1, "bhsd", 11, True),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (1, "bhsd", 8, True),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, "bhsd", 11, True),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, "bhsd", 14, True),
    "aten::_flash_attention_backward": (1, "bshd", 11, True),
    "aten::_efficient_attention_backward": (1, "bshd", -14, True),
    "flash_attn::_flash_attn_forward": (0, "bshd", 5, False),
    "flash_attn::_flash_attn_backward": (1, "bshd", 11, True),
}
"""A negative causal index names efficient attention's custom_mask_type argument (1, 2: causal)."""


def causal_pairs(sq: int, sk: int) -> int:
    """(query, key) pairs under a top-left causal mask: query i sees keys 0..i."""
    if sq <= sk:
        return sq * (sq + 1) // 2
    return sk * (sk + 1) // 2 + (sq - sk) * sk


def _bhsd(shape: tuple[int, ...], layout: str) -> tuple[int, int, int, int] | None:
    """(batch, heads, sequence, head size) of a q/k/v shape."""
    if layout == "bshd":
        return (shape[0], shape[2], shape[1], shape[3]) if len(shape) == 4 else None
    if len(shape) < 2:
        return None
    lead = shape[:-2]
    batch, heads = (_numel(lead[:-1]), lead[-1]) if lead else (1, 1)
    return batch, heads, shape[-2], shape[-1]


def attention_cost(name: str, t: Tensors) -> OpCost | None:
    spec = ATTENTION_OPS.get(name)
    if spec is None:
        return None
    qi, layout, ci, backward = spec
    q, k, v = (t.shape(qi + j) for j in range(3))
    if not (q and k and v):
        return OpCost("attention", t.dtype(), formula="attention_shapes_unknown")
    qd, kd, vd = _bhsd(q, layout), _bhsd(k, layout), _bhsd(v, layout)
    if qd is None or kd is None or vd is None:
        return OpCost("attention", t.dtype(), formula="attention_shapes_unknown")
    (b, hq, sq, dqk), sk, dv = qd, kd[2], vd[3]
    if ci >= 0:
        causal = t.flag(ci)
    else:
        causal = -ci < len(t.concrete) and str(t.concrete[-ci]).strip() in ("1", "2")
    pairs = causal_pairs(sq, sk) if causal else sq * sk
    per_pair = 2 * (3 * dqk + 2 * dv) if backward else 2 * (dqk + dv)
    elem = t.sizes[qi]
    io = _numel(q) + _numel(k) + _numel(v) + b * hq * sq * dv
    nbytes = (2 * io if backward else io) * elem
    formula = "attention_" + ("bwd" if backward else "fwd") + ("_causal" if causal else "")
    return OpCost("attention", t.dtypes[qi], b * hq * pairs * per_pair, nbytes, None, formula)


CONV_OPS: dict[str, tuple[int, int, int, int, int]] = {
    "aten::convolution": (3, 4, 5, 6, 8),
    "aten::_convolution": (3, 4, 5, 6, 8),
    "aten::cudnn_convolution": (3, 2, 4, -1, 5),
    "aten::miopen_convolution": (4, 3, 5, -1, 6),
    "aten::mkldnn_convolution": (4, 3, 5, -1, 6),
}
"""name → Concrete Inputs index of (stride, padding, dilation, transposed (-1: never), groups)."""


def _int_list(v: Any, n: int) -> list[int] | None:
    """A Concrete Inputs value ('[1, 1]', '2') as n ints."""
    try:
        x = json.loads(v) if isinstance(v, str) else v
    except ValueError:
        return None
    if isinstance(x, int):
        return [x] * n
    if isinstance(x, list) and all(isinstance(i, int) for i in x):
        return x * n if len(x) == 1 else (x if len(x) == n else None)
    return None


def conv_cost(name: str, t: Tensors) -> OpCost | None:
    if name == "aten::convolution_backward":
        return _conv_backward(t)
    spec = CONV_OPS.get(name)
    if spec is None:
        return None
    x, w = t.shape(0), t.shape(1)
    if not x or not w or len(x) < 3 or len(w) != len(x):
        return OpCost("conv", t.dtype(), formula="conv_shapes_unknown")
    nsp = len(x) - 2
    si, pi, di, ti, _ = spec
    stride, pad, dil = (_int_list(t.concrete[i], nsp) if i < len(t.concrete) else None for i in (si, pi, di))
    transposed = ti >= 0 and t.flag(ti)
    if transposed:
        positions = _numel(x[2:])
    elif stride and pad and dil:
        out = [(x[2 + i] + 2 * pad[i] - dil[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in range(nsp)]
        positions = prod(out)
    else:
        return OpCost("conv", t.dtype(), formula="conv_arguments_unknown")
    flops = 2 * x[0] * positions * _numel(w)
    out_numel = x[0] * (w[1] * _numel(w[:1]) // max(w[0], 1) if transposed else w[0]) * positions
    nbytes = (_numel(x) + _numel(w) + out_numel) * t.elem()
    return OpCost("conv", t.dtype(), flops, nbytes, None, "conv_fwd")


def _conv_backward(t: Tensors) -> OpCost:
    """convolution_backward(grad_output, input, weight, …, output_mask): forward FLOPs per gradient."""
    go, x, w = t.shape(0), t.shape(1), t.shape(2)
    if not go or not x or not w or len(go) < 3:
        return OpCost("conv", t.dtype(), formula="conv_shapes_unknown")
    transposed = t.flag(7)
    mask = load_json(t.concrete[10].lower()) if len(t.concrete) > 10 and isinstance(t.concrete[10], str) else None
    grads = sum(bool(m) for m in mask[:2]) if isinstance(mask, list) and len(mask) >= 2 else 2
    positions = _numel(x[2:]) if transposed else _numel(go[2:])
    flops = grads * 2 * go[0] * positions * _numel(w)
    nbytes = (_numel(go) + 2 * _numel(x) + 2 * _numel(w)) * t.elem()
    return OpCost("conv", t.dtype(), flops, nbytes, None, "conv_bwd")


DATA_MOVEMENT = {"copy_", "_to_copy", "to", "clone", "contiguous", "cat", "stack", "fill_", "zero_", "zeros",
                 "ones", "full", "empty", "new_zeros", "index", "index_put_", "_index_put_impl_", "gather",
                 "scatter", "scatter_add_", "slice_scatter", "select_scatter", "flip", "roll", "repeat",
                 "constant_pad_nd", "_unsafe_view", "masked_scatter_", "narrow_copy", "split_with_sizes_copy"}
NORM = {"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "batch_norm", "native_batch_norm",
        "_batch_norm_impl_index", "cudnn_batch_norm", "miopen_batch_norm", "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training", "group_norm", "native_group_norm", "instance_norm"}
NORM_BWD = {"native_layer_norm_backward", "_fused_rms_norm_backward", "native_batch_norm_backward",
            "cudnn_batch_norm_backward", "miopen_batch_norm_backward", "native_group_norm_backward",
            "_batch_norm_impl_index_backward"}
SOFTMAX = {"softmax", "_softmax", "log_softmax", "_log_softmax", "_softmax_backward_data",
           "_log_softmax_backward_data", "_safe_softmax"}
REDUCE = {"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std", "var_mean", "std_mean",
          "norm", "linalg_vector_norm", "prod", "all", "any", "logsumexp", "cumsum", "topk", "sort",
          "_foreach_norm", "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward"}
EMBEDDING = {"embedding", "index_select", "embedding_dense_backward", "embedding_backward", "_embedding_bag",
             "index_add_"}


def elementwise_cost(base: str, t: Tensors) -> OpCost:
    """One FLOP per output element (data movement: none); bytes: the tensor inputs plus the output."""
    out_arg = _out_argument(t)
    shapes = [s for i, s in enumerate(t.shapes) if s is not None and i != out_arg]
    lists = [n for n in t.list_numels if n]
    if not shapes and not lists:
        return OpCost("elementwise", t.dtype(), formula="elementwise_shapes_unknown")
    if base in ("cat", "stack"):
        out = sum(lists) + sum(_numel(s) for s in shapes)
    else:
        out = _numel(_broadcast_all(shapes)) if shapes else lists[0]
    moves = base in DATA_MOVEMENT
    elem = t.elem() or None
    nbytes = None
    if elem is not None:
        in_bytes = sum(_numel(s) * z for i, (s, z) in enumerate(zip(t.shapes, t.sizes))
                       if s is not None and i != out_arg) + sum(lists) * elem
        nbytes = in_bytes + (0 if base == "copy_" else out * elem)
    return OpCost("elementwise", t.dtype(), 0 if moves else out, nbytes, None,
                  "data_movement" if moves else "elementwise")


def _out_argument(t: Tensors) -> int | None:
    """Index of an `out=` tensor: aten's out variants take it last, after the scalar arguments, so a last
    tensor that follows a non-tensor argument and has the result's shape is written, not read."""
    idx = [i for i, s in enumerate(t.shapes) if s is not None]
    if len(idx) < 2:
        return None
    last = idx[-1]
    scalar_before = any(t.shapes[i] is None and not t.list_numels[i] for i in range(idx[0] + 1, last))
    others = [t.shapes[i] for i in idx[:-1]]
    return last if scalar_before and t.shapes[last] == _broadcast_all(others) else None


def _broadcast_all(shapes: list) -> tuple[int, ...]:
    out: tuple[int, ...] = ()
    for s in shapes:
        out = _broadcast(out, s)
    return out


def per_element_cost(base: str, t: Tensors) -> OpCost | None:
    """Normalization, softmax, reductions and embedding lookups (module docstring)."""
    x = t.shape(0)
    elem = t.elem()
    if base in NORM or base in NORM_BWD:
        bwd = base in NORM_BWD
        if x is None:
            return OpCost("norm", t.dtype(), formula="norm_shapes_unknown")
        return OpCost("norm", t.dtype(), (10 if bwd else 5) * _numel(x), (3 if bwd else 2) * _numel(x) * elem,
                      None, "norm_bwd" if bwd else "norm_fwd")
    if base in SOFTMAX:
        if x is None:
            return OpCost("reduce", t.dtype(), formula="softmax_shapes_unknown")
        io = 3 if "backward" in base else 2
        return OpCost("reduce", t.dtype(), 5 * _numel(x), io * _numel(x) * elem, None, "softmax")
    if base in REDUCE:
        if x is None:
            return OpCost("reduce", t.dtype(), formula="reduce_shapes_unknown")
        return OpCost("reduce", t.dtype(), _numel(x), _numel(x) * elem, None, "reduce")
    if base in EMBEDDING:
        return _embedding_cost(base, t)
    return None


def _embedding_cost(base: str, t: Tensors) -> OpCost:
    """Rows gathered (read and written) plus the indices; no FLOPs."""
    w, idx = t.shape(0), t.shape(1)
    if base == "index_select":
        idx = t.shape(2)
        dim = _int_list(t.concrete[1], 1) if len(t.concrete) > 1 else None
        d = dim[0] if dim else 0
        row = _numel(w) // w[d] if w and d < len(w) and w[d] else None
    elif base in ("embedding", "_embedding_bag"):
        row = w[-1] if w else None
    else:  # backward / index_add_: the gradient rows scattered
        row = w[-1] if w else None
        idx = t.shape(1)
    if w is None or idx is None or row is None:
        return OpCost("other", t.dtype(), formula="embedding_shapes_unknown")
    idx_bytes = _numel(idx) * t.sizes[t.shapes.index(idx)]
    return OpCost("other", t.dtype(), 0, 2 * _numel(idx) * row * t.elem() + idx_bytes, None, "embedding")


def triton_cost(name: str, t: Tensors) -> OpCost:
    """A compiled kernel's launching op: category from inductor's kernel name; bytes of its tensors."""
    kind = name[len("triton_"):].split("_", 1)[0]
    category = {"poi": "elementwise", "red": "reduce", "per": "reduce", "tem": "gemm"}.get(kind, "other")
    known = [(s, z) for s, z in zip(t.shapes, t.sizes) if s is not None]
    nbytes = sum(_numel(s) * z for s, z in known) if known else None
    return OpCost(category, t.dtype(), None, nbytes, None, "triton_tensors")


def _is_comm(name: str) -> bool:
    return name.startswith(("c10d::", "nccl:", "gloo:", "_c10d_functional::", "c10d_functional::",
                            "record_param_comms", "comm:"))


def op_cost(name: str, dims: Any, types: Any, concrete: Any, kernel_kinds: set[str],
            kernel_names: list[str]) -> OpCost:
    """Category, dtype, FLOPs and bytes of an op that launched kernels of `kernel_kinds` and names."""
    t = tensors(dims, types, concrete)
    base = name.split("::")[-1]
    if _is_comm(name) or "comm" in kernel_kinds:
        return OpCost("comm", t.dtype())
    if name.startswith("triton_"):
        return triton_cost(name, t)
    for fn in (gemm_cost, attention_cost, conv_cost):
        cost = fn(name, t)
        if cost is not None:
            if cost.dtype == "fp32" and any("tf32" in k.lower() for k in kernel_names):
                cost = replace(cost, dtype="tf32")  # fp32 inputs on TF32 tensor cores (the kernel says so)
            return cost
    if kernel_kinds and kernel_kinds <= {"memcpy", "memset"}:
        numel = sum(_numel(s) for s in t.shapes if s is not None)
        return OpCost("memcpy", t.dtype(), 0, numel * t.elem() if numel else None, None, "memcpy")
    cost = per_element_cost(base, t)
    if cost is not None:
        return cost
    if name.startswith("aten::") and (base in DATA_MOVEMENT or base.startswith("_foreach_")
                                      or _elementwise_kernels(kernel_names)):
        return elementwise_cost(base, t)
    return OpCost(kernel_category(kernel_names[0]) if kernel_names else "other", t.dtype())


def _elementwise_kernels(names: list[str]) -> bool:
    return any(kernel_category(n) == "elementwise" for n in names)


@functools.lru_cache(maxsize=1 << 16)
def kernel_category(kernel_name: str) -> str:
    """A kernel's category from its name alone (kernels no op launched, or ops we have no rule for); cached:
    a run's ranks launch the same few hundred kernel names (HTA's sampled run: 187 per rank)."""
    n = kernel_name.lower()
    if "nccl" in n or "rccl" in n or "allreduce" in n or "all_reduce" in n:
        return "comm"
    if n.startswith("memcpy") or n.startswith("memset"):
        return "memcpy"
    if "flash" in n or "fmha" in n or "attn" in n or "attention" in n:
        return "attention"
    if any(k in n for k in ("gemm", "cutlass", "xmma", "cijk_", "matmul", "sgemm", "hgemm", "wgmma", "nvjet")):
        return "gemm"
    if "conv" in n or "implicit_gemm" in n or "winograd" in n:
        return "conv"
    if "norm" in n:
        return "norm"
    if "softmax" in n or "reduce" in n:
        return "reduce"
    if "elementwise" in n or n.startswith("triton_poi"):
        return "elementwise"
    return "other"
