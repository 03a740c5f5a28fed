"""Pipelines inferred from the point-to-point graph alone: no group names, no labels (DESIGN §3).

A pipeline is a chain of ranks r0, r1, … r(p−1) where every neighbouring pair exchanges messages both
ways — activations r(i) → r(i+1) in the forward pass, gradients r(i+1) → r(i) in the backward — and
the upstream rank of each link talks first (its first p2p op with the peer in a step is a send, the
downstream rank's first is a receive). Rank lists come from the `collectives` table's send/recv rows
and their `peer` column, on any process group, the default group included.

- Interleaved (virtual-stage) schedules close the chain into a ring: the last rank also sends to the
  first, (v−1)·m times a step against v·m on every other link, which gives v. A ring whose links all
  carry the same traffic (ring attention, halo exchange) is not a pipeline.
- Micro-batches per step m = sends from stage 0 to stage 1 per step / v (median over steps).
- Schedule, from the order of the sends and receives: at each stage a forward is marked by the
  activation it sends on (or, on the last stage, the activation it received) and a backward by the
  gradient it received (on stage 0) or sent on. The most forwards a stage holds before their
  backwards ("in flight") is m on every stage under GPipe and min(m, p−s) under 1F1B (the orders
  torch.distributed.pipelining's ScheduleGPipe / Schedule1F1B produce); the schedule whose vector is
  closer wins (GPipe on a tie: with m = 1 the two are the same schedule).

Send times are the communication's start (device kernel start on GPU traces: after the compute it
waits for; the op start on CPU), receive times its end (the data has arrived).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.tables.columns import python_values
from tracekit.tables.store import RunStore

P2P_OPS = ("send", "recv")


@dataclass(frozen=True)
class P2POp:
    """One send or receive of one rank, times on the rank's own clock."""

    rank: int
    op: str
    peer: int
    start: int
    end: int
    step: int | None


@dataclass
class InferredPipeline:
    ranks: list[int]
    """Rank of each stage, stage 0 first (for interleaved schedules: of each rank's first chunk)."""
    microbatches: int | None
    chunks: int
    schedule: str | None
    in_flight: list[int] = field(default_factory=list)
    """Most forwards each stage held before their backwards (the schedule's evidence)."""
    evidence: dict[str, Any] = field(default_factory=dict)


def load_p2p(store: RunStore) -> dict[int, list[P2POp]]:
    """Send/recv rows per rank, in issue order. Per rank the trace's own rows (source kineto) are used
    when present — they carry the timing — with peers they lack taken, in order, from a collective
    log's rows of the same op and step; otherwise the log's rows. Column-wise: a rank's rows are chosen
    by index and only the kept ones become objects (a 10,000-rank run's logs hold ~1.8 M of them); a rank
    whose trace rows lack peers its log has goes through `_fill_peers` row by row."""
    cols = ["rank", "source", "op", "peer", "ts", "dur", "enqueue_ts", "enqueue_dur", "step"]
    t = store.table("collectives", cols)
    t = t.filter(pc.fill_null(pc.is_in(t["op"], pa.array(P2P_OPS)), False))
    rank = t["rank"].to_numpy(zero_copy_only=False).astype(np.int64)
    peer_ok = pc.is_valid(t["peer"]).to_numpy(zero_copy_only=False)
    # per (rank, source) its rows in table order, the sources of a rank in the order of their first row
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for i, (r, src) in enumerate(zip(rank.tolist(), python_values(t["source"]))):
        groups[(r, src or "kineto")].append(i)
    sources: dict[int, list[str]] = defaultdict(list)
    for r, src in groups:
        sources[r].append(src)
    chosen, filled = [], {}
    for r in sorted(sources):
        rows = groups.get((r, "kineto"))
        logs = [groups[(r, s)] for s in sources[r] if s != "kineto"]
        log = max(logs, key=len) if logs else []
        if rows is None:
            rows, log = log, []
        if log and not peer_ok[rows].all():
            filled[r] = _fill_peers_rows(t, rows, log)
        else:
            chosen.append(np.asarray(rows, np.int64))
    return _p2p_ops(t, np.concatenate(chosen) if chosen else np.zeros(0, np.int64), rank, filled)


