"""Build one step's cross-rank dependency graph (graph.StepGraph) from a run store's tables.

Lanes per rank:
- GPU ranks (rows in `kernels`): each device stream (the step's kernels, `kernels.step`), and each host
  thread that launched them (its CUDA/HIP runtime calls). Edges: lane order, launch call → kernel (by
  correlation), device → host for calls that wait for the device (`*Synchronize*`, blocking memcpy:
  the call's end follows the last kernel that ended inside it; the wait itself costs nothing of its own).
- CPU ranks: the training thread (the thread of `ProfilerStep#N`; its top-level `cpu_op`s, cut where
  the rank issued a collective) and one comm lane per process group (gloo runs a group's collectives in
  order). A collective that ended while the training thread sat idle, or inside the op that issued it,
  releases the thread (it was waiting for it); one ending inside other work was already overlapped.
- Collectives (matching.py's instances, arrival as matching defines it): each member's arrival node,
  one sync node per instance (the last arrival), then each member's transfer node
  (member's end − last arrival), so no member's transfer starts before the last member arrives.
- Per rank a step-start node (pinned at the step window's start) precedes each lane's first node, so
  a lane's late start (a data stall at the step's beginning) is a gap of its own.
Times go onto one clock: trace clock − (log→trace shift) − (clock offset), as matching estimates them.
The measured step of a rank: GPU = first to last kernel of the step; CPU = the ProfilerStep window. On a run
without steps a rank's one step is its breakdown window (SPAN_STEP: every row without a step): a GPU rank's
device span, a CPU rank's first to last event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.derive import intervals as iv
from tracekit.derive.activity import stepless_windows
from tracekit.derive.host_gaps import host_idle
from tracekit.derive.host_ops import (SlowOps, excess_ns, host_ops, last_ended_inside, names_where, own_op_waits,
                                     queue_full_launches, slow_ops_of)
from tracekit.derive.matching import LOG_SOURCES, MatchedCollectives, row_trace_shift
from tracekit.parse.classify import is_label, name_role
from tracekit.parse.dict_columns import codes, object_strings, text_test
from tracekit.tables.columns import (Columns, arrow_columns, concat, first_of_group, group_ids, lookup,
                                     match_rows, merged_codes, num_rows, recode, sorted_codes, sorted_unique,
                                     strings, take)
from tracekit.tables.store import RunStore
from tracekit.whatif.graph import (Category, InstInfo, MemberIO, StepGraph, add_edges, add_start_nodes,
                                   device_lane_mask, host_lane_mask, id_dtype, zero_backed)

BLOCKING_CALL_WORDS = ("Synchronize",)
BLOCKING_MEMCPY = ("cudaMemcpy", "hipMemcpy", "cudaMemcpy2D", "hipMemcpy2D", "hipMemcpyWithStream")
P2P_KEY = "p2p:"
"""prefix of a send/recv pair's instance key"""
SPAN_STEP = -2
"""The step number of a rank's one window on a run without steps, the breakdown's (derive/activity.py
`stepless_window`: a GPU rank's first to last device event, `device_span`, in a run without ProfilerStep in
which no iteration repeats; a CPU rank's first to last event, `trace`). Its
kernels, events and collectives carry no step (null, NaN, or -1 where nulls were filled): a graph of this
step reads every row without one (`in_steps`), carry-over kernels excepted, as the breakdown does."""


def reported_step(step: int) -> int | None:
    """A graph's step number as the documents write it: the device span's (SPAN_STEP) has none."""
    return None if step == SPAN_STEP else step


def _piece(val: Any, dt: Any, k: int) -> np.ndarray:
    """A column's piece of `k` nodes: a copy of an array, a scalar as a read-only broadcast view (no memory
    until the pieces are joined: most pieces of a large graph's columns are one value per call)."""
    arr = np.asarray(val, dtype=dt)
    return np.broadcast_to(arr, (k,)) if arr.ndim == 0 else np.array(np.broadcast_to(arr, (k,)))


KIND_CATEGORY = {"compute": Category.COMPUTE, "comm": Category.TRANSFER, "memcpy": Category.OTHER,
                 "memset": Category.OTHER}


