"""The reference runtime's thin communication layer: every collective and P2P op it issues goes through here.

Why: on gloo, Flight Recorder misses P2P and timings and the profiler links nothing to a group (DESIGN §5),
so each op is logged to `comms.rank{R}.jsonl` (Flight Recorder entry schema, `tracekit.record.commlog`)
with its group, per-group sequence number, sizes, dtypes, split sizes, peer, caller label and step.

Logging policy (what an entry's times mean):
- `time_created_ns` and `time_discovered_started_ns` are taken just before the op is issued (before the
  slow-link delay, so an injected delay lands inside the entry's started→completed duration);
- `time_discovered_completed_ns` is when the op finished: after the call returns for synchronous ops, from
  the Work's future callback for asynchronous collectives, at `wait()` for P2P (gloo P2P Works have no
  future). An entry is written once it completes; async ops never waited for are written by `drain()`.
- sequence numbers count only the ops issued through this layer, per group, with separate collective and
  P2P counters starting at 1 (like c10d); they are assigned at issue time, in issue order.
- `profiling_name` follows Flight Recorder: `<backend>:<op>` with op in all_reduce, all_gather,
  reduce_scatter, all_to_all, broadcast, barrier, send, recv.

Profiler labels: each op runs inside `comm:<op>:<pg_desc>` (P2P batches: `comm:p2p:<pg_descs>`), a
`_RecordFunctionFast` region: cheap, category `cpu_op` (so it never becomes the innermost
`user_annotation` "caller" of the collective), and with `record_shapes=True` it carries args
`Process Group Name`, `Process Group Description`, `seq_num` (first seq; `seq_nums` lists a P2P batch's),
`is_p2p`, `caller`. It encloses c10d's own `c10d::*` event and the slow-link delay; parsers should treat
the `comm:` prefix as issuing communication, never compute, and can join it to the log on
(pg_name, is_p2p, seq).

Autograd helpers (`copy_to_tp`, `reduce_from_tp`, `gather_from_sp`, `reduce_scatter_to_sp`,
`scatter_to_sp`, `gather_from_tp`, `all_to_all_autograd`) are Megatron's conjugate f/g operators; each
takes `(x, group, ..., *, comm=None, label=<its caller label>)` and uses `get_comm()` when `comm` is None;
ops issued in backward get the caller `<label>:bwd` (copy_to_tp's default label already says `:bwd`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch._C._profiler import _RecordFunctionFast

from tracekit.record.commlog import CommLog

ReduceOp = dist.ReduceOp

# torch 2.13 renamed the tensor-in/tensor-out collectives (same c10d ops); the old names warn.
_ALL_GATHER_TENSOR = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_REDUCE_SCATTER_TENSOR = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)

# c10 ScalarType names, as Flight Recorder writes `input_dtypes`.
_DTYPE_NAMES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
    torch.uint8: "Byte", torch.bool: "Bool",
}


def dtype_name(dtype: torch.dtype) -> str:
    """Flight Recorder's spelling of a dtype (`Float`, `BFloat16`...)."""
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """What the log says about a process group."""

    pg_name: str
    pg_desc: str
    ranks: list[int]
    backend: str

    @property
    def size(self) -> int:
        return len(self.ranks)


class _Pending:
    """One issued op whose log entry is written when it completes (exactly once)."""

    __slots__ = ("comm", "fields", "done")

    def __init__(self, comm: "Comm", fields: dict[str, Any]) -> None:
        self.comm = comm
        self.fields = fields
        self.done = False

    def complete(self, completed_ns: int | None) -> None:
        with self.comm._lock:
            if self.done:
                return
            self.done = True
            self.comm._pending.discard(self)
        if self.comm.log is not None:
            self.comm.log.record(time_completed_ns=completed_ns, **self.fields)


