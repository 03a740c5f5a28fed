"""The parallel layout: one class of parallel degrees for the whole project.

`ParallelLayout` holds the degrees (dp, tp, pp, cp, ep), how data parallelism runs (`dp_mode`), the
pipeline schedule, micro-batches, virtual stages, activation checkpointing and the layers per stage; it
validates them when built and answers the mesh arithmetic every layer needs: a rank's coordinates, the
rank at given coordinates, the ranks of a rank's group in a dimension, and the split of layers over stages.
The runtime (`instrumented_runtime/parallel_dims.py`), the simulator, the memory model and the layout
advisor all use it; none keeps its own copy of these formulas.

Mesh order is (pp, dp, cp, tp), row-major, tp innermost (tp neighbours are adjacent ranks), as the runtime
builds its DeviceMesh. Expert parallelism borrows the flattened dp × cp ranks (`dp_cp`): consecutive blocks
of `ep` of them form an `ep` group, ranks holding the same experts across blocks an `edp` group.

Imports nothing of tracekit but its errors: every layer may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")
"""Pipeline schedules; the last two run `virtual_stages` model chunks per pp rank."""
MULTI_CHUNK_SCHEDULES = ("interleaved", "zb")
DP_MODES = ("ddp", "fsdp")
"""ddp: parameters replicated, gradients all-reduced in buckets; fsdp: parameters, gradients and optimizer
state sharded over dp × cp (all-gather before use, reduce-scatter of gradients)."""
MESH_DIMS = ("pp", "dp", "cp", "tp")
"""The mesh's axes, outermost first."""
GROUP_DIMS = ("pp", "dp", "cp", "tp", "dp_cp", "ep", "edp")
"""Every dimension that has groups: the mesh axes, the flattened dp × cp, and the expert dimensions."""
DEGREES = ("dp", "tp", "pp", "cp", "ep")


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelLayout:
    """How a job is split over its ranks. Built once, validated, never changed (`dataclasses.replace`)."""

    dp: int = 1
    """Data-parallel replicas."""
    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline-parallel ranks."""
    cp: int = 1
    """Context-parallel degree (the sequence split over a ring)."""
    ep: int = 1
    """Expert-parallel degree; its groups are drawn from the dp × cp ranks, so it divides dp · cp."""
    dp_mode: str = "ddp"
    """One of DP_MODES."""
    schedule: str = "1f1b"
    """Pipeline schedule, one of SCHEDULES (meaningful when pp > 1)."""
    microbatches: int = 1
    """Micro-batches per step per data-parallel replica."""
    virtual_stages: int = 1
    """Model chunks per pp rank under the interleaved / zb schedules (`stages_per_rank` is what runs)."""
    activation_checkpointing: bool = False
    """Every block re-runs its forward in backward instead of keeping its activations."""
    stage_layers: tuple[int, ...] | None = None
    """Layers per pipeline stage (`num_stages` positive counts); None splits evenly (`split_layers`)."""
    sequence_parallel: bool = True
    """Under tp, norms and dropout run on sequence shards (activations between blocks divided by tp)."""
    bucket_mb: float = 25.0
    """DDP gradient bucket size (MB)."""

    def __post_init__(self) -> None:
        for name in (*DEGREES, "microbatches", "virtual_stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.dp_mode not in DP_MODES:
            raise ValueError(f"dp_mode must be one of {DP_MODES}, got {self.dp_mode!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r} not one of {SCHEDULES}")
        if self.dp_cp % self.ep:
            raise ValueError(f"ep {self.ep} must divide dp*cp = {self.dp_cp} (experts borrow dp x cp ranks)")
        if self.stage_layers is not None:
            counts = tuple(self.stage_layers)
            if len(counts) != self.num_stages or min(counts) < 1:
                raise ValueError(f"stage_layers {list(counts)} must list {self.num_stages} counts >= 1 "
                                 f"(one per pipeline stage)")
            object.__setattr__(self, "stage_layers", counts)

    # ---- sizes ---------------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Ranks of the job: pp · dp · cp · tp (ep borrows dp × cp ranks, adds none)."""
        return self.pp * self.dp * self.cp * self.tp

    @property
    def dp_cp(self) -> int:
        """Ranks that share every non-expert parameter of a (pp, tp) coordinate: gradient-sync width."""
        return self.dp * self.cp

    @property
    def edp(self) -> int:
        """Replicas of each expert shard along dp × cp."""
        return self.dp_cp // self.ep

    @property
    def fsdp(self) -> bool:
        return self.dp_mode == "fsdp"

    @property
    def stages_per_rank(self) -> int:
        """Model chunks each pp rank runs: `virtual_stages` under a multi-chunk schedule with pp > 1, else 1."""
        return self.virtual_stages if self.pp > 1 and self.schedule in MULTI_CHUNK_SCHEDULES else 1

    @property
    def num_stages(self) -> int:
        """Pipeline stages in total (virtual stages for the multi-chunk schedules)."""
        return self.pp * self.stages_per_rank

    def enabled(self, dim: str) -> bool:
        """Whether dimension `dim` (a degree, or dp_cp / edp) has more than one rank."""
        return self.size(dim) > 1

    def size(self, dim: str) -> int:
        """Ranks in one group of `dim` (any of GROUP_DIMS)."""
        if dim not in GROUP_DIMS:
            raise ValueError(f"unknown dimension {dim!r}; known: {', '.join(GROUP_DIMS)}")
        return getattr(self, dim)

    # ---- rank <-> coordinates ------------------------------------------------------------------------
    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of a global rank (row-major over pp, dp, cp, tp), with its dp_cp, ep and edp."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not a rank of a {self.world_size}-rank layout")
        tp_i = rank % self.tp
        cp_i = (rank // self.tp) % self.cp
        dp_i = (rank // (self.tp * self.cp)) % self.dp
        pp_i = rank // (self.tp * self.cp * self.dp)
        dpcp = dp_i * self.cp + cp_i
        return {"pp": pp_i, "dp": dp_i, "cp": cp_i, "tp": tp_i, "dp_cp": dpcp,
                "ep": dpcp % self.ep, "edp": dpcp // self.ep}

    def rank_of(self, coords: Mapping[str, int]) -> int:
        """The global rank at mesh coordinates `coords` (pp, dp, cp, tp; a missing axis is 0)."""
        c = {d: int(coords.get(d, 0)) for d in MESH_DIMS}
        for d in MESH_DIMS:
            if not 0 <= c[d] < getattr(self, d):
                raise ValueError(f"coordinate {d}={c[d]} outside 0..{getattr(self, d) - 1}")
        return ((c["pp"] * self.dp + c["dp"]) * self.cp + c["cp"]) * self.tp + c["tp"]

    def group_ranks(self, dim: str, rank: int) -> list[int]:
        """The ranks of `rank`'s group in `dim` (any of GROUP_DIMS), in group order."""
        self.coords(rank)  # validates the rank
        (group,) = [g for g in self.groups(dim) if rank in g]  # every rank is in exactly one group per dim
        return group

    def groups(self, dim: str | None = None):
        """Every group of `dim` as lists of global ranks (pure arithmetic); without `dim`, a dict of every
        dimension of GROUP_DIMS to its groups. Order: the other axes' coordinates row-major, as DeviceMesh
        creates them; ep groups are consecutive blocks of each dp_cp group, edp groups its strided slices."""
        if dim is None:
            return {d: self.groups(d) for d in GROUP_DIMS}
        self.size(dim)  # validates the name
        if dim in MESH_DIMS:
            others = [d for d in MESH_DIMS if d != dim]
            out = []
            for a in range(getattr(self, others[0])):
                for b in range(getattr(self, others[1])):
                    for c in range(getattr(self, others[2])):
                        fixed = dict(zip(others, (a, b, c)))
                        out.append([self.rank_of({**fixed, dim: i}) for i in range(getattr(self, dim))])
            return out
        dp_cp = [[self.rank_of({"pp": p, "dp": k // self.cp, "cp": k % self.cp, "tp": t}) for k in range(self.dp_cp)]
                 for p in range(self.pp) for t in range(self.tp)]
        if dim == "dp_cp":
            return dp_cp
        if dim == "ep":
            return [g[b * self.ep:(b + 1) * self.ep] for g in dp_cp for b in range(self.edp)]
        return [g[i::self.ep] for g in dp_cp for i in range(self.ep)]

    # ---- layers --------------------------------------------------------------------------------------
    def split_layers(self, n_layers: int) -> list[int]:
        """Layers per pipeline stage (`num_stages` counts): `stage_layers` when given, else `even_split`."""
        if self.stage_layers is None:
            if n_layers < self.num_stages:
                raise ValueError(f"{n_layers} layers cannot fill {self.num_stages} pipeline stages")
            return even_split(n_layers, self.num_stages)
        if sum(self.stage_layers) != n_layers:
            raise ValueError(f"stage_layers {list(self.stage_layers)} sum to {sum(self.stage_layers)}, "
                             f"not the model's {n_layers} layers")
        return list(self.stage_layers)

    def stage_layer_ids(self, n_layers: int) -> list[range]:
        """The layer ids of each pipeline stage (`split_layers`, consecutive)."""
        return layer_ranges(self.split_layers(n_layers))


def even_split(n_layers: int, n_stages: int) -> list[int]:
    """n_layers over n_stages as evenly as possible, the first stages taking the remainder."""
    if n_stages < 1:
        raise ValueError(f"need at least one stage, got {n_stages}")
    base, extra = divmod(n_layers, n_stages)
    return [base + (1 if s < extra else 0) for s in range(n_stages)]


def layer_ranges(counts: Sequence[int]) -> list[range]:
    """Consecutive layer ids for per-stage layer counts."""
    out, first = [], 0
    for c in counts:
        out.append(range(first, first + c))
        first += c
    return out


def rank_to_host(hosts: Mapping | Sequence | None, rows: Sequence[Mapping] = ()) -> dict[int, str]:
    """Rank → host name, from a manifest's `hosts` when it names them ({rank: host}, {host: [ranks]}, or a
    list indexed by rank), else from per-rank rows with `rank` and `hostname` (the ranks table); ranks
    without a name are left out."""
    if isinstance(hosts, Mapping) and hosts:
        out: dict[int, str] = {}
        for k, v in hosts.items():
            if isinstance(v, list):  # host → ranks
                out.update({int(r): str(k) for r in v})
            else:
                out[int(k)] = str(v)
        return out
    if isinstance(hosts, Sequence) and not isinstance(hosts, str) and hosts:
        return {i: str(h) for i, h in enumerate(hosts)}
    return {int(r["rank"]): str(r["hostname"]) for r in rows if r["hostname"]}