def _p2p_ops(t: pa.Table, idx: np.ndarray, rank: np.ndarray, filled: dict[int, list[P2POp]]
             ) -> dict[int, list[P2POp]]:
    """`_p2p_op` of the rows `idx` (grouped by rank, ascending), each rank's ops sorted by start (stably),
    merged with the ranks `filled` holds, in rank order."""
    def col(name: str) -> tuple[np.ndarray, np.ndarray]:
        c = t[name].take(pa.array(idx))
        return pc.fill_null(c, 0).to_numpy(zero_copy_only=False).astype(np.int64), \
            pc.is_valid(c).to_numpy(zero_copy_only=False)
    (peer, has_peer), (ts, has_ts), (dur, has_dur) = col("peer"), col("ts"), col("dur")
    (ets, has_ets), (edur, has_edur) = col("enqueue_ts"), col("enqueue_dur")
    r = rank[idx]
    start = np.where(has_ts, ts, ets)
    d = np.where(has_ts, np.where(has_dur, dur, 0), np.where(has_edur, edur, 0))
    keep = has_peer & (peer != r) & (has_ts | has_ets)
    keep_at = np.flatnonzero(keep)
    keep_at = keep_at[np.lexsort((start[keep_at], r[keep_at]))]  # by rank, then start; ties in row order
    end = start + np.maximum(d, 0)
    ops, steps = python_values(t["op"].take(pa.array(idx[keep_at]))), python_values(t["step"].take(pa.array(idx[keep_at])))
    made = [P2POp(rank=a, op=o, peer=b, start=c, end=e, step=s) for a, o, b, c, e, s in zip(
        r[keep_at].tolist(), ops, peer[keep_at].tolist(), start[keep_at].tolist(), end[keep_at].tolist(), steps)]
    out: dict[int, list[P2POp]] = {}
    ranks = r[keep_at]
    bounds = np.flatnonzero(np.r_[True, ranks[1:] != ranks[:-1], True]) if ranks.size else np.zeros(1, np.int64)
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        out[int(ranks[a])] = made[a:b]
    for rk in np.unique(r).tolist():  # a rank whose rows all fell out keeps an empty list
        out.setdefault(rk, [])
    out.update(filled)
    return dict(sorted(out.items()))


def _fill_peers_rows(t: pa.Table, rows: list[int], log: list[int]) -> list[P2POp]:
    """One rank's ops the row-by-row way: its trace rows with peers filled from its log's (`_fill_peers`)."""
    mine, theirs = t.take(pa.array(rows)).to_pylist(), t.take(pa.array(log)).to_pylist()
    _fill_peers(mine, theirs)
    return sorted((op for op in (_p2p_op(x) for x in mine) if op is not None), key=lambda o: o.start)


def _fill_peers(rows: list[dict[str, Any]], log: list[dict[str, Any]]) -> None:
    """Peers missing from trace rows, from the log's rows of the same (step, op) when both list as many."""
    if not log or all(r["peer"] is not None for r in rows):
        return
    key = lambda r: (r["step"], r["op"])  # noqa: E731
    mine: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    theirs: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(rows, key=_issue_time):
        mine[key(r)].append(r)
    for r in sorted(log, key=_issue_time):
        theirs[key(r)].append(r)
    for k, lst in mine.items():
        other = theirs.get(k, [])
        if len(other) == len(lst):
            for a, b in zip(lst, other):
                if a["peer"] is None:
                    a["peer"] = b["peer"]


def _issue_time(r: dict[str, Any]) -> int:
    t = r["enqueue_ts"] if r["enqueue_ts"] is not None else r["ts"]
    return t if t is not None else 0


