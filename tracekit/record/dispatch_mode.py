"""Log every c10d collective a process issues, without touching its code (DESIGN §5).

`CollectiveLoggingMode` is a `TorchDispatchMode`: while entered it sees each `c10d::*` op
(torch.distributed calls, DDP's reducer, FSDP2), each `_c10d_functional::*` op (DTensor,
functional collectives) and pipelining's P2P, and records one Flight-Recorder-schema entry per
collective into a `CommLog`. It roughly doubles the cost of every other op while entered, so
`tracekit record` enters it only inside the profiled window.

Measured on torch 2.13 / gloo: all c10d ops arrive on the caller's thread (DDP's bucket
allreduce too: CPU autograd runs hooks on the calling thread); the process group arrives as a
`ScriptObject` (`ProcessGroup.unbox`); c10d ops return a `Work` whose future completes when the
collective finishes — except gloo send/recv and reduce_scatter (`getFuture` not implemented: no
completion time, state "scheduled"). Functional collectives complete when their result is first
used (the `AsyncCollectiveTensor` wait) or at an explicit `wait_tensor`.

Sequence numbers are this log's own per-group counters (collectives and P2P counted apart, like
Flight Recorder): they match across the ranks of a group when every rank logs the same window,
which `tracekit record` guarantees by opening the window at the same step on every rank.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tracekit.record.commlog import COMPLETED, CommLog, new_entry

_UNSEEN = object()
try:
    from torch._C._distributed_c10d import ProcessGroup as _PROCESS_GROUP
except ImportError:  # pragma: no cover - a torch built without distributed has no collectives to log
    _PROCESS_GROUP = None
_NAMESPACES = frozenset({"c10d", "_c10d_functional", "_dtensor"})

_DTYPE_NAMES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
    torch.uint8: "Byte", torch.bool: "Bool", torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
}


def dtype_name(dtype: torch.dtype) -> str:
    """c10 ScalarType name, as Flight Recorder writes it ('Float', 'BFloat16', ...)."""
    return _DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class _OpSpec:
    """How to read one op's arguments: the collective it is, and which arguments hold what."""

    collective: str
    inputs: str | None
    outputs: str | None
    p2p_peer: str | None = None
    """Argument holding the group-local peer rank (P2P ops)."""
    in_splits: str | None = None
    out_splits: str | None = None
    functional: bool = False
    is_p2p: bool = False


def _s(collective, inputs, outputs, **kw) -> _OpSpec:
    return _OpSpec(collective, inputs, outputs, **kw)


