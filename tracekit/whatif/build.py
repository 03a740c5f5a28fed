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
The measured step of a rank: GPU = first to last kernel of the step; CPU = the ProfilerStep window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analyze.matching import MatchedCollectives, arrival_ns, row_trace_shift
from tracekit.parse.classify import is_label, name_role
from tracekit.tables.store import RunStore
from tracekit.whatif.graph import Category, StepGraph, add_start_nodes, device_lane_mask

BLOCKING_CALL_WORDS = ("Synchronize",)
BLOCKING_MEMCPY = ("cudaMemcpy", "hipMemcpy", "cudaMemcpy2D", "hipMemcpy2D")
P2P_KEY = "p2p:"
"""prefix of a send/recv pair's instance key"""
KIND_CATEGORY = {"compute": Category.COMPUTE, "comm": Category.TRANSFER, "memcpy": Category.OTHER,
                 "memset": Category.OTHER}


@dataclass
class _Buf:
    """Nodes and cross-lane edges being collected (lane-order edges are added at the end)."""

    cols: dict[str, list[np.ndarray]] = field(default_factory=lambda: {
        k: [] for k in ("rank", "lane", "category", "start", "dur", "dim", "inst", "terminal", "prio", "step",
                       "tie")})
    names: list[str] = field(default_factory=list)
    src: list[np.ndarray] = field(default_factory=list)
    dst: list[np.ndarray] = field(default_factory=list)
    n: int = 0
    lane_names: list[str] = field(default_factory=list)

    def lane(self, name: str) -> int:
        self.lane_names.append(name)
        return len(self.lane_names) - 1

    def add(self, *, rank: int, lane: Any, category: Any, start: np.ndarray, dur: np.ndarray,
            names: list[str] | str = "", dim: Any = -1, inst: Any = -1, terminal: Any = False,
            prio: Any = 1, step: Any = -1, tie: Any = None) -> np.ndarray:
        """`tie`: orders nodes of one lane that start at the same time (default: their start)."""
        k = len(start)
        for key, val, dt in (("rank", rank, np.int32), ("lane", lane, np.int64), ("category", category, np.int8),
                             ("start", start, np.int64), ("dur", dur, np.int64), ("dim", dim, np.int32),
                             ("inst", inst, np.int32), ("terminal", terminal, bool), ("prio", prio, np.int8),
                             ("step", step, np.int64), ("tie", start if tie is None else tie, np.int64)):
            self.cols[key].append(np.array(np.broadcast_to(np.asarray(val, dtype=dt), (k,))))
        self.names.extend(names if isinstance(names, list) else [names] * k)
        ids = np.arange(self.n, self.n + k, dtype=np.int64)
        self.n += k
        return ids

    def edge(self, src: np.ndarray, dst: np.ndarray) -> None:
        self.src.append(np.asarray(src, dtype=np.int64))
        self.dst.append(np.asarray(dst, dtype=np.int64))

    def finish(self, dims: list[str]) -> StepGraph:
        c = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in self.cols.items()}
        lane, start, prio = c["lane"].astype(np.int64), c["start"].astype(np.int64), c["prio"]
        chained = np.flatnonzero(lane >= 0)
        tie = c["tie"].astype(np.int64)
        order = chained[np.lexsort((chained, tie[chained], prio[chained], start[chained], lane[chained]))]
        same = lane[order[1:]] == lane[order[:-1]]
        src = np.concatenate(self.src + [order[:-1][same]]) if self.src or len(order) else np.zeros(0, np.int64)
        dst = np.concatenate(self.dst + [order[1:][same]]) if self.dst or len(order) else np.zeros(0, np.int64)
        return StepGraph(rank=c["rank"].astype(np.int32), lane=lane, category=c["category"].astype(np.int8),
                         start=start, dur=np.maximum(c["dur"].astype(np.int64), 0),
                         src=src.astype(np.int64), dst=dst.astype(np.int64), dim=c["dim"].astype(np.int32),
                         inst=c["inst"].astype(np.int32), name=self.names, lane_names=self.lane_names,
                         dims=dims, terminal=c["terminal"].astype(bool), step=c["step"].astype(np.int64))