def _p2p_op(r: dict[str, Any]) -> P2POp | None:
    if r["peer"] is None or r["peer"] == r["rank"]:
        return None
    start = r["ts"] if r["ts"] is not None else r["enqueue_ts"]
    if start is None:
        return None
    dur = r["dur"] if r["ts"] is not None else r["enqueue_dur"]
    return P2POp(rank=r["rank"], op=r["op"], peer=int(r["peer"]), start=int(start),
                 end=int(start + max(dur or 0, 0)), step=r["step"])


def send_counts(p2p: dict[int, list[P2POp]]) -> Counter:
    """Messages per directed (src, dst) pair: the larger of what the sender and the receiver recorded."""
    sent: Counter = Counter()
    received: Counter = Counter()
    for rank, ops in p2p.items():
        for o in ops:
            if o.op == "send":
                sent[(rank, o.peer)] += 1
            else:
                received[(o.peer, rank)] += 1
    return Counter({k: max(sent[k], received[k]) for k in set(sent) | set(received)})


def _components(counts: Counter) -> list[tuple[set[int], set[frozenset[int]]]]:
    """Connected components of the graph of rank pairs that exchange messages both ways."""
    links = {frozenset(k) for k in counts if counts.get((k[1], k[0]), 0) > 0 and k[0] != k[1]}
    adj: dict[int, set[int]] = defaultdict(set)
    for ln in links:
        a, b = tuple(ln)
        adj[a].add(b)
        adj[b].add(a)
    seen: set[int] = set()
    comps = []
    for start in sorted(adj):
        if start in seen:
            continue
        stack, nodes = [start], set()
        while stack:
            n = stack.pop()
            if n not in nodes:
                nodes.add(n)
                stack.extend(adj[n] - nodes)
        seen |= nodes
        comps.append((nodes, {ln for ln in links if ln <= nodes}))
    return comps


def _walk(nodes: set[int], links: set[frozenset[int]], start: int) -> list[int]:
    """The ranks of a path (or a ring opened before `start`) in order from `start`."""
    order, prev = [start], None
    while len(order) < len(nodes):
        nxt = [n for ln in links if order[-1] in ln for n in ln if n != order[-1] and n != prev]
        nxt = [n for n in nxt if n not in order]
        if not nxt:
            break
        prev = order[-1]
        order.append(nxt[0])
    return order


def _upstream_votes(p2p: dict[int, list[P2POp]], a: int, b: int) -> int:
    """> 0 when a is upstream of b: per step, a's first op with b is a send, b's first op with a a recv."""
    votes = 0
    for me, peer, first_if_up in ((a, b, "send"), (b, a, "recv")):
        firsts: dict[Any, str] = {}
        for o in p2p.get(me, ()):
            if o.peer == peer and o.step not in firsts:
                firsts[o.step] = o.op
        votes += sum(1 if op == first_if_up else -1 for op in firsts.values())
    return votes


def _orient(p2p: dict[int, list[P2POp]], order: list[int]) -> list[int] | None:
    """`order` or its reverse, whichever every link's upstream rank agrees with; None when they disagree."""
    signs = {int(np.sign(_upstream_votes(p2p, x, y))) for x, y in zip(order, order[1:])}
    if signs == {1}:
        return order
    if signs == {-1}:
        return order[::-1]
    return None


def _chain(p2p: dict[int, list[P2POp]], counts: Counter, nodes: set[int],
           links: set[frozenset[int]]) -> tuple[list[int], int] | None:
    """(stage order, chunks per rank) of one component, or None when it is not a pipeline."""
    degree = Counter(n for ln in links for n in ln)
    if max(degree.values()) > 2 or len(nodes) < 2:
        return None
    if len(links) == len(nodes) - 1:  # a path
        end = min(n for n in nodes if degree[n] == 1)
        order = _orient(p2p, _walk(nodes, links, end))
        return (order, 1) if order else None
    if len(links) != len(nodes) or len(nodes) < 3:
        return None
    # a ring: the wrap link (last → first) carries (v−1)·m messages a direction, the others v·m
    traffic = {ln: sum(counts.get((x, y), 0) for x in ln for y in ln if x != y) for ln in links}
    wrap = min(traffic, key=traffic.get)
    if sorted(traffic.values())[1] == traffic[wrap]:
        return None
    x, y = tuple(wrap)
    opened = links - {wrap}
    order = _orient(p2p, _walk(nodes, opened, x))
    if order is None:
        return None
    fwd = counts.get((order[0], order[1]), 0)
    back = counts.get((order[-1], order[0]), 0)
    if fwd <= back:
        return None
    return order, max(1, round(fwd / (fwd - back)))