# Keyed by (namespace, op name without overload). "@result" = the op's return value.
_SPECS: dict[tuple[str, str], _OpSpec] = {
    ("c10d", "allreduce_"): _s("all_reduce", "tensors", "tensors"),
    ("c10d", "allreduce_coalesced_"): _s("all_reduce_coalesced", "tensors", "tensors"),
    ("c10d", "allgather_"): _s("all_gather", "input_tensors", "output_tensors"),
    ("c10d", "_allgather_base_"): _s("all_gather", "input_tensor", "output_tensor"),
    ("c10d", "allgather_coalesced_"): _s("all_gather_coalesced", "input_list", "output_lists"),
    ("c10d", "allgather_into_tensor_coalesced_"): _s("all_gather_into_tensor_coalesced", "inputs", "outputs"),
    ("c10d", "reduce_scatter_"): _s("reduce_scatter", "input_tensors", "output_tensors"),
    ("c10d", "_reduce_scatter_base_"): _s("reduce_scatter", "input_tensor", "output_tensor"),
    ("c10d", "reduce_scatter_tensor_coalesced_"): _s("reduce_scatter_tensor_coalesced", "inputs", "outputs"),
    ("c10d", "alltoall_base_"): _s("all_to_all", "input", "output", in_splits="input_split_sizes",
                                   out_splits="output_split_sizes"),
    ("c10d", "alltoall_"): _s("all_to_all", "input_tensors", "output_tensors"),
    ("c10d", "broadcast_"): _s("broadcast", "tensors", "tensors"),
    ("c10d", "reduce_"): _s("reduce", "tensors", "tensors"),
    ("c10d", "gather_"): _s("gather", "input_tensors", "output_tensors"),
    ("c10d", "scatter_"): _s("scatter", "input_tensors", "output_tensors"),
    ("c10d", "barrier"): _s("barrier", None, None),
    ("c10d", "monitored_barrier_"): _s("barrier", None, None),
    ("c10d", "send"): _s("send", "tensors", "tensors", p2p_peer="dst", is_p2p=True),
    ("c10d", "recv_"): _s("recv", "tensors", "tensors", p2p_peer="src", is_p2p=True),
    ("c10d", "recv_any_source_"): _s("recv", "tensors", "tensors", is_p2p=True),
    ("_c10d_functional", "all_reduce"): _s("all_reduce", "input", "@result", functional=True),
    ("_c10d_functional", "all_reduce_"): _s("all_reduce", "input", "@result", functional=True),
    ("_c10d_functional", "all_reduce_coalesced"): _s("all_reduce_coalesced", "inputs", "@result", functional=True),
    ("_c10d_functional", "all_reduce_coalesced_"): _s("all_reduce_coalesced", "inputs", "@result", functional=True),
    ("_c10d_functional", "all_gather_into_tensor"): _s("all_gather", "input", "@result", functional=True),
    ("_c10d_functional", "all_gather_into_tensor_out"): _s("all_gather", "input", "@result", functional=True),
    ("_c10d_functional", "all_gather_into_tensor_coalesced"): _s("all_gather_into_tensor_coalesced", "inputs",
                                                                 "@result", functional=True),
    ("_c10d_functional", "reduce_scatter_tensor"): _s("reduce_scatter", "input", "@result", functional=True),
    ("_c10d_functional", "reduce_scatter_tensor_out"): _s("reduce_scatter", "input", "@result", functional=True),
    ("_c10d_functional", "reduce_scatter_tensor_coalesced"): _s("reduce_scatter_tensor_coalesced", "inputs",
                                                                "@result", functional=True),
    ("_c10d_functional", "all_to_all_single"): _s("all_to_all", "input", "@result", functional=True,
                                                  in_splits="input_split_sizes", out_splits="output_split_sizes"),
    ("_c10d_functional", "broadcast"): _s("broadcast", "input", "@result", functional=True),
    ("_c10d_functional", "broadcast_"): _s("broadcast", "input", "@result", functional=True),
    ("_c10d_functional", "isend"): _s("send", "tensor", "tensor", p2p_peer="dst", is_p2p=True, functional=True),
    ("_c10d_functional", "irecv"): _s("recv", "tensor", "@result", p2p_peer="src", is_p2p=True, functional=True),
    ("_dtensor", "shard_dim_alltoall"): _s("all_to_all", "input", "@result", functional=True),
}


def c10d_op_names() -> list[str]:
    """Names of the `c10d::*` collective ops this module knows how to read."""
    return [name for ns, name in _SPECS if ns == "c10d"]


@dataclass(frozen=True)
class GroupInfo:
    """What the log needs about one process group."""

    name: str
    desc: str
    ranks: list[int]
    backend: str


def _shapes(value: Any) -> tuple[list[Any], list[str]]:
    """Shapes (`torch.Size`, a tuple) and dtype names of a tensor, a list of tensors or a list of lists
    (flattened). Runs inside the user's collective: the common cases take one comprehension."""
    if isinstance(value, torch.Tensor):
        return [value.shape], [dtype_name(value.dtype)]
    try:  # a flat list of tensors (most c10d ops)
        return [v.shape for v in value], [dtype_name(v.dtype) for v in value]
    except (AttributeError, TypeError):
        pass
    shapes: list[Any] = []
    dtypes: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop(0)
        if isinstance(v, torch.Tensor):
            shapes.append(v.shape)
            dtypes.append(dtype_name(v.dtype))
        elif isinstance(v, (list, tuple)):
            stack[0:0] = list(v)
    return shapes, dtypes


Reader = Callable[[tuple, dict, Any, int], None]
"""Logs one call of an op: (args, kwargs, out, created_ns)."""