@dataclass
class StepInput:
    """What the builder needs besides the tables: the matched collectives and the run's dims."""

    matched: MatchedCollectives | None
    dims: dict[str, str]
    """pg_name → parallel dim"""
    p2p: pd.DataFrame | None = None
    """send/recv rows of the rank's matching source (matching.load_collectives columns)"""
    ends: pd.DataFrame | None = None
    """per (rank, pg_name, seq): the trace-clock end (ts + dur) of the collective from a source that
    records it: a matching source with enqueue times only (a comms log) leaves members without an end"""


def _arr(t: pa.Table, col: str, dtype: Any = np.int64) -> np.ndarray:
    return t.column(col).to_numpy(zero_copy_only=False).astype(dtype)


def _top_level(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Mask of intervals (sorted by start, longest first) not nested in an earlier one."""
    if ts.size == 0:
        return np.zeros(0, dtype=bool)
    prev_end = np.maximum.accumulate(np.r_[np.iinfo(np.int64).min, end[:-1]])
    return ts >= prev_end


def clock_shift(matched: MatchedCollectives | None) -> dict[int, int]:
    """Per rank: subtract from trace-clock times to reach the common (matching) clock."""
    if matched is None or matched.n_rows == 0:
        return {}
    rows = matched.rows
    off = (rows["arrival_raw"] - rows["arrival"]).groupby(rows["rank"]).first()
    out = {}
    for r, o in off.items():
        shift = matched.trace_shift.get(int(r))
        out[int(r)] = int(o) + int(shift or 0)
    return out


def step_members(inp: StepInput, steps: tuple[int, ...], shift: dict[int, int]) -> pd.DataFrame:
    """The step's collective members on the common clock: key, rank, arrival, end, dim, op, bytes, inst."""
    m = inp.matched
    if m is None or m.n_rows == 0:
        return pd.DataFrame(columns=["key", "rank", "arrival", "end", "dim", "op", "bytes", "inst", "pg_name", "step",
                                     "source"])
    rows = _with_trace_ends(m.rows[m.rows["step"].isin(steps)], inp.ends, shift)
    rows = rows[rows["end"].notna() | rows["trace_end"].notna()].copy()
    rs = row_trace_shift(rows, m.trace_shift)
    rows = rows[~np.isnan(rs)].copy()
    rs = rs[~np.isnan(rs)].astype(np.int64)
    conv = rows["rank"].map(shift).fillna(0).astype(np.int64).to_numpy()
    off = (rows["arrival_raw"] - rows["arrival"]).astype(np.int64).to_numpy()
    rows["arrival"] = rows["arrival_raw"].astype(np.int64).to_numpy() + rs - conv
    own_end = rows["end"].fillna(0).astype(np.int64).to_numpy() + off + rs - conv
    rows["end"] = np.where(rows["end"].notna().to_numpy(), own_end,
                           rows["trace_end"].fillna(0).astype(np.int64).to_numpy() - conv)
    names = rows["pg_name"].astype(str)
    rows["dim"] = names.map({p: inp.dims.get(p.removeprefix("kineto:"), "unknown") for p in names.unique()})
    n = rows.groupby("key")["rank"].transform("size")
    rows = rows[n >= 2].copy()
    cols = ["key", "rank", "arrival", "end", "dim", "op", "bytes", "pg_name", "step", "source"]
    parts = [x for x in (rows[cols], p2p_members(inp, steps, shift)) if not x.empty]
    both = pd.concat(parts, ignore_index=True) if parts else rows[cols].copy()
    both["inst"] = both["key"].astype("category").cat.codes.astype(np.int64)
    return both


def with_sizes(store: RunStore, members: pd.DataFrame) -> pd.DataFrame:
    """`members` with `in_bytes` / `out_bytes`: what each member sent and received (the collectives table's
    in/out elements at the row's element size; NaN when unknown). An all_to_all's members differ: what an
    expert's owner receives is its load."""
    members = members.assign(in_bytes=np.nan, out_bytes=np.nan)
    if members.empty or not store.has("collectives"):
        return members
    key = ["rank", "source", "pg_name", "seq"]
    t = store.table("collectives", [*key, "in_nelems", "out_nelems"]).to_pandas()
    t = t.dropna(subset=["seq", "in_nelems", "out_nelems"]).astype({"pg_name": str, "source": str, "seq": np.int64})
    seq = members["key"].astype(str).str.rsplit("#", n=1).str[-1]
    left = members[["rank", "source", "pg_name"]].astype({"rank": np.int64, "source": str, "pg_name": str})
    left = left.assign(seq=pd.to_numeric(seq, errors="coerce").fillna(-1).astype(np.int64))
    got = left.merge(t.drop_duplicates(key).astype({"rank": np.int64}), on=key, how="left")
    n_in, n_out = got["in_nelems"].to_numpy(np.float64), got["out_nelems"].to_numpy(np.float64)
    elem = members["bytes"].to_numpy(np.float64) / np.maximum(n_in, n_out)
    return members.assign(in_bytes=n_in * elem, out_bytes=n_out * elem)


def _with_trace_ends(rows: pd.DataFrame, ends: pd.DataFrame | None, shift: dict[int, int]) -> pd.DataFrame:
    """`rows` with `trace_end`: the collective's trace-clock end from `ends` where the row has no end."""
    rows = rows.copy()
    rows["trace_end"] = pd.array([pd.NA] * len(rows), dtype="Int64")
    if ends is None or ends.empty or rows.empty or rows["end"].notna().all():
        return rows
    key = ["rank", "pg_name", "seq"]
    left = rows[key].astype({"rank": np.int64, "pg_name": str, "seq": np.int64})
    right = ends.astype({"rank": np.int64, "pg_name": str, "seq": np.int64})
    got = left.merge(right, on=key, how="left")["trace_end"]
    rows["trace_end"] = pd.array(got.to_numpy(), dtype="Int64")
    return rows


def p2p_members(inp: StepInput, steps: tuple[int, ...], shift: dict[int, int]) -> pd.DataFrame:
    """Send/recv pairs of the step as two-member instances (the k-th send src→dst on a group with the
    k-th receive at dst from src): the transfer waits for both sides to be posted."""
    cols = ["key", "rank", "arrival", "end", "dim", "op", "bytes", "pg_name", "step", "source"]
    df = inp.p2p
    if df is None or df.empty:
        return pd.DataFrame(columns=cols)
    df = df[df["step"].isin(steps) & df["peer"].notna() & df["ts"].notna() & df["dur"].notna()].copy()
    op = df["op"].astype(str)
    df = df[op.str.contains("send") ^ op.str.contains("recv")].copy()
    if df.empty:
        return pd.DataFrame(columns=cols)
    trace_shift = inp.matched.trace_shift if inp.matched is not None else {}
    log = df["source"].astype(str).isin(("comms-log", "flight-recorder")).to_numpy()
    conv = df["rank"].map(shift).fillna(0).astype(np.int64).to_numpy()
    own = df["rank"].map(lambda r: trace_shift.get(int(r)) or 0).astype(np.int64).to_numpy()
    back = np.where(log, conv - own, conv)  # log rows: minus the offset; trace rows: minus shift+offset
    on_gpu = inp.matched.gpu_ranks if inp.matched is not None else set()
    arrival = arrival_ns(df, on_gpu).astype(np.int64).to_numpy()  # DESIGN §3 (ts is known here)
    df["arrival"] = arrival - back
    df["end"] = (df["ts"] + df["dur"]).astype(np.int64).to_numpy() - back
    df["send"] = df["op"].astype(str).str.contains("send")
    df["src"] = np.where(df["send"], df["rank"], df["peer"]).astype(np.int64)
    df["dst"] = np.where(df["send"], df["peer"], df["rank"]).astype(np.int64)
    df["pg_name"] = df["pg_name"].fillna("?").astype(str)
    df = df.sort_values(["src", "dst", "pg_name", "send", "arrival"], kind="stable")
    df["k"] = df.groupby(["src", "dst", "pg_name", "send"]).cumcount()
    df["key"] = (P2P_KEY + df["src"].astype(str) + ">" + df["dst"].astype(str) + ":" + df["pg_name"] + "#"
                 + df["k"].astype(str))
    df = df[df.groupby("key")["rank"].transform("size") == 2]
    df["dim"] = df["pg_name"].map(lambda p: inp.dims.get(p, "pp"))
    return df[cols].reset_index(drop=True)


def add_collectives(buf: _Buf, members: pd.DataFrame, dims: list[str]) -> dict[str, np.ndarray]:
    """Arrival, sync and transfer nodes (members' `arr_lane` / `xfer_lane` say where they sit);
    returns per member row the arrival and transfer node ids."""
    if members.empty:
        return {k: np.zeros(0, np.int64) for k in ("arrival", "transfer", "sync", "last_arrival")}
    dim_idx = members["dim"].map({d: i for i, d in enumerate(dims)}).fillna(-1).to_numpy(np.int32)
    inst = members["inst"].to_numpy(np.int64)
    arrival = members["arrival"].to_numpy(np.int64)
    end = members["end"].to_numpy(np.int64)
    last = members.groupby("inst")["arrival"].max()
    ninst = int(inst.max()) + 1
    sync_t = last.reindex(range(ninst)).to_numpy(np.int64)
    sync = buf.add(rank=-1, lane=-1, category=Category.MARK, start=sync_t, dur=np.zeros(ninst, np.int64),
                   inst=np.arange(ninst), names="sync")
    lanes = members["xfer_lane"].to_numpy(np.int64)
    arr_lanes = members["arr_lane"].to_numpy(np.int64)
    ranks = members["rank"].to_numpy(np.int32)
    arr_ids = buf.add(rank=ranks, lane=arr_lanes, category=Category.MARK, start=arrival,
                      dur=np.zeros(len(members), np.int64), dim=dim_idx, inst=inst, names="arrive", prio=0)
    # a group runs its collectives in order: a transfer starts after the last arrival and after the
    # previous transfer on the same lane ended (ties on the lane keep that order: by arrival)
    xs = np.maximum(sync_t[inst], _prev_end_on_lane(lanes, arrival, end))
    xfer_ids = buf.add(rank=ranks, lane=lanes, category=Category.TRANSFER, start=xs, dur=np.maximum(end - xs, 0),
                       dim=dim_idx, inst=inst, tie=arrival,
                       names=(members["op"].astype(str) + " " + members["pg_name"].astype(str)).tolist(),
                       terminal=True, step=members["step"].fillna(-1).to_numpy(np.int64))
    buf.edge(arr_ids, sync[inst])
    buf.edge(sync[inst], xfer_ids)
    buf.edge(arr_ids, xfer_ids)
    return {"arrival": arr_ids, "transfer": xfer_ids, "sync": sync[inst], "last_arrival": sync_t[inst]}


def _prev_end_on_lane(lanes: np.ndarray, arrival: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per member: the latest end of the earlier collectives on its lane (int64 min when none, or when the
    member sits on no lane)."""
    order = np.lexsort((arrival, lanes))
    s = pd.Series(end[order])
    g = lanes[order]
    prev = s.groupby(g).cummax().groupby(g).shift(1, fill_value=np.iinfo(np.int64).min)
    out = np.empty(lanes.size, np.int64)
    out[order] = prev.to_numpy(np.int64)
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
    return pc.fill_null(pc.is_in(col, value_set=pa.array(list(steps), col.type)), False)


def _rank_events(store: RunStore, rank: int, steps: tuple[int, ...], columns: list[str]) -> pa.Table:
    ev = store.rank_table("events", rank, columns)
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
    return ts, end, nm, ann, _arr(ev, "step")[order]


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


def add_cpu_rank(buf: _Buf, store: RunStore, rank: int, steps: tuple[int, ...], conv: int, mem: pd.DataFrame,
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
    a = mem["arrival"].to_numpy(np.int64)
    e = mem["end"].to_numpy(np.int64)
    issue = np.array([name_role(n) == "comm" for n in names], dtype=bool)  # the parser's rule (events.role)
    leaf = _leaf(ts, end)
    idle_like = issue | ~leaf  # per op: its own time is a call or the gap between its children
    at_e = _containing(s0, s1, e, strict=False)
    blocking = (at_e < 0) | idle_like[owner[np.maximum(at_e, 0)]] if s0.size else np.ones(e.size, bool)
    p0, p1, piece = cut_intervals(s0, s1, np.concatenate([a, e]))
    own = owner[piece]
    load = np.array([name_role(n) == "data_load" for n in names], dtype=bool)
    cat = np.where(issue, Category.HOST, np.where(load, Category.STALL, Category.COMPUTE)).astype(np.int8)[own]
    wait = idle_like[own] & _inside_union(p0, p1, a, e)
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
    buf.edge(ids["sync"][early], seg[resume[early]])
    blocking &= ~early
    nxt = np.searchsorted(p0, e[blocking], side="left")
    ok = nxt < p0.size
    buf.edge(ids["transfer"][blocking][ok], seg[nxt[ok]])
    return seg


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
    kind: list[str]
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
    """Per kernel (by external id): the CPU op of the rank's events `ev` that launched it is autograd's (its
    name says backward, as PyTorch names them: `aten::*_backward*`, `autograd::engine::evaluate_function:
    MmBackward0`, ...)."""
    ev = ev.filter(pc.and_(pc.fill_null(pc.equal(ev["cat"].cast(pa.string()), "cpu_op"), False),
                           pc.is_valid(ev["external_id"])))
    names = pc.utf8_lower(ev.column("name").cast(pa.string()))
    bwd = _arr(ev.filter(pc.fill_null(pc.match_substring(names, "backward"), False)), "external_id")
    return np.isin(external_id, bwd) & (external_id >= 0)


def load_gpu_rank(buf: _Buf, store: RunStore, rank: int, steps: tuple[int, ...], conv: int) -> GpuRank | None:
    k = store.rank_table("kernels", rank, ["name", "stream", "ts", "dur", "kind", "correlation", "step", "external_id"])
    k = k.filter(pc.and_(_in_steps(k["step"], steps), pc.is_valid(k["dur"])))
    if k.num_rows == 0:
        return None
    ts = _arr(k, "ts") - conv
    order = np.argsort(ts, kind="stable")
    stream = np.nan_to_num(_arr(k, "stream", float), nan=-1).astype(np.int64)[order]
    lanes = {int(s): buf.lane(f"rank {rank} stream {int(s)}") for s in np.unique(stream)}
    corr = np.nan_to_num(_arr(k, "correlation", float), nan=-1).astype(np.int64)[order]
    kind = [str(x) for x in np.asarray(k.column("kind").cast(pa.string()).to_pylist(), dtype=object)[order]]
    names = [str(x) for x in np.asarray(k.column("name").cast(pa.string()).to_pylist(), dtype=object)[order]]
    ext = np.nan_to_num(_arr(k, "external_id", float), nan=-1).astype(np.int64)[order]
    return GpuRank(ts=ts[order], end=(ts + _arr(k, "dur"))[order], kind=kind, stream=stream, correlation=corr,
                   names=names, lanes=lanes, step=_arr(k, "step")[order], external_id=ext)


def match_gpu_members(gr: GpuRank, mem: pd.DataFrame) -> np.ndarray:
    """Index of each member's collective kernel, -1 if none: the comm kernel whose end is nearest the
    member's end, one member per kernel (a fused send/recv pair ends together on two kernels)."""
    comm = np.flatnonzero(np.array([k == "comm" for k in gr.kind], dtype=bool))
    if comm.size == 0 or mem.empty:
        return np.full(len(mem), -1, np.int64)
    o = np.argsort(gr.end[comm], kind="stable")
    ends = gr.end[comm][o]
    e = mem["end"].to_numpy(np.int64)
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
    lanes = np.array([gr.lanes[int(s)] for s in gr.stream], dtype=np.int64)
    cats = np.array([KIND_CATEGORY.get(k, Category.OTHER) for k in gr.kind], dtype=np.int8)
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
    ev = _rank_events(store, rank, steps, ["name", "cat", "ts", "dur", "tid", "step", "correlation", "stream",
                                           "external_id"])
    gr.backward = launched_by_backward(ev, gr.external_id)
    ev = ev.filter(pc.is_null(ev["stream"]))
    cat = ev.column("cat").cast(pa.string())
    rt = pc.fill_null(pc.or_(pc.match_substring(cat, "runtime"), pc.match_substring(cat, "driver")), False)
    ev = ev.filter(rt)
    if ev.num_rows == 0:
        return
    ts, end = _arr(ev, "ts") - conv, _arr(ev, "ts") + _arr(ev, "dur") - conv
    tid = np.nan_to_num(_arr(ev, "tid", float), nan=-1).astype(np.int64)
    corr = np.nan_to_num(_arr(ev, "correlation", float), nan=-2).astype(np.int64)
    names = [str(x) for x in ev.column("name").cast(pa.string()).to_pylist()]
    blocking = np.array([any(w in n for w in BLOCKING_CALL_WORDS) or n in BLOCKING_MEMCPY for n in names], bool)
    # the device work a blocking call waited for: the kernel that ended last inside it
    by_end = np.argsort(gr.end, kind="stable")
    hi = np.searchsorted(gr.end[by_end], end, side="right") - 1
    waited = np.where((hi >= 0) & (gr.end[by_end][np.maximum(hi, 0)] >= ts), by_end[np.maximum(hi, 0)], -1)
    waited = np.where(blocking, waited, -1)
    w = waited >= 0
    for t in np.unique(tid):
        lane = buf.lane(f"rank {rank} host thread {t}")
        sel = tid == t
        plain = sel & ~w
        ids = buf.add(rank=rank, lane=lane, category=Category.HOST, start=ts[plain], dur=end[plain] - ts[plain],
                      names=[names[i] for i in np.flatnonzero(plain)])
        _launch_edges(buf, corr[plain], ids, gr, node)
        bw = np.flatnonzero(sel & w)
        if bw.size:  # call issued (dur 0) … returns when the waited kernel ended
            buf.add(rank=rank, lane=lane, category=Category.HOST, start=ts[bw], dur=np.zeros(bw.size, np.int64),
                    names=[names[i] for i in bw])
            kend = gr.end[waited[bw]]
            back = buf.add(rank=rank, lane=lane, category=Category.WAIT, start=np.maximum(kend, ts[bw]),
                           dur=end[bw] - np.maximum(kend, ts[bw]), names="device wait", prio=1)
            buf.edge(done[waited[bw]], back)


def _launch_edges(buf: _Buf, call_corr: np.ndarray, call_ids: np.ndarray, gr: GpuRank, node: np.ndarray) -> None:
    if call_corr.size == 0:
        return
    o = np.argsort(call_corr)
    j = np.searchsorted(call_corr[o], gr.correlation)
    j = np.clip(j, 0, call_corr.size - 1)
    hit = (call_corr[o][j] == gr.correlation) & (gr.correlation >= 0) & (node >= 0)
    buf.edge(call_ids[o][j[hit]], node[hit])


def _cpu_windows(store: RunStore, rank: int, steps: tuple[int, ...], conv: int) -> dict[tuple[int, int], tuple[int, int]]:
    st = store.rank_table("steps", rank, ["step", "ts", "dur"])
    st = st.filter(pc.and_(_in_steps(st["step"], steps), pc.is_valid(st["dur"])))
    return {(rank, int(s)): (int(t) - conv, int(t) + int(d) - conv)
            for s, t, d in zip(st.column("step").to_pylist(), st.column("ts").to_pylist(), st.column("dur").to_pylist())}


def _gpu_windows(rank: int, gr: GpuRank) -> dict[tuple[int, int], tuple[int, int, int]]:
    """Per (rank, step): first kernel start, last kernel end, first backward kernel's start (-1: none)."""
    out = {}
    for s in np.unique(gr.step):
        m = gr.step == s
        bwd = gr.ts[m & gr.backward] if gr.backward is not None else gr.ts[:0]
        out[(rank, int(s))] = (int(gr.ts[m].min()), int(gr.end[m].max()), int(bwd.min()) if bwd.size else -1)
    return out


def _place_members(buf: _Buf, store: RunStore, steps: tuple[int, ...], ranks: list[int], shift: dict[int, int],
                   members: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, Any]]:
    """Decide each rank's kind (GPU: its kernels; CPU: its training thread) and where its members sit."""
    members = members.reset_index(drop=True)
    arrival = members["arrival"].to_numpy(np.int64).copy()
    arr_lane = np.full(len(members), -1, np.int64)
    xfer_lane = np.full(len(members), -1, np.int64)
    by_rank = members.groupby("rank").indices if len(members) else {}
    pg = members["pg_name"].astype(str).to_numpy()
    p2p = members["key"].astype(str).str.startswith(P2P_KEY).to_numpy()
    placed: dict[int, Any] = {}
    for r in ranks:
        rows = np.asarray(by_rank.get(r, np.zeros(0, np.int64)), dtype=np.int64)
        gr = load_gpu_rank(buf, store, r, steps, shift.get(r, 0))
        if gr is not None:
            kidx = match_gpu_members(gr, members.iloc[rows])
            ok = kidx >= 0
            lanes = np.array([gr.lanes[int(gr.stream[i])] for i in kidx[ok]], dtype=np.int64)
            arrival[rows[ok]] = gr.ts[kidx[ok]]  # device arrival: the kernel's start
            arr_lane[rows[ok]] = lanes
            xfer_lane[rows[ok]] = lanes
            placed[r] = ("gpu", gr, None)
            continue
        host = buf.lane(f"rank {r} training thread")
        arr_lane[rows] = host
        # gloo runs a group's collectives in order on one thread; send/recv are asynchronous (an isend's
        # record ends at its wait(), after later receives on the pair ended): on no lane
        coll = rows[~p2p[rows]]
        for name in np.unique(pg[coll]):
            xfer_lane[coll[pg[coll] == name]] = buf.lane(f"rank {r} comm {name}")
        placed[r] = ("cpu", host, None)
    members = members.assign(arrival=arrival, arr_lane=arr_lane, xfer_lane=xfer_lane)
    members = members[members["arr_lane"] >= 0].reset_index(drop=True)
    members["inst"] = members["key"].astype("category").cat.codes.astype(np.int64)
    return members, placed


def build_step_graph(store: RunStore, steps: int | tuple[int, ...], inp: StepInput,
                     ranks: list[int] | None = None) -> StepGraph:
    """The dependency graph of `steps` (consecutive profiled steps, one graph: a fix that shortens one step
    lets the next start earlier) across `ranks` (default: every rank in the store)."""
    steps = (steps,) if isinstance(steps, int) else tuple(steps)
    ranks = sorted(store.ranks() if ranks is None else ranks)
    buf = _Buf()
    shift = clock_shift(inp.matched)
    members = with_sizes(store, step_members(inp, steps, shift))
    dims = sorted(set(inp.dims.values()) | set(members["dim"].astype(str)))
    members, placed = _place_members(buf, store, steps, ranks, shift, members)
    ids = add_collectives(buf, members, dims)
    windows: dict[tuple[int, int], tuple[int, ...]] = {}
    host_start: dict[int, int] = {}
    by_rank = members.groupby("rank").indices if len(members) else {}
    for r, (kind, obj, _) in placed.items():
        conv = shift.get(r, 0)
        sel = np.asarray(by_rank.get(r, np.zeros(0, np.int64)), dtype=np.int64)
        sub_ids = {k: v[sel] for k, v in ids.items()}
        mem = members.iloc[sel]
        if kind == "gpu":
            kidx = match_gpu_members(obj, mem) if len(mem) else np.zeros(0, np.int64)
            add_gpu_rank(buf, store, r, steps, conv, obj, kidx, sub_ids)
            windows.update(_gpu_windows(r, obj))
            marks = _cpu_windows(store, r, steps, conv)  # the host's step began before its first launch
            if marks:
                host_start[r] = min(b for b, _ in marks.values())
        else:
            add_cpu_rank(buf, store, r, steps, conv, mem, sub_ids, obj)
            windows.update(_cpu_windows(store, r, steps, conv))
    g = buf.finish(dims)
    infer_stream_waits(g)
    g.inst_info = members.groupby("inst").agg(key=("key", "first"), pg_name=("pg_name", "first"),
                                             dim=("dim", "first"), op=("op", "first"),
                                             bytes=("bytes", "max"), n=("rank", "size"))
    io = {i: list(zip(x["rank"].tolist(), x["in_bytes"].tolist(), x["out_bytes"].tolist()))
          for i, x in members.groupby("inst")}  # per member: (rank, bytes sent, bytes received)
    g.inst_info["io"] = pd.Series(io, index=g.inst_info.index, dtype=object)
    attach_windows(g, windows, host_start)
    return g


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
    latest op of the rank's other streams that ended in that gap becomes its predecessor."""
    dev = np.flatnonzero(device_lane_mask(g) & (g.rank >= 0))
    if dev.size == 0:
        return
    end = g.start + g.dur
    ready = np.full(g.num_nodes, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(ready, g.dst, end[g.src])
    waiting = dev[(g.start[dev] > ready[dev]) & (ready[dev] > np.iinfo(np.int64).min)]
    if waiting.size == 0:
        return
    order = dev[np.lexsort((end[dev], g.rank[dev]))]
    key_r, key_e = g.rank[order].astype(np.int64), end[order]
    # per waiting op: the last device op of its rank ending at or before its start
    lo = np.searchsorted(key_r, g.rank[waiting], side="left")
    hi = np.searchsorted(key_r, g.rank[waiting], side="right")
    pos = np.empty(waiting.size, np.int64)
    for r in np.unique(g.rank[waiting]):  # one search per rank, vectorised over its ops
        m = g.rank[waiting] == r
        pos[m] = lo[m][0] + np.searchsorted(key_e[lo[m][0]:hi[m][0]], g.start[waiting[m]], side="right") - 1
    ok = pos >= lo
    u = order[np.maximum(pos, 0)]
    ok &= (end[u] > ready[waiting]) & (g.lane[u] != g.lane[waiting])
    g.src = np.r_[g.src, u[ok]]
    g.dst = np.r_[g.dst, waiting[ok]]
    g._plan = None
