"""Mixture-of-experts routing: tokens per expert per layer, skew, dropped tokens, all-to-all cost per rank.

Definitions (DESIGN §3): routing skew = max tokens per expert / mean tokens per expert, per layer and
step (mean over all the layer's experts, idle ones included). Tokens come from the `routing` table
(tokens counted on the rank that routed them, summed over ranks, global expert ids). Without routing
statistics the dispatch all-to-all split sizes stand in: elements sent to each expert-parallel rank
(`granularity: "ep_rank"`; which expert on a rank is hot is not in the trace, so the finding names "the
experts on rank R", R the member of the dispatch's group the split points at). Dispatches labelled as such
are taken in order, one per layer; otherwise they are found from the sizes (`moe_passes_of`): an
all_to_all with split sizes followed by one mirroring them (the combine) is a layer's pass, and when the
second half of a step's passes mirrors the first (backward sends the combine's gradient out like the
dispatch) it is backward: 2 MoE layers give 8 such all_to_alls a step (and 2 split-size exchanges),
layers 0 and 1. Expert owners: expert e of E lives on rank `ranks[e // (E / n)]` of each ep group of size n.

Section `experts` (JSON):
{
  "source": "routing" | "all_to_all_splits" | null,
  "granularity": "expert" | "ep_rank",
  "layers": [{"layer", "num_experts", "skew", "skew_max", "hot_expert", "hot_owner_ranks": [..],
              "tokens_total", "dropped_total", "dropped_fraction"}],    # skew: mean over steps
  "heatmap": [{"step", "layer", "tokens": [per expert], "dropped": [per expert], "skew"}],
  "ranks": [{"rank", "a2a_ns", "a2a_calls", "a2a_recv_elems", "a2a_bytes", "tokens_received",
             "expert_ns"}]                                            # per step, mean over steps
}
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc

from tracekit.derive.topology import LayoutResult
from tracekit.findings import recommend
from tracekit.findings.evidence import RoutingSkewEvidence
from tracekit.findings.finding import Finding, FindingKind, Severity
from tracekit.findings.result import AnalyzerResult, section_of
from tracekit.tables.columns import table_rows
from tracekit.tables.store import RunStore

SKEW_INFO = 1.25
"""Skew (max/mean tokens per expert) from which the worst layer is reported at all."""
SKEW_WARNING = 2.5
"""A fresh router already sends up to ~2x the mean to one expert on the reference runtime (measured
with 4 and 8 experts, top-2; top-2 over 4 experts cannot exceed 2): warn above that."""
SKEW_CRITICAL = 3.5
SKEW_RANK_WARNING = 1.4
"""Without routing statistics the load is per expert-parallel rank (dispatch split sizes), whose max/mean
cannot exceed the group size (2 on 2 ranks): the per-expert thresholds are out of reach there. A rank with
1.4x the mean load makes its peers wait 29% of its expert time at the combine; a fresh router's experts
add up per rank (tests/user_scripts/moe_ep.py, 4 experts per rank: 1.00-1.16)."""
SKEW_RANK_CRITICAL = 2.0
EXPERT_LABEL = "ep:experts"
DISPATCH_LABEL = "dispatch"


def _find(d: Any, key: str, depth: int = 0) -> Any:
    """First value of `key` anywhere in a nested manifest (runtime config or record layout)."""
    if not isinstance(d, dict) or depth > 4:
        return None
    if d.get(key) is not None:
        return d[key]
    for v in d.values():
        found = _find(v, key, depth + 1)
        if found is not None:
            return found
    return None


def _ep_groups(store: RunStore, layout: dict[str, Any]) -> list[list[int]]:
    if layout and layout.get("groups"):
        groups = [list(g["ranks"]) for g in layout["groups"] if g.get("dim") == "ep" and g.get("ranks")]
    else:
        groups = [list(g["ranks"] or []) for g in store.table("process_groups", ["pg_desc", "ranks", "dim"]).to_pylist()
                  if g["dim"] == "ep" or (g["pg_desc"] or "").lower() == "mesh_ep"]
    out: list[list[int]] = []
    for g in groups:
        if g and g not in out:
            out.append(g)
    return out


def owners(expert: int, num_experts: int, ep_groups: list[list[int]]) -> list[int]:
    """Global ranks holding `expert` (one per ep group), [] when the sharding is not even."""
    out = []
    for g in ep_groups:
        if num_experts % len(g) == 0:
            out.append(g[expert // (num_experts // len(g))])
    return sorted(out)


def _per_rank_step_sum(store: RunStore, name: str) -> dict[tuple[int, int], int]:
    """Summed duration of the events called `name` per (rank, step), scanned batch by batch."""
    sums = store.grouped_sum("events", ["rank", "step"], "dur", pc.field("name") == name)
    return defaultdict(int, {k: int(v) for k, v in sums.items()})


@dataclass(frozen=True)
class ExpertsResult(AnalyzerResult):
    pass


def analyze_experts(store: RunStore, layout: LayoutResult | None) -> ExpertsResult:
    """Experts section and `expert_routing_skew` finding for the most skewed layer."""
    ep_groups = _ep_groups(store, section_of(layout))
    a2a_rows = _dedupe(_all_to_alls(store))
    routing = [r for r in store.table("routing").to_pylist() if r["tokens"] is not None]
    expert_ns = _per_rank_step_sum(store, EXPERT_LABEL)

    split_groups: dict[tuple[int, int], list[int]] = {}
    rule = "routing statistics"
    if routing:
        counts, dropped, source, gran = _from_routing(routing), _dropped(routing), "routing", "expert"
    elif a2a_rows and _from_splits(a2a_rows):
        counts, split_groups, rule = _splits_layers(a2a_rows)
        source, gran = "all_to_all_splits", "ep_rank"
        dropped = {}
    else:
        return ExpertsResult(findings=[], section={"source": None, "granularity": None, "layers": [],
                                                    "heatmap": [], "ranks": []})

    layers = sorted({layer for (_, layer) in counts})
    layer_ranks: dict[int, set[int]] = defaultdict(set)
    for r in routing:
        layer_ranks[r["layer"]].add(r["rank"])
    heat, layer_out = [], []
    for layer in layers:
        steps = sorted(s for (s, lay) in counts if lay == layer)
        E = max(len(counts[(s, layer)]) for s in steps)
        mats = np.zeros((len(steps), E))
        skews = []
        for i, s in enumerate(steps):
            vec = np.asarray(counts[(s, layer)], dtype=float)
            mats[i, :vec.size] = vec
            drop = dropped.get((s, layer), [0] * E)
            skew = float(vec.max() / vec.mean()) if vec.mean() > 0 else None
            if skew is not None:
                skews.append(skew)
            heat.append({"step": s, "layer": layer, "tokens": [int(x) for x in vec],
                         "dropped": [int(x) for x in drop], "skew": skew})
        tot = mats.sum(axis=0)
        hot = int(np.argmax(tot))
        owners_ = _hot_owners(hot, E, ep_groups, gran, layer_ranks.get(layer, set()))
        if not owners_ and gran == "ep_rank":  # no ep group named: the dispatch's own group
            owners_ = sorted({split_groups[(s, layer)][hot] for s in steps if (s, layer) in split_groups})
        drop_tot = sum(sum(dropped.get((s, layer), [])) for s in steps)
        layer_out.append({
            "layer": layer, "num_experts": E, "skew": float(np.mean(skews)) if skews else None,
            "skew_max": float(np.max(skews)) if skews else None, "hot_expert": hot,
            "hot_owner_ranks": owners_,
            "tokens_total": int(tot.sum()), "dropped_total": int(drop_tot),
            "dropped_fraction": float(drop_tot / tot.sum()) if tot.sum() else 0.0,
            "hot_dropped_fraction": (float(sum(dropped.get((s, layer), [0] * E)[hot] for s in steps) / tot[hot])
                                     if tot[hot] and dropped else 0.0),
        })

    rank_out = _rank_table(store, a2a_rows, routing, ep_groups, expert_ns)
    section = {"source": source, "granularity": gran, "layers": layer_out, "heatmap": heat, "ranks": rank_out}
    findings = _skew_finding(store, layer_out, rank_out, gran, rule)
    return ExpertsResult(findings=findings, section=section)


def _all_to_alls(store: RunStore) -> list[dict[str, Any]]:
    """The all_to_all rows with a step, selected in Arrow (every collective as a dict costs seconds at
    thousands of ranks)."""
    a2a = store.table("collectives", ["rank", "step", "op", "dur", "out_nelems", "out_split_sizes",
                                      "in_split_sizes", "bytes", "caller", "group_ranks", "seq", "source", "pg_name"])
    return table_rows(a2a.filter(pc.and_(pc.equal(a2a["op"], "all_to_all"), pc.is_valid(a2a["step"]))))


def _hot_owners(hot: int, E: int, ep_groups: list[list[int]], gran: str, layer_ranks: set[int]) -> list[int]:
    """Ranks holding the hot expert; limited to the ranks that run the layer (pipeline stages) when known."""
    own = set(owners(hot, E, ep_groups)) if gran == "expert" else {g[hot] for g in ep_groups if hot < len(g)}
    if layer_ranks:
        own = (own & layer_ranks) or layer_ranks
    return sorted(own)


def _from_routing(routing: list[dict[str, Any]]) -> dict[tuple[int, int], list[int]]:
    """(step, layer) -> tokens per global expert id, summed over the routing ranks."""
    acc: dict[tuple[int, int], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for r in routing:
        acc[(r["step"], r["layer"])][r["expert"]] += int(r["tokens"])
    out = {}
    for key, d in acc.items():
        E = max(d) + 1
        out[key] = [d.get(e, 0) for e in range(E)]
    return out


def _dropped(routing: list[dict[str, Any]]) -> dict[tuple[int, int], list[int]]:
    acc: dict[tuple[int, int], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for r in routing:
        acc[(r["step"], r["layer"])][r["expert"]] += int(r["dropped"] or 0)
    return {k: [d.get(e, 0) for e in range(max(d) + 1)] for k, d in acc.items()}


def _from_splits(rows: list[dict[str, Any]]) -> dict[tuple[int, int], list[int]]:
    """(step, MoE layer) -> elements sent to each ep rank, from the dispatch all-to-alls' input splits."""
    return _splits_layers(rows)[0]


