"""The parallel layout: degrees, validation, the named DeviceMesh and the expert-parallel groups.

Mirrors torchtitan's `ParallelDims`: one object is the single source of truth for which dimensions are
on, how ranks map to coordinates, and which process group serves each dimension. The mesh axes are
ordered (pp, dp, cp, tp) so tp neighbours are adjacent ranks; DeviceMesh names each group
`mesh_<axis>`. Expert parallelism borrows from the flattened dp x cp ranks: consecutive blocks of `ep`
ranks of that flattened axis form an `mesh_ep` group, and ranks holding the same experts across blocks
form an `mesh_edp` (expert data-parallel) group.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported lazily so config-only users (and the launcher parent) stay light
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

    from .config import RunConfig


class MeshAxisName(str, enum.Enum):
    """Axis names of the DeviceMesh (and of the extra expert groups); `mesh_<value>` is the group desc."""

    PP = "pp"
    DP = "dp"
    CP = "cp"
    TP = "tp"
    EP = "ep"
    EDP = "edp"
    DP_CP = "dp_cp"

    def __str__(self) -> str:
        return self.value


MESH_AXES = (MeshAxisName.PP, MeshAxisName.DP, MeshAxisName.CP, MeshAxisName.TP)


@dataclass
class ParallelDims:
    pp: int
    dp: int
    cp: int
    tp: int
    ep: int
    world_size: int
    _mesh: "DeviceMesh | None" = field(default=None, repr=False)
    _groups: dict[str, "ProcessGroup"] = field(default_factory=dict, repr=False)
    _dp_cp_mesh: "DeviceMesh | None" = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._validate()

    @classmethod
    def from_config(cls, cfg: "RunConfig", world_size: int) -> "ParallelDims":
        return cls(pp=cfg.pp, dp=cfg.dp, cp=cfg.cp, tp=cfg.tp, ep=cfg.ep, world_size=world_size)

    def _validate(self) -> None:
        for name in ("pp", "dp", "cp", "tp", "ep"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.pp * self.dp * self.cp * self.tp != self.world_size:
            raise ValueError(f"pp*dp*cp*tp = {self.pp * self.dp * self.cp * self.tp} != world size "
                             f"{self.world_size}")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"ep {self.ep} must divide dp*cp = {self.dp * self.cp} (experts borrow dp x cp ranks)")

    # ---- enabled flags -------------------------------------------------------------------------------
    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    @property
    def dp_cp(self) -> int:
        """Ranks that share every non-expert parameter of a (pp, tp) coordinate: gradient-sync width."""
        return self.dp * self.cp

    @property
    def edp(self) -> int:
        """Replicas of each expert shard along dp x cp."""
        return self.dp_cp // self.ep

    # ---- coordinates ---------------------------------------------------------------------------------
    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of a global rank (row-major over pp, dp, cp, tp)."""
        tp_i = rank % self.tp
        cp_i = (rank // self.tp) % self.cp
        dp_i = (rank // (self.tp * self.cp)) % self.dp
        pp_i = rank // (self.tp * self.cp * self.dp)
        dpcp = dp_i * self.cp + cp_i
        return {"pp": pp_i, "dp": dp_i, "cp": cp_i, "tp": tp_i, "dp_cp": dpcp,
                "ep": dpcp % self.ep, "edp": dpcp // self.ep}

    def rank_of(self, pp: int, dp: int, cp: int, tp: int) -> int:
        return ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp

    def group_ranks(self) -> dict[str, list[list[int]]]:
        """Every group of every dimension as lists of global ranks (pure arithmetic, no torch)."""
        out: dict[str, list[list[int]]] = {}
        r = range
        out["pp"] = [[self.rank_of(p, d, c, t) for p in r(self.pp)] for d in r(self.dp) for c in r(self.cp)
                     for t in r(self.tp)]
        out["dp"] = [[self.rank_of(p, d, c, t) for d in r(self.dp)] for p in r(self.pp) for c in r(self.cp)
                     for t in r(self.tp)]
        out["cp"] = [[self.rank_of(p, d, c, t) for c in r(self.cp)] for p in r(self.pp) for d in r(self.dp)
                     for t in r(self.tp)]
        out["tp"] = [[self.rank_of(p, d, c, t) for t in r(self.tp)] for p in r(self.pp) for d in r(self.dp)
                     for c in r(self.cp)]
        dpcp = [[[self.rank_of(p, k // self.cp, k % self.cp, t) for k in r(self.dp_cp)] for t in r(self.tp)]
                for p in r(self.pp)]
        out["dp_cp"] = [g for per_pp in dpcp for g in per_pp]
        out["ep"] = [g[b * self.ep:(b + 1) * self.ep] for g in out["dp_cp"] for b in r(self.edp)]
        out["edp"] = [g[i::self.ep] for g in out["dp_cp"] for i in r(self.ep)]
        return out

    # ---- process groups ------------------------------------------------------------------------------
    def build_mesh(self, device_type: str = "cpu") -> "DeviceMesh | None":
        """Create the (pp, dp, cp, tp) DeviceMesh, the flattened dp_cp mesh and the ep / edp groups.

        Every rank must call this once, in the same order (new_group is collective).
        """
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if self.world_size == 1:
            return None
        names = tuple(a.value for a in MESH_AXES)
        # An explicit backend makes DeviceMesh create a `mesh_<axis>` group even for an axis spanning the
        # whole world (otherwise it reuses the default group, whose desc "default_pg" names no dimension).
        backend = dist.get_backend()
        self._mesh = init_device_mesh(device_type, tuple(getattr(self, n) for n in names), mesh_dim_names=names,
                                      backend_override={n: backend for n in names})
        self._dp_cp_mesh = self._mesh["dp", "cp"]._flatten("dp_cp", backend_override=backend)
        for name in names:
            self._groups[name] = self._mesh[name].get_group()
        self._groups["dp_cp"] = self._dp_cp_mesh.get_group()
        me = dist.get_rank()
        for dim in ("ep", "edp"):
            for ranks in self.group_ranks()[dim]:
                g = dist.new_group(ranks, group_desc=f"mesh_{dim}")
                if me in ranks:
                    self._groups[dim] = g
        return self._mesh

    @property
    def world_mesh(self) -> "DeviceMesh | None":
        return self._mesh

    def get_mesh(self, name: str | MeshAxisName) -> "DeviceMesh":
        """Sub-mesh of one axis (pp, dp, cp, tp or the flattened dp_cp)."""
        if self._mesh is None:
            raise RuntimeError("build_mesh() has not run (or world size is 1)")
        if str(name) == "dp_cp":
            return self._dp_cp_mesh
        return self._mesh[str(name)]

    def get_group(self, name: str | MeshAxisName) -> "ProcessGroup | None":
        """Process group of one dimension for this rank; None when the run is single-process."""
        if self._mesh is None:
            return None
        return self._groups[str(name)]

    def layout(self) -> dict[str, Any]:
        return {"pp": self.pp, "dp": self.dp, "cp": self.cp, "tp": self.tp, "ep": self.ep, "edp": self.edp,
                "mesh_axes": [a.value for a in MESH_AXES], "groups": self.group_ranks()}
