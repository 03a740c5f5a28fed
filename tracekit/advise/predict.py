"""Step time of a layout from the simulator, with few data-parallel replicas standing for all of them.

Data-parallel replicas run the same program: a layout with dp = 128 has the step time of the same layout
with dp = 2 whose dp collectives cost what 128 members cost (NCCL-tests bus factor of the full group, the
link tier the full group spans). `predict_step` simulates that reduced world, so a 1,024-GPU layout
costs about what a 16-GPU one does. Memory comes from tracekit.model.memory, not from here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tracekit.layout import ParallelLayout
from tracekit.simulate import ClusterSpec, Faults, ModelSpec
from tracekit.simulate import executor
from tracekit.simulate.api import T0_NS
from tracekit.simulate.key import answer_key
from tracekit.simulate.program import build_programs, make_world
from tracekit.simulate.topology import build_topology

SCALED_DIMS = ("dp", "dp_cp", "edp", "ep", "pp", "cp", "tp")


@dataclass(frozen=True)
class StepPrediction:
    step_ns: int
    simulated_ranks: int
    """Ranks actually simulated (the reduced world)."""
    compute_ns: int = 0
    exposed_comm_ns: int = 0
    idle_ns: int = 0
    """Per step, mean over ranks: the parts of the step (GPU breakdown) that a layout change moves."""


def replicas_needed(layout: ParallelLayout, max_dp: int = 2) -> int:
    """Fewest dp replicas (a divisor of dp, at least min(dp, max_dp)) that keep ep's groups whole and keep
    an expert-data-parallel group (dp·cp/ep members) where the full layout has one: without it the reduced
    world has no expert-gradient all-reduce at all, which `full_size` can only rescale, not create
    (dp8 tp4 ep2 replayed at 51 ms where the full world takes 226: its 4-member expert all-reduce across
    hosts was gone)."""
    want = min(layout.dp, max_dp)
    full_edp = layout.dp * layout.cp // layout.ep
    for d in range(want, layout.dp + 1):
        if layout.dp % d or (d * layout.cp) % layout.ep:
            continue
        if full_edp > 1 and d * layout.cp // layout.ep < 2:
            continue
        return d
    return layout.dp


def _full_scale(layout: ParallelLayout, cluster: ClusterSpec) -> tuple[dict[str, int], dict[str, bool]]:
    """Group size and whether groups span hosts, per dim, at full scale (largest group of the dim)."""
    topo = build_topology(layout, cluster)
    size: dict[str, int] = {}
    inter: dict[str, bool] = {}
    for g in topo.groups.values():
        size[g.dim] = max(size.get(g.dim, 0), g.size)
        inter[g.dim] = inter.get(g.dim, False) or g.hosts > 1
    return size, inter


def predict_step(model: ModelSpec, cluster: ClusterSpec, layout: ParallelLayout, *, steps: int = 2, seed: int = 0,
                 max_dp: int = 2) -> StepPrediction:
    """Mean step time (slowest rank's GPU step window) of `layout` on `cluster`, fault-free."""
    dp_sim = replicas_needed(layout, max_dp)
    size, inter = _full_scale(layout, cluster)
    small = dataclasses.replace(layout, dp=dp_sim)
    w = make_world(model, cluster, small, Faults(), seed)
    if dp_sim != layout.dp:
        w.full_size = {d: n for d, n in size.items() if d in SCALED_DIMS}
    w.full_inter = {d: v for d, v in inter.items() if d in SCALED_DIMS}
    progs = build_programs(w, steps)
    executor.run(progs, T0_NS)
    executor.finish_colls(progs)
    key = answer_key(progs, (), steps)
    return StepPrediction(key["mean_step_ns"], small.world_size, **_parts(key))


def _parts(key: dict) -> dict[str, int]:
    rows = [s for r in key["ranks"] for s in r["steps"]]
    n = max(1, len(rows))
    return {k: int(sum(s[k] for s in rows) / n) for k in ("compute_ns", "exposed_comm_ns", "idle_ns")}


def tokens_per_step(model: ModelSpec, layout: ParallelLayout) -> int:
    """Tokens one training step consumes over the whole job."""
    return model.seq * model.micro_batch_size * layout.microbatches * layout.dp


def model_flops_per_token(model: ModelSpec) -> float:
    """6 × active parameters (forward + backward) plus attention's 12·layers·hidden·seq (causal: half)."""
    active = 0
    for layer in range(model.layers):
        p = model.layer_params(layer)
        if model.is_moe(layer):
            experts = 3 * model.hidden * model.ffn_dim * model.experts
            p = p - experts + experts * model.top_k // model.experts
        active += p
    active += model.embed_params  # the LM head's matmul
    return 6.0 * active + 6.0 * model.layers * model.hidden * model.seq


def mfu(model: ModelSpec, cluster: ClusterSpec, layout: ParallelLayout, step_ns: int) -> float:
    flops = model_flops_per_token(model) * tokens_per_step(model, layout)
    gpus = layout.world_size
    return flops / (step_ns * 1e-9) / (gpus * cluster.peak_tflops * 1e12) if step_ns > 0 else math.nan
