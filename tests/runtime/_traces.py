"""Plain-json readers of the runtime's outputs for the runtime tests (independent of tracekit.parse).

Times are integer ns from the trace text (json.loads with parse_float=Decimal, so nothing is rounded).
"Compute" on a CPU trace = union of `cpu_op` intervals on the rank's main thread minus the union of its
communication regions (`comm:*` labels of B2's Comm, `c10d::*` ops) — the same definition DESIGN §3 gives.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

Interval = tuple[int, int]


def load_trace(path: str | Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        return json.loads(fh.read(), parse_float=Decimal)


def ns(x: Any) -> int:
    return int(Decimal(x) * 1000)


def complete_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def main_tid(events: list[dict[str, Any]]) -> Any:
    """The training thread: the one with the most cpu_op events."""
    return Counter(e["tid"] for e in events if e.get("cat") == "cpu_op").most_common(1)[0][0]


def interval(e: dict[str, Any]) -> Interval:
    return ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])


def union(iv: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def total(iv: list[Interval]) -> int:
    return sum(b - a for a, b in union(iv))


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Parts of union(a) not covered by union(b)."""
    out: list[Interval] = []
    b = union(b)
    for s, e in union(a):
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < e:
            out.append((cur, e))
    return out


def intersect_total(a: list[Interval], b: list[Interval]) -> int:
    return total(a) - total(subtract(a, b))


def clip(iv: list[Interval], window: Interval) -> list[Interval]:
    lo, hi = window
    return [(max(a, lo), min(b, hi)) for a, b in iv if b > lo and a < hi]


def step_windows(events: list[dict[str, Any]]) -> list[Interval]:
    return sorted(interval(e) for e in events if e["name"].startswith("ProfilerStep#"))


def is_comm(e: dict[str, Any]) -> bool:
    n = e["name"]
    return n.startswith("comm:") or n.startswith("c10d::") or n.startswith("gloo:")


class RankTrace:
    """One rank's trace with the interval sets the tests need."""

    def __init__(self, path: str | Path) -> None:
        self.trace = load_trace(path)
        self.events = complete_events(self.trace)
        self.tid = main_tid(self.events)
        self.main = [e for e in self.events if e["tid"] == self.tid]
        self.windows = step_windows(self.events)

    def named(self, prefix: str, *, main_only: bool = True) -> list[dict[str, Any]]:
        src = self.main if main_only else self.events
        return [e for e in src if e["name"].startswith(prefix)]

    def compute_intervals(self) -> list[Interval]:
        ops = [interval(e) for e in self.main if e.get("cat") == "cpu_op" and not is_comm(e)]
        comm = [interval(e) for e in self.main if is_comm(e)]
        return subtract(ops, comm)

    def compute_ns(self) -> int:
        """Compute time inside the profiled steps."""
        comp = self.compute_intervals()
        return sum(total(clip(comp, w)) for w in self.windows)

    def label_ns(self, prefix: str) -> int:
        return sum(ns(e["dur"]) for e in self.named(prefix))

    def gloo_thread_intervals(self) -> list[Interval]:
        """Collective work on gloo's runloop threads (user annotations `gloo:*` off the main thread)."""
        return [interval(e) for e in self.events if e["tid"] != self.tid and e["name"].startswith("gloo:")]


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def robust_op_ns(t: "RankTrace", name: str) -> int:
    """Time in ops `name` on the main thread, preemption-robust: per distinct input shape, the median
    duration times the count (a 2-core box shared by many processes stretches a few ops arbitrarily)."""
    by_shape: dict[str, list[int]] = {}
    for e in t.named(name):
        if e["name"] == name:
            by_shape.setdefault(json.dumps(e.get("args", {}).get("Input Dims"), default=str), []).append(ns(e["dur"]))
    return int(sum(sorted(d)[len(d) // 2] * len(d) for d in by_shape.values()))


def robust_compute_ns(t: "RankTrace") -> int:
    """Compute time robust to preemption: each cpu_op's self time (its duration minus its cpu_op children),
    summed as median x count per (op name, input dims). On a box shared by many processes a few op
    instances are stretched arbitrarily; medians ignore them. Comm ops excluded; profiled steps only."""
    ops = sorted((interval(e) + (e,) for e in t.main if e.get("cat") == "cpu_op"
                  and any(w[0] <= interval(e)[0] < w[1] for w in t.windows)), key=lambda x: (x[0], -x[1]))
    self_ns: list[tuple[str, int]] = []
    stack: list[list] = []          # [end, name-key, dur, children]
    def close(item):
        self_ns.append((item[1], item[2] - item[3]))
    for start, end, e in ops:
        while stack and stack[-1][0] <= start:
            close(stack.pop())
        if stack:
            stack[-1][3] += end - start
        key = "" if is_comm(e) else e["name"] + json.dumps(e.get("args", {}).get("Input Dims"), default=str)
        stack.append([end, key, end - start, 0])
    while stack:
        close(stack.pop())
    groups: dict[str, list[int]] = {}
    for key, d in self_ns:
        if key:
            groups.setdefault(key, []).append(d)
    return int(sum(sorted(v)[len(v) // 2] * len(v) for v in groups.values()))