class LoggedWork:
    """A c10d Work whose completion is logged; `wait()` behaves like the Work's."""

    def __init__(self, work: Any, pending: _Pending, use_future: bool) -> None:
        self.work = work
        self._pending = pending
        if use_future:
            work.get_future().add_done_callback(lambda _f: pending.complete(time.time_ns()))

    def wait(self, timeout: Any = None) -> bool:
        ok = self.work.wait() if timeout is None else self.work.wait(timeout)
        self._pending.complete(time.time_ns())
        return ok

    def is_completed(self) -> bool:
        return self.work.is_completed()

    def get_future(self) -> Any:
        return self.work.get_future()


class Comm:
    """Issues collectives/P2P on torch.distributed, logging each to a `CommLog` and applying slow-link delays.

    `slow_groups` maps a group's `pg_desc` (e.g. "mesh_tp") to extra seconds slept before each op on it
    (collectives and P2P batches): the slow-link fault. `step` is set by the train loop and copied into
    each entry. `log=None` disables logging (labels and delays still apply).
    """

    def __init__(self, log: CommLog | None, rank: int, slow_groups: dict[str, float] | None = None) -> None:
        self.log = log
        self.rank = rank
        self.slow_groups: dict[str, float] = dict(slow_groups or {})
        self.step: int | None = None
        self._groups: dict[int, GroupInfo] = {}
        self._labels = threading.local()
        self._lock = threading.Lock()
        self._pending: set[_Pending] = set()

    # ---- groups, labels -------------------------------------------------------------------------

    def group_info(self, group: dist.ProcessGroup | None) -> GroupInfo:
        """Name, description, global ranks and backend of `group` (WORLD when None), cached."""
        group = group if group is not None else dist.group.WORLD
        info = self._groups.get(id(group))
        if info is None:
            info = GroupInfo(pg_name=str(group.group_name), pg_desc=str(group.group_desc),
                             ranks=list(dist.get_process_group_ranks(group)),
                             backend=str(dist.get_backend(group)))
            self._groups[id(group)] = info
        return info

    @contextlib.contextmanager
    def labelled(self, label: str) -> Iterator[None]:
        """Ops issued inside (without an explicit `label`) get `caller=label`; innermost wins."""
        stack = self._label_stack()
        stack.append(label)
        try:
            yield
        finally:
            stack.pop()

    def _label_stack(self) -> list[str]:
        stack = getattr(self._labels, "stack", None)
        if stack is None:
            stack = self._labels.stack = []
        return stack

    def _caller(self, label: str | None) -> str | None:
        if label is not None:
            return label
        stack = self._label_stack()
        return stack[-1] if stack else None

    # ---- the common path ------------------------------------------------------------------------

    def _prefix(self, info: GroupInfo, tensor: torch.Tensor) -> str:
        backend = info.backend
        if "," in backend or ":" in backend:  # e.g. "cpu:gloo,cuda:nccl"
            device = "cuda" if tensor.is_cuda else "cpu"
            for part in backend.split(","):
                dev, _, name = part.partition(":")
                if dev == device:
                    return name
        return backend

    def _begin(self, op: str, info: GroupInfo, tensor: torch.Tensor, *, p2p: bool,
               inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], label: str | None,
               peer: int | None = None, in_splits: list[int] | None = None,
               out_splits: list[int] | None = None) -> _Pending:
        created = time.time_ns()
        seq = self.log.next_seq(info.pg_name, p2p) if self.log is not None else 0
        fields = dict(
            pg_name=info.pg_name, pg_desc=info.pg_desc,
            profiling_name=f"{self._prefix(info, tensor)}:{op}",
            time_created_ns=created, time_started_ns=created,
            input_sizes=[list(t.shape) for t in inputs], input_dtypes=[dtype_name(t.dtype) for t in inputs],
            output_sizes=[list(t.shape) for t in outputs], output_dtypes=[dtype_name(t.dtype) for t in outputs],
            is_p2p=p2p, peer=peer, group_ranks=info.ranks, in_split_sizes=in_splits,
            out_split_sizes=out_splits, caller=self._caller(label), step=self.step, seq=seq,
        )
        pending = _Pending(self, fields)
        with self._lock:
            self._pending.add(pending)
        return pending

    def _region(self, op: str, info: GroupInfo, pending: _Pending) -> Any:
        f = pending.fields
        return _RecordFunctionFast(f"comm:{op}:{info.pg_desc}", [],
                                   _region_args(info, [f["seq"]], False, f["caller"]))

    def _delay(self, info: GroupInfo) -> None:
        delay_s = self.slow_groups.get(info.pg_desc)
        if delay_s:
            time.sleep(delay_s)

    def _run(self, op: str, group: dist.ProcessGroup | None, tensor: torch.Tensor, issue: Any, *,
             inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], label: str | None,
             async_op: bool, in_splits: list[int] | None = None,
             out_splits: list[int] | None = None) -> LoggedWork | None:
        info = self.group_info(group)
        pending = self._begin(op, info, tensor, p2p=False, inputs=inputs, outputs=outputs, label=label,
                              in_splits=in_splits, out_splits=out_splits)
        with self._region(op, info, pending):
            self._delay(info)
            work = issue(async_op)
        if async_op:
            return LoggedWork(work, pending, use_future=True)
        pending.complete(time.time_ns())
        return None

    # ---- collectives ----------------------------------------------------------------------------

    def all_reduce(self, t: torch.Tensor, group: dist.ProcessGroup | None, op: Any = ReduceOp.SUM, *,
                   label: str | None = None, async_op: bool = False) -> LoggedWork | None:
        """In-place all-reduce of `t` over `group`."""
        return self._run("all_reduce", group, t,
                         lambda a: dist.all_reduce(t, op=op, group=group, async_op=a),
                         inputs=[t], outputs=[t], label=label, async_op=async_op)

    def all_gather_into_tensor(self, out: torch.Tensor, t: torch.Tensor, group: dist.ProcessGroup | None, *,
                               label: str | None = None, async_op: bool = False) -> LoggedWork | None:
        """`out` (group size × t along dim 0) ← every rank's `t`, in group rank order."""
        return self._run("all_gather", group, t,
                         lambda a: _ALL_GATHER_TENSOR(out, t, group=group, async_op=a),
                         inputs=[t], outputs=[out], label=label, async_op=async_op)

    def reduce_scatter_tensor(self, out: torch.Tensor, t: torch.Tensor, group: dist.ProcessGroup | None,
                              op: Any = ReduceOp.SUM, *, label: str | None = None,
                              async_op: bool = False) -> LoggedWork | None:
        """`out` ← this rank's dim-0 chunk of the sum of every rank's `t`."""
        return self._run("reduce_scatter", group, t,
                         lambda a: _REDUCE_SCATTER_TENSOR(out, t, op=op, group=group, async_op=a),
                         inputs=[t], outputs=[out], label=label, async_op=async_op)

    def all_to_all_single(self, out: torch.Tensor, t: torch.Tensor, out_splits: list[int] | None,
                          in_splits: list[int] | None, group: dist.ProcessGroup | None, *,
                          label: str | None = None, async_op: bool = False) -> LoggedWork | None:
        """Dim-0 rows of `t` split by `in_splits` go to each group rank; `out` gathers by `out_splits`."""
        in_l = [int(s) for s in in_splits] if in_splits is not None else None
        out_l = [int(s) for s in out_splits] if out_splits is not None else None
        return self._run("all_to_all", group, t,
                         lambda a: dist.all_to_all_single(out, t, out_l, in_l, group=group, async_op=a),
                         inputs=[t], outputs=[out], label=label, async_op=async_op,
                         in_splits=in_l, out_splits=out_l)

    def broadcast(self, t: torch.Tensor, src: int, group: dist.ProcessGroup | None, *,
                  label: str | None = None, async_op: bool = False) -> LoggedWork | None:
        """In-place broadcast from global rank `src`."""
        return self._run("broadcast", group, t,
                         lambda a: dist.broadcast(t, src, group=group, async_op=a),
                         inputs=[t], outputs=[t], label=label, async_op=async_op)

    def barrier(self, group: dist.ProcessGroup | None, *, label: str | None = None) -> None:
        """Barrier over `group` (logged with no tensors)."""
        empty = torch.empty(0)
        self._run("barrier", group, empty, lambda a: dist.barrier(group=group, async_op=a),
                  inputs=[], outputs=[], label=label, async_op=False)

    # ---- point to point -------------------------------------------------------------------------

    def batch_isend_irecv(self, ops: Sequence[tuple[str, torch.Tensor, int, dist.ProcessGroup | None]], *,
                          label: str | None = None) -> list[LoggedWork]:
        """Issue `("send"|"recv", tensor, peer_global_rank, group)` ops together; one entry per op.

        Each returned Work logs its entry at `wait()` (gloo P2P Works have no future). The slow-link delay
        of each distinct group in the batch is slept once before issuing.
        """
        p2p_ops, pendings, infos = [], [], {}
        for kind, tensor, peer, group in ops:
            if kind not in ("send", "recv"):
                raise ValueError(f"batch_isend_irecv: op must be 'send' or 'recv', got {kind!r}")
            info = self.group_info(group)
            if peer not in info.ranks:
                raise ValueError(f"batch_isend_irecv: peer {peer} is not in group {info.pg_desc} {info.ranks}")
            infos[info.pg_name] = info
            pending = self._begin(kind, info, tensor, p2p=True,
                                  inputs=[tensor] if kind == "send" else [],
                                  outputs=[tensor] if kind == "recv" else [], label=label, peer=peer)
            pendings.append(pending)
            p2p_ops.append(dist.P2POp(dist.isend if kind == "send" else dist.irecv, tensor, peer, group))
        if not p2p_ops:
            return []
        first = next(iter(infos.values()))
        name = "comm:p2p:" + "+".join(sorted({i.pg_desc for i in infos.values()}))
        seqs = [p.fields["seq"] for p in pendings]
        with _RecordFunctionFast(name, [], _region_args(first, seqs, True, pendings[0].fields["caller"])):
            for info in infos.values():
                self._delay(info)
            works = dist.batch_isend_irecv(p2p_ops)
        return [LoggedWork(w, p, use_future=False) for w, p in zip(works, pendings)]

    def send(self, t: torch.Tensor, peer: int, group: dist.ProcessGroup | None, *,
             label: str | None = None) -> LoggedWork:
        """Non-blocking send (never a blocking one: a gloo send waits for the peer's recv, DESIGN §8)."""
        return self.batch_isend_irecv([("send", t, peer, group)], label=label)[0]

    def recv(self, t: torch.Tensor, peer: int, group: dist.ProcessGroup | None, *,
             label: str | None = None) -> LoggedWork:
        """Non-blocking receive into `t`."""
        return self.batch_isend_irecv([("recv", t, peer, group)], label=label)[0]

    # ---- bookkeeping ----------------------------------------------------------------------------

    def drain(self) -> None:
        """Write entries of ops issued but never waited on, as not completed (e.g. before closing)."""
        with self._lock:
            pending = list(self._pending)
        for p in sorted(pending, key=lambda p: p.fields["time_created_ns"]):
            p.complete(None)