class CollectiveLogger:
    """Turns collective calls into entries of `comm_log` (Flight Recorder entry schema).

    Fed by a front end that sees the calls: `C10dOpHook` (tracekit/record/c10d_hook.py, the one
    `tracekit record` uses: kernels on the c10d ops alone) or `CollectiveLoggingMode` below (a
    TorchDispatchMode: sees every op, so it costs far more). Entries are buffered and written at
    `flush()` (call it at each step boundary and before exit), so completion times that arrive
    shortly after the call still make it into the entry. `step` is copied into every entry; set it
    from the training loop. Never raises into the training code: a collective it cannot decode is
    counted in `errors` and passed through.

    The per-call work runs inside the user's collective (inside the profiled window), so what can be
    done once is: each op's reader is built once (`reader`), each group is described once (cached by
    name and by its ProcessGroup object), and an entry is built once, in its final form.
    """

    source = "dispatch_mode"
    """How entries were seen; written into every entry as `source`."""
    completion_times = True
    """Attach a callback to each collective's Work future for its completion time. Costs a Python
    callback on the backend's thread per collective, which must take the GIL from the training thread
    (measured on gloo: a 65 µs all-reduce took 400 µs with the logging, ~120 µs of it in that handoff);
    `tracekit record` turns it off — the trace has the collective's times."""

    def __init__(self, comm_log: CommLog, rank: int) -> None:
        self.comm_log = comm_log
        self.rank = rank
        self.step: int | None = None
        self.errors = 0
        self.last_error: str | None = None
        self.logged = 0
        self._pending: list[dict[str, Any]] = []
        self._by_output: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._groups: dict[Any, GroupInfo] = {}
        self._readers: dict[Any, Reader | None] = {}

    def log_call(self, func, args, kwargs, out, created_ns: int) -> None:
        """Log one call of a collective op `func` (an OpOverload) that returned `out`."""
        read = self._readers.get(func, _UNSEEN)
        if read is _UNSEEN:
            read = self._readers[func] = self.reader(func)
        if read is not None:
            read(args, kwargs, out, created_ns)

    def reader(self, func) -> Reader | None:
        """The logger of `func`'s calls (built once per op), or None for an op this logger does not read."""
        ns, name = func.namespace, func._schema.name.split("::", 1)[1]
        spec = _SPECS.get((ns, name))
        if spec is None and (ns, name) != ("_c10d_functional", "batch_p2p_ops"):
            return None
        names = [a.name for a in func._schema.arguments]
        log = self._log_batch_p2p if spec is None else partial(self._log, spec)
        op_name = func._schema.name

        def read(args: tuple, kwargs: dict, out: Any, created_ns: int) -> None:
            try:
                bound = dict(zip(names, args))
                if kwargs:
                    bound.update(kwargs)
                log(bound, out, created_ns)
            except Exception as exc:  # never break training because of logging
                self.errors += 1
                self.last_error = f"{op_name}: {type(exc).__name__}: {exc}"

        return read

    # -- groups -----------------------------------------------------------------------------
    def group_info(self, group: Any) -> GroupInfo:
        """GroupInfo for a ProcessGroup ScriptObject/object or a group name (cached by both)."""
        if isinstance(group, torch.ScriptObject):  # a new box per call around the one ProcessGroup
            group = _unbox_group(group)
        info = self._groups.get(group)
        if info is None:
            info = self._groups[group] = self._describe(group)
        return info

    def _describe(self, group: Any) -> GroupInfo:
        import torch.distributed as dist

        pg = torch._C._distributed_c10d._resolve_process_group(group) if isinstance(group, str) else group
        name = pg.group_name
        known = self._groups.get(name)
        if known is not None:
            return known
        try:
            ranks = list(dist.get_process_group_ranks(pg))
        except Exception:
            ranks = _ranks_by_name(name)
        info = GroupInfo(name=name, desc=getattr(pg, "group_desc", "") or "", ranks=ranks,
                         backend=_backend_name(pg))
        self._groups[name] = info
        return info

    @property
    def groups(self) -> dict[str, GroupInfo]:
        return {info.name: info for info in self._groups.values()}

    # -- logging ----------------------------------------------------------------------------
    def _log(self, spec: _OpSpec, bound: dict[str, Any], out: Any, created_ns: int) -> None:
        group = bound.get("group_name") if spec.functional else bound.get("process_group")
        info = self.group_info(group)
        in_shapes, in_dtypes = _shapes(bound.get(spec.inputs)) if spec.inputs else ([], [])
        if spec.outputs == "@result":
            out_value = out
        else:
            out_value = bound.get(spec.outputs) if spec.outputs else None
        out_shapes, out_dtypes = _shapes(out_value) if out_value is not None else ([], [])
        peer = None
        if spec.p2p_peer is not None:
            local = bound.get(spec.p2p_peer)
            peer = info.ranks[local] if local is not None and 0 <= local < len(info.ranks) else local
        seq = _c10d_seq(group) if info.backend == "nccl" and not spec.is_p2p and not spec.functional else None
        entry = self._new_entry(spec.collective, spec.is_p2p, info, created_ns, in_shapes, in_dtypes,
                                out_shapes, out_dtypes, peer,
                                _int_list(bound.get(spec.in_splits)) if spec.in_splits else None,
                                _int_list(bound.get(spec.out_splits)) if spec.out_splits else None, seq=seq)
        if spec.functional:
            if isinstance(out, torch.Tensor):
                self._by_output[id(out)] = entry
            elif isinstance(out, (list, tuple)):
                for t in out:
                    if isinstance(t, torch.Tensor):
                        self._by_output[id(t)] = entry
        elif self.completion_times:
            self._attach_work(entry, out[1] if isinstance(out, tuple) else out)

    def _log_batch_p2p(self, bound: dict[str, Any], out: Any, created_ns: int) -> None:
        info = self.group_info(bound["group_name"])
        for op, peer, t in zip(bound["op_list"], bound["peer_list"], bound["tensors"]):
            shapes, dtypes = _shapes(t)
            kind = "send" if "send" in op else "recv"
            glob = info.ranks[peer] if 0 <= peer < len(info.ranks) else peer
            self._new_entry(kind, True, info, created_ns, shapes, dtypes, shapes, dtypes, glob, None, None)

    def _new_entry(self, collective, is_p2p, info, created_ns, in_shapes, in_dtypes, out_shapes,
                   out_dtypes, peer, in_splits, out_splits, seq: int | None = None) -> dict[str, Any]:
        entry = new_entry(
            pg_name=info.name, pg_desc=info.desc, profiling_name=f"{info.backend}:{collective}",
            time_created_ns=created_ns, input_sizes=in_shapes, input_dtypes=in_dtypes,
            output_sizes=out_shapes, output_dtypes=out_dtypes, is_p2p=is_p2p, peer=peer,
            group_ranks=info.ranks, in_split_sizes=in_splits, out_split_sizes=out_splits, step=self.step,
            seq=seq if seq is not None else self.comm_log.next_seq(info.name, is_p2p), source=self.source)
        with self._lock:
            self._pending.append(entry)
        return entry

    @staticmethod
    def _attach_work(entry: dict[str, Any], work_obj: Any) -> None:
        from torch._C._distributed_c10d import Work

        if work_obj is None:
            return
        work = Work.unbox(work_obj) if isinstance(work_obj, torch.ScriptObject) else work_obj
        try:
            fut = work.get_future()
        except RuntimeError:  # gloo send/recv: no future, no completion time
            return

        def _done(_f, entry=entry):
            entry[COMPLETED] = time.time_ns()

        entry["_future"] = fut
        fut.add_done_callback(_done)

    def _async_outputs(self, args: Any) -> list[dict[str, Any]]:
        """Entries of functional collectives whose (still unwaited) outputs appear in `args`."""
        found = []
        for a in args:
            for t in (a if isinstance(a, (list, tuple)) else (a,)):
                elem = getattr(t, "elem", None) if type(t).__name__ == "AsyncCollectiveTensor" else None
                if elem is not None:
                    entry = self._by_output.pop(id(elem), None)
                    if entry is not None:
                        found.append(entry)
        return found

    def _mark_waited(self, tensor: Any) -> None:
        entry = self._by_output.pop(id(tensor), None)
        if entry is not None and entry[COMPLETED] is None:
            entry[COMPLETED] = time.time_ns()

    def flush(self, final: bool = False, grace_s: float = 1.0, settle_s: float = 0.05) -> int:
        """Write buffered entries (in issue order) to the log; returns how many were written.

        Not `final`: first waits up to `settle_s` for the callbacks of futures that already say
        done (c10d marks a future complete, wakes its waiters, then runs callbacks: the training
        thread can reach the step boundary before our callback has run), then stops at the first
        collective whose completion is still due (written at a later flush). `final`: waits up to
        `grace_s` for pending completions, then writes everything.
        """
        with self._lock:
            pending = self._pending
            if not self.completion_times:  # no completion callbacks to wait for: everything is ready
                cut = len(pending)
            elif final:
                deadline = time.monotonic() + grace_s
                while any(_due(e) for e in pending) and time.monotonic() < deadline:
                    time.sleep(0.001)
                cut = len(pending)
            else:
                deadline = time.monotonic() + settle_s
                while any(_settling(e) for e in pending) and time.monotonic() < deadline:
                    time.sleep(0.0002)
                cut = next((i for i, e in enumerate(pending) if _due(e)), len(pending))
            ready, self._pending = pending[:cut], pending[cut:]
        if final:
            self._by_output.clear()
        if not ready:  # a step without collectives costs no write
            return 0
        for e in ready:
            e.pop("_future", None)
        self.comm_log.append(ready)
        self.logged += len(ready)
        self.comm_log.flush()
        return len(ready)


