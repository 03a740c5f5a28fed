"""Collective calls from the events of one Kineto trace → rows of the `collectives` table.

Four shapes exist in the wild, tried in this order (the first that has calls wins):
- "args": modern NCCL/RCCL: `record_param_comms` CPU ops carry `Collective name`, sizes, group and
  sometimes `Seq`; the comm kernel launched inside the op gives device ts/dur.
- "gloo": CPU traces: `c10d::<op>` on the caller thread and `gloo:<op>` on `pt_gloo_runloop` threads.
  Nothing links them, so each c10d call takes the earliest unused gloo event of a compatible op and
  size that starts after it (gloo runs reduce_scatter as all_reduce); gloo events left over become
  rows of their own.
- "nccl": old NCCL schema without args: one call per host `nccl:<op>` annotation, sizes from the
  enclosing `c10d::` op's `Input Dims`.
- "c10d": outermost `c10d::<op>` ops alone.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec
import numpy as np
import pyarrow as pa

from tracekit.parse.collective_names import (
    ALLTOALL_SPLIT_POSITIONS,
    C10D_ARG_ROLES,
    dtype_bytes,
    normalize_op,
)
from tracekit.tables.schema import COLLECTIVES, STEP_PATTERN

import re

_STEP_RE = re.compile(STEP_PATTERN)
_P2P = ("send", "recv")
C10D_PEER_POSITION = 2  # c10d::send / c10d::recv_ schema: (tensors, process_group, peer, tag)
# gloo implements some ops with others: ops a c10d call may appear as on the gloo thread.
_GLOO_ALIASES = {"reduce_scatter": ("reduce_scatter", "all_reduce")}


@dataclass
class CollectiveInputs:
    """Columns of one trace's complete events that collective assembly needs."""

    path: str
    name_dict: list
    name_codes: np.ndarray
    cat_codes: np.ndarray
    cat_values: list
    ts: np.ndarray
    end: np.ndarray
    dur: np.ndarray
    dur_ok: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    ext: pa.Array
    corr: np.ndarray
    args: dict  # row → args struct, for the candidate rows only
    gpu_row: np.ndarray
    kernel_rows: np.ndarray
    kernel_launch: np.ndarray
    step_at: Callable[[np.ndarray], np.ndarray]
    lenient: bool
    world_size: int | None
    only_default_group: bool = False
    """The trace's process groups are the default group alone: a c10d send/recv's group-local peer
    (its `Concrete Inputs`) is then the global rank."""


class _RowValues:
    """`column[row]` as int or None, without turning the whole column into Python objects."""

    def __init__(self, arr: pa.Array) -> None:
        self._values = arr.fill_null(0).to_numpy(zero_copy_only=False)
        self._valid = arr.is_valid().to_numpy(zero_copy_only=False)

    def __getitem__(self, row: int) -> int | None:
        return int(self._values[row]) if self._valid[row] else None


@dataclass
class CollectiveResult:
    table: pa.Table
    kernel_row_to_call: dict[int, dict]
    mode: str | None
    warnings: list[str] = field(default_factory=list)


