"""Layout: which parallel dimension each process group is, and each rank's coordinates in the mesh.

Evidence, strongest first: the group's `pg_desc` (DeviceMesh names its groups `mesh_<axis>`), the
run manifest's layout (`layout.groups` rank sets, or mesh names + shape; it also names the default
group when its ranks are exactly one dim's group, e.g. DDP over the whole world is "dp"), the dim
the parser already inferred, and last the structure of
the rank sets alone (contiguous stride-1 groups look like tp, strided ones like dp) — the last is
labelled `inferred_from: "structure"`, `confidence: "low"`. A group nothing identifies stays
`"unknown"`; nothing is guessed silently.

Section `layout`:
    {"world_size": int | null,
     "groups": [{"pg_name", "pg_desc", "dim", "ranks": [int], "size", "inferred_from":
                 "pg_desc|manifest|parser|structure|none", "confidence": "high|medium|low",
                 "flattened": [basic dims]  # only for flattened mesh groups (mesh_dp_cp, mesh_edp)}],
     "ranks": [{"rank": int, "coords": {dim: index within its group of that dim}}],
     "mesh_shape": {dim: group size},          # dims other than world/unknown, from basic groups
     "dims_inferred_from": {dim: source}}
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracekit.findings.result import AnalyzerResult
from tracekit.layout import rank_to_host
from tracekit.parse.classify import dim_from_desc, flattened_from_desc  # the one vocabulary of group names
from tracekit.tables.store import RunStore

# When one rank set is several dims' group in the manifest (e.g. dp and edp), the first of these wins.
_MANIFEST_PREFERENCE = ("dp", "fsdp", "tp", "cp", "pp", "ep")
_KNOWN_DIMS = ("dp", "fsdp", "tp", "pp", "cp", "ep")
_CONFIDENCE = {"pg_desc": "high", "manifest": "high", "parser": "medium", "structure": "low",
               "none": "low"}


def _manifest_group_sets(manifest: dict[str, Any] | None) -> dict[tuple[int, ...], str]:
    """Rank set -> dim from the manifest's explicit `layout.groups` ({axis: [[ranks], ...]})."""
    layout = (manifest or {}).get("layout")
    if not isinstance(layout, dict) or not isinstance(layout.get("groups"), dict):
        return {}
    fsdp = str(layout.get("dp_mode") or (manifest or {}).get("dp_mode") or "").lower() == "fsdp"
    found: dict[tuple[int, ...], set[str]] = {}
    for axis, sets in layout["groups"].items():
        dim = dim_from_desc(str(axis))
        if dim is None or dim == "world" or not isinstance(sets, list):
            continue
        if dim == "dp" and fsdp and str(axis) in ("dp", "dp_cp"):
            dim = "fsdp"
        for ranks in sets:
            if isinstance(ranks, list) and len(ranks) >= 2:
                found.setdefault(tuple(sorted(int(r) for r in ranks)), set()).add(dim)
    return {k: next(d for d in _MANIFEST_PREFERENCE if d in v) for k, v in found.items()}


def _manifest_mesh(manifest: dict[str, Any] | None) -> list[tuple[str, int]] | None:
    """Mesh axes (outermost first) with sizes from the manifest, if it states them."""
    if not manifest:
        return None
    for key in ("mesh", "layout", "parallel", "parallel_dims", "parallelism"):
        val = manifest.get(key)
        if isinstance(val, dict):
            names = val.get("mesh_dim_names") or val.get("dim_names") or val.get("names")
            shape = val.get("mesh_shape") or val.get("shape") or val.get("sizes")
            if isinstance(names, list) and isinstance(shape, list) and len(names) == len(shape):
                return [(str(n), int(s)) for n, s in zip(names, shape)]
            axes = [(k, v) for k, v in val.items() if dim_from_desc(str(k)) in _KNOWN_DIMS
                    and isinstance(v, int)]
            if axes:
                # torchtitan order: pp, dp(_replicate/_shard), cp, tp (innermost)
                order = {"pp": 0, "dp": 1, "fsdp": 2, "ep": 3, "cp": 4, "tp": 5}
                return sorted(((str(k), int(v)) for k, v in axes),
                              key=lambda kv: order.get(dim_from_desc(kv[0]) or "", 9))
    return None