class CollectiveLoggingMode(CollectiveLogger, TorchDispatchMode):
    """A TorchDispatchMode front end for `CollectiveLogger`: every op passes through Python while
    entered (about doubling the step's cost), and collectives issued inside another op's dispatch
    (e.g. DTensor's Partial→Replicate all-reduce inside `clip_grad_norm_`) are not seen, because a
    mode is off the stack while its own `__torch_dispatch__` runs. Kept for direct use and tests;
    `tracekit record` uses `C10dOpHook`.
    """

    def __init__(self, comm_log: CommLog, rank: int) -> None:
        CollectiveLogger.__init__(self, comm_log, rank)
        TorchDispatchMode.__init__(self)

    # -- dispatch ---------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ns = func.namespace
        if ns not in _NAMESPACES:
            if not self._by_output:
                return func(*args, **kwargs)
            waited = self._async_outputs(args)
            out = func(*args, **kwargs)
            for entry in waited:  # an AsyncCollectiveTensor was used: its wait ran inside func
                if entry[COMPLETED] is None:
                    entry[COMPLETED] = time.time_ns()
            return out
        name = func._schema.name.split("::", 1)[1]
        if ns == "_c10d_functional" and name == "wait_tensor":
            out = func(*args, **kwargs)
            self._mark_waited(args[0] if args else kwargs.get("tensor"))
            return out
        created_ns = time.time_ns()
        out = func(*args, **kwargs)
        self.log_call(func, args, kwargs, out, created_ns)
        return out