def _region_args(info: GroupInfo, seqs: list[int], p2p: bool, caller: str | None) -> dict[str, Any]:
    """Args of a `comm:` profiler region, keyed like Kineto's `record_param_comms` where one exists."""
    return {"Process Group Name": info.pg_name, "Process Group Description": info.pg_desc,
            "seq_num": seqs[0], "seq_nums": ",".join(map(str, seqs)), "is_p2p": int(p2p), "caller": caller or ""}


# ---- the active Comm --------------------------------------------------------------------------------

_ACTIVE: Comm | None = None


def set_comm(comm: Comm | None) -> None:
    """Make `comm` the one model code reaches through `get_comm()`."""
    global _ACTIVE
    _ACTIVE = comm


def get_comm() -> Comm:
    """The active Comm; raises if the runtime has not set one (no silent unlogged fallback)."""
    if _ACTIVE is None:
        raise RuntimeError("instrumented_runtime.comm: no active Comm; call set_comm(Comm(...)) first")
    return _ACTIVE


def _resolve(comm: Comm | None) -> Comm:
    return comm if comm is not None else get_comm()


def group_size_rank(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(size, this rank's index) in `group`."""
    return dist.get_world_size(group), dist.get_rank(group)


# ---- Megatron tensor-parallel / sequence-parallel conjugates -------------------------------------

def _all_gather_dim(comm: Comm, x: torch.Tensor, group: Any, dim: int, label: str | None) -> torch.Tensor:
    size = dist.get_world_size(group)
    moved = x.movedim(dim, 0).contiguous()
    out = torch.empty((size * moved.shape[0], *moved.shape[1:]), dtype=x.dtype, device=x.device)
    comm.all_gather_into_tensor(out, moved, group, label=label)
    return out.movedim(0, dim)


def _reduce_scatter_dim(comm: Comm, x: torch.Tensor, group: Any, dim: int, label: str | None) -> torch.Tensor:
    size = dist.get_world_size(group)
    if x.shape[dim] % size:
        raise ValueError(f"reduce_scatter along dim {dim}: size {x.shape[dim]} not divisible by group size {size}")
    moved = x.movedim(dim, 0).contiguous()
    out = torch.empty((moved.shape[0] // size, *moved.shape[1:]), dtype=x.dtype, device=x.device)
    comm.reduce_scatter_tensor(out, moved, group, label=label)
    return out.movedim(0, dim)


def _split_dim(x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
    size, idx = group_size_rank(group)
    if x.shape[dim] % size:
        raise ValueError(f"split along dim {dim}: size {x.shape[dim]} not divisible by group size {size}")
    return x.chunk(size, dim=dim)[idx].contiguous()


def _all_reduce_copy(comm: Comm, x: torch.Tensor, group: Any, label: str | None) -> torch.Tensor:
    out = x.contiguous().clone()
    comm.all_reduce(out, group, label=label)
    return out


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, comm, label):  # type: ignore[override]
        ctx.group, ctx.comm, ctx.label = group, comm, label
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return _all_reduce_copy(ctx.comm, g, ctx.group, ctx.label), None, None, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, comm, label):  # type: ignore[override]
        return _all_reduce_copy(comm, x, group, label)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return g, None, None, None


class _GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim, comm, label):  # type: ignore[override]
        ctx.group, ctx.dim, ctx.comm, ctx.label = group, dim, comm, label
        return _all_gather_dim(comm, x, group, dim, label)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        bwd_label = f"{ctx.label}:bwd" if ctx.label else None
        return _reduce_scatter_dim(ctx.comm, g, ctx.group, ctx.dim, bwd_label), None, None, None, None


class _ReduceScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim, comm, label):  # type: ignore[override]
        ctx.group, ctx.dim, ctx.comm, ctx.label = group, dim, comm, label
        return _reduce_scatter_dim(comm, x, group, dim, label)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        bwd_label = f"{ctx.label}:bwd" if ctx.label else None
        return _all_gather_dim(ctx.comm, g, ctx.group, ctx.dim, bwd_label), None, None, None, None


class _ScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim, comm, label):  # type: ignore[override]
        ctx.group, ctx.dim, ctx.comm, ctx.label = group, dim, comm, label
        return _split_dim(x, group, dim)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        bwd_label = f"{ctx.label}:bwd" if ctx.label else None
        return _all_gather_dim(ctx.comm, g, ctx.group, ctx.dim, bwd_label), None, None, None, None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim, comm, label):  # type: ignore[override]
        ctx.group, ctx.dim = group, dim
        return _all_gather_dim(comm, x, group, dim, label)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return _split_dim(g, ctx.group, ctx.dim), None, None, None, None