def _mesh_groups(axes: list[tuple[str, int]]) -> dict[tuple[int, ...], str]:
    """Every rank set that varies along exactly one mesh axis -> that axis's dim."""
    sizes = [s for _, s in axes]
    out: dict[tuple[int, ...], str] = {}
    n = 1
    for s in sizes:
        n *= s
    strides = []
    acc = 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= s
    strides.reverse()
    for ai, (name, size) in enumerate(axes):
        dim = dim_from_desc(name)
        if dim is None or size <= 1:
            continue
        for r in range(n):
            if (r // strides[ai]) % size != 0:
                continue
            out[tuple(r + k * strides[ai] for k in range(size))] = dim
    return out


def _structure_dim(ranks: list[int], world_size: int | None) -> str | None:
    if len(ranks) < 2:
        return None
    if world_size is not None and len(ranks) == world_size:
        return "world"
    diffs = {b - a for a, b in zip(ranks, ranks[1:])}
    if diffs == {1}:
        return "tp"
    if len(diffs) == 1:
        return "dp"
    return None


def _groups(store: RunStore) -> list[dict[str, Any]]:
    """Process groups from the table, plus groups only the collectives mention."""
    groups: dict[str, dict[str, Any]] = {}
    for row in store.table("process_groups").to_pylist():
        groups[row["pg_name"]] = {"pg_name": row["pg_name"], "pg_desc": row.get("pg_desc"),
                                  "ranks": sorted(row.get("ranks") or []),
                                  "parser_dim": row.get("dim")}
    coll = store.table("collectives", ["pg_name", "pg_desc", "group_ranks"])
    if coll.num_rows:
        seen = coll.group_by(["pg_name", "pg_desc"]).aggregate([]).to_pylist()
        for row in seen:
            name = row["pg_name"]
            if name is None or name in groups:
                continue
            groups[name] = {"pg_name": name, "pg_desc": row["pg_desc"], "ranks": [], "parser_dim": None}
        missing = [n for n, g in groups.items() if not g["ranks"]]
        if missing:
            sub = coll.filter(pc.is_in(coll["pg_name"], value_set=pa.array(missing)))
            for row in sub.to_pylist():
                g = groups[row["pg_name"]]
                if not g["ranks"] and row["group_ranks"]:
                    g["ranks"] = sorted(row["group_ranks"])
    return list(groups.values())


def world_size_of(store: RunStore) -> int | None:
    ws = [w for w in store.table("ranks", ["world_size"]).column("world_size").to_pylist() if w]
    if ws:
        return max(ws)
    man = store.manifest or {}
    if isinstance(man.get("world_size"), int):
        return man["world_size"]
    return None


@dataclass(frozen=True)
class LayoutResult(AnalyzerResult):
    dims: dict[str, str] = field(default_factory=dict)
    """pg_name -> dim (`group_dims` of the section)."""

    @property
    def groups(self) -> list[dict[str, Any]]:
        return (self.section or {}).get("groups", [])


def dims_of(layout: LayoutResult | None) -> dict[str, str]:
    """pg_name -> dim of a layout that may be missing ({} then)."""
    return layout.dims if layout is not None else {}


def _classify_group(g: dict[str, Any], mesh_sets: dict[tuple[int, ...], str],
                    world_size: int | None) -> dict[str, Any]:
    """One `groups` row: the group's dim and which evidence named it."""
    ranks = [int(r) for r in g["ranks"]]
    dim, source = None, "none"
    d = dim_from_desc(g["pg_desc"])
    if d == "world" and tuple(ranks) in mesh_sets:
        # the default group doing a dim's job (e.g. DDP over the whole world): the manifest says which
        dim, source = mesh_sets[tuple(ranks)], "manifest"
    elif d is not None:
        dim, source = d, "pg_desc"
    elif tuple(ranks) in mesh_sets:
        dim, source = mesh_sets[tuple(ranks)], "manifest"
    elif world_size is not None and len(ranks) == world_size and ranks:
        dim, source = "world", "structure"
    elif g["parser_dim"] and g["parser_dim"] != "unknown":
        dim, source = g["parser_dim"], "parser"
    else:
        d = _structure_dim(ranks, world_size)
        if d is not None:
            dim, source = d, "structure"
    confidence = _CONFIDENCE[source]
    if dim == "world":
        confidence = "high" if source in ("pg_desc", "structure") else confidence
    row = {
        "pg_name": g["pg_name"], "pg_desc": g["pg_desc"], "dim": dim or "unknown",
        "ranks": ranks, "size": len(ranks), "inferred_from": source, "confidence": confidence,
    }
    flat = flattened_from_desc(g["pg_desc"])
    if flat is not None and dim not in (None, "world", "unknown"):
        row["flattened"] = flat
    return row


def _mesh(out_groups: list[dict[str, Any]], all_ranks: list[int]
          ) -> tuple[dict[int, dict[str, int]], dict[str, int], dict[str, str]]:
    """Each rank's coordinates, the mesh shape and where each dim came from."""
    coords: dict[int, dict[str, int]] = {r: {} for r in all_ranks}
    mesh_shape: dict[str, int] = {}
    dims_from: dict[str, str] = {}
    # the mesh comes from the basic axes' groups; a flattened group (dp x cp) only stands in for a
    # dim no basic group shows
    basic_dims = {g["dim"] for g in out_groups if "flattened" not in g}
    for g in out_groups:
        dim = g["dim"]
        if dim in ("world", "unknown") or g["size"] < 1:
            continue
        if "flattened" in g and dim in basic_dims:
            continue
        mesh_shape.setdefault(dim, g["size"])
        if mesh_shape[dim] != g["size"]:
            mesh_shape[dim] = max(mesh_shape[dim], g["size"])
        prev = dims_from.get(dim)
        if prev is None or _CONFIDENCE[g["inferred_from"]] == "high":
            dims_from[dim] = g["inferred_from"]
        for i, r in enumerate(g["ranks"]):
            coords.setdefault(r, {}).setdefault(dim, i)
    # outermost first, as DeviceMesh/torchtitan order them (pp, dp, fsdp, cp, ep, tp), then any others
    order = ("pp", "dp", "fsdp", "cp", "ep", "tp")
    mesh_shape = dict(sorted(mesh_shape.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order
                                                                  else len(order), kv[0])))
    return coords, mesh_shape, dims_from


