"""One place that knows how collectives, comm kernels and dtypes are spelled in traces."""

from __future__ import annotations

import functools
import re

from tracekit.collectives import dtype_bytes  # noqa: F401  (parsers import it from here)
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


@functools.lru_cache(maxsize=4096)
def normalize_op(raw: str | None) -> str | None:
    """allreduce / AllReduce / c10d::allreduce_ / _allgather_base → all_reduce / all_gather ...

    Returns None for names that are not collective calls (wait, coalesced, SendRecv...).
    Unrecognised names give "unknown". Memoized: a trace names a few ops thousands of times (a parse called it
    three times per collective, two regex passes each).
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