def copy_to_tp(x: torch.Tensor, group: Any, *, comm: Comm | None = None,
               label: str | None = "tp:copy_to_tp:bwd") -> torch.Tensor:
    """Megatron f: identity forward, all-reduce of the gradient backward (input of a column-parallel layer)."""
    return _CopyToTP.apply(x, group, _resolve(comm), label)


def reduce_from_tp(x: torch.Tensor, group: Any, *, comm: Comm | None = None,
                   label: str | None = "tp:reduce_from_tp") -> torch.Tensor:
    """Megatron g: all-reduce forward, identity backward (output of a row-parallel layer)."""
    return _ReduceFromTP.apply(x, group, _resolve(comm), label)


def gather_from_sp(x: torch.Tensor, group: Any, *, dim: int = 1, comm: Comm | None = None,
                   label: str | None = "tp:sp_all_gather") -> torch.Tensor:
    """Sequence parallel: all-gather along `dim` (the sequence) forward, reduce-scatter of the gradient backward."""
    return _GatherFromSP.apply(x, group, dim, _resolve(comm), label)


def reduce_scatter_to_sp(x: torch.Tensor, group: Any, *, dim: int = 1, comm: Comm | None = None,
                         label: str | None = "tp:sp_reduce_scatter") -> torch.Tensor:
    """Sequence parallel: reduce-scatter along `dim` forward, all-gather of the gradient backward."""
    return _ReduceScatterToSP.apply(x, group, dim, _resolve(comm), label)


