"""Where a step-time change came from: the base run's dependency graph replayed with the new run's
durations, one cause at a time (docs/metrics.md §9, "explained diff").

Causes (players):
 - `compute:<family>`: compute nodes of one op family (gemm, attention, norm, optimizer, other),
 - `comm:<dim>`: the transfer time of one dim's collectives / P2P ops,
 - `host`: host work between launches, host and data stalls, and the gaps the graph cannot explain,
 - `other_device`: memcpy / memset / other device work,
 - `schedule`: what changed in the graph's shape rather than in its durations (more or fewer
   micro-batches, ops or collectives: the pipeline bubble that comes with them).
Waiting for a peer is no cause of its own: the replay makes the peers wait, so a rank's slower compute
carries the waiting it causes.

A cause's new durations are mapped onto the base graph per rank: every base node of that (rank, cause)
is scaled by (its total per step in the new run) / (its total per step in the base run). The value of a
set S of causes is the replayed step time (slowest rank, mean over the graph's steps) with the causes in S
at the new durations. Each cause's part is its Shapley value (exact over all subsets up to
EXACT_PLAYERS causes, else the mean over the forward, reverse and seeded random orders of sequential
substitution), so the duration parts sum exactly to v(all) − v(none); `schedule` = replayed new −
v(all). The parts then sum exactly to replayed new − replayed base, and the replay of an unchanged graph
gives back its measured step, so the residual against the measured change is what the replay does not
reproduce (reported, never hidden).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.whatif.graph import Category, StepGraph, rank_step_ns, replay

ATTRIBUTION_SCHEMA = "tracekit.diff.attribution/1"
EXACT_PLAYERS = 7
"""Up to this many causes with a change: exact Shapley values (2^n replays); above: sampled orders."""
SAMPLED_ORDERS = 24
FAMILIES = (("gemm", re.compile(r"gemm|matmul|\bmm\b|aten::mm|addmm|bmm|linear|cutlass|xmma|cublas|sgemm", re.I)),
            ("attention", re.compile(r"attn|attention|softmax|flash|sdpa|fmha", re.I)),
            ("norm", re.compile(r"norm", re.I)),
            ("optimizer", re.compile(r"optim|adam|sgd|multi_tensor|foreach", re.I)))
SCHEDULE = "schedule"


def op_family(name: str) -> str:
    """The op family of a compute node's name (kernel or CPU op): gemm, attention, norm, optimizer, other."""
    return next((fam for fam, rx in FAMILIES if rx.search(name)), "other")


def node_causes(g: StepGraph) -> np.ndarray:
    """Per node: its cause label ('' for zero-length marks and waits, which carry no duration)."""
    out = np.full(g.num_nodes, "", dtype=object)
    cat = g.category
    comp = np.flatnonzero(cat == Category.COMPUTE)
    names = g.name if len(g.name) == g.num_nodes else [""] * g.num_nodes
    out[comp] = ["compute:" + op_family(names[i]) for i in comp.tolist()]
    xfer = np.flatnonzero(cat == Category.TRANSFER)
    dims = np.array(list(g.dims) + ["unknown"], dtype=object)
    out[xfer] = ["comm:" + str(d) for d in dims[np.where(g.dim[xfer] >= 0, g.dim[xfer], len(g.dims))]]
    out[(cat == Category.HOST) | (cat == Category.STALL)] = "host"
    out[cat == Category.OTHER] = "other_device"
    return out


@dataclass
class _Side:
    """One run's graph with its per-(cause, rank) duration and per-rank gap totals per step."""

    g: StepGraph
    causes: np.ndarray
    nsteps: int
    totals: dict[tuple[str, int], float]
    gaps: dict[int, float]


def _side(g: StepGraph) -> _Side:
    causes = node_causes(g)
    nsteps = max(1, int(np.unique(g.win_step).size))
    totals: dict[tuple[str, int], float] = {}
    for c, r, d in zip(causes.tolist(), g.rank.tolist(), g.dur.tolist()):
        if c:
            totals[(c, r)] = totals.get((c, r), 0.0) + d / nsteps
    gaps: dict[int, float] = {}
    for r, gp in zip(g.rank.tolist(), g.gap.tolist()):
        if r >= 0:
            gaps[r] = gaps.get(r, 0.0) + gp / nsteps
    return _Side(g=g, causes=causes, nsteps=nsteps, totals=totals, gaps=gaps)


def step_value(g: StepGraph, dur: np.ndarray | None = None, gap: np.ndarray | None = None) -> float:
    """The replayed step time (slowest rank of each step, mean over the graph's steps)."""
    dur = g.dur if dur is None else dur
    gap = g.gap if gap is None else gap
    times = rank_step_ns(g, replay(g, dur, gap), dur, gap)
    return float(np.mean([times[g.win_step == s].max() for s in np.unique(g.win_step)]))


def measured_value(g: StepGraph) -> float:
    """The measured step time by the same rule (slowest rank of each step, mean over steps)."""
    from tracekit.whatif.graph import measured_step_ns

    meas = measured_step_ns(g)
    return float(np.mean([meas[g.win_step == s].max() for s in np.unique(g.win_step)]))


