"""The answer key: exact per-rank, per-step breakdown from the simulator's own intervals.

Step window (GPU definition, DESIGN §3): the device work a `ProfilerStep#N` launched, from its first
kernel start to the next step's first kernel start (the last step: to its last kernel end). Breakdown,
exclusive by priority inside the window: compute kernels ▸ communication kernels overlapping no compute
(exposed comm) ▸ other device work (memcpy) ▸ idle.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tracekit.simulate.executor import COLL, KERNEL, MEMORY, Op

ANSWER_KEY_FILE = ".ground_truth.json"
"""Where the writer puts the answer key: a hidden file, which trace discovery never reads."""

COMPUTE, COMM, OTHER = 0, 1, 2


def device_intervals(ops: list[Op]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, class, step) of every device op of one rank, int64 ns."""
    rows = [(o.d0, o.d1, COMM if o.kind == COLL else (OTHER if o.cat == "gpu_memcpy" else COMPUTE), o.step)
            for o in ops if o.kind == KERNEL or o.kind == COLL]
    a = np.array(rows, dtype=np.int64).reshape(-1, 4)
    return a[:, 0], a[:, 1], a[:, 2], a[:, 3]


def merge(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted union of intervals."""
    if len(s) == 0:
        return s, e
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    run = np.maximum.accumulate(e)
    brk = np.ones(len(s), bool)
    brk[1:] = s[1:] > run[:-1]
    idx = np.flatnonzero(brk)
    ends = np.append(run[idx[1:] - 1], run[-1])
    return s[idx], ends


def covered(ms: np.ndarray, me: np.ndarray, lo: int, hi: int) -> int:
    """Length of a merged union inside [lo, hi)."""
    if hi <= lo or len(ms) == 0:
        return 0
    return int(np.clip(np.minimum(me, hi) - np.maximum(ms, lo), 0, None).sum())


class RankIntervals:
    def __init__(self, ops: list[Op] | None = None, arrays: tuple | None = None):
        """From one rank's ops, or from `arrays` (start, end, class, step) as `KeyStream` keeps them."""
        s, e, c, st = device_intervals(ops) if arrays is None else arrays
        self.start, self.end, self.cls, self.step = s, e, c, st
        comp = c == COMPUTE
        self.comp = merge(s[comp], e[comp])
        cc = c != OTHER
        self.comp_comm = merge(s[cc], e[cc])
        self.all = merge(s, e)

    def breakdown(self, lo: int, hi: int) -> dict[str, int]:
        comp = covered(*self.comp, lo, hi)
        cc = covered(*self.comp_comm, lo, hi)
        busy = covered(*self.all, lo, hi)
        return {"window_ns": hi - lo, "compute_ns": comp, "exposed_comm_ns": cc - comp, "other_ns": busy - cc,
                "idle_ns": (hi - lo) - busy}

    def windows(self, steps: list[int]) -> list[tuple[int, int]]:
        firsts = []
        for s in steps:
            m = self.step == s
            firsts.append((int(self.start[m].min()), int(self.end[m].max())))
        out = []
        for i, (lo, last_end) in enumerate(firsts):
            hi = firsts[i + 1][0] if i + 1 < len(firsts) else last_end
            out.append((lo, hi))
        return out


def late_arrival(c) -> tuple[int, int] | None:
    """(rank, ns) of a collective instance's lone last arrival: how long it held its peers back (last
    arrival − second-last); None for P2P, single-member instances and ties."""
    if c.op == "sendrecv" or len(c.members) < 2:
        return None
    arr = sorted((t, r) for r, t in c.starts.items())
    (t2, _), (t1, r1) = arr[-2], arr[-1]
    return (r1, t1 - t2) if t1 > t2 else None


def late_arrivals(colls) -> dict[tuple[Any, int], int]:
    """(instance key, rank) → how long the rank, arriving last, held its peers back (last arrival −
    second-last arrival), over every collective instance (P2P excluded) where the last arrived alone."""
    out: dict[tuple[Any, int], int] = {}
    for c in colls:
        got = late_arrival(c)
        if got is not None:
            out[(c.key, got[0])] = got[1]
    return out


def delays(colls, rank_step: dict) -> dict[tuple[int, int], int]:
    """(rank, step) → time the rank held its peers back: over every collective instance (P2P excluded)
    where it arrived last, last arrival − second-last arrival."""
    out: dict[tuple[int, int], int] = {}
    for (key, r1), d in late_arrivals(colls).items():
        k = (r1, rank_step.get((key, r1), 0))
        out[k] = out.get(k, 0) + d
    return out


def answer_key(programs: list[list[Op]], colls, steps: int) -> dict[str, Any]:
    held = late_arrivals(colls)
    # the step of the late arrivals only (a dict of every member's step: 11 M entries at 10,000 ranks)
    rank_step = {}
    if held:
        for r, prog in enumerate(programs):
            for o in prog:
                if o.kind == COLL and (o.coll.key, r) in held and o.coll.op != "sendrecv":
                    rank_step[(o.coll.key, r)] = o.step
    late: dict[tuple[int, int], int] = {}
    for (key, r1), d in held.items():
        k = (r1, rank_step.get((key, r1), 0))
        late[k] = late.get(k, 0) + d
    return _key_rows(lambda r: RankIntervals(programs[r]), late, len(programs), steps)


def _key_rows(intervals_of, late: dict[tuple[int, int], int], world: int, steps: int, done=None) -> dict[str, Any]:
    step_ids = list(range(steps))
    ranks = []
    step_ns = [0] * steps
    for r in range(world):
        iv = intervals_of(r)
        rows = []
        for s, (lo, hi) in zip(step_ids, iv.windows(step_ids)):
            b = iv.breakdown(lo, hi)
            b.update(step=s, ts=lo, delay_caused_ns=late.get((r, s), 0))
            b["bubble"] = (b["idle_ns"] + b["exposed_comm_ns"]) / b["window_ns"] if b["window_ns"] else 0.0
            rows.append(b)
            step_ns[s] = max(step_ns[s], hi - lo)
        tot = {k: sum(x[k] for x in rows) for k in ("window_ns", "compute_ns", "exposed_comm_ns", "other_ns",
                                                       "idle_ns", "delay_caused_ns")}
        ranks.append({"rank": r, "steps": rows, "total": tot})
        if done is not None:
            done(r)
    return {"step_ns": step_ns, "mean_step_ns": int(sum(step_ns) / max(1, steps)), "ranks": ranks}


class KeyStream:
    """The answer key of a streamed run (`executor.run(retire=...)`), from each rank's finished ops as they
    retire: per rank its device intervals as compact arrays (what `RankIntervals` reads), the late arrivals
    it caused (per step) and its peak allocated memory; `answer_key_streamed` gives the same key as
    `answer_key` on the whole programs. With `delays=False` (the step time only, as `answer_key(progs, ())`)
    late arrivals are not summed."""

    def __init__(self, ranks: int, delays: bool = True) -> None:
        from array import array

        self.start = [array("q") for _ in range(ranks)]
        self.end = [array("q") for _ in range(ranks)]
        self.cls = [array("b") for _ in range(ranks)]
        self.step = [array("h") for _ in range(ranks)]
        self.peak_memory = [0] * ranks
        self.late: dict[tuple[int, int], int] = {}
        self.delays = delays

    def add(self, r: int, ops: list[Op]) -> None:
        s, e, c, st = self.start[r], self.end[r], self.cls[r], self.step[r]
        peak = self.peak_memory[r]
        for o in ops:
            k = o.kind
            if k == KERNEL or k == COLL:
                s.append(o.d0)
                e.append(o.d1)
                c.append(COMM if k == COLL else (OTHER if o.cat == "gpu_memcpy" else COMPUTE))
                st.append(o.step)
                if k == COLL and self.delays:
                    co = o.coll
                    if co.late is None:
                        co.late = late_arrival(co) or ()
                    if co.late and co.late[0] == r:
                        key = (r, o.step)
                        self.late[key] = self.late.get(key, 0) + co.late[1]
            elif k == MEMORY and o.extra[1] > peak:
                peak = o.extra[1]
        self.peak_memory[r] = peak

    def intervals(self, r: int) -> RankIntervals:
        arrays = (np.asarray(self.start[r], dtype=np.int64), np.asarray(self.end[r], dtype=np.int64),
                  np.asarray(self.cls[r], dtype=np.int64), np.asarray(self.step[r], dtype=np.int64))
        return RankIntervals(arrays=arrays)

    def free(self, r: int) -> None:
        from array import array

        self.start[r], self.end[r], self.cls[r], self.step[r] = array("q"), array("q"), array("b"), array("h")


def answer_key_streamed(ks: KeyStream, steps: int, keep: set[int] | frozenset[int] = frozenset()) -> dict[str, Any]:
    """`answer_key` of a streamed run; each rank's intervals are freed once read, but those in `keep`."""
    return _key_rows(ks.intervals, ks.late, len(ks.start), steps, lambda r: r in keep or ks.free(r))
