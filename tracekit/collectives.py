"""The collective vocabulary: op names as the collectives table spells them, element sizes of dtypes, and
the NCCL-tests bus-bandwidth factors (docs/metrics.md). Imports nothing of tracekit: every layer may use it."""

from __future__ import annotations

import functools
import re

COLLECTIVE_OPS = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
    "gather", "scatter", "send", "recv", "barrier", "unknown",
)
"""Ops as the collectives table spells them (`collectives.op`)."""

MIN_JUDGED_BYTES = 4096
"""Smaller messages are pure latency: tabulated, never judged (nor sped up by a bandwidth what-if)."""


def bus_factor(op: str, n: int) -> float | None:
    """NCCL-tests bus-bandwidth factor for `op` over `n` ranks (None for ops without one): all_reduce
    2(n−1)/n; all_gather, reduce_scatter, all_to_all, gather, scatter (n−1)/n; broadcast, reduce and P2P 1."""
    if n < 1:
        return None
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "send", "recv", "sendrecv"):
        return 1.0
    return None


DTYPE_BYTES = {
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
DTYPE_PREFIXES = ("torch.", "c10::", "at::")
SUB_BYTE = re.compile(r"^(?:u?int[1-7]|dummy_u?int1_7_t<[1-7]>)$")


@functools.lru_cache(maxsize=4096)
def dtype_bytes(dtype: str | None) -> int | None:
    """Element size of a dtype as torch, NCCL args or a log writes it (Float, BFloat16, float, c10::Half,
    long int, unsigned char, Float8_e4m3fn, torch.int32...); None when it is not a dtype."""
    if not dtype:
        return None
    key = dtype.strip().lower().replace(" ", "")
    for prefix in DTYPE_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix):]
    if key.startswith(("float8", "fp8", "float4")):  # 8-bit floats; float4_e2m1fn_x2 packs two in a byte
        return 1
    if SUB_BYTE.match(key):  # int1..int7 / uint1..uint7: torch stores one per byte
        return 1
    return DTYPE_BYTES.get(key)