def _microbatches(p2p: dict[int, list[P2POp]], first: int, second: int, v: int) -> int | None:
    per_step = Counter(o.step for o in p2p.get(first, ()) if o.op == "send" and o.peer == second
                       and o.step is not None)
    if not per_step:
        per_step = Counter(o.step for o in p2p.get(second, ()) if o.op == "recv" and o.peer == first
                           and o.step is not None)
    if not per_step:
        return None
    return max(1, int(np.median(list(per_step.values()))) // v)


def _stage_markers(p2p: dict[int, list[P2POp]], ranks: list[int], s: int) -> dict[Any, list[tuple[int, str]]]:
    """(time, "F"|"B") per step at stage s: forwards and backwards as its sends and receives show them."""
    me = ranks[s]
    nxt = ranks[s + 1] if s + 1 < len(ranks) else None
    prev = ranks[s - 1] if s > 0 else None
    out: dict[Any, list[tuple[int, str]]] = defaultdict(list)
    for o in p2p.get(me, ()):
        if nxt is not None and o.peer == nxt:
            out[o.step].append((o.start, "F") if o.op == "send" else (o.end, "B"))
        elif nxt is None and o.peer == prev:
            out[o.step].append((o.end, "F") if o.op == "recv" else (o.start, "B"))
    return out


def in_flight(markers: list[tuple[int, str]]) -> int:
    """Most forwards outstanding (forwards seen minus backwards seen) along the markers in time order."""
    held = best = 0
    for _, kind in sorted(markers, key=lambda x: (x[0], x[1] == "F")):
        held += 1 if kind == "F" else -1
        best = max(best, held)
    return best


def expected_in_flight(schedule: str, p: int, m: int) -> list[int]:
    """Forwards in flight per stage: m under GPipe, min(m, p − s) under 1F1B."""
    if schedule == "gpipe":
        return [m] * p
    return [min(m, p - s) for s in range(p)]


def _schedule(p2p: dict[int, list[P2POp]], ranks: list[int], m: int | None, v: int) -> tuple[str | None, list[int]]:
    if v > 1:
        return "interleaved", []
    p = len(ranks)
    seen = []
    for s in range(p):
        per_step = [in_flight(mk) for mk in _stage_markers(p2p, ranks, s).values() if mk]
        seen.append(int(np.median(per_step)) if per_step else 0)
    if not m:
        return None, seen
    dist = {name: sum(abs(a - b) for a, b in zip(seen, expected_in_flight(name, p, m)))
            for name in ("gpipe", "1f1b")}
    return ("1f1b" if dist["1f1b"] < dist["gpipe"] else "gpipe"), seen


def infer_pipelines(p2p: dict[int, list[P2POp]]) -> list[InferredPipeline]:
    """Every pipeline the p2p graph shows, longest chains first (data-parallel replicas: one each)."""
    counts = send_counts(p2p)
    found = []
    for nodes, links in _components(counts):
        chain = _chain(p2p, counts, nodes, links)
        if chain is None:
            continue
        order, v = chain
        m = _microbatches(p2p, order[0], order[1], v)
        schedule, seen = _schedule(p2p, order, m, v)
        found.append(InferredPipeline(ranks=order, microbatches=m, chunks=v, schedule=schedule, in_flight=seen,
                                      evidence={"sends_per_link": [counts.get((a, b), 0)
                                                                   for a, b in zip(order, order[1:])]}))
    if not found:
        return []
    p = Counter(len(x.ranks) for x in found).most_common(1)[0][0]
    return sorted((x for x in found if len(x.ranks) == p), key=lambda x: x.ranks[0])
