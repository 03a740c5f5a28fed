"""Ranks, coordinates, process groups and hosts of a layout on a cluster.

Mesh order (pp, dp, cp, tp), tp innermost, DeviceMesh-style group descriptions `mesh_<axis>`; expert
parallelism borrows the flattened dp × cp ranks in consecutive blocks of `ep` (`mesh_ep`), ranks holding
the same experts across blocks form `mesh_edp`. Gradients of dense parameters reduce over `mesh_dp_cp`
when cp > 1, else over `mesh_dp`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracekit.layout import ParallelLayout
from tracekit.simulate.specs import ClusterSpec

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
    layout: ParallelLayout
    cluster: ClusterSpec
    tp_across_hosts: bool = False
    groups: dict[str, Group] = field(default_factory=dict)  # pg_name -> group
    of_rank: dict[tuple[int, str], Group] = field(default_factory=dict)  # (rank, dim) -> group
    host: list[int] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.layout.world_size

    def coords(self, r: int) -> tuple[int, int, int, int]:
        """(pp, dp, cp, tp) coordinates of rank `r` (`ParallelLayout.coords`)."""
        c = self.layout.coords(r)
        return c["pp"], c["dp"], c["cp"], c["tp"]

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


def build_topology(layout: ParallelLayout, cluster: ClusterSpec, tp_across_hosts: bool = False) -> Topology:
    if layout.world_size > cluster.world:
        raise ValueError(f"layout needs {layout.world_size} GPUs, cluster {cluster.name} has {cluster.world}")
    t = Topology(layout, cluster, tp_across_hosts)
    t.host = [t.position(r) // cluster.gpus_per_host for r in range(layout.world_size)]
    L = layout
    sizes = {"pp": L.pp, "dp": L.dp, "cp": L.cp, "tp": L.tp, "dp_cp": L.dp * L.cp if L.cp > 1 and L.dp > 1 else 1,
             "ep": L.ep, "edp": (L.dp * L.cp) // L.ep if L.ep > 1 else 1}
    n = 1  # "0" is the default group
    t.groups["0"] = Group("0", "default_pg", "world", tuple(range(layout.world_size)), len(set(t.host)))
    for d in DIM_ORDER:
        if sizes[d] <= 1:
            continue
        for ranks in layout.groups(d):
            rs = tuple(sorted(ranks))
            g = Group(str(n), f"mesh_{d}", d, rs, len({t.host[r] for r in rs}))
            n += 1
            t.groups[g.name] = g
            for r in rs:
                t.of_rank[(r, d)] = g
    return t
