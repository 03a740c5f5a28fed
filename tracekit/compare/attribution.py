"""Where a step-time change came from: the base run's dependency graph replayed with the new run's
durations, one cause at a time (docs/metrics.md §14).

Causes (players):
 - `compute:<family>`: compute nodes of one op family (gemm, attention, norm, optimizer, other),
 - `comm:<dim>`: the transfer time of one dim's collectives / P2P ops,
 - `host`: host work between launches, host and data stalls, and the gaps the graph cannot explain,
 - `other_device`: memcpy / memset / other device work,
 - `schedule`: what changed in the graph's shape rather than in its durations (more or fewer
   micro-batches, ops or collectives: the pipeline bubble that comes with them).
Waiting for a peer is no cause of its own: the replay makes the peers wait, so a rank's slower compute
carries the waiting it causes.

Both graphs are replayed without their assumed edges (`observed`: orders the builder adds for a faster
host's what-if that the trace does not show). A base node takes its counterpart's duration and gap in the new run (`mapped_times`: same rank, lane, op
name, step index and category, same position), or its key's ratio of totals when the counts differ. The value of a
set S of causes is the replayed step time (slowest rank, mean over the graph's steps) with the causes in S
at the new durations. Each cause's part is its Shapley value (exact over all subsets up to
EXACT_PLAYERS causes, else the mean over the forward, reverse and seeded random orders of sequential
substitution), so the duration parts sum exactly to v(all) − v(none); `schedule` = replayed new −
v(all). The parts then sum exactly to replayed new − replayed base, and the replay of an unchanged graph
gives back its measured step, so the residual against the measured change is what the replay does not
reproduce (reported, never hidden).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from typing import Any

import numpy as np

from tracekit.assess.whatif import prepare
from tracekit.whatif.graph import Category, StepGraph, rank_step_ns, replay
from tracekit.whatif.graph import measured_step_ns
from tracekit.whatif.steps import replay_steps, step_input

ATTRIBUTION_SCHEMA = "tracekit.diff.attribution/1"
EXACT_PLAYERS = 5
"""Up to this many causes with a change: exact Shapley values (2^n replays); above: sampled orders."""
SAMPLED_ORDERS = 8
FAMILIES = (("attention", re.compile(r"attn|attention|softmax|flash|sdpa|fmha", re.I)),
            ("gemm", re.compile(r"gemm|gemv|matmul|aten::mm\b|addmm|bmm|linear|cutlass|xmma|cublas|nvjet", re.I)),
            ("norm", re.compile(r"norm", re.I)),
            ("optimizer", re.compile(r"optim|adam|sgd|multi_tensor|foreach", re.I)))
"""Op families of compute nodes, first match wins (kernel names: cuBLAS `nvjet_*` / `*gemm*`, flash
attention; CPU op names: `aten::mm`, `aten::_softmax`, `Optimizer.step#AdamW.step`)."""
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


def lane_keys(g: StepGraph) -> list[str]:
    """Per lane of `g`: a name that holds across runs — its kind (the lane name without its rank and ids:
    "stream", "host thread", "training thread") and its place among the rank's lanes of that kind, busiest
    first (thread ids and stream numbers differ from one process to the next; the busiest stream is the
    compute stream, the busiest thread the one launching)."""
    counts = np.bincount(g.lane[g.lane >= 0], minlength=len(g.lane_names))
    kinds = [re.sub(r"-?\d+", "#", re.sub(r"^rank\s*\d+\s*", "", n)).strip() for n in g.lane_names]
    owner = [re.match(r"^rank\s*(\d+)", n) for n in g.lane_names]
    groups: dict[tuple[str, str], list[int]] = {}
    for i, k in enumerate(kinds):
        groups.setdefault((owner[i].group(1) if owner[i] else "", k), []).append(i)
    out = [""] * len(g.lane_names)
    for (_, kind), lanes in groups.items():
        for place, i in enumerate(sorted(lanes, key=lambda i: (-counts[i], g.lane_names[i]))):
            out[i] = f"{kind} {place}"
    return out


def rank_map(base_ranks: list[int], new_ranks: list[int]) -> dict[int, int]:
    """New run's rank → the base rank it stands for: the same rank when both runs hold the same ranks, else
    the i-th of each (one trace per run recorded on different ranks); ranks without a counterpart map to
    themselves (their nodes then keep the base times)."""
    b, n = sorted(set(base_ranks)), sorted(set(new_ranks))
    if b == n or len(b) != len(n):
        return {r: r for r in n}
    return dict(zip(n, b))


def _node_keys(g: StepGraph, ranks: dict[int, int] | None = None) -> Any:
    """Per node: (rank, lane, name, step index, category) and its occurrence among the nodes of that key
    (by start): what names one node in both runs. `ranks` relabels the ranks (`rank_map`)."""
    import pandas as pd

    lanes = np.array(lane_keys(g) + [""], dtype=object)
    names = g.name if len(g.name) == g.num_nodes else [""] * g.num_nodes
    steps = np.unique(g.step[g.step >= 0])
    rank = g.rank.astype(np.int64)
    if ranks:
        rank = np.array([ranks.get(r, r) for r in rank.tolist()], np.int64)
    df = pd.DataFrame({"rank": rank, "lane": lanes[np.where(g.lane >= 0, g.lane, len(g.lane_names))],
                       "name": names, "step": np.searchsorted(steps, g.step) * (g.step >= 0) - (g.step < 0),
                       "cat": g.category.astype(np.int64), "start": g.start, "dur": g.dur.astype(np.float64),
                       "gap": g.gap.astype(np.float64), "node": np.arange(g.num_nodes)})
    df = df.sort_values(["start", "node"], kind="stable")
    keys = ["rank", "lane", "name", "step", "cat"]
    df["occ"] = df.groupby(keys, sort=False).cumcount()
    df["count"] = df.groupby(keys, sort=False)["node"].transform("size")
    return df.sort_values("node")


def mapped_times(base_g: StepGraph, new_g: StepGraph) -> tuple[np.ndarray, np.ndarray]:
    """Per node of `base_g`: its duration and gap in the new run. A node whose key (rank, lane, op name,
    step index, category) holds as many nodes in both runs takes its counterpart's times (by order); a key
    whose count changed is scaled by the ratio of its totals; a key the new run lacks keeps the base times
    (what changed in the graph's shape is the `schedule` part)."""
    keys = ["rank", "lane", "name", "step", "cat"]
    b = _node_keys(base_g)
    n = _node_keys(new_g, rank_map(base_g.ranks.tolist(), new_g.ranks.tolist()))
    m = b.merge(n[keys + ["occ", "count", "dur", "gap"]], on=keys + ["occ"], how="left", suffixes=("", "_new"))
    m = m.sort_values("node")
    tot_b = b.groupby(keys)[["dur", "gap"]].sum()
    tot_n = n.groupby(keys)[["dur", "gap"]].sum()
    ratio = (tot_n / tot_b.replace(0, np.nan)).reindex(tot_b.index)
    r = ratio.reindex(m.set_index(keys).index)
    same = (m["count"] == m["count_new"]).to_numpy()
    dur, gap = b["dur"].to_numpy().copy(), b["gap"].to_numpy().copy()
    scale_d = np.nan_to_num(r["dur"].to_numpy(), nan=1.0)
    scale_g = np.nan_to_num(r["gap"].to_numpy(), nan=1.0)
    dur = np.where(same, m["dur_new"].to_numpy(), dur * scale_d)
    gap = np.where(same, m["gap_new"].to_numpy(), gap * scale_g)
    return np.rint(dur).astype(np.int64), np.rint(gap).astype(np.int64)


def step_value(g: StepGraph, dur: np.ndarray | None = None, gap: np.ndarray | None = None) -> float:
    """The replayed step time (slowest rank of each step, mean over the graph's steps)."""
    dur = g.dur if dur is None else dur
    gap = g.gap if gap is None else gap
    times = rank_step_ns(g, replay(g, dur, gap), dur, gap)
    return float(np.mean([times[g.win_step == s].max() for s in np.unique(g.win_step)]))


def measured_value(g: StepGraph) -> float:
    """The measured step time by the same rule (slowest rank of each step, mean over steps)."""
    meas = measured_step_ns(g)
    return float(np.mean([meas[g.win_step == s].max() for s in np.unique(g.win_step)]))


def _players(base_g: StepGraph, new_g: StepGraph) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Per cause with a change: the base nodes it substitutes (host: also every node's gap); and the new
    run's (durations, gaps) mapped onto the base graph's nodes."""
    causes = node_causes(base_g)
    dur, gap = mapped_times(base_g, new_g)
    out = {}
    for cause in sorted(set(causes.tolist()) - {""}):
        mask = causes == cause
        if np.any(dur[mask] != base_g.dur[mask]) or (cause == "host" and np.any(gap != base_g.gap)):
            out[cause] = mask
    return out, (dur, gap)


def _subset_value(g: StepGraph, players: dict[str, np.ndarray], mapped: tuple[np.ndarray, np.ndarray],
                  subset: frozenset[str], cache: dict[frozenset[str], float]) -> float:
    if subset not in cache:
        new_dur, new_gap = mapped
        on = np.zeros(g.num_nodes, bool)
        for p in subset:
            on |= players[p]
        dur = np.where(on, new_dur, g.dur)
        gap = new_gap if "host" in subset else g.gap
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


def observed(g: StepGraph) -> StepGraph:
    """`g` without its assumed edges (`StepGraph.assumed_edges`: a launch-bound op kept after another
    stream's op that ended before it, an order the trace does not show). Replayed with another run's
    durations such an edge serializes what that run overlapped: in HTA's control run three launch-bound
    compute kernels start 12-16 µs after a 5.8-7.0 ms NCCL SendRecv on another stream ended; in the test run
    that SendRecv takes 9.2-9.7 ms and the same kernels start 3.8-5.3 ms before it ends (the schedule part
    was -9.7 ms of +46.7 ms with these edges, -1.1 ms without). The gaps are taken again, so the replay with
    the graph's own durations still gives back its measured step."""
    if len(g.assumed_edges) == 0:
        return g
    n = np.int64(g.num_nodes)
    drop = np.isin(g.src.astype(np.int64) * n + g.dst, g.assumed_edges[:, 0] * n + g.assumed_edges[:, 1])
    return dataclasses.replace(g, src=g.src[~drop], dst=g.dst[~drop], assumed_edges=np.zeros((0, 2), np.int64),
                               _plan=None)


def attribute(base_g: StepGraph, new_g: StepGraph) -> dict[str, Any]:
    """The explained step change of `new_g` against `base_g` (see the module doc): per cause its part in
    ns per step, the measured and replayed steps of both runs, and the residual. Both graphs are replayed
    without their assumed edges (`observed`)."""
    base_g, new_g = observed(base_g), observed(new_g)
    scales, mapped = _players(base_g, new_g)
    cache: dict[frozenset[str], float] = {}
    value = lambda s: _subset_value(base_g, scales, mapped, s, cache)  # noqa: E731
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
            "steps": {"base": _nsteps(base_g), "new": _nsteps(new_g)}, "by_rank": _by_rank(base_g, mapped)}


def _nsteps(g: StepGraph) -> int:
    return int(np.unique(g.win_step).size)


def _by_rank(g: StepGraph, mapped: tuple[np.ndarray, np.ndarray]) -> list[dict[str, Any]]:
    """The duration parts again with ranks as the players (every node and gap of one rank at the new
    run's): which rank's changes moved the step. Sums to the same v(all) − v(none) as the causes."""
    ranks = sorted({int(r) for r in g.rank.tolist() if r >= 0})
    new_dur, new_gap = mapped
    cache: dict[frozenset[int], float] = {}

    def value(subset: frozenset[int]) -> float:
        if subset not in cache:
            on = np.isin(g.rank, list(subset))
            cache[subset] = step_value(g, np.where(on, new_dur, g.dur), np.where(on, new_gap, g.gap))
        return cache[subset]

    parts, _ = shapley(ranks, value)  # type: ignore[arg-type]
    return [{"rank": r, "delta_ns": int(round(v))} for r, v in sorted(parts.items(), key=lambda kv: -abs(kv[1]))]


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
    graphs = []
    for store in (base_store, new_store):
        inputs = prepare(store)
        results = replay_steps(store, step_input(store, inputs.layout, inputs.matching))
        if not results:
            return None
        graphs.append(results[0].graph)
    return attribute(graphs[0], graphs[1])