def _unbox_group(group: torch.ScriptObject) -> Any:
    return _PROCESS_GROUP.unbox(group)


def _c10d_seq(group: Any) -> int | None:
    """The group's own collective sequence number after a call (NCCL: the one its Flight Recorder and the
    profiler's `record_param_comms` carry; gloo counts P2P in it too, so gloo entries use our counters)."""
    try:
        pg = _unbox_group(group) if isinstance(group, torch.ScriptObject) else group
        return int(pg._get_sequence_number_for_group())
    except Exception:
        return None


def _due(entry: dict[str, Any]) -> bool:
    """A collective whose completion callback has not fired yet."""
    return entry[COMPLETED] is None and "_future" in entry


def _settling(entry: dict[str, Any]) -> bool:
    """A collective whose future is complete but whose completion callback has not run yet."""
    return _due(entry) and entry["_future"].done()


def _int_list(value: Any) -> list[int] | None:
    if value is None:
        return None
    return [int(v) for v in value]


def _backend_name(pg: Any) -> str:
    try:
        return str(pg.name()).lower()
    except Exception:
        return "unknown"


def _ranks_by_name(name: str) -> list[int]:
    """Global ranks of the group called `name`, from torch.distributed's registry."""
    import torch.distributed.distributed_c10d as c10d

    for pg, pg_name in c10d._world.pg_names.items():
        if pg_name == name:
            ranks = c10d._world.pg_group_ranks[pg]  # global -> group rank
            return sorted(ranks, key=ranks.__getitem__)
    return []