def scatter_to_sp(x: torch.Tensor, group: Any, *, dim: int = 1, comm: Comm | None = None,
                  label: str | None = "tp:sp_scatter") -> torch.Tensor:
    """Sequence parallel entry: keep this rank's chunk along `dim` forward, all-gather the gradient backward."""
    return _ScatterToSP.apply(x, group, dim, _resolve(comm), label)


def gather_from_tp(x: torch.Tensor, group: Any, *, dim: int = -1, comm: Comm | None = None,
                   label: str | None = "tp:gather_from_tp") -> torch.Tensor:
    """All-gather along `dim` (e.g. column-parallel logits) forward, keep this rank's chunk backward."""
    return _GatherFromTP.apply(x, group, dim % x.dim(), _resolve(comm), label)


# ---- expert-parallel all-to-all ------------------------------------------------------------------

class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, comm, label):  # type: ignore[override]
        ctx.out_splits, ctx.in_splits, ctx.group, ctx.comm, ctx.label = out_splits, in_splits, group, comm, label
        return _a2a(comm, x, out_splits, in_splits, group, label)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        bwd_label = f"{ctx.label}:bwd" if ctx.label else None
        grad = _a2a(ctx.comm, g, ctx.in_splits, ctx.out_splits, ctx.group, bwd_label)
        return grad, None, None, None, None, None


def _a2a(comm: Comm, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any,
         label: str | None) -> torch.Tensor:
    x = x.contiguous()
    if sum(in_splits) != x.shape[0]:
        raise ValueError(f"all_to_all: in_splits {in_splits} do not sum to {x.shape[0]} rows")
    out = torch.empty((sum(out_splits), *x.shape[1:]), dtype=x.dtype, device=x.device)
    comm.all_to_all_single(out, x, out_splits, in_splits, group, label=label)
    return out


def all_to_all_autograd(x: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int], group: Any, *,
                        comm: Comm | None = None, label: str | None = "ep:all_to_all") -> torch.Tensor:
    """Differentiable `all_to_all_single` along dim 0 with uneven (possibly zero) splits; backward swaps them."""
    return _AllToAll.apply(x, [int(s) for s in out_splits], [int(s) for s in in_splits], group,
                           _resolve(comm), label)