def _scales(base: _Side, new: _Side) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """Per cause: the base graph's durations with that cause at the new run's (and the gaps, for host)."""
    g = base.g
    out: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for cause in sorted({c for c, _ in base.totals} | {c for c, _ in new.totals}):
        factor = np.ones(g.num_nodes)
        for (c, r), tot in base.totals.items():
            if c == cause and tot > 0 and (c, r) in new.totals:
                factor[(base.causes == c) & (g.rank == r)] = new.totals[(c, r)] / tot
        gap_factor = None
        if cause == "host":
            gap_factor = np.ones(g.num_nodes)
            for r, tot in base.gaps.items():
                if tot > 0 and r in new.gaps:
                    gap_factor[g.rank == r] = new.gaps[r] / tot
        if np.any(factor != 1.0) or (gap_factor is not None and np.any(gap_factor != 1.0)):
            out[cause] = (factor, gap_factor)
    return out


def _subset_value(g: StepGraph, scales: dict[str, tuple[np.ndarray, np.ndarray | None]], subset: frozenset[str],
                  cache: dict[frozenset[str], float]) -> float:
    if subset not in cache:
        factor, gap_factor = np.ones(g.num_nodes), np.ones(g.num_nodes)
        for p in subset:
            factor = factor * scales[p][0]
            if scales[p][1] is not None:
                gap_factor = gap_factor * scales[p][1]
        dur = np.rint(g.dur * factor).astype(np.int64)
        gap = np.rint(g.gap * gap_factor).astype(np.int64)
        cache[subset] = step_value(g, dur, gap)
    return cache[subset]


def shapley(players: list[str], value) -> tuple[dict[str, float], str]:
    """Shapley value of each player for `value(frozenset)`: exact up to EXACT_PLAYERS, else averaged over
    sampled orders (forward, reverse, then seeded shuffles). Either way the values sum to
    value(all) − value(none)."""
    n = len(players)
    out = {p: 0.0 for p in players}
    if n <= EXACT_PLAYERS:
        for p in players:
            others = [q for q in players if q != p]
            for k in range(n):
                w = math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n)
                for s in itertools.combinations(others, k):
                    fs = frozenset(s)
                    out[p] += w * (value(fs | {p}) - value(fs))
        return out, "exact Shapley"
    rng = np.random.default_rng(0)
    orders = [list(players), list(reversed(players))]
    orders += [[players[i] for i in rng.permutation(n)] for _ in range(SAMPLED_ORDERS - 2)]
    for order in orders:
        done: frozenset[str] = frozenset()
        for p in order:
            out[p] += (value(done | {p}) - value(done)) / len(orders)
            done = done | {p}
    return out, f"Shapley over {len(orders)} orders"


def attribute(base_g: StepGraph, new_g: StepGraph) -> dict[str, Any]:
    """The explained step change of `new_g` against `base_g` (see the module doc): per cause its part in
    ns per step, the measured and replayed steps of both runs, and the residual."""
    base, new = _side(base_g), _side(new_g)
    scales = _scales(base, new)
    cache: dict[frozenset[str], float] = {}
    value = lambda s: _subset_value(base_g, scales, s, cache)  # noqa: E731
    parts, method = shapley(sorted(scales), value)
    replayed_base = value(frozenset())
    replayed_new = step_value(new_g)
    parts[SCHEDULE] = replayed_new - value(frozenset(scales))
    measured_base, measured_new = measured_value(base_g), measured_value(new_g)
    measured = measured_new - measured_base
    total = sum(parts.values())
    rows = [{"cause": c, "group": c.split(":")[0], "delta_ns": int(round(v)),
             "share": (v / measured) if measured else None}
            for c, v in sorted(parts.items(), key=lambda kv: -abs(kv[1]))]
    return {"schema": ATTRIBUTION_SCHEMA, "method": method, "replays": len(cache) + 1,
            "measured": {"base_ns": int(measured_base), "new_ns": int(measured_new), "delta_ns": int(measured)},
            "replayed": {"base_ns": int(replayed_base), "new_ns": int(replayed_new),
                         "delta_ns": int(round(replayed_new - replayed_base))},
            "parts": rows, "groups": _groups(rows, measured),
            "explained_ns": int(round(total)), "residual_ns": int(round(measured - total)),
            "residual_ratio": ((measured - total) / measured) if measured else None,
            "steps": {"base": base.nsteps, "new": new.nsteps}}


def _groups(rows: list[dict[str, Any]], measured: float) -> list[dict[str, Any]]:
    """The parts summed per group (compute, comm, host, other_device, schedule)."""
    acc: dict[str, int] = {}
    for r in rows:
        acc[r["group"]] = acc.get(r["group"], 0) + r["delta_ns"]
    return [{"group": k, "delta_ns": v, "share": (v / measured) if measured else None}
            for k, v in sorted(acc.items(), key=lambda kv: -abs(kv[1]))]


def attribute_stores(base_store: Any, new_store: Any) -> dict[str, Any] | None:
    """`attribute` on the graphs of two run stores (the last profiled steps each, as `tracekit whatif`
    builds them); None when either run has no replayable step."""
    from tracekit.analyze.critical_path import replay_steps, step_input
    from tracekit.whatif.api import prepare

    graphs = []
    for store in (base_store, new_store):
        inputs = prepare(store)
        results = replay_steps(store, step_input(store, inputs.layout, inputs.matching))
        if not results:
            return None
        graphs.append(results[0].graph)
    return attribute(graphs[0], graphs[1])
