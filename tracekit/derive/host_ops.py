"""Each GPU rank's host ops with their own time and whether they wait, and which of them ran far slower
than the same op elsewhere: the derived fact the `host_bound` analyzer measures and the what-if replay
(whatif/build.py) repairs. Definitions are in analyze/host_bound.py's docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.derive import intervals as iv
from tracekit.parse.dict_columns import object_strings, text_test
from tracekit.tables.columns import Columns, group_ids, group_median, sorted_codes, take
from tracekit.tables.store import RunStore

SLOW_FACTOR = 10
SLOW_MIN_NS = 500_000
"""A host op is slow when its own time is at least SLOW_FACTOR × the op's median and SLOW_MIN_NS more."""
HOST_CATS = ("cpu_op", "cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver")
RUNTIME_CATS = HOST_CATS[1:]
DEVICE_WAIT_WORDS = ("Synchronize",)
BLOCKING_MEMCPY = ("cudaMemcpy", "hipMemcpy", "cudaMemcpy2D", "hipMemcpy2D", "hipMemcpyWithStream")
"""Copies that return when the device finished them (HIP's hipMemcpyWithStream is PyTorch's blocking copy on
ROCm: `.item()`, `.cpu()`)."""
QUEUE_WAIT_MIN_NS = 50_000
"""A launch call at least this long (a launch costs a few µs) that returned within `QUEUE_RETURN_MAX_NS` of
a device op's end, the device busy with that op since before the call, waited for a launch-queue slot (when
the queue stays full, every launch does: no median of the rank's launches tells them apart)."""
QUEUE_RETURN_MAX_NS = 50_000
MODULE_KINDS = ("compute", "comm")
"""Device ops that run a kernel from a loaded module (`kernels.kind`; copies and memsets do not)."""


def last_ended_inside(ts: np.ndarray, end: np.ndarray, k_end: np.ndarray) -> np.ndarray:
    """Per call [ts, end]: index of the device op (by `k_end`) that ended last inside it, -1 if none."""
    by_end = np.argsort(k_end, kind="stable")
    hi = np.searchsorted(k_end[by_end], end, side="right") - 1
    j = by_end[np.maximum(hi, 0)] if by_end.size else np.zeros(ts.size, np.int64)
    return np.where((hi >= 0) & (k_end[j] >= ts), j, -1) if by_end.size else np.full(ts.size, -1, np.int64)


def queue_full_launches(ts: np.ndarray, end: np.ndarray, corr: np.ndarray, k_ts: np.ndarray, k_end: np.ndarray,
                        k_corr: np.ndarray, waited: np.ndarray) -> np.ndarray:
    """Per runtime call: a launch that blocked on a full launch queue (CUDA/HIP block a launch while the
    device holds its maximum of pending work), so it waited for the device: longer than any launch's own
    cost, busy device all along (the device op that ended last inside the call, `waited`, had started
    before the call) and returning right after that op ended. A host thread preempted inside a launch
    returns at no particular device event (and usually finds the device idle)."""
    ok = waited >= 0
    if not ok.any():
        return np.zeros(ts.size, bool)
    w = np.maximum(waited, 0)
    launches = np.isin(corr, k_corr) & (corr >= 0)
    return ok & launches & (end - ts >= QUEUE_WAIT_MIN_NS) & (k_ts[w] <= ts) & (end - k_end[w] <= QUEUE_RETURN_MAX_NS)


def own_op_waits(ts: np.ndarray, end: np.ndarray, corr: np.ndarray, k_end: np.ndarray, k_corr: np.ndarray
                 ) -> np.ndarray:
    """Per runtime call: a call that returned when the device op it launched (same correlation) ended: a
    copy that blocks the host (cudaMemcpyAsync from pageable memory), at least QUEUE_WAIT_MIN_NS long, its
    op ending inside it and at most QUEUE_RETURN_MAX_NS before it returned."""
    if k_end.size == 0 or ts.size == 0:
        return np.zeros(ts.size, bool)
    o = np.argsort(k_corr, kind="stable")
    j = o[np.clip(np.searchsorted(k_corr[o], corr), 0, o.size - 1)]
    own = (corr >= 0) & (k_corr[j] == corr)
    return own & (end - ts >= QUEUE_WAIT_MIN_NS) & (k_end[j] >= ts) & (k_end[j] <= end) & (end - k_end[j] <= QUEUE_RETURN_MAX_NS)