def analyze_layout(store: RunStore) -> LayoutResult:
    world_size = world_size_of(store)
    mesh_sets = _manifest_group_sets(store.manifest)
    if not mesh_sets:
        mesh_axes = _manifest_mesh(store.manifest)
        mesh_sets = _mesh_groups(mesh_axes) if mesh_axes else {}
    out_groups = [_classify_group(g, mesh_sets, world_size) for g in _groups(store)]
    out_groups.sort(key=lambda g: (str(g["dim"]), str(g["pg_name"])))
    coords, mesh_shape, dims_from = _mesh(out_groups, store.ranks())
    section = {
        "world_size": world_size,
        "groups": out_groups,
        "ranks": [{"rank": r, "coords": coords[r]} for r in sorted(coords)],
        "mesh_shape": mesh_shape,
        "dims_inferred_from": dims_from,
    }
    return LayoutResult(findings=[], section=section, dims=group_dims(section))


def group_dims(layout: dict[str, Any] | None) -> dict[str, str]:
    """pg_name -> dim from a layout section ({} when there is none)."""
    if not layout:
        return {}
    return {g["pg_name"]: g["dim"] for g in layout.get("groups", [])}


def rank_hosts(store: RunStore | None) -> dict[int, str]:
    """Rank → host name (ranks table: the trace's host name, else the run manifest's), for the ranks
    that name one."""
    if store is None or not store.has("ranks"):
        return {}
    return rank_to_host(None, store.table("ranks", ["rank", "hostname"]).to_pylist())


CORE_WAIT_SHARE = 0.10
"""A rank whose threads waited for a core at least this share of their runnable time over the profiled
steps (`ranks.cpu_wait_share`) did not have a core of its own, whatever the host's core count: another
process took cores (processor sharing: n runnable threads on c < n cores wait (n − c) / n of the time, a
third for one thread too many on 2 cores; a thread with a free core waits only for its wake-ups)."""


def cpu_hosts(store: RunStore | None) -> dict[int, str]:
    """CPU-only ranks (no kernel in the trace) → hostname (ranks table), on hosts whose ranks share cores:
    more ranks than the host's recorded CPU cores, cores unknown, or a rank of the host recorded waiting for
    a core (`CORE_WAIT_SHARE`: a busy process beside a core per rank). Empty when any rank has a device."""
    if store is None or not store.has("ranks"):
        return {}
    t = store.table("ranks", ["rank", "hostname", "trace_kind", "host_cpus", "cpu_wait_share"]).to_pylist()
    if not t or any(r["trace_kind"] != "cpu" or not r["hostname"] for r in t):
        return {}
    hosts = rank_to_host(None, t)
    per_host = Counter(hosts.values())
    cpus = {int(r["rank"]): r["host_cpus"] for r in t}
    waited = {hosts[int(r["rank"])] for r in t if int(r["rank"]) in hosts
              and (r["cpu_wait_share"] or 0.0) >= CORE_WAIT_SHARE}
    return {r: h for r, h in hosts.items() if cpus[r] is None or per_host[h] > cpus[r] or h in waited}
