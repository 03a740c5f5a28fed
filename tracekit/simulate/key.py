"""The answer key: exact per-rank, per-step breakdown from the simulator's own intervals.

Step window (GPU definition, DESIGN §3): the device work a `ProfilerStep#N` launched, from its first
kernel start to the next step's first kernel start (the last step: to its last kernel end). Breakdown,
exclusive by priority inside the window: compute kernels ▸ communication kernels overlapping no compute
(exposed comm) ▸ other device work (memcpy) ▸ idle.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tracekit.simulate.executor import COLL, KERNEL, Op

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
    def __init__(self, ops: list[Op]):
        s, e, c, st = device_intervals(ops)
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


def late_arrivals(colls) -> dict[tuple[Any, int], int]:
    """(instance key, rank) → how long the rank, arriving last, held its peers back (last arrival −
    second-last arrival), over every collective instance (P2P excluded) where the last arrived alone."""
    out: dict[tuple[Any, int], int] = {}
    for c in colls:
        if c.op == "sendrecv" or len(c.members) < 2:
            continue
        arr = sorted((t, r) for r, t in c.starts.items())
        (t2, _), (t1, r1) = arr[-2], arr[-1]
        if t1 > t2:
            out[(c.key, r1)] = t1 - t2
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
    step_ids = list(range(steps))
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
    ranks = []
    step_ns = [0] * steps
    for r, prog in enumerate(programs):
        iv = RankIntervals(prog)
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
    return {"step_ns": step_ns, "mean_step_ns": int(sum(step_ns) / max(1, steps)), "ranks": ranks}