def self_time(tid: np.ndarray, ts: np.ndarray, end: np.ndarray, parent: np.ndarray | None = None) -> np.ndarray:
    """Each interval's own time (less its direct children's), rows sorted by (tid, ts, -end).

    A row's parent is the last earlier row of its thread still open at its start (`parents`, or `parent` where
    the caller found them); each row takes its overlap with its parent, min(its end, the parent's end) - its
    start, off the parent's time."""
    own = (end - ts).astype(np.int64)
    p = parents(tid, ts, end) if parent is None else parent
    child = np.flatnonzero(p >= 0)
    np.subtract.at(own, p[child], np.minimum(end[child], end[p[child]]) - ts[child])
    return np.maximum(own, 0)


def parents(tid: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per row (sorted by (tid, ts, -end)): the last earlier row of the same thread whose end lies past its start
    (its enclosing op on a call stack), -1 for none. Found for all rows at once by binary lifting over a sparse
    table of running maxima of the ends: from the row leftwards, skip each power-of-two block whose ends all lie
    at or before the row's start."""
    n = ts.size
    if n == 0:
        return np.zeros(0, np.int64)
    ts, end = ts.astype(np.int64), end.astype(np.int64)
    first = np.searchsorted(tid, tid, side="left")  # each row's thread's first row
    table = [end]  # table[k][j] = max(end[j : j + 2**k])
    while 2 ** len(table) <= n:
        prev, half = table[-1], 2 ** (len(table) - 1)
        table.append(np.maximum(prev[:-half], prev[half:]))
    pos = np.arange(n, dtype=np.int64)  # exclusive right end of the rows still to search
    for k in range(len(table) - 1, -1, -1):
        at = pos - 2 ** k
        ok = at >= first
        skip = ok & (table[k][np.maximum(at, 0)] <= ts)
        pos = np.where(skip, at, pos)
    p = pos - 1
    found = (p >= first) & (end[np.maximum(p, 0)] > ts)
    return np.where(found, p, -1)


def innermost_time(ops: Columns, parent: np.ndarray, spans: dict[int, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Per host op (`ops` sorted by (tid, ts, -end) as `host_ops` gives them, `parent` their `parents`): the part of its thread's `spans`
    (thread id -> disjoint interval set) during which it is the innermost op running on that thread (its own
    time there, not its children's). The spans are cut at every op boundary of the thread; each piece goes to
    the last op starting at or before it that is still open over it (ops nest on a thread)."""
    out = np.zeros(ops["ts"].size, np.int64)
    for t, (ws, we) in spans.items():
        a, b = int(np.searchsorted(ops["tid"], t, "left")), int(np.searchsorted(ops["tid"], t, "right"))
        if a == b or not ws.size:
            continue
        ts, end = ops["ts"][a:b], ops["end"][a:b]
        inside = lambda x: x[(x > ws[0]) & (x < we[-1])]  # noqa: E731  (boundaries outside the spans cut nothing)
        cuts = np.unique(np.concatenate([inside(ts), inside(end), ws, we]))
        lo, hi = cuts[:-1], cuts[1:]
        cov = iv.covered((ws, we), lo, hi)
        lo, cov = lo[cov > 0], cov[cov > 0]
        j = np.searchsorted(ts, lo, "right") - 1 + a
        j = np.where(j >= a, j, -1)
        while True:  # up the call stack to the op still open over the piece (a parent's index is smaller)
            closed = (j >= 0) & (ops["end"][np.maximum(j, 0)] <= lo)
            if not closed.any():
                break
            j = np.where(closed, parent[np.maximum(j, 0)], j)
        np.add.at(out, j[j >= 0], cov[j >= 0])
    return out


def launches_below(ops: Columns, parent: np.ndarray) -> np.ndarray:
    """Per host op (`ops` as `innermost_time` takes them): it is, or encloses, a runtime call that launched
    device work (a correlation id)."""
    below = np.zeros(ops["ts"].size, bool)
    j = np.flatnonzero(ops["runtime"] & (ops["corr"] >= 0))
    while j.size:
        j = j[~below[j]]  # an op already marked has its ancestors marked
        below[j] = True
        j = parent[j]
        j = j[j >= 0]
    return below


def device_ops(store: RunStore, rank: int) -> Columns | None:
    k = store.rank_table("kernels", rank, ["name", "kind", "ts", "dur", "correlation", "step"])
    k = k.filter(pc.is_valid(k["dur"]))
    if k.num_rows == 0:
        return None
    ts = k.column("ts").to_numpy().astype(np.int64)
    return {"ts": ts, "end": ts + k.column("dur").to_numpy().astype(np.int64),
            "corr": k.column("correlation").fill_null(-1).to_numpy().astype(np.int64),
            "step": k.column("step").fill_null(-1).to_numpy().astype(np.int64),
            "name": object_strings(k.column("name"), ""),
            "module": np.asarray(pc.fill_null(text_test(k.column("kind"), pc.is_in, pa.array(MODULE_KINDS)), False)
                                 .to_numpy(zero_copy_only=False), dtype=bool)}


def first_launches(kern: Columns) -> np.ndarray:
    """Correlation ids of the launches, in the rank's first step, of a kernel (by name) that the trace had not
    run before: CUDA and HIP load a kernel's module on its first launch (lazy loading, the default since CUDA
    11.7 / ROCm's deferred loading), so that launch can take milliseconds once — a warm-up cost, not a host
    that lost its core."""
    stepped = kern["step"] != -1  # -1: no step (a device-span step is SPAN_STEP, whatif/build.py)
    if not stepped.any():
        return np.zeros(0, np.int64)
    o = np.argsort(kern["ts"], kind="stable")
    o = o[kern["module"][o]]  # kernels (a copy or memset loads no module)
    _, first = np.unique(sorted_codes(kern["name"][o])[0], return_index=True)  # each name's first launch
    i = o[first]
    return kern["corr"][i[(kern["step"][i] == kern["step"][stepped].min()) & (kern["corr"][i] >= 0)]]


def host_ops(store: RunStore, rank: int, kern: Columns | None = None) -> Columns | None:
    """The rank's host ops and runtime calls (sorted by thread, start, longest first) with their own time
    and whether they wait (for the device or for peers); None on a rank without device work."""
    kern = device_ops(store, rank) if kern is None else kern
    if kern is None:
        return None
    t = store.rank_table("events", rank, ["name", "cat", "ts", "dur", "tid", "step", "role", "lane", "correlation"])
    cat, role, lane = (t.column(c) for c in ("cat", "role", "lane"))  # tested on their distinct values
    keep = pc.and_(pc.and_(text_test(cat, pc.is_in, pa.array(HOST_CATS)), text_test(lane, pc.equal, "host")),
                   pc.and_(pc.is_valid(t["dur"]), pc.invert(text_test(role, pc.is_in, pa.array(
                       ["step_annotation", "data_load", "overhead"])))))
    t = t.filter(pc.fill_null(keep, False))
    ts = t.column("ts").to_numpy().astype(np.int64)
    end = ts + t.column("dur").to_numpy().astype(np.int64)
    tid = t.column("tid").fill_null(-1).to_numpy().astype(np.int64)
    o = np.lexsort((-end, ts, tid))
    # text columns from their dictionary codes: a string per distinct value, not one per row
    cols = {"name": object_strings(t.column("name"), ""),
            "tid": tid, "ts": ts, "end": end, "step": t.column("step").fill_null(-1).to_numpy().astype(np.int64),
            "runtime": _bools(text_test(t.column("cat"), pc.is_in, pa.array(RUNTIME_CATS))),
            "comm": _bools(text_test(t.column("role"), pc.equal, "comm")),
            "corr": t.column("correlation").fill_null(-1).to_numpy().astype(np.int64)}
    cols = take(cols, o)
    cols["parent"] = parents(cols["tid"], cols["ts"], cols["end"])  # the call stacks (host_bound reads them too)
    cols["self_ns"] = self_time(cols["tid"], cols["ts"], cols["end"], cols["parent"])
    cols["waits"] = _waits(cols, kern)
    cols["first_launch"] = cols["runtime"] & np.isin(cols["corr"], first_launches(kern)) & (cols["corr"] >= 0)
    return cols


def _bools(col: pa.ChunkedArray) -> np.ndarray:
    """A boolean column as numpy, null as False."""
    return np.asarray(pc.fill_null(col, False).to_numpy(zero_copy_only=False), dtype=bool).reshape(-1)


def names_where(names: list[str], test) -> np.ndarray:
    """Per name: test(name), asked once per distinct name (a rank's few hundred op names repeat over its
    thousands of ops)."""
    seen = {n: bool(test(n)) for n in dict.fromkeys(names)}
    return np.fromiter(map(seen.__getitem__, names), bool, len(names))


def _waits(ops: Columns, kern: Columns) -> np.ndarray:
    """Per op: a call that waits (for the device: synchronize, blocking memcpy, a launch on a full queue;
    for peers: communication calls)."""
    sync = names_where(ops["name"].tolist(), lambda n: any(w in n for w in DEVICE_WAIT_WORDS) or n in BLOCKING_MEMCPY)
    waited = last_ended_inside(ops["ts"], ops["end"], kern["end"])
    queued = ops["runtime"] & queue_full_launches(ops["ts"], ops["end"], ops["corr"], kern["ts"], kern["end"],
                                                  kern["corr"], waited)
    own = ops["runtime"] & own_op_waits(ops["ts"], ops["end"], ops["corr"], kern["end"], kern["corr"])
    return sync | queued | own | ops["comm"]


def excess_ns(ops_by_rank: dict[int, Columns], *, first_launch: bool = False) -> dict[int, np.ndarray]:
    """Per rank, per host op: its own time beyond the median of the same op over every rank and step,
    where far beyond it (`SLOW_FACTOR`, `SLOW_MIN_NS`), the op does not wait and is no kernel's first launch
    (`first_launches`: a warm-up); else 0. `first_launch=True`: the same excess of the first launches only."""
    ranks = list(ops_by_rank)
    if not ranks:
        return {}
    names = np.concatenate([ops_by_rank[r]["name"] for r in ranks])
    own = np.concatenate([ops_by_rank[r]["self_ns"] for r in ranks])
    waits = np.concatenate([ops_by_rank[r]["waits"] for r in ranks])
    first = np.concatenate([ops_by_rank[r]["first_launch"] for r in ranks])
    code, n = group_ids(names)
    med = np.rint(group_median(code, n, own.astype(np.float64))).astype(np.int64)[code]
    slow = ~waits & (first == first_launch) & (own >= SLOW_FACTOR * med) & (own - med >= SLOW_MIN_NS)
    out = np.where(slow, own - med, 0)
    bounds = np.cumsum([0] + [ops_by_rank[r]["name"].size for r in ranks])
    return {r: out[bounds[i]:bounds[i + 1]] for i, r in enumerate(ranks)}


@dataclass
class OpSummary:
    """What the run-wide slow-op test needs of one rank's host ops (`host_ops`), kept while the other ranks
    are read: each op's name (as a code into the rank's distinct names) and own time, and the few ops that
    can be slow at all (not waiting, own time at least SLOW_MIN_NS: a median is never negative) with what
    the analyzer and the what-if build read of them. About 12 bytes per op instead of every op column."""

    names: np.ndarray
    """the rank's distinct op names (object array, sorted)"""
    code: np.ndarray
    """per op: index into `names` (int32)"""
    self_ns: np.ndarray
    """per op: own time"""
    cand: Columns
    """the ops that can be slow, in the rank's op order: SLOW_COLUMNS, name, self_ns, first_launch, code"""


def summarize_ops(ops: Columns) -> OpSummary:
    code, values = sorted_codes(ops["name"])  # np.unique's names and inverse, without sorting every row's text
    names = np.empty(len(values), dtype=object)
    names[:] = values
    keep = ~ops["waits"] & (ops["self_ns"] >= SLOW_MIN_NS)
    cand = {c: ops[c][keep] for c in (*SLOW_COLUMNS, "name", "self_ns", "first_launch")}
    cand["code"] = code.reshape(-1)[keep]
    return OpSummary(names=names, code=code.reshape(-1).astype(np.int32), self_ns=ops["self_ns"].copy(), cand=cand)


def name_medians(summaries: dict[int, OpSummary]) -> dict[int, np.ndarray]:
    """Per rank: for each of its distinct op names, the rounded median of that op's own time over every rank
    and step (`excess_ns`' median), computed from the summaries."""
    ranks = list(summaries)
    if not ranks:
        return {}
    glob, inv = np.unique(np.concatenate([summaries[r].names for r in ranks]), return_inverse=True)
    inv = inv.reshape(-1)
    off = np.cumsum([0] + [summaries[r].names.size for r in ranks])
    codes = np.concatenate([inv[off[i]:off[i + 1]][summaries[r].code] for i, r in enumerate(ranks)])
    own = np.concatenate([summaries[r].self_ns for r in ranks])
    med = np.rint(group_median(codes, glob.size, own.astype(np.float64))).astype(np.int64)
    return {r: med[inv[off[i]:off[i + 1]]] for i, r in enumerate(ranks)}


def candidate_excess(s: OpSummary, med: np.ndarray, *, first_launch: bool = False) -> np.ndarray:
    """`excess_ns` of the rank's candidate ops (`OpSummary.cand`; every other op's is 0), `med` its names'
    medians (`name_medians`)."""
    c = s.cand
    m = med[c["code"]]
    own = c["self_ns"]
    slow = (c["first_launch"] == first_launch) & (own >= SLOW_FACTOR * m) & (own - m >= SLOW_MIN_NS)
    return np.where(slow, own - m, 0)


SlowOps = dict[int, Columns]
"""Per GPU rank: its host ops with an excess (`excess_ns` > 0 over every GPU rank: a few of its thousands),
`SLOW_COLUMNS` and `excess`."""

SLOW_COLUMNS = ("tid", "ts", "end", "runtime", "step")


def slow_ops_from(summaries: dict[int, OpSummary], excess: dict[int, np.ndarray]) -> SlowOps:
    """`SlowOps` from the ranks' summaries and their candidates' excess (`candidate_excess`)."""
    slow = {}
    for r, x in excess.items():
        keep = x > 0
        slow[r] = {**{c: summaries[r].cand[c][keep] for c in SLOW_COLUMNS}, "excess": x[keep]}
    return slow


def _has_device_ops(store: RunStore, rank: int) -> bool:
    """device_ops(store, rank) is not None, from the durations alone."""
    dur = store.rank_table("kernels", rank, ["dur"]).column("dur")
    return len(dur) - dur.null_count > 0


def slow_ops_of(store: RunStore, ranks: list[int], found: SlowOps | None = None) -> SlowOps:
    """Per rank of `ranks` with host ops (a GPU rank): its ops with an excess (`excess_ns` > 0 over these
    ranks): `found` (the host_bound analyzer's, over every GPU rank) where it covers exactly these ranks, else
    derived now."""
    gpu = [r for r in ranks if _has_device_ops(store, r)]  # the ranks host_ops derives (device_ops not None)
    if found is not None and set(found) == set(gpu):
        return found
    summ = {r: summarize_ops(o) for r in gpu if (o := host_ops(store, r)) is not None}  # one rank's ops at a time
    med = name_medians(summ)
    return slow_ops_from(summ, {r: candidate_excess(sm, med[r]) for r, sm in summ.items()})
