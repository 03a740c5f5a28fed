"""The parallel layout's process groups: the named DeviceMesh and the expert-parallel groups.

Mirrors torchtitan's `ParallelDims`. The degrees, their validation and the rank <-> coordinate arithmetic
are `tracekit.layout.ParallelLayout`'s (the project's one class of parallel degrees); this module adds
which process group serves each dimension. The mesh axes are
ordered (pp, dp, cp, tp) so tp neighbours are adjacent ranks; DeviceMesh names each group
`mesh_<axis>`. Expert parallelism borrows from the flattened dp x cp ranks: consecutive blocks of `ep`
ranks of that flattened axis form an `mesh_ep` group, and ranks holding the same experts across blocks
form an `mesh_edp` (expert data-parallel) group.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tracekit.layout import ParallelLayout

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
    """The layout's process groups on this rank: degrees, coordinates and group membership come from
    `layout` (tracekit.layout.ParallelLayout, the project's one class of parallel degrees); this object
    adds what needs torch — the DeviceMesh and the ep / edp groups."""

    layout: ParallelLayout
    world_size: int
    _mesh: "DeviceMesh | None" = field(default=None, repr=False)
    _groups: dict[str, "ProcessGroup"] = field(default_factory=dict, repr=False)
    _dp_cp_mesh: "DeviceMesh | None" = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.layout.world_size != self.world_size:
            raise ValueError(f"pp*dp*cp*tp = {self.layout.world_size} != world size {self.world_size}")

    @classmethod
    def from_config(cls, cfg: "RunConfig", world_size: int) -> "ParallelDims":
        return cls(layout=cfg.layout, world_size=world_size)

    # ---- process groups ------------------------------------------------------------------------------
    def build_mesh(self, device_type: str = "cpu") -> "DeviceMesh | None":
        """Create the (pp, dp, cp, tp) DeviceMesh, the flattened dp_cp mesh and the ep / edp groups.

        Every rank must call this once, in the same order (new_group is collective).
        """
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if self.world_size == 1:
            return None
        lay = self.layout
        names = tuple(a.value for a in MESH_AXES)
        # An explicit backend makes DeviceMesh create a `mesh_<axis>` group even for an axis spanning the
        # whole world (otherwise it reuses the default group, whose desc "default_pg" names no dimension).
        backend = dist.get_backend()
        self._mesh = init_device_mesh(device_type, tuple(getattr(lay, n) for n in names), mesh_dim_names=names,
                                      backend_override={n: backend for n in names})
        self._dp_cp_mesh = self._mesh["dp", "cp"]._flatten("dp_cp", backend_override=backend)
        for name in names:
            self._groups[name] = self._mesh[name].get_group()
        self._groups["dp_cp"] = self._dp_cp_mesh.get_group()
        me = dist.get_rank()
        for dim in ("ep", "edp"):
            for ranks in lay.groups(dim):
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

    def manifest_layout(self) -> dict[str, Any]:
        lay = self.layout
        return {"pp": lay.pp, "dp": lay.dp, "cp": lay.cp, "tp": lay.tp, "ep": lay.ep, "edp": lay.edp,
                "mesh_axes": [a.value for a in MESH_AXES], "groups": lay.groups()}