def _dedupe(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per collective call: the profiler's and the collective log's rows of one (rank, group, seq)
    are the same call (the first source that has split sizes is kept)."""
    seen: set[tuple] = set()
    out = []
    for r in sorted(rows, key=lambda r: (not r["in_split_sizes"], r["dur"] is None, r["source"] or "")):
        key = (r["rank"], r["step"], r["pg_name"], r["seq"]) if r["seq"] is not None else (id(r),)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def moe_passes_of(calls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """A rank's all_to_alls of one step (in order) → (the dispatch of each MoE layer in forward order, the
    number of MoE layers). A dispatch is an all_to_all with split sizes followed by the combine mirroring it
    (its input splits the dispatch's output splits and back); other all_to_alls (a split-size exchange) are
    skipped. Backward runs the same pairs in reverse order with the same sizes (the combine's gradient goes
    out like the dispatch): when the second half of the pairs mirrors the first, it is backward and the step
    has half as many MoE layers; otherwise (forward only) each pair is a layer."""
    pairs, i = [], 0
    while i + 1 < len(calls):
        d, c = calls[i], calls[i + 1]
        if d["in_split_sizes"] and list(d["in_split_sizes"]) == list(c["out_split_sizes"] or []) \
                and list(d["out_split_sizes"] or []) == list(c["in_split_sizes"] or []):
            pairs.append(d)
            i += 2
        else:
            i += 1
    m = len(pairs)
    sizes = [(tuple(p["in_split_sizes"]), tuple(p["out_split_sizes"] or ())) for p in pairs]
    if m >= 2 and m % 2 == 0 and all(sizes[k] == sizes[m - 1 - k] for k in range(m // 2)):
        return pairs[: m // 2], m // 2
    return pairs, m


Layered = dict[tuple[int, int], list[int]]
"""(step, MoE layer) -> one number per member of the layer's group"""


def _splits_layers(rows: list[dict[str, Any]]) -> tuple[Layered, Layered, str]:
    """(step, MoE layer) -> elements sent to each member of the dispatch's group (summed over the senders),
    (step, layer) -> the group's ranks, and the rule used. Dispatches labelled as such (`DISPATCH_LABEL` in
    the caller) are taken in order, one per layer; otherwise `moe_passes_of` finds them from the sizes."""
    rows = [r for r in rows if r["in_split_sizes"]]
    labelled = [r for r in rows if r["caller"] and DISPATCH_LABEL in r["caller"]]
    per_rank: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in labelled or rows:
        per_rank[(r["rank"], r["step"])].append(r)
    acc: dict[tuple[int, int], np.ndarray] = {}
    group: dict[tuple[int, int], list[int]] = {}
    for (rank, step), lst in per_rank.items():
        lst.sort(key=lambda r: (r["seq"] is None, r["seq"]))
        if labelled:
            dispatches = [r for r in lst if r["in_split_sizes"]]
        else:
            dispatches, _ = moe_passes_of(lst)
        for k, r in enumerate(dispatches):
            vec = np.asarray(r["in_split_sizes"], dtype=np.int64)
            cur = acc.get((step, k))
            acc[(step, k)] = vec if cur is None or cur.size != vec.size else cur + vec
            if r.get("group_ranks") and len(r["group_ranks"]) == vec.size:
                group[(step, k)] = list(r["group_ranks"])
    rule = "labelled dispatches" if labelled else "dispatch/combine pairs (backward mirrored)"
    return {k: [int(x) for x in v] for k, v in acc.items()}, group, rule


def _rank_table(store, a2a_rows, routing, ep_groups, expert_ns) -> list[dict[str, Any]]:
    per: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    by_rank_step: dict[tuple[int, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in a2a_rows:
        d = by_rank_step[(r["rank"], r["step"])]
        d["a2a_ns"] += int(r["dur"] or 0)
        d["a2a_calls"] += 1
        d["a2a_recv_elems"] += int(sum(r["out_split_sizes"]) if r["out_split_sizes"] else (r["out_nelems"] or 0))
        d["a2a_bytes"] += int(r["bytes"] or 0)
    # tokens each rank receives: routed by ranks of its ep group to experts it owns
    if routing and ep_groups:
        E_by_layer: dict[int, int] = defaultdict(int)
        for r in routing:
            E_by_layer[r["layer"]] = max(E_by_layer[r["layer"]], r["expert"] + 1)
        group_of = {rk: g for g in ep_groups for rk in g}
        for r in routing:
            g = group_of.get(r["rank"])
            E = E_by_layer[r["layer"]]
            if g is None or E % len(g):
                continue
            dest = g[r["expert"] // (E // len(g))]
            by_rank_step[(dest, r["step"])]["tokens_received"] += int(r["tokens"]) - int(r["dropped"] or 0)
    for (rk, st), v in expert_ns.items():
        by_rank_step[(rk, st)]["expert_ns"] += v
    for (rk, _), d in by_rank_step.items():
        for k, v in d.items():
            per[rk][k].append(v)
    out = []
    for rk in sorted(per):
        d = per[rk]
        n = max(len(v) for v in d.values())
        row = {"rank": rk}
        for k in ("a2a_ns", "a2a_calls", "a2a_recv_elems", "a2a_bytes", "tokens_received", "expert_ns"):
            row[k] = float(np.sum(d[k]) / n) if d.get(k) else None
        out.append(row)
    return out


def _skew_finding(store, layer_out, rank_out, gran, rule: str) -> list[Finding]:
    cands = [x for x in layer_out if x["skew"] is not None]
    if not cands:
        return []
    worst = max(cands, key=lambda x: x["skew"])
    if worst["skew"] < SKEW_INFO:
        return []
    man = store.manifest or {}
    ex = [r["expert_ns"] for r in rank_out if r["expert_ns"] is not None]
    hot_ns = max(ex) if ex else None
    mean_ns = float(np.mean(ex)) if ex else None
    recv = [r for r in rank_out if r["tokens_received"] is not None and r["a2a_ns"] is not None]
    if len(recv) > 1 and max(r["tokens_received"] for r in recv) > 0:
        busiest = max(recv, key=lambda r: r["tokens_received"])
        a2a_hot = busiest["a2a_ns"]
        ratio = float(np.mean([r["tokens_received"] for r in recv])) / busiest["tokens_received"]
    else:
        a2a_hot, ratio = None, None
    advice = recommend.advise_routing_skew(
        layer=worst["layer"], expert=worst["hot_expert"], skew=worst["skew"], hot_rank_expert_ns=hot_ns,
        mean_rank_expert_ns=mean_ns, aux_loss_weight=_find(man, "aux_loss_weight"),
        capacity_factor=_find(man, "capacity_factor"), dropped_fraction=worst["hot_dropped_fraction"] or None,
        hot_rank_a2a_ns=a2a_hot, recv_mean_over_max=ratio,
        hot_label=None if gran == "expert" else _who(worst["hot_owner_ranks"], worst["hot_expert"]).capitalize())
    warn, crit = (SKEW_WARNING, SKEW_CRITICAL) if gran == "expert" else (SKEW_RANK_WARNING, SKEW_RANK_CRITICAL)
    sev = (Severity.CRITICAL if worst["skew"] >= crit else
           Severity.WARNING if worst["skew"] >= warn else Severity.INFO)
    if gran == "expert":
        summary = (f"MoE layer {worst['layer']}: expert {worst['hot_expert']} gets {worst['skew']:.2f}x the mean "
                   f"tokens ({worst['dropped_fraction']:.0%} of the layer's tokens dropped)")
    else:  # the trace shows tokens per expert-parallel rank only: which of its experts is hot is not visible
        who = _who(worst["hot_owner_ranks"], worst["hot_expert"])
        n_layers = len(layer_out)
        summary = (f"MoE layer {worst['layer']} (of {n_layers}, counted from 0 in forward order): {who} get "
                   f"{worst['skew']:.2f}x the mean tokens of the {worst['num_experts']} expert-parallel ranks "
                   f"(dispatch all_to_all split sizes; which expert on the rank is hot is not in the trace)")
    evidence = {"layer": worst["layer"], "expert": worst["hot_expert"], "granularity": gran,
                "skew": worst["skew"], "skew_max": worst["skew_max"], "num_experts": worst["num_experts"],
                "dropped_fraction": worst["dropped_fraction"], "hot_dropped_fraction": worst["hot_dropped_fraction"],
                "hot_rank_expert_ns": hot_ns, "mean_rank_expert_ns": mean_ns, "moe_layers": len(layer_out),
                "layers_from": rule, **advice.evidence}
    return [Finding(kind=FindingKind.EXPERT_ROUTING_SKEW, severity=sev, summary=summary,
                    ranks=tuple(worst["hot_owner_ranks"]), dim="ep", evidence=RoutingSkewEvidence.of(evidence),
                    recommendation=advice.text, est_saving_ns=int(advice.saving_ns))]


def _who(owner: list[int], ep_index: int) -> str:
    """The hot experts as the trace shows them (per expert-parallel rank, not per expert id)."""
    if len(owner) == 1:
        return f"the experts on rank {owner[0]}"
    if owner:
        return f"the experts on ranks {', '.join(map(str, owner))}"
    return f"the experts of expert-parallel rank {ep_index}"
