"""Ranks, coordinates, process groups and hosts of a layout on a cluster.

Mesh order (pp, dp, cp, tp), tp innermost, DeviceMesh-style group descriptions `mesh_<axis>`; expert
parallelism borrows the flattened dp × cp ranks in consecutive blocks of `ep` (`mesh_ep`), ranks holding
the same experts across blocks form `mesh_edp`. Gradients of dense parameters reduce over `mesh_dp_cp`
when cp > 1, else over `mesh_dp`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from tracekit.simulate.specs import ClusterSpec, Layout

DIM_ORDER = ("pp", "dp", "cp", "tp", "dp_cp", "ep", "edp")


@dataclass
class Group:
    name: str  # pg_name: a global creation counter, as c10d numbers groups
    desc: str  # mesh_<dim>
    dim: str
    ranks: tuple[int, ...]
    hosts: int  # distinct hosts the group spans

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass
class Topology:
    layout: Layout
    cluster: ClusterSpec
    tp_across_hosts: bool = False
    groups: dict[str, Group] = field(default_factory=dict)  # pg_name -> group
    of_rank: dict[tuple[int, str], Group] = field(default_factory=dict)  # (rank, dim) -> group
    host: list[int] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.layout.world

    def coords(self, r: int) -> tuple[int, int, int, int]:
        L = self.layout
        tp_i = r % L.tp
        cp_i = (r // L.tp) % L.cp
        dp_i = (r // (L.tp * L.cp)) % L.dp
        pp_i = r // (L.tp * L.cp * L.dp)
        return pp_i, dp_i, cp_i, tp_i

    def rank_of(self, pp_i: int, dp_i: int, cp_i: int, tp_i: int) -> int:
        L = self.layout
        return ((pp_i * L.dp + dp_i) * L.cp + cp_i) * L.tp + tp_i

    def group(self, rank: int, dim: str) -> Group | None:
        return self.of_rank.get((rank, dim))

    def local_device(self, rank: int) -> int:
        return self.position(rank) % self.cluster.gpus_per_host

    def position(self, rank: int) -> int:
        """Slot of the rank on the cluster: rank order, or tp-outermost when the tp-across-hosts fault is on."""
        if not self.tp_across_hosts:
            return rank
        L = self.layout
        return (rank % L.tp) * (self.world // L.tp) + rank // L.tp

    def hostname(self, rank: int) -> str:
        return f"node{self.host[rank]:04d}"


def build_topology(layout: Layout, cluster: ClusterSpec, tp_across_hosts: bool = False) -> Topology:
    if layout.world > cluster.world:
        raise ValueError(f"layout needs {layout.world} GPUs, cluster {cluster.name} has {cluster.world}")
    t = Topology(layout, cluster, tp_across_hosts)
    t.host = [t.position(r) // cluster.gpus_per_host for r in range(layout.world)]
    members: dict[str, dict[tuple, list[int]]] = {d: {} for d in DIM_ORDER}
    L = layout
    for r in range(layout.world):
        pp_i, dp_i, cp_i, tp_i = t.coords(r)
        flat = dp_i * L.cp + cp_i
        keys = {
            "pp": (dp_i, cp_i, tp_i), "dp": (pp_i, cp_i, tp_i), "cp": (pp_i, dp_i, tp_i), "tp": (pp_i, dp_i, cp_i),
            "dp_cp": (pp_i, tp_i), "ep": (pp_i, tp_i, flat // L.ep), "edp": (pp_i, tp_i, flat % L.ep),
        }
        for d, k in keys.items():
            members[d].setdefault(k, []).append(r)
    sizes = {"pp": L.pp, "dp": L.dp, "cp": L.cp, "tp": L.tp, "dp_cp": L.dp * L.cp if L.cp > 1 and L.dp > 1 else 1,
             "ep": L.ep, "edp": (L.dp * L.cp) // L.ep if L.ep > 1 else 1}
    n = 1  # "0" is the default group
    t.groups["0"] = Group("0", "default_pg", "world", tuple(range(layout.world)), len(set(t.host)))
    for d in DIM_ORDER:
        if sizes[d] <= 1:
            continue
        for k in sorted(members[d]):
            rs = tuple(sorted(members[d][k]))
            g = Group(str(n), f"mesh_{d}", d, rs, len({t.host[r] for r in rs}))
            n += 1
            t.groups[g.name] = g
            for r in rs:
                t.of_rank[(r, d)] = g
    return t


@lru_cache(maxsize=64)
def stage_layers(num_layers: int, num_stages: int, explicit: tuple[int, ...] | None) -> tuple[tuple[int, ...], ...]:
    """Layer ids per stage: explicit counts, else as even as possible (earlier stages take the remainder)."""
    if explicit is not None:
        if len(explicit) != num_stages or sum(explicit) != num_layers or min(explicit) < 1:
            raise ValueError(f"stage layers {explicit} must be {num_stages} positive counts summing to {num_layers}")
        counts = list(explicit)
    else:
        base, extra = divmod(num_layers, num_stages)
        counts = [base + (1 if s < extra else 0) for s in range(num_stages)]
    out, i = [], 0
    for c in counts:
        out.append(tuple(range(i, i + c)))
        i += c
    return tuple(out)
