"""One step's graph as a Chrome-trace / Perfetto JSON document, critical path marked.

Every node with time becomes a complete event (`ph: X`; process = rank, thread = lane, µs relative to
the step's start with ns kept as decimals); the critical path's nodes carry `args.critical_path = true`
and a red colour, and where the path leaves a lane (to a peer rank, a stream, a collective's sync) a flow
event pair (`ph: s` / `ph: f`) draws an arrow, so ui.perfetto.dev and chrome://tracing show the path
across ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tracekit.whatif.build import reported_step
from tracekit.whatif.graph import CATEGORY_NAMES, Category
from tracekit.whatif.replay import StepResult, step_span

PATH_COLOUR = "terrible"  # the trace viewers' red
SYNC_PID = -1


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def export_step(res: StepResult, path: np.ndarray) -> dict[str, Any]:
    g = res.graph
    t0, t1 = step_span(res)
    on_path = np.zeros(g.num_nodes, bool)
    on_path[path] = True
    events: list[dict[str, Any]] = []
    tid_of: dict[int, int] = {}
    for lane, name in enumerate(g.lane_names):
        rank = int(name.split()[1]) if name.startswith("rank ") and name.split()[1].lstrip("-").isdigit() else SYNC_PID
        tid_of[lane] = lane + 1
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": lane + 1, "args": {"name": name}})
    for r in np.unique(g.ranks).tolist():
        events.append({"ph": "M", "name": "process_name", "pid": int(r), "args": {"name": f"rank {int(r)}"}})
    events.append({"ph": "M", "name": "process_name", "pid": SYNC_PID, "args": {"name": "collective syncs"}})
    inside = (res.start + g.dur > t0) & (res.start < t1)
    show = np.flatnonzero(((g.dur > 0) & inside) | on_path)
    for v in show.tolist():
        pid, tid = _where(g, v, tid_of)
        ev = {"ph": "X", "name": (g.name[v] if g.name else "") or CATEGORY_NAMES[Category(int(g.category[v]))],
              "cat": CATEGORY_NAMES[Category(int(g.category[v]))], "pid": pid, "tid": tid,
              "ts": _us(int(res.start[v]) - t0), "dur": _us(int(g.dur[v])),
              "args": {"critical_path": bool(on_path[v]), "rank": int(g.rank[v])}}
        if on_path[v]:
            ev["cname"] = PATH_COLOUR
        events.append(ev)
    hops = [(u, v) for u, v in zip(path[:-1].tolist(), path[1:].tolist()) if _where(g, u, tid_of) != _where(g, v, tid_of)]
    for i, (u, v) in enumerate(hops):  # an arrow where the path leaves a lane (to a peer, a stream, a sync)
        pu, tu = _where(g, u, tid_of)
        pv, tv = _where(g, v, tid_of)
        events.append({"ph": "s", "id": i, "name": "critical path", "cat": "critical_path", "pid": pu, "tid": tu,
                       "ts": _us(int(res.start[u]) - t0), "cname": PATH_COLOUR})
        events.append({"ph": "f", "bp": "e", "id": i, "name": "critical path", "cat": "critical_path", "pid": pv,
                       "tid": tv, "ts": _us(int(res.start[v]) - t0), "cname": PATH_COLOUR})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "tracekit whatif", "step": reported_step(res.step), "measured_step_ns": res.measured_ns,
                          "step_start_ns": t0}}


def _where(g, v: int, tid_of: dict[int, int]) -> tuple[int, int]:
    lane = int(g.lane[v])
    if lane < 0:
        return (int(g.rank[v]) if g.rank[v] >= 0 else SYNC_PID), 0
    return int(g.rank[v]), tid_of[lane]
