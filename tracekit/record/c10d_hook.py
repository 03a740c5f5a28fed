"""See every c10d collective a process issues, at the cost of the collectives alone (DESIGN §5).

Every collective in PyTorch — `torch.distributed` calls, DDP's C++ reducer, FSDP2, functional
collectives (`_c10d_functional.*`, which DTensor issues, e.g. the all-reduce of the total norm in
`clip_grad_norm_` on FSDP2, from inside another op's dispatch) and P2P — reaches the dispatcher as
a `c10d::*` op (`ProcessGroup::allreduce` etc. call it). `C10dOpHook` registers a Python kernel for
those ops alone at the `BackendSelect` dispatch key, which every call passes through and no guard
excludes (autograd's below-autograd guards and a TorchDispatchMode's own dispatch do not touch it):
the kernel re-dispatches to the real one and hands the call to a `CollectiveLogger`. No other op
pays anything, unlike a TorchDispatchMode (every op through Python: about 2x the step); the
kernels are removed when the hook is left, so nothing is paid outside the profiled window.

Our own work inside a collective is wrapped in `tracekit::log_collective` profiler ranges so the
analyzers count it as tracekit's overhead, not the user's time.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

from tracekit.record.dispatch_mode import CollectiveLogger, Reader, c10d_op_names

LOG_RANGE = "tracekit::log_collective"
"""Profiler range around our logging inside a collective (parse classifies `tracekit::*` as overhead)."""


@functools.lru_cache(maxsize=1)
def c10d_ops() -> tuple[tuple[str, Any], ...]:
    """(name, default overload) of every c10d op the hook wraps. The first lookup resolves the ops'
    schemas (~10-25 ms measured on the 2-core box): the recorder makes it before its profiled steps, so
    that tracekit's one-off cost never lands in a measured step (where it read as the rank's idle time
    and as a late arrival at the step's first collective)."""
    out = []
    for name in c10d_op_names():
        packet = getattr(torch.ops.c10d, name, None)
        if packet is not None and "default" in packet.overloads():
            out.append((name, packet.default))
    return tuple(out)


class C10dOpHook:
    """While entered, every c10d collective op of this process is logged by `logger`.

    Re-entrant use is an error; one hook per process at a time (kernels are process-global).
    """

    _active: "C10dOpHook | None" = None

    def __init__(self, logger: CollectiveLogger) -> None:
        self.logger = logger
        self._lib = None
        self.ops: list[str] = []

    def __enter__(self) -> "C10dOpHook":
        if C10dOpHook._active is not None:
            raise RuntimeError("a C10dOpHook is already active in this process")
        from torch._C import DispatchKey

        after = torch._C._dispatch_keyset_full_after(DispatchKey.BackendSelect)
        lib = torch.library.Library("c10d", "IMPL")
        try:
            for name, op in c10d_ops():
                read = self.logger.reader(op)
                if read is None:
                    continue
                lib.impl(name, _kernel(op, after, read), "BackendSelect", with_keyset=True)
                self.ops.append(name)
        except Exception:
            lib._destroy()
            raise
        self._lib = lib
        C10dOpHook._active = self
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None
        if C10dOpHook._active is self:
            C10dOpHook._active = None


def _kernel(op, after, read: Reader):
    """The kernel of `op`: the real one, then `read` (the logger's reader of `op`, built once)."""
    record_range = torch._C._profiler._RecordFunctionFast
    redispatch = op._handle.redispatch_boxed  # what OpOverload.redispatch calls, minus a Python frame

    def kernel(keyset, *args, **kwargs):
        created_ns = time.time_ns()
        out = redispatch(keyset & after, *args, **kwargs)
        with record_range(LOG_RANGE):
            read(args, kwargs, out, created_ns)
        return out

    return kernel
