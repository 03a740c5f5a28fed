"""Placement against topology: do communication-heavy groups stay inside a host?

Hosts come from the manifest (`hosts`: rank → host, e.g. the runtime's `--ranks-per-host` virtual
hosts) or else `ranks.hostname`. TP, CP and EP groups move activations every layer (heavy); DP and PP
move gradients once per step or one activation per micro-batch (light). A heavy group spanning
several hosts is a `placement_mismatch`; it is a warning or critical when some light group of size > 1
sits inside one host — swapping the mesh order would put the heavy traffic on the fast links. Where the
dim's groups would not fit in a host beside the heavy groups already inside one (`_displaced`: tp 8 filling
an 8-GPU host), the remap pushes another heavy dim across hosts: a trade the trace cannot price, so the
finding is info with no saving (`displaced_dims`).
Exposed time of the dim = its transfer time covered by no compute (the `unoverlapped` section, worst
rank per step) or, without it, the group's communication time per step (an upper bound).

Section `placement` (JSON):
{"hosts": {rank: host} | {}, "host_source": "manifest" | "ranks" | null, "num_hosts": int,
 "groups": [{"pg_name", "dim", "ranks": [..], "hosts": [..], "crosses_hosts": bool, "heavy": bool,
             "exposed_ns_per_step": float | null, "exposed_basis": "unoverlapped" | "comm_time" | null}]}
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from tracekit.analyze.unoverlapped import UnoverlappedResult
from tracekit.derive import intervals as iv
from tracekit.derive.topology import LayoutResult
from tracekit.findings import recommend
from tracekit.findings.evidence import PlacementEvidence
from tracekit.findings.finding import Finding, FindingKind, Severity
from tracekit.findings.result import AnalyzerResult, section_of
from tracekit.layout import rank_to_host
from tracekit.tables.columns import table_rows
from tracekit.tables.store import RunStore

HEAVY_DIMS = ("tp", "cp", "ep")
LIGHT_DIMS = ("dp", "pp")
CRITICAL_SHARE = 0.05
"""Exposed time of the heavy dim / step time from which a fixable mismatch is critical."""


def hosts_by_rank(store: RunStore) -> tuple[dict[int, str], str | None]:
    """rank → host name from the manifest (`hosts`), else from the ranks table; ({}, None) if unknown."""
    out = rank_to_host((store.manifest or {}).get("hosts"))
    if out:
        return out, "manifest"
    out = rank_to_host(None, store.table("ranks", ["rank", "hostname"]).to_pylist())
    return (out, "ranks") if out else ({}, None)


def _groups(store: RunStore, layout: dict[str, Any]) -> list[dict[str, Any]]:
    if layout and layout.get("groups"):
        src = layout["groups"]
    else:
        src = store.table("process_groups", ["pg_name", "dim", "ranks"]).to_pylist()
    return [{"pg_name": g["pg_name"], "dim": g.get("dim") or "unknown", "ranks": list(g.get("ranks") or [])}
            for g in src if g.get("ranks") and len(g["ranks"]) > 1]


def _step_ns(store: RunStore) -> float:
    per: dict[int, int] = defaultdict(int)
    for s in store.table("steps", ["step", "dur"]).to_pylist():
        if s["dur"] is not None:
            per[s["step"]] = max(per[s["step"]], s["dur"])
    return sum(per.values()) / len(per) if per else 0.0


def _exposed_by_dim(sec: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    if not sec:
        return out
    for row in sec.get("by_dim_op", []):
        val = row.get("transfer_exposed_ns_per_step", row.get("exposed_ns_per_step"))
        if val is not None:
            out[row["dim"]] += float(val)
    return out


def _comm_time_by_group(store: RunStore) -> dict[str, float]:
    """Per group: the busiest member's communication time (union of its collective intervals) per step."""
    t = table_rows(store.table("collectives", ["rank", "pg_name", "source", "ts", "dur", "step"]))
    acc: dict[tuple[str, int, str], list[tuple[int, int]]] = defaultdict(list)
    steps: dict[str, set] = defaultdict(set)
    for r in t:
        if r["ts"] is None or r["dur"] is None or not r["pg_name"]:
            continue
        acc[(r["pg_name"], r["rank"], r["source"])].append((r["ts"], r["ts"] + r["dur"]))
        steps[r["pg_name"]].add(r["step"])
    best: dict[tuple[str, int], float] = {}
    for (pg, rank, _), ivs in acc.items():
        tot = iv.total(iv.union([a for a, _ in ivs], [b for _, b in ivs]))
        best[(pg, rank)] = max(best.get((pg, rank), 0.0), tot)  # one source per rank: the fuller one
    out: dict[str, float] = defaultdict(float)
    for (pg, _), v in best.items():
        out[pg] = max(out[pg], v / max(1, len(steps[pg] - {None}) or 1))
    return out


