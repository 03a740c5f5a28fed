"""One place that knows how collectives, comm kernels and dtypes are spelled in traces."""

from __future__ import annotations

import re

from tracekit.parse.comm_kernels import match_comm_kernel

# Ops as the collectives table spells them (tracekit.tables.schema.COLLECTIVE_OPS).
_OP_KEYS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "allgatherv": "all_gather",
    "reducescatter": "reduce_scatter",
    "reducescatterv": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all",
    "broadcast": "broadcast",
    "bcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "isend": "send",
    "recv": "recv",
    "irecv": "recv",
    "recvanysource": "recv",
    "barrier": "barrier",
    "monitoredbarrier": "barrier",
}
# Names that look like collectives but are not collective calls.
NOT_COLLECTIVES = frozenset({"wait", "coalesced", "startcoalescing", "endcoalescing", "sendrecv", "generic"})
_PREFIX = re.compile(r"^(?:nccl:|gloo:|rccl:|mpi:|ucc:|c10d::|_c10d_functional::|c10d_functional::)", re.I)
_SUFFIXES = ("coalesced", "base", "intotensor", "tensor", "single", "async")


def normalize_op(raw: str | None) -> str | None:
    """allreduce / AllReduce / c10d::allreduce_ / _allgather_base → all_reduce / all_gather ...

    Returns None for names that are not collective calls (wait, coalesced, SendRecv...).
    Unrecognised names give "unknown".
    """
    if not raw:
        return None
    key = re.sub(r"[^a-z]", "", _PREFIX.sub("", raw.strip()).lower())
    if key in NOT_COLLECTIVES:
        return None
    changed = True
    while changed and key not in _OP_KEYS:
        changed = False
        for suffix in _SUFFIXES:
            if key.endswith(suffix) and len(key) > len(suffix):
                key = key[: -len(suffix)]
                changed = True
    if key in NOT_COLLECTIVES:
        return None
    return _OP_KEYS.get(key, "unknown")


def is_comm_kernel_name(name: str) -> bool:
    """A communication kernel by its name: NCCL/RCCL (ncclKernel_*, ncclDevKernel_*, ...) and every library of
    the declared table in `comm_kernels` (DeepEP, NVSHMEM, TE userbuffers, custom all-reduce kernels, ...),
    plus the user's patterns."""
    return match_comm_kernel(name) is not None


def kernel_op(name: str) -> str | None:
    """Op a comm kernel implements, from the table (ncclKernel_AllReduce_RING_LL_Sum_float → all_reduce,
    deep_ep::intranode::dispatch → all_to_all). SendRecv, RCCL's Generic kernel and metadata exchanges serve
    several ops (or none), so they give None."""
    m = match_comm_kernel(name)
    return m[1] if m else None


# c10d op name (after "c10d::") → roles of its leading tensor arguments in `Input Dims`.
# "inout": the tensor is both input and output; "in" / "out": one side only.
C10D_ARG_ROLES: dict[str, tuple[str, ...]] = {
    "allreduce_": ("inout",),
    "allreduce_coalesced_": ("inout",),
    "broadcast_": ("inout",),
    "reduce_": ("inout",),
    "send": ("inout",),
    "recv_": ("inout",),
    "recv_any_source_": ("inout",),
    "_allgather_base_": ("out", "in"),
    "allgather_": ("out", "in"),
    "allgather_coalesced_": ("out", "in"),
    "allgather_into_tensor_coalesced_": ("out", "in"),
    "_reduce_scatter_base_": ("out", "in"),
    "reduce_scatter_": ("out", "in"),
    "reduce_scatter_tensor_coalesced_": ("out", "in"),
    "alltoall_base_": ("out", "in"),
    "alltoall_": ("out", "in"),
    "gather_": ("out", "in"),
    "scatter_": ("out", "in"),
    "barrier": (),
}
# Position of (output_split_sizes, input_split_sizes) in `Concrete Inputs` of c10d::alltoall_base_.
ALLTOALL_SPLIT_POSITIONS = (3, 4)

_DTYPE_BYTES = {
    # ScalarType names (record_param_comms `dtype`, Flight Recorder) and TypeMeta names (`Input type`),
    # lower-cased, spaces and a `c10::`/`at::`/`torch.` prefix removed
    "float": 4, "float32": 4,
    "double": 8, "float64": 8,
    "half": 2, "float16": 2,
    "bfloat16": 2,
    "long": 8, "int64": 8, "longint": 8, "int64_t": 8, "longlong": 8, "longlongint": 8,
    "int": 4, "int32": 4, "int32_t": 4,
    "short": 2, "int16": 2, "shortint": 2, "int16_t": 2,
    "char": 1, "int8": 1, "signedchar": 1, "int8_t": 1,
    "byte": 1, "uint8": 1, "unsignedchar": 1, "uint8_t": 1,
    "bool": 1,
    "uint16": 2, "unsignedshort": 2, "uint16_t": 2, "shortunsignedint": 2,
    "uint32": 4, "unsignedint": 4, "uint32_t": 4,
    "uint64": 8, "unsignedlong": 8, "uint64_t": 8, "unsignedlonglong": 8, "longunsignedint": 8,
    "complexfloat": 8, "complex64": 8, "complex<float>": 8,
    "complexdouble": 16, "complex128": 16, "complex<double>": 16,
    "complexhalf": 4, "complex32": 4, "complex<half>": 4, "complex<c10::half>": 4,
    "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1,
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
}
_DTYPE_PREFIXES = ("torch.", "c10::", "at::")
_SUB_BYTE = re.compile(r"^(?:u?int[1-7]|dummy_u?int1_7_t<[1-7]>)$")


def dtype_bytes(dtype: str | None) -> int | None:
    """Element size of a dtype as torch, NCCL args or a log writes it (Float, BFloat16, float, c10::Half,
    long int, unsigned char, Float8_e4m3fn, torch.int32...); None when it is not a dtype."""
    if not dtype:
        return None
    key = dtype.strip().lower().replace(" ", "")
    for prefix in _DTYPE_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix):]
    if key.startswith(("float8", "fp8", "float4")):  # 8-bit floats; float4_e2m1fn_x2 packs two in a byte
        return 1
    if _SUB_BYTE.match(key):  # int1..int7 / uint1..uint7: torch stores one per byte
        return 1
    return _DTYPE_BYTES.get(key)