@dataclass
class _Buf:
    """Nodes and cross-lane edges being collected (lane-order edges are added at the end)."""

    cols: dict[str, list[np.ndarray]] = field(default_factory=lambda: {
        k: [] for k in ("rank", "lane", "category", "start", "dur", "dim", "inst", "terminal", "prio", "step",
                       "tie", "xgap", "xdur")})
    names: list[str] = field(default_factory=list)
    src: list[np.ndarray] = field(default_factory=list)
    dst: list[np.ndarray] = field(default_factory=list)
    n: int = 0
    lane_names: list[str] = field(default_factory=list)
    distinct: dict[str, str] = field(default_factory=dict)
    slow: dict[int, Columns] = field(default_factory=dict)
    """per GPU rank: its slow host ops (`host_bound.excess_ns` > 0: tid, ts, end, excess, runtime; trace clock)"""
    idle: dict[int, iv.IntervalSet] = field(default_factory=dict)
    """per GPU rank: its host gaps and data loading (derive/host_gaps.py `host_idle`; common clock)"""

    def _name_of(self, name: str) -> str:
        return self.distinct.setdefault(name, name)

    def lane(self, name: str) -> int:
        self.lane_names.append(name)
        return len(self.lane_names) - 1

    def add(self, *, rank: int, lane: Any, category: Any, start: np.ndarray, dur: np.ndarray,
            names: list[str] | str = "", dim: Any = -1, inst: Any = -1, terminal: Any = False,
            prio: Any = 1, step: Any = -1, tie: Any = None, xgap: Any = 0, xdur: Any = 0) -> np.ndarray:
        """`tie`: orders nodes of one lane that start at the same time (default: their start); `xgap` /
        `xdur`: slow host time in the node's gap / its own time (`StepGraph.excess_gap`)."""
        k = len(start)
        for key, val, dt in (("rank", rank, np.int32), ("lane", lane, np.int64), ("category", category, np.int8),
                             ("start", start, np.int64), ("dur", dur, np.int64), ("dim", dim, np.int32),
                             ("inst", inst, np.int32), ("terminal", terminal, bool), ("prio", prio, np.int8),
                             ("step", step, np.int64), ("xgap", xgap, np.int64), ("xdur", xdur, np.int64)):
            self.cols[key].append(_piece(val, dt, k))
        # a node's tie is its start unless given: the start's piece itself (both are only read when joined)
        self.cols["tie"].append(self.cols["start"][-1] if tie is None else _piece(tie, np.int64, k))
        # one string object per distinct name (a 1,024-rank graph: 5 M nodes, ~1,000 names)
        # (`distinct.setdefault` mapped directly: `_name_of` per node was a Python call per node)
        self.names.extend(map(self.distinct.setdefault, names, names) if isinstance(names, list)
                          else [self._name_of(names)] * k)
        ids = np.arange(self.n, self.n + k, dtype=np.int64)
        self.n += k
        return ids

    def edge(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Edges among nodes added so far: ids below `n`, kept in the smallest dtype that holds them."""
        small = id_dtype(self.n)
        self.src.append(np.asarray(src).astype(small, copy=False))
        self.dst.append(np.asarray(dst).astype(small, copy=False))

    def finish(self, dims: list[str]) -> StepGraph:
        c = {}
        for k in list(self.cols):  # each column's pieces freed once joined (a large run's graph: not twice at once)
            v = self.cols.pop(k)
            c[k] = np.concatenate(v) if v else np.zeros(0)
            del v
        lane, start = c["lane"].astype(np.int64), c["start"].astype(np.int64)
        chained = np.flatnonzero(lane >= 0)
        tie, prio = c.pop("tie"), c.pop("prio")  # read by the sort only: freed before the edges are joined
        order = chained[np.lexsort((chained, tie[chained], prio[chained], start[chained], lane[chained]))]
        del tie, prio, chained
        same = lane[order[1:]] == lane[order[:-1]]
        # edge ids in the smallest dtype that holds them, each array written once (`graph.add_edges`)
        small = id_dtype(len(lane))
        src = np.concatenate(self.src + [order[:-1][same]], dtype=small, casting="same_kind")
        self.src.clear()
        dst = np.concatenate(self.dst + [order[1:][same]], dtype=small, casting="same_kind")
        self.dst.clear()
        del order, same
        as_ = {"copy": False}  # the joined columns are the graph's own (no second copy of a large graph)
        return StepGraph(rank=c["rank"].astype(np.int32, **as_), lane=lane, category=c["category"].astype(np.int8, **as_),
                         start=start, dur=np.maximum(c["dur"].astype(np.int64, **as_), 0),
                         src=src, dst=dst,
                         dim=c["dim"].astype(np.int32, **as_), inst=c["inst"].astype(np.int32, **as_), name=self.names,
                         lane_names=self.lane_names, dims=dims, terminal=c["terminal"].astype(bool, **as_),
                         step=c["step"].astype(np.int64, **as_), excess_gap=zero_backed(c.pop("xgap")),
                         excess_dur=zero_backed(c.pop("xdur")), host_idle=self.idle)


@dataclass
class StepInput:
    """What the builder needs besides the tables: the matched collectives and the run's dims."""

    matched: MatchedCollectives | None
    dims: dict[str, str]
    """pg_name → parallel dim"""
    p2p: Columns | None = None
    """send/recv rows of the rank's matching source (the collectives table's columns, `columns.arrow_columns`)"""
    ends: Columns | None = None
    """per (rank, pg_name, seq): the trace-clock end `trace_end` (ts + dur) of the collective from a source
    that records it: a matching source with enqueue times only (a comms log) leaves members without an end"""
    slow_ops: SlowOps | None = None
    """each GPU rank's slow host ops as the host_bound analyzer found them (None: derived when the graph is
    built, `slow_host_ops`)"""


MEMBER_COLS = ("key", "rank", "arrival", "end", "dim", "op", "bytes", "pg_name", "step", "source")
"""A member: its instance's key, rank, arrival and end (common clock, int64 ns), dim, op, bytes (float64,
NaN: unknown), process group, step (float64, NaN: unknown) and matching source."""


def no_members() -> Columns:
    """Members (MEMBER_COLS) without a row."""
    obj = np.zeros(0, dtype=object)
    return {"key": obj, "rank": np.zeros(0, np.int64), "arrival": np.zeros(0, np.int64),
            "end": np.zeros(0, np.int64), "dim": obj, "op": obj, "bytes": np.zeros(0), "pg_name": obj,
            "step": np.zeros(0), "source": obj}


def _arr(t: pa.Table, col: str, dtype: Any = np.int64) -> np.ndarray:
    return t.column(col).to_numpy(zero_copy_only=False).astype(dtype)


def _top_level(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Mask of intervals (sorted by start, longest first) not nested in an earlier one."""
    if ts.size == 0:
        return np.zeros(0, dtype=bool)
    prev_end = np.maximum.accumulate(np.r_[np.iinfo(np.int64).min, end[:-1]])
    return ts >= prev_end


def matched_columns(matched: MatchedCollectives | None) -> Columns | None:
    """matching.py's per-member rows (a DataFrame) as numpy columns, None when there are none. Times stay
    int64 (`end` 0 where unknown, `end_ok` says where known); step and bytes float64 (NaN: unknown)."""
    if matched is None or matched.n_rows == 0:
        return None
    rows = matched.rows
    out = {c: rows[c].to_numpy(np.int64) for c in ("rank", "seq", "arrival", "arrival_raw")}
    out["end_ok"] = rows["end"].notna().to_numpy(bool)
    out["end"] = rows["end"].to_numpy(np.int64, na_value=0)
    out.update({c: rows[c].to_numpy(np.float64) for c in ("step", "bytes")})
    out.update({c: strings(rows[c].to_numpy(object)) for c in ("key", "op", "pg_name", "source")})
    return out


def clock_shift(rows: Columns | None, trace_shift: dict[int, int | None]) -> dict[int, int]:
    """Per rank: subtract from trace-clock times to reach the common (matching) clock (`rows`:
    `matched_columns`; `trace_shift`: matching's log → trace shifts)."""
    if rows is None:
        return {}
    ranks, first = np.unique(rows["rank"], return_index=True)
    off = rows["arrival_raw"][first] - rows["arrival"][first]
    return {r: o + int(trace_shift.get(r) or 0) for r, o in zip(ranks.tolist(), off.tolist())}


def step_members(inp: StepInput, rows: Columns | None, steps: tuple[int, ...], shift: dict[int, int],
                 log_only: set[int] | frozenset[int] = frozenset()) -> Columns:
    """The step's collective members on the common clock (MEMBER_COLS, `rows`: `matched_columns`) with
    the send/recv pairs after them, and `inst`: each one's instance, numbered in key order. A log-only rank's
    rows (`log_only`) are on its log's clock: no trace to shift them to."""
    # a pure pipeline job matches no collective: its send/recv pairs are the only cross-rank links
    coll, coll_codes = (no_members(), (np.zeros(0, np.int64), [])) if rows is None else _matched_members(
        inp, rows, steps, shift, log_only)
    p2p = p2p_members(inp, steps, shift)
    both = concat([coll, p2p])
    # numbered as grouping every key would (~6 M members at 10,000 ranks): the collectives' key codes from
    # `_matched_members` and the pairs' merged over their sorted keys
    both["inst"] = merged_codes([coll_codes, sorted_codes(p2p["key"])])
    return both


def _matched_members(inp: StepInput, rows: Columns, steps: tuple[int, ...], shift: dict[int, int],
                     log_only: set[int] | frozenset[int] = frozenset()) -> tuple[Columns, tuple[np.ndarray, list[str]]]:
    """The step's members of instances matched on two ranks or more, with a known end (their own or the
    trace's, `_trace_ends`) and a known clock (a log-only rank's: its log's), and their keys' `sorted_codes`."""
    rows = take(rows, in_steps(rows["step"], steps))
    rows["step"] = step_values(rows["step"], steps)
    trace_end, has_trace_end = _trace_ends(rows, inp.ends)
    rs, known = row_trace_shift(rows["rank"], rows["source"], inp.matched.trace_shift)
    if log_only:
        known = known | np.isin(rows["rank"], np.fromiter(log_only, np.int64, len(log_only)))
    keep = (rows["end_ok"] | has_trace_end) & known
    rows, trace_end, rs = take(rows, keep), trace_end[keep], rs[keep]
    conv = lookup(rows["rank"], shift)[0]
    own_end = rows["end"] + (rows["arrival_raw"] - rows["arrival"]) + rs - conv
    out = {k: rows[k] for k in MEMBER_COLS if k in rows}
    out["arrival"] = rows["arrival_raw"] + rs - conv
    out["end"] = np.where(rows["end_ok"], own_end, trace_end - conv)
    dim_of = {p: inp.dims.get(p.removeprefix("kineto:"), "unknown") for p in set(rows["pg_name"].tolist())}
    out["dim"] = np.array([dim_of[p] for p in rows["pg_name"].tolist()], dtype=object)
    code, keys = sorted_codes(out["key"])
    keep = np.bincount(code, minlength=len(keys))[code] >= 2
    kept = sorted_unique(code[keep])
    return take({k: out[k] for k in MEMBER_COLS}, keep), (recode(code[keep]), [keys[i] for i in kept.tolist()])


def _trace_ends(rows: Columns, ends: Columns | None) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the collective's trace-clock end from `ends` (by rank, pg_name, seq) and whether found
    (looked up only when some row has no end of its own)."""
    n = num_rows(rows)
    if ends is None or num_rows(ends) == 0 or n == 0 or rows["end_ok"].all():
        return np.zeros(n, np.int64), np.zeros(n, bool)
    j = match_rows([rows["rank"], rows["pg_name"], rows["seq"]], [ends["rank"], ends["pg_name"], ends["seq"]])
    return np.where(j >= 0, ends["trace_end"][np.maximum(j, 0)], 0), j >= 0


def with_sizes(store: RunStore, members: Columns) -> Columns:
    """`members` with `in_bytes` / `out_bytes`: what each member sent and received (the collectives table's
    in/out elements at the row's element size; NaN when unknown). An all_to_all's members differ: what an
    expert's owner receives is its load."""
    n = num_rows(members)
    members = {**members, "in_bytes": np.full(n, np.nan), "out_bytes": np.full(n, np.nan)}
    if n == 0 or not store.has("collectives"):
        return members
    t = arrow_columns(store.table("collectives", ["rank", "source", "pg_name", "seq", "in_nelems", "out_nelems"]))
    t = take(t, t["seq_ok"] & t["in_nelems_ok"] & t["out_nelems_ok"])
    if num_rows(t) == 0:
        return members
    # each instance's key parsed once (members of one instance share it: a 10,000-rank run has ~6 M members)
    inst = members["inst"]
    first = first_of_group(inst, int(inst.max()) + 1)
    seq = np.array([_key_seq(k) for k in members["key"][first].tolist()], dtype=np.int64)[inst]
    j = match_rows([members["rank"], strings(members["source"]), strings(members["pg_name"]), seq],
               [t["rank"], strings(t["source"]), strings(t["pg_name"]), t["seq"]])
    n_in, n_out = (np.where(j >= 0, t[c][np.maximum(j, 0)].astype(np.float64), np.nan)
                   for c in ("in_nelems", "out_nelems"))
    elem = members["bytes"].astype(np.float64) / np.maximum(n_in, n_out)
    return {**members, "in_bytes": n_in * elem, "out_bytes": n_out * elem}


def _key_seq(key: str) -> int:
    """The sequence number ending an instance key (`...#seq`), -1 when it ends in none."""
    s = str(key).rsplit("#", 1)[-1]
    return int(s) if s.isdigit() else -1


def p2p_members(inp: StepInput, steps: tuple[int, ...], shift: dict[int, int]) -> Columns:
    """Send/recv pairs of the step as two-member instances (the k-th send src→dst on a group with the
    k-th receive at dst from src): the transfer waits for both sides to be posted."""
    df, send = _p2p_rows(inp.p2p, steps)
    if df is None:
        return no_members()
    arrival, end = _p2p_times(inp, df, shift)
    pg = np.array(["?" if p is None else str(p) for p in df["pg_name"].tolist()], dtype=object)
    src, dst = np.where(send, df["rank"], df["peer"]), np.where(send, df["peer"], df["rank"])
    o = np.lexsort((arrival, send, group_ids(pg)[0], dst, src))
    out = {"key": _pair_keys(src[o], dst[o], pg[o], send[o]), "rank": df["rank"][o], "arrival": arrival[o],
           "end": end[o], "dim": np.array([inp.dims.get(p, "pp") for p in pg[o].tolist()], dtype=object),
           "op": strings(df["op"][o]), "bytes": np.where(df["bytes_ok"], df["bytes"], np.nan)[o],
           "pg_name": pg[o], "step": step_values(np.where(df["step_ok"], df["step"], np.nan)[o], steps),
           "source": strings(df["source"][o])}
    return take(out, _key_counts(out["key"]) == 2)


def delivered(members: Columns) -> np.ndarray:
    """Per member: its end, but a send's at the earlier of its own and its receive's: the data was delivered
    by then. An isend's record runs on to its wait(), which the sender may call much later (after its next
    micro-batch's work): as the transfer's end, the replay would hold the pair, and whoever it releases, that
    long (the thread's own wait at the record's end stays: `add_cpu_rank`)."""
    inst, end = members["inst"], members["end"]
    first = np.full(int(inst.max(initial=-1)) + 1, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, inst, end)
    return np.where(sends(members), first[inst], end)


def _p2p_times(inp: StepInput, df: Columns, shift: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Arrival (DESIGN §3, as matching.arrival_ns with ts known: the device start on GPU ranks, else the
    enqueue) and end of send/recv rows, on the common clock."""
    trace_shift = inp.matched.trace_shift if inp.matched is not None else {}
    conv, own = lookup(df["rank"], shift)[0], lookup(df["rank"], trace_shift)[0]
    log = np.isin(strings(df["source"]), LOG_SOURCES)
    back = np.where(log, conv - own, conv)  # log rows: minus the offset; trace rows: minus shift+offset
    on_gpu = np.isin(df["rank"], list(inp.matched.gpu_ranks if inp.matched is not None else ()))
    arrival = np.where(on_gpu | ~df["enqueue_ts_ok"], df["ts"], df["enqueue_ts"])
    return arrival - back, df["ts"] + df["dur"] - back


def _key_counts(keys: np.ndarray) -> np.ndarray:
    """Per row: how many rows share its key."""
    code, n = group_ids(keys)  # a dict of the strings, not np.unique's sort of them (~2x slower)
    return np.bincount(code, minlength=n)[code]


def _p2p_rows(p2p: Columns | None, steps: tuple[int, ...]) -> tuple[Columns | None, np.ndarray]:
    """The step's send or receive rows (not both: a fused op has no side) with a peer and device times,
    and per row whether it sends; None when there is none."""
    if p2p is None or num_rows(p2p) == 0:
        return None, np.zeros(0, bool)
    op = strings(p2p["op"])
    send, recv = (np.array([w in o for o in op.tolist()], dtype=bool) for w in ("send", "recv"))
    keep = (in_steps(np.where(p2p["step_ok"], p2p["step"], np.nan), steps) & p2p["peer_ok"] & p2p["ts_ok"]
            & p2p["dur_ok"] & (send ^ recv))
    return (take(p2p, keep), send[keep]) if keep.any() else (None, np.zeros(0, bool))


def _pair_keys(src: np.ndarray, dst: np.ndarray, pg: np.ndarray, send: np.ndarray) -> np.ndarray:
    """Instance keys of send/recv rows sorted by (src, dst, pg, send, arrival): `p2p:src>dst:pg#k`, k the
    row's position among its (src, dst, pg, side)."""
    new = np.ones(src.size, dtype=bool)
    new[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1]) | (pg[1:] != pg[:-1]) | (send[1:] != send[:-1])
    start = np.maximum.accumulate(np.where(new, np.arange(src.size), 0))
    k = np.arange(src.size) - start
    rows = zip(src.tolist(), dst.tolist(), pg.tolist(), k.tolist())
    return np.array([f"{P2P_KEY}{s}>{d}:{p}#{i}" for s, d, p, i in rows], dtype=object)


def add_collectives(buf: _Buf, members: Columns, dims: list[str]) -> dict[str, np.ndarray]:
    """Arrival, sync and transfer nodes (members' `arr_lane` / `xfer_lane` say where they sit);
    returns per member row the arrival and transfer node ids."""
    if num_rows(members) == 0:
        return {k: np.zeros(0, np.int64) for k in ("arrival", "transfer", "sync", "last_arrival")}
    dim_of = {d: i for i, d in enumerate(dims)}
    dim_idx = np.array([dim_of.get(d, -1) for d in members["dim"].tolist()], dtype=np.int32)
    inst, arrival, end = members["inst"], members["arrival"], members["end"]
    ninst = int(inst.max()) + 1
    sync_t = np.full(ninst, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(sync_t, inst, arrival)
    sync = buf.add(rank=-1, lane=-1, category=Category.MARK, start=sync_t, dur=np.zeros(ninst, np.int64),
                   inst=np.arange(ninst), names="sync")
    lanes, ranks = members["xfer_lane"], members["rank"].astype(np.int32)
    arr_ids = buf.add(rank=ranks, lane=members["arr_lane"], category=Category.MARK, start=arrival,
                      dur=np.zeros(inst.size, np.int64), dim=dim_idx, inst=inst, names="arrive", prio=0)
    # a group runs its collectives in order: a transfer starts after the last arrival and after the
    # previous transfer on the same lane ended (ties on the lane keep that order: by arrival)
    xs = np.maximum(sync_t[inst], _prev_end_on_lane(lanes, arrival, end))
    named: dict[tuple[str, str], str] = {}  # one string per (op, group), not one per member (~6 M at 10,000 ranks)
    names = [named.get(k) or named.setdefault(k, f"{k[0]} {k[1]}")
             for k in zip(strings(members["op"]).tolist(), strings(members["pg_name"]).tolist())]
    xfer_ids = buf.add(rank=ranks, lane=lanes, category=Category.TRANSFER, start=xs, dur=np.maximum(delivered(members) - xs, 0),
                       dim=dim_idx, inst=inst, tie=arrival, names=names, terminal=True,
                       step=np.nan_to_num(members["step"], nan=-1).astype(np.int64))
    buf.edge(arr_ids, sync[inst])
    buf.edge(sync[inst], xfer_ids)
    buf.edge(arr_ids, xfer_ids)
    return {"arrival": arr_ids, "transfer": xfer_ids, "sync": sync[inst], "last_arrival": sync_t[inst]}


def _prev_end_on_lane(lanes: np.ndarray, arrival: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per member: the latest end of the earlier collectives on its lane (int64 min when none, or when the
    member sits on no lane)."""
    order = np.lexsort((arrival, lanes))
    lane, e = lanes[order], end[order]
    prev = np.full(lanes.size, np.iinfo(np.int64).min, np.int64)
    first = np.flatnonzero(np.r_[True, lane[1:] != lane[:-1]]) if lane.size else np.zeros(0, np.int64)
    for a, b in zip(first.tolist(), np.r_[first[1:], lane.size].tolist()):
        prev[a + 1:b] = np.maximum.accumulate(e[a:b - 1])
    out = np.empty(lanes.size, np.int64)
    out[order] = prev
    out[lanes < 0] = np.iinfo(np.int64).min
    return out


def cut_intervals(starts: np.ndarray, ends: np.ndarray, cuts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split sorted disjoint intervals at the cut times strictly inside them: (seg_start, seg_end, interval index)."""
    if starts.size == 0:
        return starts.copy(), ends.copy(), np.zeros(0, np.int64)
    idx = np.searchsorted(starts, cuts, side="right") - 1
    inside = (idx >= 0) & (cuts > starts[np.maximum(idx, 0)]) & (cuts < ends[np.maximum(idx, 0)])
    owner = np.concatenate([np.arange(starts.size), idx[inside]])
    at = np.concatenate([starts, cuts[inside]])
    order = np.lexsort((at, owner))
    owner, at = owner[order], at[order]
    keep = np.r_[True, (owner[1:] != owner[:-1]) | (at[1:] != at[:-1])]
    owner, at = owner[keep], at[keep]
    nxt = np.r_[at[1:], 0]
    last = np.r_[owner[1:] != owner[:-1], True]
    seg_end = np.where(last, ends[owner], nxt)
    return at, seg_end, owner


def _containing(starts: np.ndarray, ends: np.ndarray, t: np.ndarray, strict: bool) -> np.ndarray:
    """Index of the interval holding each time (start ≤ t < end; strict: start < t < end), else -1."""
    if starts.size == 0:
        return np.full(t.size, -1, np.int64)
    idx = np.searchsorted(starts, t, side="right") - 1
    i = np.maximum(idx, 0)
    ok = (idx >= 0) & (t < ends[i]) & ((t > starts[i]) if strict else (t >= starts[i]))
    return np.where(ok, idx, -1)


def _in_steps(col: Any, steps: tuple[int, ...]) -> Any:
    """Arrow mask of the rows of the step column `col` in `steps` (the device span's step, SPAN_STEP: every
    row without a step)."""
    hit = pc.fill_null(pc.is_in(col, value_set=pa.array(list(steps), col.type)), False)
    return pc.or_(hit, pc.is_null(col)) if SPAN_STEP in steps else hit


def in_steps(step: np.ndarray, steps: tuple[int, ...]) -> np.ndarray:
    """Mask of the rows whose step (`step`: numbers, NaN or -1 for none) is in `steps` (the device span's
    step, SPAN_STEP: every row without one)."""
    return np.isin(step_values(step, steps), steps)


def step_values(step: np.ndarray, steps: tuple[int, ...]) -> np.ndarray:
    """The rows' steps (float, NaN for none) as the graph numbers them: in a graph of the device span's
    step (SPAN_STEP) a row without one is in it."""
    step = np.asarray(step, dtype=np.float64)
    return np.where(np.isnan(step) | (step == -1), SPAN_STEP, step) if SPAN_STEP in steps else step


def _step_column(t: pa.Table) -> np.ndarray:
    """The step column of rows `_in_steps` selected, as int64 (a null one: the device span's step)."""
    return t.column("step").fill_null(SPAN_STEP).to_numpy(zero_copy_only=False).astype(np.int64)


def _rank_events(store: RunStore, rank: int, steps: tuple[int, ...], columns: list[str],
                 events: pa.Table | None = None) -> pa.Table:
    """The rank's events of `steps` with a duration (`events`: the rank's table, already read)."""
    ev = events if events is not None else store.rank_table("events", rank, columns)
    return ev.filter(pc.and_(_in_steps(ev["step"], steps), pc.is_valid(ev["dur"])))


def _leaf(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Mask of intervals (sorted by start, longest first) inside which no other interval starts."""
    out = np.ones(ts.size, dtype=bool)
    out[:-1] = ts[1:] >= end[:-1]
    return out


def _training_thread_ops(store: RunStore, rank: int, steps: tuple[int, ...]
                         ) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray, np.ndarray]:
    """The `cpu_op`s and annotations (but the step's own, and users' labels: a `record_function` label
    such as `data:load` or `my_fetch` is no work by itself, its empty time is a gap like any other) of
    the thread that ran ProfilerStep#step (trace clock, sorted by start, longest first). Returns starts,
    ends, names, a mask of the annotations and each op's step."""
    ev = _rank_events(store, rank, steps, ["name", "cat", "ts", "dur", "tid", "step", "stream"])
    ev = ev.filter(pc.is_null(ev["stream"]))
    names = ev.column("name").cast(pa.string())
    marker = ev.filter(pc.fill_null(pc.starts_with(names, "ProfilerStep#"), False))
    cat = ev.column("cat").cast(pa.string())
    is_op = pc.fill_null(pc.equal(cat, "cpu_op"), False)
    labels = pa.array([n for n in pc.unique(names).to_pylist() if is_label(n, "user_annotation")], pa.string())
    is_ann = pc.and_(pc.fill_null(pc.equal(cat, "user_annotation"), False),
                     pc.invert(pc.fill_null(pc.or_(pc.starts_with(names, "ProfilerStep#"),
                                                   pc.is_in(names, value_set=labels)), False)))
    if marker.num_rows:
        tid = marker.column("tid")[0].as_py()
    elif pc.sum(is_op).as_py():
        tid = pc.mode(ev.filter(is_op).column("tid"))[0]["mode"].as_py()
    else:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), [], np.zeros(0, bool), np.zeros(0, np.int64)
    ev = ev.filter(pc.and_(pc.fill_null(pc.equal(ev["tid"], tid), False), pc.or_(is_op, is_ann)))
    ts, dur = _arr(ev, "ts"), _arr(ev, "dur")
    order = np.lexsort((-(ts + dur), ts))
    ts, end = ts[order], (ts + dur)[order]
    ann = (ev.column("cat").cast(pa.string()).to_numpy(zero_copy_only=False) == "user_annotation")[order]
    nm = [str(x) for x in ev.column("name").cast(pa.string()).to_numpy(zero_copy_only=False)[order]]
    return ts, end, nm, ann, _step_column(ev)[order]


def innermost_segments(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where a thread is at every moment: nested intervals (sorted by start, longest first) split into
    pieces each owned by the innermost interval covering it; idle time is left out.
    Returns piece starts, ends and owners."""
    out_s: list[int] = []
    out_e: list[int] = []
    out_o: list[int] = []
    stack: list[int] = []
    t = int(ts[0]) if ts.size else 0
    ends = end.tolist()
    for i, s in enumerate(ts.tolist()):
        while stack and ends[stack[-1]] <= s:
            top = stack.pop()
            out_s.append(t), out_e.append(ends[top]), out_o.append(top)
            t = ends[top]
        if stack:
            out_s.append(t), out_e.append(s), out_o.append(stack[-1])
            ends[i] = min(ends[i], ends[stack[-1]])  # a child never outlives its parent
        t = s
        stack.append(i)
    while stack:
        top = stack.pop()
        out_s.append(t), out_e.append(ends[top]), out_o.append(top)
        t = ends[top]
    s0, s1, o = np.array(out_s, np.int64), np.array(out_e, np.int64), np.array(out_o, np.int64)
    keep = s1 > s0
    return s0[keep], s1[keep], o[keep]


def add_cpu_rank(buf: _Buf, store: RunStore, rank: int, steps: tuple[int, ...], conv: int, mem: Columns,
                 ids: dict[str, np.ndarray], host_lane: int) -> np.ndarray:
    """The training thread, as pieces owned by its innermost op, cut where this rank's collectives arrive
    and end; returns their ids.

    While one of its collectives is outstanding, the thread's time in a communication call
    (the parser's comm role) or in an op's own time between its children is waiting (length 0 here, one
    node for a run of such pieces; the next piece's gap keeps it when the collective ended earlier). A
    collective's end releases the thread when it came in such time or while the thread recorded nothing;
    ending inside other work (a leaf op) it was overlapped."""
    ts, end, names, ann, op_step = _training_thread_ops(store, rank, steps)
    ts, end = ts - conv, end - conv
    s0, s1, owner = innermost_segments(ts, end)
    a, e = mem["arrival"], mem["end"]
    issue = np.array([name_role(n) == "comm" for n in names], dtype=bool)  # the parser's rule (events.role)
    leaf = _leaf(ts, end)
    idle_like = issue | ~leaf  # per op: its own time is a call or the gap between its children
    at_e = _containing(s0, s1, e, strict=False)
    # an isend's end releases the thread only where it recorded nothing (its wait()): inside a wait on
    # another call (a receive) that call released it
    blocking = (at_e < 0) | (idle_like[owner[np.maximum(at_e, 0)]] & ~sends(mem)) if s0.size else np.ones(e.size, bool)
    p0, p1, piece = cut_intervals(s0, s1, np.concatenate([a, e]))
    own = owner[piece]
    load = np.array([name_role(n) == "data_load" for n in names], dtype=bool)
    cat = np.where(issue, Category.HOST, np.where(load, Category.STALL, Category.COMPUTE)).astype(np.int8)[own]
    # under an isend's record the thread's own calls into the library wait (gloo serialises a pair's
    # messages), the op it runs past does not
    snd = sends(mem)
    wait = idle_like[own] & (_inside_union(p0, p1, *_holding(mem, p0, p1, idle_like[own]))
                             | ((issue & ~ann)[own] & _inside_union(p0, p1, a[snd], e[snd])))
    wait |= _resumes(p0, own, idle_like, ts, s0, owner, at_e, a, e, blocking)
    # a run of waiting pieces (the comm call, the op it waits in, their parents' own time) is one wait, kept
    # as its first piece: the time of the others is waiting too, released by the collective's end, not gaps
    first = ~(wait & np.r_[False, wait[:-1]])
    p0, p1, own, cat, wait = p0[first], p1[first], own[first], cat[first], wait[first]
    dur = p1 - p0
    dur[wait] = 0
    cat[wait] = Category.WAIT
    seg = buf.add(rank=rank, lane=host_lane, category=cat, start=p0, dur=dur,
                  names=[names[o] for o in own], terminal=True, step=op_step[own])
    # the thread sat idle (nothing recorded) when the last member arrived and resumed before the recorded
    # end (an async op's record outlives the work it waited for): the resume follows the last arrival
    la = ids["last_arrival"]
    resume = np.searchsorted(p0, la, side="right")
    early = (_containing(s0, s1, la, strict=False) < 0) & (resume < p0.size) & (resume > 0)
    early &= p0[np.minimum(resume, p0.size - 1)] < e
    # entering a wait is not resuming: the member's arrival may precede its own call's record (the collective
    # log stamps it first), so the thread is "idle" at its own last arrival and its next piece is the wait
    early &= ~wait[np.minimum(resume, p0.size - 1)]
    buf.edge(ids["sync"][early], seg[resume[early]])
    blocking &= ~early
    nxt = np.searchsorted(p0, e[blocking], side="left")
    ok = nxt < p0.size
    buf.edge(ids["transfer"][blocking][ok], seg[nxt[ok]])
    return seg


def _resumes(p0: np.ndarray, own: np.ndarray, idle_like: np.ndarray, ts: np.ndarray, s0: np.ndarray,
             owner: np.ndarray, at_e: np.ndarray, a: np.ndarray, e: np.ndarray, blocking: np.ndarray) -> np.ndarray:
    """Per piece: the op that issued a blocking collective and waited for it (it began before the arrival and
    holds the collective's end in its own time) resuming after the collective's end: its own time from that
    end to its next child (or its own end) recorded nothing and is the rest of the wait — the thread waking
    up, on a loaded box 1-9 ms after gloo's record ended (a user's autograd Function around
    `all_to_all_single`) — not work: a gap after the release. Not an op that only happened to run when an
    asynchronous collective issued elsewhere ended (a DDP bucket's record ending inside the next forward's
    matmul): that op's own time is its work."""
    out = np.zeros(p0.size, bool)
    if s0.size == 0 or e.size == 0:
        return out
    o = owner[np.maximum(at_e, 0)]
    waited = blocking & (at_e >= 0) & idle_like[o] & (ts[o] <= a)
    if not waited.any():
        return out
    resume = set(zip(e[waited].tolist(), o[waited].tolist()))
    cand = np.flatnonzero(np.isin(p0, e[waited]) & idle_like[own])
    out[cand] = [(int(t), int(w)) in resume for t, w in zip(p0[cand].tolist(), own[cand].tolist())]
    return out


def _holding(mem: Columns, p0: np.ndarray, p1: np.ndarray, idle: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The intervals in which the members hold the thread (pieces `p0`..`p1`, `idle`: a call's or an op's own
    time): a collective from arrival to end; an isend only at its record's end, from the thread's last work
    before it (its wait(): the record runs on past the thread's later work, which it holds nothing of)."""
    a, e, snd = mem["arrival"].copy(), mem["end"], sends(mem)
    work_end = p1[~idle]
    k = np.searchsorted(work_end, e[snd], side="right") - 1
    a[snd] = np.maximum(a[snd], np.where(k >= 0, work_end[np.maximum(k, 0)], a[snd]))
    return a, e


def sends(mem: Columns) -> np.ndarray:
    """Per member: whether it is the sending side of a send/recv pair."""
    keys, ops = strings(mem["key"]).tolist(), strings(mem["op"]).tolist()
    return np.array([k.startswith(P2P_KEY) and "send" in o for k, o in zip(keys, ops)], dtype=bool)


def _inside_union(s0: np.ndarray, s1: np.ndarray, a: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Per segment [s0, s1): whether it lies inside the union of the intervals [a, e]."""
    if a.size == 0 or s0.size == 0:
        return np.zeros(s0.size, bool)
    o = np.argsort(a, kind="stable")
    a, e = a[o], np.maximum.accumulate(e[o])
    new = np.r_[True, a[1:] > e[:-1]]
    ua = a[new]
    ue = np.maximum.reduceat(e, np.flatnonzero(new))
    k = np.searchsorted(ua, s0, side="right") - 1
    kk = np.maximum(k, 0)
    return (k >= 0) & (s1 <= ue[kk])


@dataclass
class GpuRank:
    """A GPU rank's kernels of the step (common clock, sorted by start) and their lanes."""

    ts: np.ndarray
    end: np.ndarray
    category: np.ndarray
    """per kernel: its kind's node category (`KIND_CATEGORY`: a comm kernel's is TRANSFER), int8"""
    stream: np.ndarray
    correlation: np.ndarray
    names: list[str]
    lanes: dict[int, int]
    step: np.ndarray
    external_id: np.ndarray
    backward: np.ndarray | None = None
    """per kernel: launched by a CPU op of the backward pass (`launched_by_backward`, set with the
    runtime calls: one read of the rank's events)"""


def launched_by_backward(ev: pa.Table, external_id: np.ndarray) -> np.ndarray:
    """Per kernel (by external id): the CPU op of the rank's events `ev` that launched it is autograd's: its
    name says backward, as PyTorch names them (`aten::*_backward*`, `autograd::engine::evaluate_function:
    MmBackward0`, ...), or it runs inside such an op on the same thread (a kernel's external id is its innermost
    op's: `MmBackward0`'s `aten::mm`, a checkpointed block's recomputed forward)."""
    ev = ev.filter(pc.fill_null(text_test(ev["cat"], pc.equal, "cpu_op"), False))
    backward = lambda text: pc.match_substring(text, "backward", ignore_case=True)  # noqa: E731
    named = pc.fill_null(text_test(ev.column("name"), backward), False).to_numpy(zero_copy_only=False)
    ts = _arr(ev, "ts")
    end = ts + np.nan_to_num(_arr(ev, "dur", float), nan=0).astype(np.int64)
    tid = np.nan_to_num(_arr(ev, "tid", float), nan=-1).astype(np.int64)
    inside = named.copy()
    for t in np.unique(tid[named]).tolist():
        lo, hi = iv.union(ts[named & (tid == t)], end[named & (tid == t)])
        mine = np.flatnonzero(tid == t)
        at = np.searchsorted(lo, ts[mine], side="right") - 1
        inside[mine] |= (at >= 0) & (ts[mine] < hi[np.maximum(at, 0)])
    ext = np.nan_to_num(_arr(ev, "external_id", float), nan=-1).astype(np.int64)
    bwd = ext[inside & (ext >= 0)]
    return np.isin(external_id, bwd) & (external_id >= 0)


def load_gpu_rank(buf: _Buf, store: RunStore, rank: int, steps: tuple[int, ...], conv: int) -> GpuRank | None:
    span = SPAN_STEP in steps and "carry_over" in store.columns("kernels")
    k = store.rank_table("kernels", rank, ["name", "stream", "ts", "dur", "kind", "correlation", "step", "external_id"]
                         + (["carry_over"] if span else []))
    k = k.filter(pc.and_(_in_steps(k["step"], steps), pc.is_valid(k["dur"])))
    if span:  # launched before profiling: outside the device span, as in the breakdown
        k = k.filter(pc.invert(pc.fill_null(k["carry_over"], False)))
    if k.num_rows == 0:
        return None
    ts = _arr(k, "ts") - conv
    order = np.argsort(ts, kind="stable")
    stream = np.nan_to_num(_arr(k, "stream", float), nan=-1).astype(np.int64)[order]
    lanes = {int(s): buf.lane(f"rank {rank} stream {int(s)}") for s in np.unique(stream)}
    corr = np.nan_to_num(_arr(k, "correlation", float), nan=-1).astype(np.int64)[order]
    # one string object per distinct value (the builder's names: `_Buf._name_of`): a 1,024-rank run holds
    # every rank's kernels at once while its graph is placed, ~1 M kernels with a few hundred names
    names = _interned(buf, k.column("name"), order)
    kind_codes, kinds = codes(k.column("kind"))
    category = np.array([KIND_CATEGORY.get(str(v), Category.OTHER) for v in kinds], np.int8)[kind_codes[order]]
    ext = np.nan_to_num(_arr(k, "external_id", float), nan=-1).astype(np.int64)[order]
    return GpuRank(ts=ts[order], end=(ts + _arr(k, "dur"))[order], category=category, stream=stream,
                   correlation=corr, names=names, lanes=lanes, step=_step_column(k)[order], external_id=ext)


def _interned(buf: _Buf, col: Any, order: np.ndarray) -> list[str]:
    """The column's values in `order` as text (null: "None"), one string object per distinct value
    (`_Buf._name_of`), each distinct value converted once (the column's dictionary codes)."""
    row_codes, values = codes(col)
    text = np.array([buf._name_of(str(v)) for v in values], dtype=object)
    return text[row_codes[order]].tolist()


def lanes_of(gr: GpuRank) -> np.ndarray:
    """Each kernel's lane (its stream's)."""
    streams = np.array(sorted(gr.lanes), np.int64)
    lane = np.array([gr.lanes[int(s)] for s in streams], np.int64)
    return lane[np.searchsorted(streams, gr.stream)] if gr.stream.size else np.zeros(0, np.int64)


def match_gpu_members(gr: GpuRank, e: np.ndarray) -> np.ndarray:
    """Index of each member's collective kernel (`e`: the members' ends), -1 if none: the comm kernel whose
    end is nearest the member's end, one member per kernel (a fused send/recv pair ends together on two
    kernels)."""
    comm = np.flatnonzero(gr.category == Category.TRANSFER)  # the comm kernels (KIND_CATEGORY)
    if comm.size == 0 or e.size == 0:
        return np.full(e.size, -1, np.int64)
    o = np.argsort(gr.end[comm], kind="stable")
    ends = gr.end[comm][o]
    j = np.clip(np.searchsorted(ends, e), 0, comm.size - 1)
    jm = np.clip(j - 1, 0, comm.size - 1)
    pick = np.where(np.abs(ends[jm] - e) < np.abs(ends[j] - e), jm, j)
    seen, dup = np.unique(pick, return_counts=True)
    if (dup > 1).any():
        pick = _distinct(pick, ends, e)
    return np.where(pick >= 0, comm[o][np.maximum(pick, 0)], -1)


def _distinct(pick: np.ndarray, ends: np.ndarray, e: np.ndarray, reach: int = 8) -> np.ndarray:
    """Members that share a kernel: the best fit keeps it, the others move to the nearest unused kernel
    within `reach` positions (by end); -1 when none is left."""
    order = np.argsort(np.abs(ends[pick] - e), kind="stable")
    _, first_pos = np.unique(pick[order], return_index=True)
    keeps = np.zeros(pick.size, bool)
    keeps[order[first_pos]] = True
    out = np.where(keeps, pick, -1)
    used = set(pick[keeps].tolist())
    for i in order[~keeps[order]]:  # the duplicates only, best fits first
        cands = [c for c in range(max(0, pick[i] - reach), min(ends.size, pick[i] + reach + 1)) if c not in used]
        if cands:
            c = min(cands, key=lambda k: abs(int(ends[k]) - int(e[i])))
            used.add(c)
            out[i] = c
    return out


def add_gpu_rank(buf: _Buf, store: RunStore, rank: int, steps: tuple[int, ...], conv: int, gr: GpuRank,
                 kern_of_member: np.ndarray, ids: dict[str, np.ndarray]) -> np.ndarray:
    """Kernel nodes per stream, host threads' runtime calls, launch and blocking edges; returns kernel ids."""
    is_coll = np.zeros(gr.ts.size, bool)
    is_coll[kern_of_member[kern_of_member >= 0]] = True
    node = np.full(gr.ts.size, -1, np.int64)  # node whose start is the kernel's start
    done = np.full(gr.ts.size, -1, np.int64)  # node whose end is the kernel's end
    plain = np.flatnonzero(~is_coll)
    lanes, cats = lanes_of(gr), gr.category
    node[plain] = done[plain] = buf.add(rank=rank, lane=lanes[plain], category=cats[plain], start=gr.ts[plain],
                                        dur=(gr.end - gr.ts)[plain], names=[gr.names[i] for i in plain],
                                        terminal=True, step=gr.step[plain])
    m = kern_of_member >= 0
    node[kern_of_member[m]] = ids["arrival"][m]
    done[kern_of_member[m]] = ids["transfer"][m]
    add_runtime_calls(buf, store, rank, steps, conv, gr, node, done)
    return done


def add_runtime_calls(buf: _Buf, store: RunStore, rank: int, steps: tuple[int, ...], conv: int, gr: GpuRank,
                      node: np.ndarray, done: np.ndarray) -> None:
    every = store.rank_table("events", rank, ["name", "cat", "ts", "dur", "tid", "step", "correlation", "stream",
                                              "external_id", "lane", "role"])  # read once: host_idle needs all
    ev = _rank_events(store, rank, steps, [], every)
    gr.backward = launched_by_backward(ev, gr.external_id)
    engine_tids = autograd_threads(ev)
    # host rows: not the device's (HIP runtime calls carry their `stream` argument: a null stream is no test)
    ev = ev.filter(pc.fill_null(text_test(ev["lane"], pc.not_equal, "device"), True))
    calls = lambda cat: pc.or_(pc.match_substring(cat, "runtime"), pc.match_substring(cat, "driver"))  # noqa: E731
    ev = ev.filter(pc.fill_null(text_test(ev.column("cat"), calls), False))
    if ev.num_rows == 0:
        return
    idle = host_idle(store, rank, every)
    buf.idle[rank] = (idle[0] - conv, idle[1] - conv)
    ts, end = _arr(ev, "ts") - conv, _arr(ev, "ts") + _arr(ev, "dur") - conv
    tid = np.nan_to_num(_arr(ev, "tid", float), nan=-1).astype(np.int64)
    corr = np.nan_to_num(_arr(ev, "correlation", float), nan=-2).astype(np.int64)
    name_of = object_strings(ev.column("name"), "None")  # per row (a null as str(None) did), a string per value
    names = name_of.tolist()
    blocking = names_where(names, lambda n: any(w in n for w in BLOCKING_CALL_WORDS) or n in BLOCKING_MEMCPY)
    # the device work a blocking call waited for: the kernel that ended last inside it
    waited = last_ended_inside(ts, end, gr.end)
    queued = queue_full_launches(ts, end, corr, gr.ts, gr.end, gr.correlation, waited)
    blocking |= queued | own_op_waits(ts, end, corr, gr.end, gr.correlation)
    waited = np.where(blocking, waited, -1)
    w = waited >= 0
    xgap, xdur = slow_host_time(buf.slow.get(rank), tid, ts, end, conv)
    first = np.full(ts.size, -1, np.int64)  # per call: its node that starts it / that ends it
    last = np.full(ts.size, -1, np.int64)
    for t in np.unique(tid):
        lane = buf.lane(f"rank {rank} host thread {t}")
        sel = tid == t
        plain = sel & ~w
        ids = buf.add(rank=rank, lane=lane, category=Category.HOST, start=ts[plain], dur=end[plain] - ts[plain],
                      names=name_of[plain].tolist(), xgap=xgap[plain], xdur=xdur[plain])
        first[plain] = last[plain] = ids
        _launch_edges(buf, corr[plain], ids, gr, node)
        bw = np.flatnonzero(sel & w)
        if bw.size:  # call issued (dur 0) … returns when the waited kernel ended
            issue = buf.add(rank=rank, lane=lane, category=Category.HOST, start=ts[bw],
                            dur=np.zeros(bw.size, np.int64), names=name_of[bw].tolist(), xgap=xgap[bw])
            kend = gr.end[waited[bw]]
            back = buf.add(rank=rank, lane=lane, category=Category.WAIT, start=np.maximum(kend, ts[bw]),
                           dur=end[bw] - np.maximum(kend, ts[bw]), names="device wait", prio=1)
            first[bw], last[bw] = issue, back
            buf.edge(done[waited[bw]], back)
            # what the call launches: once it returns from waiting for a queue slot, else once issued (a
            # blocking copy waits for its own op)
            q = queued[bw]
            _launch_edges(buf, corr[bw][q], back[q], gr, node)
            _launch_edges(buf, corr[bw][~q], issue[~q], gr, node)
    launches = np.isin(corr, gr.correlation[gr.correlation >= 0]) & (corr >= 0)
    src, dst = backward_joins(tid, ts, end, engine_tids, launches)
    buf.edge(last[src], first[dst])


def autograd_threads(ev: pa.Table) -> np.ndarray:
    """Threads of a rank's events `ev` that ran autograd's engine (`autograd::engine::evaluate_function: ...`
    ops): PyTorch runs a device's backward on its own engine thread, and the thread that called `backward()`
    blocks until the engine is done."""
    ops = ev.filter(pc.fill_null(text_test(ev["name"], pc.starts_with, "autograd::engine::"), False))
    return np.unique(np.nan_to_num(_arr(ops, "tid", float), nan=-1).astype(np.int64))


def backward_joins(tid: np.ndarray, ts: np.ndarray, end: np.ndarray, engine: np.ndarray, launches: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Edges (runtime-call indices) from autograd's engine threads back to the thread that waited for them.

    A thread that launches kernels and is not an engine thread, silent between two of its calls while an engine
    thread made calls that all started and ended inside that silence, was blocked in `backward()`: its next call
    follows the engine's last call there (its gap after it stays). A call of the engine thread that began before
    the silence is no such burst (the threads ran side by side)."""
    src: list[int] = []
    dst: list[int] = []
    callers = [t for t in np.unique(tid[launches]).tolist() if t not in set(engine.tolist())]
    for e in engine.tolist():
        eng = np.flatnonzero(tid == e)
        eng = eng[np.argsort(ts[eng], kind="stable")]
        if eng.size == 0:
            continue
        for t in callers:
            mine = np.flatnonzero(tid == t)
            mine = mine[np.argsort(ts[mine], kind="stable")]
            if mine.size < 2:
                continue
            silent_from, silent_to = end[mine[:-1]], ts[mine[1:]]
            # the engine's calls inside each silence: first starting at/after its start, last ending by its end
            lo = np.searchsorted(ts[eng], silent_from, side="left")
            hi = np.searchsorted(ts[eng], silent_to, side="left") - 1
            for g in np.flatnonzero(hi >= lo).tolist():
                burst = eng[lo[g]:hi[g] + 1]
                if end[burst].max() <= silent_to[g] and (lo[g] == 0 or end[eng[lo[g] - 1]] <= silent_from[g]):
                    src.append(int(burst[np.argmax(end[burst])]))
                    dst.append(int(mine[g + 1]))
    return np.asarray(src, np.int64), np.asarray(dst, np.int64)


def slow_host_time(slow: Columns | None, tid: np.ndarray, ts: np.ndarray, end: np.ndarray, conv: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per runtime call (common clock): the slow host time (`host_bound.excess_ns`) in the gap before it on
    its thread (slow ops that ended since the thread's previous call) and in the call itself."""
    xgap, xdur = np.zeros(ts.size, np.int64), np.zeros(ts.size, np.int64)
    if slow is None or num_rows(slow) == 0 or ts.size == 0:
        return xgap, xdur
    for t in np.unique(tid).tolist():
        mine = np.flatnonzero(tid == t)
        mine = mine[np.argsort(ts[mine], kind="stable")]
        s = take(slow, slow["tid"] == t)
        s_ts, s_end = s["ts"] - conv, s["end"] - conv
        own = s["runtime"] & np.isin(s_ts, ts[mine])
        j = np.clip(np.searchsorted(ts[mine], s_ts[own]), 0, max(mine.size - 1, 0))
        np.add.at(xdur, mine[j], np.where(ts[mine][j] == s_ts[own], s["excess"][own], 0))
        k = np.searchsorted(ts[mine], s_end[~own], side="left")
        ok = k < mine.size
        np.add.at(xgap, mine[k[ok]], s["excess"][~own][ok])
    return xgap, xdur


def _launch_edges(buf: _Buf, call_corr: np.ndarray, call_ids: np.ndarray, gr: GpuRank, node: np.ndarray) -> None:
    if call_corr.size == 0:
        return
    o = np.argsort(call_corr)
    j = np.searchsorted(call_corr[o], gr.correlation)
    j = np.clip(j, 0, call_corr.size - 1)
    hit = (call_corr[o][j] == gr.correlation) & (gr.correlation >= 0) & (node >= 0)
    buf.edge(call_ids[o][j[hit]], node[hit])


def _cpu_windows(store: RunStore, rank: int, steps: tuple[int, ...], conv: int) -> dict[tuple[int, int], tuple[int, int]]:
    """Per (rank, step): the host's step window (the steps table's); a rank without step rows in the device
    span's step (SPAN_STEP) has the breakdown's one window for it (derive/activity.py `stepless_window`: a CPU
    rank's first to last event)."""
    st = store.rank_table("steps", rank, ["step", "ts", "dur"])
    if SPAN_STEP in steps and st.num_rows == 0:
        lo, hi = stepless_windows(store, None, [rank]).get(rank, (0, 0))
        return {(rank, SPAN_STEP): (lo - conv, hi - conv)} if hi > lo else {}
    st = st.filter(pc.and_(_in_steps(st["step"], steps), pc.is_valid(st["dur"])))
    return {(rank, int(s)): (int(t) - conv, int(t) + int(d) - conv)
            for s, t, d in zip(st.column("step").to_pylist(), st.column("ts").to_pylist(), st.column("dur").to_pylist())}


def _gpu_windows(rank: int, gr: GpuRank) -> dict[tuple[int, int], tuple[int, int, int]]:
    """Per (rank, step): first kernel start, last kernel end, and where its last backward pass began (-1: no
    backward): its first backward kernel after the last forward compute kernel that precedes its last backward
    kernel (`last_backward_start`)."""
    out = {}
    compute = gr.category == Category.COMPUTE
    for s in np.unique(gr.step):
        m = gr.step == s
        start = last_backward_start(gr.ts[m], gr.backward[m], compute[m]) if gr.backward is not None else -1
        out[(rank, int(s))] = (int(gr.ts[m].min()), int(gr.end[m].max()), start)
    return out


def last_backward_start(ts: np.ndarray, backward: np.ndarray, compute: np.ndarray) -> int:
    """Start of the last backward pass among kernels (`ts`; launched by backward; compute kernels): a step that
    runs several forward/backward passes (gradient accumulation, pipeline micro-batches) finishes its
    gradients, and DDP fills its buckets, in the last one. -1 when no kernel is backward's."""
    if not backward.any():
        return -1
    last = ts[backward].max()
    fwd = ts[compute & ~backward & (ts < last)]
    after = ts[backward & (ts > fwd.max())] if fwd.size else ts[backward]
    return int(after.min())


def rows_by(values: np.ndarray) -> dict[int, np.ndarray]:
    """Value → the positions of the rows holding it (ascending)."""
    order = np.argsort(values, kind="stable")
    bounds = np.flatnonzero(np.diff(values[order])) + 1
    return {int(values[idx[0]]): idx for idx in np.split(order, bounds)} if order.size else {}


def _place_members(buf: _Buf, store: RunStore, steps: tuple[int, ...], ranks: list[int], shift: dict[int, int],
                   members: Columns, log_only: set[int] | frozenset[int] = frozenset()
                   ) -> tuple[Columns, dict[int, Any]]:
    """Decide each rank's kind (GPU: its kernels; CPU: its training thread; log: a log-only rank's chain of
    collectives, `add_log_rank`) and where its members sit: (the kept members, per rank (kind, its kernels or
    host lane, and for a GPU rank the kernel of each of its kept members in their order))."""
    arrival = members["arrival"].copy()
    arr_lane = np.full(arrival.size, -1, np.int64)
    xfer_lane = np.full(arrival.size, -1, np.int64)
    by_rank = rows_by(members["rank"])
    pg = strings(members["pg_name"])
    p2p = np.array([k.startswith(P2P_KEY) for k in strings(members["key"]).tolist()], dtype=bool)
    placed: dict[int, Any] = {}
    for r in ranks:
        rows = by_rank.get(r, np.zeros(0, np.int64))
        if r in log_only:
            if rows.size:  # on no lane: add_log_rank chains them (its arrivals tie where lane order would not)
                arr_lane[rows] = _LOG_LANE
                placed[r] = ("log", None, None)
            continue
        gr = load_gpu_rank(buf, store, r, steps, shift.get(r, 0))
        if gr is not None:
            kidx = match_gpu_members(gr, members["end"][rows])
            ok = kidx >= 0
            lanes = lanes_of(gr)[kidx[ok]]
            arrival[rows[ok]] = gr.ts[kidx[ok]]  # device arrival: the kernel's start
            arr_lane[rows[ok]] = lanes
            xfer_lane[rows[ok]] = lanes
            placed[r] = ("gpu", gr, kidx[ok])  # its kept members' kernels, in their order
            continue
        host = buf.lane(f"rank {r} training thread")
        arr_lane[rows] = host
        # gloo runs a group's collectives in order on one thread; send/recv are asynchronous (an isend's
        # record ends at its wait(), after later receives on the pair ended): on no lane
        coll = rows[~p2p[rows]]
        for name in np.unique(pg[coll]):
            xfer_lane[coll[pg[coll] == name]] = buf.lane(f"rank {r} comm {name}")
        placed[r] = ("cpu", host, None)
    members = take({**members, "arrival": arrival, "arr_lane": arr_lane, "xfer_lane": xfer_lane},
                   (arr_lane >= 0) | (arr_lane == _LOG_LANE))
    members["arr_lane"] = np.where(members["arr_lane"] == _LOG_LANE, -1, members["arr_lane"])
    # the kept members' instances renumbered (`step_members` numbered them in key order: the same numbers as
    # grouping the kept keys again, without the strings: ~6 M members at 10,000 ranks)
    members["inst"] = recode(members["inst"])
    return members, placed


def instance_info(members: Columns) -> InstInfo:
    """Per instance (members' `inst`): its first member's key, group, dim and op, the largest member's bytes,
    the member count and each member's (rank, bytes sent, bytes received)."""
    inst = members["inst"]
    n = int(inst.max()) + 1 if inst.size else 0
    first = first_of_group(inst, n)
    size = np.full(n, np.nan)
    np.fmax.at(size, inst, members["bytes"].astype(np.float64))
    io = MemberIO(inst, members["rank"], members["in_bytes"], members["out_bytes"], n)
    return InstInfo(key=members["key"][first], pg_name=members["pg_name"][first], dim=members["dim"][first],
                    op=members["op"][first], bytes=size, n=np.bincount(inst, minlength=n).astype(np.int64), io=io)


def build_step_graph(store: RunStore, steps: int | tuple[int, ...], inp: StepInput,
                     ranks: list[int] | None = None, log_only: set[int] | frozenset[int] = frozenset()
                     ) -> StepGraph:
    """The dependency graph of `steps` (consecutive profiled steps, one graph: a fix that shortens one step
    lets the next start earlier) across `ranks` (default: every rank in the store); the ranks in `log_only`
    (a partial recording's ranks without a trace) as chains of their logged collectives (`add_log_rank`)."""
    steps = (steps,) if isinstance(steps, int) else tuple(steps)
    ranks = sorted(store.ranks() if ranks is None else ranks)
    buf = _Buf()
    rows = matched_columns(inp.matched)
    shift = clock_shift(rows, inp.matched.trace_shift if inp.matched is not None else {})
    members = with_sizes(store, step_members(inp, rows, steps, shift, log_only))
    dims = sorted(set(inp.dims.values()) | set(strings(members["dim"]).tolist()))
    members, placed = _place_members(buf, store, steps, ranks, shift, members, log_only)
    buf.slow = slow_host_ops(store, [r for r, p in placed.items() if p[0] == "gpu"], steps, inp.slow_ops)
    ids = add_collectives(buf, members, dims)
    windows: dict[tuple[int, int], tuple[int, ...]] = {}
    host_start: dict[int, int] = {}
    by_rank = rows_by(members["rank"])
    for r, (kind, obj, kernel_of) in placed.items():
        conv = shift.get(r, 0)
        sel = by_rank.get(r, np.zeros(0, np.int64))
        sub_ids = {k: v[sel] for k, v in ids.items()}
        mem = take(members, sel)
        if kind == "gpu":
            add_gpu_rank(buf, store, r, steps, conv, obj, kernel_of, sub_ids)
            windows.update(_gpu_windows(r, obj))
            marks = _cpu_windows(store, r, steps, conv)  # the host's step began before its first launch
            if marks:
                host_start[r] = min(b for b, _ in marks.values())
        elif kind == "log":
            windows.update(add_log_rank(buf, r, mem, sub_ids))
        else:
            add_cpu_rank(buf, store, r, steps, conv, mem, sub_ids, obj)
            windows.update(_cpu_windows(store, r, steps, conv))
        placed[r] = (kind, None, None)  # the rank's kernels are in the graph now: freed as the graph grows
        del obj
    g = buf.finish(dims)
    infer_stream_waits(g)
    g.inst_info = instance_info(members)
    attach_windows(g, windows, host_start)
    return g


_LOG_LANE = -2
"""`_place_members`: a log-only rank's member (kept, on no lane)"""
LOG_WORK = "work (from the collective log)"
"""name of a log-only rank's work segment"""


def add_log_rank(buf: _Buf, rank: int, mem: Columns, ids: dict[str, np.ndarray]
                 ) -> dict[tuple[int, int], tuple[int, int]]:
    """A log-only rank (a partial recording: its collective log, no trace) as a chain of nodes: before each
    of its collectives' arrivals a work node (COMPUTE) for its device's time since it last waited, then the
    arrival. The log gives, per collective, the arrival and the end on the device; the work before arrival i
    begins at the previous arrival or, later, at the end of the collectives that ended between the two (the
    stream waited for them: a collective's end releases the next work after it); an end that falls after the
    next arrival (an asynchronous collective, overlapped) releases the work after that arrival. The nodes sit
    on no lane (`_place_members`): explicit edges chain arrival i - 1 → work → arrival i in the log's order
    (lane order would sort collectives arriving at one instant by node id, against the chain). Replaying the
    unchanged chain gives back the logged times; a fix that scales the rank's compute (`whatif.fixes._rank_compute`: each work node at its peers' median, the ranks
    of its stage running the same program) moves its arrivals and so its peers' collectives.
    Returns its windows: per step, from its first node's start to its last node's end."""
    a, e = mem["arrival"], mem["end"]
    if a.size == 0:
        return {}
    step = mem["step"].copy()
    order = np.lexsort((ids["arrival"], a))
    a, e, step = a[order], e[order], step[order]
    arr_ids, xfer_ids = ids["arrival"][order], ids["transfer"][order]
    # a member without a step takes the step of the one before it (the first: the next known one)
    known = ~np.isnan(step)
    if not known.any():
        return {}
    idx = np.where(known, np.arange(step.size), -1)
    np.maximum.accumulate(idx, out=idx)
    first_known = int(np.flatnonzero(known)[0])
    step = np.where(idx >= 0, step[np.maximum(idx, 0)], step[first_known]).astype(np.int64)
    n = a.size
    # the work before arrival i (i >= 1) follows arrival i - 1 and the collectives released into it
    rel = np.maximum(np.searchsorted(a, e, side="left"), np.arange(n) + 1)  # first arrival at or after the end
    ok = rel < n
    begin = np.r_[a[0], a[:-1]].copy()
    np.maximum.at(begin, rel[ok], e[ok])
    begin = np.minimum(begin, a)  # (ends after an arrival never release it: rel is past it)
    w = np.arange(1, n)
    work = buf.add(rank=rank, lane=-1, category=Category.COMPUTE, start=begin[w], dur=a[w] - begin[w],
                   names=LOG_WORK, terminal=True, step=step[w])
    buf.edge(arr_ids[w - 1], work)  # work node k is the work before arrival k + 1
    buf.edge(work, arr_ids[w])
    buf.edge(xfer_ids[ok], work[rel[ok] - 1])
    out: dict[tuple[int, int], tuple[int, int]] = {}
    node_start = np.r_[begin[w], a[:1]]
    node_end = np.r_[a[w], e[:1]]
    node_step = np.r_[step[w], step[:1]]
    for s in np.unique(step).tolist():
        m = node_step == s
        mx = e[step == s]
        out[(rank, int(s))] = (int(node_start[m].min()), int(max(node_end[m].max(), mx.max())))
    return out


def slow_host_ops(store: RunStore, ranks: list[int], steps: tuple[int, ...], found: SlowOps | None = None
                  ) -> dict[int, Columns]:
    """Per GPU rank: its slow host ops of `steps` (tid, ts, end, excess, runtime; trace clock), each op
    judged against the same op on every GPU rank (`host_bound.excess_ns`): `found` where it covers these ranks
    (the host_bound analyzer's), else derived (`slow_ops_of`)."""
    out = {}
    for r, o in slow_ops_of(store, ranks, found).items():
        keep = in_steps(o["step"], steps)
        out[r] = {"tid": o["tid"][keep], "ts": o["ts"][keep], "end": o["end"][keep],
                  "excess": o["excess"][keep], "runtime": o["runtime"][keep]}
    return out


def attach_windows(g: StepGraph, windows: dict[tuple[int, int], tuple[int, ...]],
                   host_start: dict[int, int] | None = None) -> None:
    """Per (rank, step): its measured step window (and where its backward began, when known); per rank a pinned start node before its lanes' first nodes
    (at the host's step start where `host_start` has one: a GPU rank's window opens at its first kernel,
    but what held its host before the first launch, a data wait or a stall, is the first launch's gap)."""
    keys = sorted(windows)
    g.ranks = np.array([k[0] for k in keys], dtype=np.int64)
    g.win_step = np.array([k[1] for k in keys], dtype=np.int64)
    g.win_start = np.array([windows[k][0] for k in keys], dtype=np.int64)
    g.win_end = np.array([windows[k][1] for k in keys], dtype=np.int64)
    g.win_backward = np.array([(windows[k] + (-1,))[2] for k in keys], dtype=np.int64)
    add_start_nodes(g, host_start)


def infer_stream_waits(g: StepGraph) -> None:
    """A device op that started later than everything the graph makes it wait for (its stream, its launch,
    a collective) waited for another stream of its rank (an event wait the trace does not record): the
    latest op of the rank's other streams that ended in that gap becomes its predecessor. So does the
    latest such op that ended before a launch-bound op (its launch returned last): the late launch hides
    whether it also waited for that op (a compute kernel consuming an all-reduce's output), and a replay
    that makes the host faster must not let it start before that op ended."""
    dev = np.flatnonzero(device_lane_mask(g) & (g.rank >= 0))
    if dev.size == 0:
        return
    low = np.iinfo(np.int64).min
    end = g.start + g.dur
    ready, ready_host = np.full(g.num_nodes, low, np.int64), np.full(g.num_nodes, low, np.int64)
    np.maximum.at(ready, g.dst, end[g.src])
    from_host = host_lane_mask(g)[g.src]
    np.maximum.at(ready_host, g.dst[from_host], end[g.src[from_host]])
    ready_dev = np.full(g.num_nodes, low, np.int64)
    np.maximum.at(ready_dev, g.dst[~from_host], end[g.src[~from_host]])
    launch_bound = (ready_host[dev] >= ready[dev]) & (ready_host[dev] > ready_dev[dev]) & (ready_host[dev] > low)
    sel = ((g.start[dev] > ready[dev]) & (ready[dev] > low)) | launch_bound
    waiting, floor = dev[sel], np.where(launch_bound, ready_dev[dev], ready[dev])[sel]
    if waiting.size == 0:
        return
    cand = dev[g.dur[dev] > 0]  # a zero-length mark (a collective's arrival) ends where it starts: never its own wait
    order = cand[np.lexsort((end[cand], g.rank[cand]))]
    key_r, key_e = g.rank[order].astype(np.int64), end[order]
    # per waiting op: the last device op of its rank ending at or before its start
    lo = np.searchsorted(key_r, g.rank[waiting], side="left")
    # one merge of the ops (rank, end) with the waiting ops (rank, start), an op before a waiting op on ties:
    # the ops before a waiting op are those of lower ranks and of its rank ending at or before its start
    both = np.lexsort((np.r_[np.zeros(order.size, np.int8), np.ones(waiting.size, np.int8)],
                       np.r_[key_e, g.start[waiting]], np.r_[key_r, g.rank[waiting].astype(np.int64)]))
    is_wait = both >= order.size
    pos = np.empty(waiting.size, np.int64)
    pos[both[is_wait] - order.size] = np.cumsum(~is_wait)[is_wait] - 1
    ok = pos >= lo
    u = order[np.maximum(pos, 0)]
    ok &= (end[u] > floor) & (g.lane[u] != g.lane[waiting])
    add_edges(g, u[ok], waiting[ok])
    # a launch-bound op's edge from an op that ended before everything else it waited for is assumed: the
    # trace shows no wait for it (`StepGraph.assumed_edges`)
    assumed = ok & (end[u] <= ready[waiting])
    g.assumed_edges = np.r_[g.assumed_edges, np.c_[u[assumed], waiting[assumed]].astype(np.int64)]
    g._plan = None