def _displaced(groups: list[dict[str, Any]], hosts: dict[int, str], dim: str, first: list[int]) -> list[str]:
    """The heavy dims whose groups sit inside a host now and would not fit in one host beside `dim`'s groups:
    the ranks that must share a host once `dim` is inside one — `first` (one of its groups) closed under
    `dim`'s groups and those heavy groups (each must stay whole on one host) — outnumber a host's ranks.
    Placing `dim` inside a host then pushes one of them across hosts: a trade between heavy traffic, not a free
    remap. [] when they fit."""
    per_host = max(Counter(hosts.values()).values(), default=0)
    inside = {g["dim"] for g in groups if g["heavy"] and g["dim"] != dim and not g["crosses_hosts"]}
    if not inside:
        return []
    of_rank: dict[int, list[list[int]]] = defaultdict(list)
    for g in groups:
        if g["dim"] == dim or g["dim"] in inside:
            for r in g["ranks"]:
                of_rank[r].append(g["ranks"])
    block, todo = set(first), list(first)
    while todo and len(block) <= per_host:
        for ranks in of_rank.get(todo.pop(), ()):
            new = [r for r in ranks if r not in block]
            block.update(new)
            todo += new
    return sorted(inside) if len(block) > per_host else []


@dataclass(frozen=True)
class PlacementResult(AnalyzerResult):
    pass


def analyze_placement(store: RunStore, layout: LayoutResult | None,
                      unoverlapped: UnoverlappedResult | None) -> PlacementResult:
    """Placement section and `placement_mismatch` findings (one per heavy dim spanning hosts)."""
    hosts, host_src = hosts_by_rank(store)
    groups = _groups(store, section_of(layout))
    exposed_dim = _exposed_by_dim(section_of(unoverlapped))
    comm_group = _comm_time_by_group(store) if not exposed_dim else {}
    for g in groups:
        hs = sorted({hosts[r] for r in g["ranks"] if r in hosts})
        g["hosts"] = hs
        g["crosses_hosts"] = len(hs) > 1
        g["heavy"] = g["dim"] in HEAVY_DIMS
        if exposed_dim:
            g["exposed_ns_per_step"], g["exposed_basis"] = exposed_dim.get(g["dim"], 0.0), "unoverlapped"
        elif g["pg_name"] in comm_group:
            g["exposed_ns_per_step"], g["exposed_basis"] = comm_group[g["pg_name"]], "comm_time"
        else:
            g["exposed_ns_per_step"], g["exposed_basis"] = None, None
    section = {"hosts": {str(k): v for k, v in sorted(hosts.items())}, "host_source": host_src,
               "num_hosts": len(set(hosts.values())), "groups": groups}
    if len(set(hosts.values())) < 2:
        return PlacementResult(findings=[], section=section)

    step_ns = _step_ns(store)
    light_inside = sorted({g["dim"] for g in groups if g["dim"] in LIGHT_DIMS and not g["crosses_hosts"]})
    findings = []
    by_dim: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for g in groups:
        if g["heavy"] and g["crosses_hosts"]:
            by_dim[g["dim"]].append(g)
    for dim, gs in by_dim.items():
        exposed = max((g["exposed_ns_per_step"] or 0.0) for g in gs)
        worst = max(gs, key=lambda g: g["exposed_ns_per_step"] or 0.0)
        displaced = _displaced(groups, hosts, dim, worst["ranks"])
        advice = recommend.advise_placement(dim=dim, group_ranks=worst["ranks"], hosts=worst["hosts"],
                                            exposed_ns=exposed, light_dims_inside=light_inside,
                                            displaced=displaced)
        share = exposed / step_ns if step_ns else 0.0
        if displaced:  # a trade between heavy dims the trace cannot price: no saving claimed
            sev = Severity.INFO
        elif light_inside:
            sev = Severity.CRITICAL if share >= CRITICAL_SHARE else Severity.WARNING
        else:
            sev = Severity.WARNING if share >= CRITICAL_SHARE else Severity.INFO
        ranks = sorted({r for g in gs for r in g["ranks"]})
        n_sets = len({tuple(sorted(g["ranks"])) for g in gs})
        summary = (f"{n_sets} {dim.upper()} group(s) span hosts (e.g. {worst['ranks']} on {', '.join(worst['hosts'])})"
                   + (f" while {'/'.join(light_inside)} groups stay inside one host" if light_inside else "")
                   + f"; {exposed / 1e6:.1f} ms exposed {dim} communication per step")
        evidence = {"groups": [{"pg_name": g["pg_name"], "ranks": g["ranks"], "hosts": g["hosts"]} for g in gs],
                    "light_dims_inside_host": light_inside, "displaced_dims": displaced,
                    "exposed_ns_per_step": int(exposed),
                    "exposed_basis": worst["exposed_basis"], "step_ns": int(step_ns), **advice.evidence}
        findings.append(Finding(kind=FindingKind.PLACEMENT_MISMATCH, severity=sev, summary=summary,
                                ranks=tuple(ranks), dim=dim, evidence=PlacementEvidence.of(evidence), recommendation=advice.text,
                                est_saving_ns=int(advice.saving_ns)))
    return PlacementResult(findings=findings, section=section)