def build_collectives(inp: CollectiveInputs) -> CollectiveResult:
    host = ~inp.gpu_row
    codes = classify_collective_names(inp.name_dict)
    rows = {kind: np.flatnonzero(np.isin(inp.name_codes, c) & host) if c else np.zeros(0, np.int64)
            for kind, c in codes.items()}
    ops = [normalize_op(_str(inp.args[r].coll_name)) for r in rows["rpc"].tolist()]
    modern = [i for i, o in enumerate(ops) if o is not None]
    if modern:
        return _args_result(inp, rows["rpc"][modern], [ops[i] for i in modern], rows["ann"])
    ext = _RowValues(inp.ext) if len(rows["rpc"]) or len(rows["c10d"]) or len(rows["nccl"]) else None
    warnings: list[str] = []
    calls: list[dict]
    if len(rows["gloo"]):
        mode = "gloo"
        calls = _gloo_calls(inp, _outermost(inp, rows["c10d"]), rows["gloo"])
    elif len(rows["nccl"]):
        mode = "nccl"
        calls = _nccl_calls(inp, rows["nccl"], rows["c10d"])
    elif len(rows["c10d"]):
        mode = "c10d"
        calls = [_c10d_call(inp, int(r)) for r in _outermost(inp, rows["c10d"])]
        calls = [c for c in calls if c is not None]
    else:
        mode = None
        calls = []

    if ext is not None:
        for c in calls:
            r = c.get("_row")
            if r is not None and c.get("external_id") is None:
                c["external_id"] = ext[r]

    link = _link_kernels(inp, calls, ext) if mode in ("nccl", "c10d") and len(inp.kernel_rows) else {}
    _assign_callers(inp, calls, rows["ann"])
    times = np.array([c["enqueue_ts"] if c.get("enqueue_ts") is not None else (c["ts"] if c["ts"] is not None else 0)
                      for c in calls], np.int64)
    steps = inp.step_at(times) if len(calls) else np.zeros(0, np.int64)
    for c, s in zip(calls, steps):
        c["step"] = int(s) if s >= 0 else None
        if c.get("state") is None:
            c["state"] = "completed" if c.get("ts") is not None else "unknown"
        if c.get("bytes") is None:
            c["bytes"] = _bytes_of(c.get("in_nelems"), c.get("out_nelems"), c.get("dtype"))
        c["size_note"] = size_note(c)
        c["is_p2p"] = c["op"] in _P2P
    calls.sort(key=lambda c: (c["enqueue_ts"] if c.get("enqueue_ts") is not None else c["ts"]))
    cols = {f.name: [c.get(f.name) for c in calls] for f in COLLECTIVES}
    cols["rank"] = [-1] * len(calls)
    cols["source"] = ["kineto"] * len(calls)
    table = pa.Table.from_pydict(cols, schema=COLLECTIVES)
    return CollectiveResult(table=table, kernel_row_to_call=link, mode=mode, warnings=warnings)


def candidate_codes(name_dict: list) -> list[int]:
    """Name codes of the events whose args collective assembly reads."""
    c = classify_collective_names(name_dict)
    return c["rpc"] + c["nccl"] + c["gloo"] + c["c10d"]


def classify_collective_names(name_dict: list) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {"rpc": [], "nccl": [], "gloo": [], "c10d": [], "ann": []}
    for code, nm in enumerate(name_dict):
        if not nm:
            continue
        low = nm.lower()
        if nm == "record_param_comms":
            out["rpc"].append(code)
        elif low.startswith("nccl:") or low.startswith("rccl:"):
            if normalize_op(nm) is not None:
                out["nccl"].append(code)
        elif low.startswith("gloo:"):
            if normalize_op(nm) is not None:
                out["gloo"].append(code)
        elif nm.startswith("c10d::"):
            if nm[6:] in C10D_ARG_ROLES or normalize_op(nm) not in (None, "unknown"):
                out["c10d"].append(code)
        elif not _STEP_RE.match(nm):
            out["ann"].append(code)
    return out


# ----------------------------------------------------------------------------------------------
# value helpers


def _str(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else str(v)


def _int(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v == v:
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            return None
    return None


def _int_list(v: Any) -> list[int] | None:
    """"[0, 1]" or [0, 1] → [0, 1]; empty or unparsable → None."""
    if v is None:
        return None
    if isinstance(v, (bytes, bytearray, memoryview, msgspec.Raw)):
        v = bytes(v)
    if isinstance(v, (str, bytes)):  # a group's ranks, written again on each of its collectives: decoded once
        got = _int_list_of_text(v)
        return None if got is None else list(got)
    if not isinstance(v, list) or not v:
        return None
    out = [_int(x) for x in v]
    return None if any(x is None for x in out) else out


@functools.lru_cache(maxsize=4096)
def _int_list_of_text(v: str | bytes) -> tuple[int, ...] | None:
    """`_int_list` of JSON text, as a tuple (cached: each caller gets its own list)."""
    try:
        got = _int_list(msgspec.json.decode(v))  # a list, or a JSON string holding one
    except msgspec.DecodeError:
        return None
    return None if got is None else tuple(got)


def _raw_json(v: Any) -> Any:
    if v is None or len(v) == 0:
        return None
    try:
        return msgspec.json.decode(bytes(v))
    except (msgspec.DecodeError, TypeError):
        return None


def _numel(dims: Any) -> int | None:
    """[] or [a, b] → product; [[a], [b]] (tensor list) → sum of products."""
    if not isinstance(dims, list):
        return None
    if all(isinstance(d, int) for d in dims):
        p = 1
        for d in dims:
            p *= d
        return p
    total = 0
    for d in dims:
        n = _numel(d)
        if n is None:
            return None
        total += n
    return total


def _first_dtype(types: Any) -> str | None:
    """The first `Input type` entry that is a tensor dtype (not TensorList, Scalar, GenericList, '' ...)."""
    if not isinstance(types, list):
        return None
    return next((t for t in types if isinstance(t, str) and dtype_bytes(t) is not None), None)


def _tensor_numel(dims: Any, typ: Any) -> int | None:
    """Elements of one recorded argument: a tensor (its type a dtype) → product of its dims; a TensorList
    or anything whose dims were not recorded → None (unknown, never the 1 element of `[]`)."""
    if not isinstance(typ, str) or dtype_bytes(typ) is None:
        return None
    return _numel(dims)


def size_note(call: dict) -> str | None:
    """Why a collective has no byte count (None when it has one)."""
    if call.get("bytes") is not None:
        return None
    if call.get("size_note"):
        return call["size_note"]
    if call.get("in_nelems") is None and call.get("out_nelems") is None:
        return "no element count recorded"
    if call.get("dtype") is None:
        return "no dtype recorded"
    return f"unknown dtype {call['dtype']!r}"


def _interval(inp: CollectiveInputs, r: int) -> tuple[int, int | None]:
    return int(inp.ts[r]), (int(inp.dur[r]) if inp.dur_ok[r] else None)


# ----------------------------------------------------------------------------------------------
# call shapes


def _base(inp: CollectiveInputs, r: int, op: str, enqueue: bool) -> dict:
    t, d = _interval(inp, r)
    c = {
        "_row": r, "_pid": int(inp.pid[r]), "_tid": int(inp.tid[r]),
        "op": op, "name": inp.name_dict[inp.name_codes[r]],
        "ts": None, "dur": None, "enqueue_ts": None, "enqueue_dur": None,
    }
    if enqueue:
        c["enqueue_ts"], c["enqueue_dur"] = t, d
    else:
        c["ts"], c["dur"] = t, d
    return c


def _c10d_sizes(inp: CollectiveInputs, r: int) -> dict:
    """Sizes, dtype and all_to_all splits of a `c10d::<op>` from its recorded shapes."""
    a = inp.args[r]
    nm = inp.name_dict[inp.name_codes[r]]
    roles = C10D_ARG_ROLES.get(nm[6:] if nm.startswith("c10d::") else nm, ())
    dims = _raw_json(a.input_dims)
    types = _raw_json(a.input_type)
    out: dict = {"dtype": _first_dtype(types)}
    if isinstance(dims, list):
        types = types if isinstance(types, list) else []
        for i, (role, d) in enumerate(zip(roles, dims)):
            typ = types[i] if i < len(types) else None
            n = _tensor_numel(d, typ)
            if n is None and typ is not None:
                out["size_note"] = f"{nm}: input {i} is a {typ or 'value'} whose sizes were not recorded"
            if role in ("in", "inout"):
                out["in_nelems"] = n
            if role in ("out", "inout"):
                out["out_nelems"] = n
    if nm == "c10d::alltoall_base_" and len(a.concrete_inputs):
        ci = _raw_json(a.concrete_inputs)
        if isinstance(ci, list) and len(ci) > max(ALLTOALL_SPLIT_POSITIONS):
            out["out_split_sizes"] = _int_list(ci[ALLTOALL_SPLIT_POSITIONS[0]])
            out["in_split_sizes"] = _int_list(ci[ALLTOALL_SPLIT_POSITIONS[1]])
    return out


def _c10d_call(inp: CollectiveInputs, r: int) -> dict | None:
    op = normalize_op(inp.name_dict[inp.name_codes[r]])
    if op is None:
        return None
    c = _base(inp, r, op, enqueue=True)
    c.update(_c10d_sizes(inp, r))
    if op in _P2P and inp.only_default_group:
        c["peer"] = _c10d_peer(inp, r)
    return c


def _c10d_peer(inp: CollectiveInputs, r: int) -> int | None:
    """`c10d::send(tensors, group, dst, tag)` / `c10d::recv_(tensors, group, src, tag)`: the peer argument."""
    ci = _raw_json(inp.args[r].concrete_inputs) if len(inp.args[r].concrete_inputs) else None
    return _int(ci[C10D_PEER_POSITION]) if isinstance(ci, list) and len(ci) > C10D_PEER_POSITION else None


def _annotation_sizes(inp: CollectiveInputs, r: int, op: str) -> dict:
    """Sizes from a gloo:/nccl: annotation's own `Input Dims` (its input tensor)."""
    a = inp.args[r]
    dims = _raw_json(a.input_dims)
    types = _raw_json(a.input_type)
    typ = types[0] if isinstance(types, list) and types else None
    n = _tensor_numel(dims[0], typ) if isinstance(dims, list) and dims else None
    out = {"dtype": _first_dtype(types), "in_nelems": n}
    if op in ("all_reduce", "broadcast", "send", "recv", "reduce"):
        out["out_nelems"] = n
    return out


GLOO_LOOKAHEAD = 4
"""Worker events after a c10d call searched for one of the size its TensorList lists (gloo's worker threads
start a group's queued ops at most a few apart; a coalesced op's events list other sizes and take the earliest)."""


def _listed_numel(inp: CollectiveInputs, r: int) -> int | None:
    """Elements of a c10d call's first input as its recorded dims list them, a TensorList's included
    (DDP buckets: `[[[29184]], ...]`). Only to pair the call with its gloo worker event: gloo runs a
    group's async ops on several threads, so two buckets' events may start in the other order. The row's
    size still comes from the worker's tensor (a TensorList's dtype, hence its bytes, is not recorded)."""
    if inp.name_dict[inp.name_codes[r]] != "c10d::allreduce_":  # other ops' lists (coalesced, gathered
        return None                                             # outputs) are not the worker's tensor
    dims = _raw_json(inp.args[r].input_dims)
    if isinstance(dims, list) and dims and isinstance(dims[0], list) and dims[0]:
        return _numel(dims[0])
    return None


def _gloo_calls(inp: CollectiveInputs, c10d_rows: np.ndarray, gloo_rows: np.ndarray) -> list[dict]:
    pending: dict[str, list[int]] = {}
    for r in sorted((int(r) for r in gloo_rows), key=lambda r: inp.ts[r]):
        pending.setdefault(normalize_op(inp.name_dict[inp.name_codes[r]]), []).append(r)
    sizes_of = {}
    calls = []
    for r in sorted((int(r) for r in c10d_rows), key=lambda r: inp.ts[r]):
        c = _c10d_call(inp, r)
        if c is None:
            continue
        t0 = inp.ts[r]
        wanted = {v for v in (c.get("in_nelems"), c.get("out_nelems")) if v is not None}
        listed = _listed_numel(inp, r)
        best = None
        for op in _GLOO_ALIASES.get(c["op"], (c["op"],)):
            fits = []
            for g in pending.get(op, ()):
                if inp.ts[g] < t0:
                    continue
                if g not in sizes_of:
                    sizes_of[g] = _annotation_sizes(inp, g, op)
                n = sizes_of[g].get("in_nelems")
                if wanted and n is not None and n not in wanted:
                    continue
                fits.append(g)
                if listed is None or n == listed or len(fits) == GLOO_LOOKAHEAD:
                    break
            # the first fitting event of the listed size among the next few, else the earliest one
            g = next((x for x in fits if sizes_of[x].get("in_nelems") == listed), fits[0] if fits else None)
            if g is not None and (best is None or inp.ts[g] < inp.ts[best[0]]):
                best = (g, op)
        if best is not None:
            g, op = best
            pending[op].remove(g)
            c["ts"], c["dur"] = _interval(inp, g)
            c["_worker_row"] = g
            for key in ("dtype", "in_nelems", "out_nelems"):  # e.g. a bucket's TensorList: the worker's tensor
                if c.get(key) is None:
                    c[key] = sizes_of[g].get(key)
        calls.append(c)
    for op, rest in pending.items():
        for g in rest:
            c = _base(inp, g, op, enqueue=False)
            c.update(sizes_of.get(g) or _annotation_sizes(inp, g, op))
            calls.append(c)
    return calls


def _nccl_calls(inp: CollectiveInputs, nccl_rows: np.ndarray, c10d_rows: np.ndarray) -> list[dict]:
    enclosing = _innermost_by_thread(inp, c10d_rows, nccl_rows, use_end=False)
    calls = []
    for r, outer in zip(nccl_rows, enclosing):
        r = int(r)
        op = normalize_op(inp.name_dict[inp.name_codes[r]])
        if op is None:
            continue
        c = _base(inp, r, op, enqueue=True)
        c["_link_row"] = r
        sizes = _annotation_sizes(inp, r, op)
        if outer >= 0:
            c["enqueue_ts"], c["enqueue_dur"] = _interval(inp, int(outer))
            c["_row"] = int(outer)
            from_c10d = _c10d_sizes(inp, int(outer))
            sizes.update({k: v for k, v in from_c10d.items() if v is not None})
        c.update(sizes)
        calls.append(c)
    return calls


# ----------------------------------------------------------------------------------------------
# intervals


def _outermost(inp: CollectiveInputs, rows: np.ndarray) -> np.ndarray:
    """Rows not nested inside another row of the same set on the same thread."""
    if len(rows) == 0:
        return rows
    parent = _innermost_by_thread(inp, rows, rows, use_end=False, exclude_self=True)
    return rows[parent < 0]


def _innermost(starts: list[int], ends: list[int], queries: list[tuple[int, int]]) -> dict[int, int]:
    """For (time, key) queries, the index of the innermost interval containing time (sweep + stack)."""
    order = sorted(range(len(starts)), key=lambda i: (starts[i], -ends[i]))
    out: dict[int, int] = {}
    stack: list[int] = []
    j = 0
    for t, key in sorted(queries):
        while j < len(order) and starts[order[j]] <= t:
            i = order[j]
            while stack and ends[stack[-1]] < starts[i]:
                stack.pop()
            stack.append(i)
            j += 1
        k = len(stack) - 1
        while k >= 0 and ends[stack[k]] < t:
            k -= 1
        del stack[k + 1:]
        out[key] = stack[-1] if stack else -1
    return out


def _innermost_by_thread(inp: CollectiveInputs, cand_rows: np.ndarray, query_rows: np.ndarray,
                         use_end: bool, exclude_self: bool = False) -> np.ndarray:
    """For each query row, the innermost candidate row on the same (pid, tid) containing its start."""
    result = np.full(len(query_rows), -1, np.int64)
    if len(cand_rows) == 0 or len(query_rows) == 0:
        return result
    by_thread: dict[tuple[int, int], list[int]] = {}
    for r in cand_rows:
        by_thread.setdefault((int(inp.pid[r]), int(inp.tid[r])), []).append(int(r))
    queries: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for qi, r in enumerate(query_rows):
        queries.setdefault((int(inp.pid[r]), int(inp.tid[r])), []).append((int(inp.ts[r]), qi))
    for key, qs in queries.items():
        cands = by_thread.get(key)
        if not cands:
            continue
        if exclude_self:
            # a candidate never contains itself: shift starts by one so equal-start parents win
            starts = [int(inp.ts[c]) for c in cands]
            ends = [int(inp.end[c]) for c in cands]
            qrow = {qi: int(query_rows[qi]) for _, qi in qs}
            for _, qi in qs:
                r = qrow[qi]
                best = -1
                for ci, c in enumerate(cands):
                    if c != r and starts[ci] <= inp.ts[r] and ends[ci] >= inp.end[r] and (
                            best < 0 or starts[ci] >= inp.ts[best]):
                        best = c
                result[qi] = best
            continue
        starts = [int(inp.ts[c]) for c in cands]
        ends = [int(inp.end[c]) for c in cands]
        found = _innermost(starts, ends, qs)
        for _, qi in qs:
            i = found.get(qi, -1)
            result[qi] = cands[i] if i >= 0 else -1
    return result


def _link_kernels(inp: CollectiveInputs, calls: list[dict], ext: _RowValues | None) -> dict[int, dict]:
    """Comm kernel → call: the call whose CPU interval on the launching thread contains the launch;
    kernels without a launch record fall back to equal External id. Sets the call's device ts/dur."""
    link: dict[int, dict] = {}
    if not calls:
        return link
    by_thread: dict[tuple[int, int], list[tuple[int, int, dict]]] = {}
    for c in calls:
        r = c.get("_link_row", c["_row"])
        by_thread.setdefault((int(inp.pid[r]), int(inp.tid[r])), []).append((int(inp.ts[r]), int(inp.end[r]), c))
        if c.get("_row") is not None and c["_row"] != r:
            o = c["_row"]
            by_thread.setdefault((int(inp.pid[o]), int(inp.tid[o])), []).append((int(inp.ts[o]), int(inp.end[o]), c))
    for lst in by_thread.values():
        lst.sort(key=lambda x: x[0])
    starts_of = {k: [x[0] for x in v] for k, v in by_thread.items()}
    by_ext: dict[int, dict] = {}
    if ext is not None:
        for c in calls:
            if c.get("external_id") is not None:
                by_ext.setdefault(c["external_id"], c)
    for k, launch in zip(inp.kernel_rows, inp.kernel_launch):
        k = int(k)
        call = None
        if launch >= 0:
            key = (int(inp.pid[launch]), int(inp.tid[launch]))
            lst = by_thread.get(key)
            if lst:
                t = int(inp.ts[launch])
                i = bisect_left(starts_of[key], t + 1) - 1
                steps = 0
                while i >= 0 and steps < 16:
                    s, e, c = lst[i]
                    if s <= t <= e:
                        call = c
                        break
                    i -= 1
                    steps += 1
        if call is None and ext is not None and ext[k] is not None and launch < 0:
            call = by_ext.get(ext[k])
        if call is None:
            continue
        link[k] = call
        kt, kd = _interval(inp, k)
        ke = kt + (kd or 0)
        if call["ts"] is None:
            call["ts"], call["_kend"] = kt, ke
            call["correlation"] = int(inp.corr[k]) if inp.corr[k] >= 0 else None
        else:
            call["_kend"] = max(call.get("_kend", call["ts"]), ke)
            call["ts"] = min(call["ts"], kt)
        call["dur"] = call["_kend"] - call["ts"]
    return link


def _assign_callers(inp: CollectiveInputs, calls: list[dict], ann_rows: np.ndarray) -> None:
    """caller = innermost user_annotation on the calling thread around the call's enqueue (`_callers`)."""
    queued = [c for c in calls if c.get("enqueue_ts") is not None]
    for c, caller in zip(queued, _callers(inp, np.array([c["_row"] for c in queued], np.int64), ann_rows)):
        if caller is not None:
            c["caller"] = caller


# ----------------------------------------------------------------------------------------------
# the "args" shape, as columns (a trace of thousands of NCCL calls: no dict per call)


def _args_result(inp: CollectiveInputs, rows: np.ndarray, op: list[str], ann_rows: np.ndarray) -> CollectiveResult:
    """The "args" shape's table: one row per `record_param_comms` op of `rows` (its collective `op`), read from
    its args field by field; device ts/dur from its comm kernels (`_args_kernels`), caller from the annotations
    around it; rows in enqueue order."""
    a = [inp.args[r] for r in rows.tolist()]
    seq = [s if (s := _int(x.seq)) is not None else _int(x.seq_num) for x in a]
    enq, enq_ok = inp.ts[rows], inp.dur_ok[rows]
    ext = inp.ext.take(pa.array(rows, pa.int64())) if len(rows) else pa.array([], pa.int64())
    pg = [_str(x.pg_name) for x in a]
    ts, dur, corr, link = _args_kernels(inp, rows, ext, op, pg)
    steps = inp.step_at(enq) if len(rows) else np.zeros(0, np.int64)
    in_n, out_n = [_int(x.in_nelems) for x in a], [_int(x.out_nelems) for x in a]
    dtype = [_str(x.dtype) for x in a]
    nbytes = [_bytes_of(i, o, d) for i, o, d in zip(in_n, out_n, dtype)]
    cols = {
        "rank": np.full(len(rows), -1, np.int32), "source": ["kineto"] * len(rows),
        "pg_name": pg, "pg_desc": [_str(x.pg_desc) for x in a],
        "seq": seq, "seq_source": ["args" if s is not None else None for s in seq], "op": op,
        "is_p2p": [o in _P2P for o in op],
        "peer": [_int(x.dst_rank) if o == "send" else (_int(x.src_rank) if o == "recv" else None)
                 for x, o in zip(a, op)],
        "in_nelems": in_n, "out_nelems": out_n, "dtype": dtype, "bytes": nbytes,
        "size_note": [size_note({"bytes": b, "in_nelems": i, "out_nelems": o, "dtype": d})
                      for b, i, o, d in zip(nbytes, in_n, out_n, dtype)],
        "in_split_sizes": [_int_list(x.in_split) for x in a], "out_split_sizes": [_int_list(x.out_split) for x in a],
        "group_size": [_int(x.group_size) for x in a], "group_ranks": [_int_list(x.pg_ranks) for x in a],
        "ts": pa.array(ts, pa.int64(), mask=ts == _NONE), "dur": pa.array(dur, pa.int64(), mask=ts == _NONE),
        "enqueue_ts": enq, "enqueue_dur": pa.array(inp.dur[rows], pa.int64(), mask=~enq_ok),
        "state": np.where(ts == _NONE, "unknown", "completed").tolist(),
        "name": [inp.name_dict[c] for c in inp.name_codes[rows].tolist()],
        "caller": _callers(inp, rows, ann_rows),
        "correlation": pa.array(corr, pa.int64(), mask=corr < 0), "external_id": ext,
        "step": pa.array(steps, pa.int32(), mask=steps < 0), "match_note": [None] * len(rows),
    }
    order = np.argsort(enq, kind="stable")  # enqueue order, before the dictionary columns are encoded
    cols = {k: (v.take(pa.array(order)) if isinstance(v, pa.Array) else np.asarray(v)[order] if isinstance(
        v, np.ndarray) else [v[i] for i in order.tolist()]) for k, v in cols.items()}
    return CollectiveResult(table=pa.Table.from_pydict(cols, schema=COLLECTIVES), kernel_row_to_call=link,
                            mode="args")


_NONE = np.iinfo(np.int64).min
"""`_args_kernels`: a call no kernel was linked to (no device ts/dur)."""


def _bytes_of(in_n: int | None, out_n: int | None, dtype: str | None) -> int | None:
    """max(in, out) elements x the dtype's size; None when either is unknown."""
    size = dtype_bytes(dtype)
    nel = [v for v in (in_n, out_n) if v is not None]
    return max(nel) * size if nel and size else None


def _callers(inp: CollectiveInputs, rows: np.ndarray, ann_rows: np.ndarray) -> list[str | None]:
    """Per call row of `rows`: the innermost user annotation on its thread around its enqueue (its start)."""
    out: list[str | None] = [None] * len(rows)
    cats = inp.cat_values
    if "user_annotation" not in cats or not len(rows) or not len(ann_rows):
        return out
    ann = ann_rows[inp.cat_codes[ann_rows] == cats.index("user_annotation")]
    if len(ann) == 0:
        return out
    found = _innermost_by_thread(inp, ann, rows, use_end=False)
    return [inp.name_dict[inp.name_codes[f]] if f >= 0 else None for f in found.tolist()]


def _args_kernels(inp: CollectiveInputs, rows: np.ndarray, ext: pa.Array, op: list[str], pg: list[str | None]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, dict]]:
    """Per call: device ts and dur over its comm kernels (first start to last end; `_NONE` without one) and
    the first kernel's correlation (-1: none); and kernel row -> its call's op and group. A kernel belongs to
    the call whose interval on the launching thread contains the launch (the latest of the 16 calls starting
    at or before it that does), or, without a launch record, to the first call of its External id
    (`_link_kernels`, per call)."""
    n = len(rows)
    ts, kend, corr = np.full(n, _NONE, np.int64), np.full(n, _NONE, np.int64), np.full(n, -1, np.int64)
    krows, launch = np.asarray(inp.kernel_rows, np.int64), np.asarray(inp.kernel_launch, np.int64)
    if n == 0 or krows.size == 0:
        return ts, ts.copy(), corr, {}
    call = _calls_of_launches(inp, rows, launch)
    by_ext = np.flatnonzero((call < 0) & (launch < 0))
    if by_ext.size:
        call[by_ext] = _first_call_of_ext(ext, inp.ext.take(pa.array(krows[by_ext], pa.int64())))
    hit = np.flatnonzero(call >= 0)
    c, k = call[hit], krows[hit]
    kt = inp.ts[k].astype(np.int64)
    ke = kt + np.where(inp.dur_ok[k], inp.dur[k], 0).astype(np.int64)
    seen = np.zeros(n, bool)
    seen[c] = True
    ts[seen] = np.iinfo(np.int64).max
    np.minimum.at(ts, c, kt)
    np.maximum.at(kend, c, ke)
    first_call, first = np.unique(c, return_index=True)  # each call's first kernel (kernel order) names its correlation
    kc = inp.corr[k[first]]
    corr[first_call] = np.where(kc >= 0, kc, -1)
    dur = np.where(seen, kend - ts, 0)
    link = {int(kr): {"op": op[ci], "pg_name": pg[ci]} for kr, ci in zip(k.tolist(), c.tolist())}
    return ts, dur, corr, link


def _calls_of_launches(inp: CollectiveInputs, rows: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """Per kernel (its launch row, -1: none): the index in `rows` of the call on the launch's thread whose
    interval contains the launch, searched back from the latest call starting at or before it (16 at most);
    -1 where none does."""
    out = np.full(launch.size, -1, np.int64)
    has = np.flatnonzero(launch >= 0)
    if has.size == 0:
        return out
    lrows = launch[has]
    threads, code = np.unique(np.concatenate([np.stack([inp.pid[rows], inp.tid[rows]], 1),
                                              np.stack([inp.pid[lrows], inp.tid[lrows]], 1)]).astype(np.int64),
                              axis=0, return_inverse=True)
    code = code.reshape(-1)
    call_code, launch_code = code[:rows.size], code[rows.size:]
    for t in np.unique(launch_code).tolist():
        mine = np.flatnonzero(call_code == t)
        if mine.size == 0:
            continue
        mine = mine[np.argsort(inp.ts[rows[mine]], kind="stable")]
        s, e = inp.ts[rows[mine]], inp.end[rows[mine]]
        q = np.flatnonzero(launch_code == t)
        lt = inp.ts[lrows[q]]
        i = np.searchsorted(s, lt, side="right") - 1
        got = np.full(q.size, -1, np.int64)
        for back in range(16):
            j = i - back
            ok = (got < 0) & (j >= 0)
            jj = np.maximum(j, 0)
            ok &= (s[jj] <= lt) & (lt <= e[jj])
            got[ok] = mine[jj[ok]]
        out[has[q]] = got
    return out


def _first_call_of_ext(call_ext: pa.Array, kernel_ext: pa.Array) -> np.ndarray:
    """Per kernel External id: the index of the first call with it, -1 where none (or the id is null)."""
    cv = call_ext.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    cok = call_ext.is_valid().to_numpy(zero_copy_only=False)
    kv = kernel_ext.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    kok = kernel_ext.is_valid().to_numpy(zero_copy_only=False)
    valid = np.flatnonzero(cok)
    if valid.size == 0:
        return np.full(kv.size, -1, np.int64)
    uniq, first = np.unique(cv[valid], return_index=True)  # np.unique's index: the first occurrence
    j = np.clip(np.searchsorted(uniq, kv), 0, uniq.size - 1)
    return np.where(kok & (uniq[j] == kv), valid[first[j]], -1)
