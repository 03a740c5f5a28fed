"""What a simulation is made of: the model, the cluster, the parallel layout (`tracekit.layout.ParallelLayout`)
and the injected faults.

Plain dataclasses with named presets, so the layout advisor and what-if replay can build them in code:

    from tracekit.simulate import ModelSpec, ClusterSpec, ParallelLayout, Faults, simulate
    res = simulate(ModelSpec.preset("llama-8b-like"), ClusterSpec.preset("4x8-h100"),
                   ParallelLayout(dp=4, tp=8), Faults(slow_gpu={13: 1.3}), steps=3, seed=0)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tracekit.layout import MULTI_CHUNK_SCHEDULES, ParallelLayout



@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer; `experts` > 0 makes every `moe_every`-th layer a top-k MoE layer."""

    name: str = "custom"
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 0  # 0 = heads (no GQA)
    ffn: int = 0  # 0 = 4 * hidden
    seq: int = 512
    vocab: int = 32000
    experts: int = 0
    top_k: int = 2
    moe_every: int = 1
    dtype_bytes: int = 2
    micro_batch_size: int = 1  # sequences per micro-batch per dp replica
    packed_attention: bool = True
    """Attention spans the whole micro-batch (its sequences packed, no document mask); False: each
    sequence attends within itself (cost linear, not quadratic, in the micro-batch size)."""
    router_skew: float = 0.0
    """σ of router logits drawn per (step, layer) and shared by every rank: the router's weights favour
    some experts for everybody (calibrated from a run's routing skew); 0: only per-rank noise."""
    capacity_factor: float = 0.0
    """Expert capacity per routing rank = ceil(factor × tokens × top_k ÷ experts); tokens beyond it are
    dropped (not computed, not sent). 0: no capacity limit."""

    @property
    def ffn_dim(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    def is_moe(self, layer: int) -> bool:
        return self.experts > 0 and layer % self.moe_every == self.moe_every - 1

    def layer_params(self, layer: int) -> int:
        """Parameters of one layer (before tp/ep sharding)."""
        h, d = self.hidden, self.hidden // self.heads
        attn = h * (self.heads * d) * 2 + h * (self.kv * d) * 2
        mlp = 3 * h * self.ffn_dim
        return attn + (mlp * self.experts + h * self.experts if self.is_moe(layer) else mlp) + 2 * h

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @classmethod
    def preset(cls, name: str) -> "ModelSpec":
        try:
            return MODEL_PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown model preset {name!r}; known: {', '.join(MODEL_PRESETS)}") from None


MODEL_PRESETS: dict[str, ModelSpec] = {
    "tiny": ModelSpec("tiny", layers=8, hidden=2048, heads=16, seq=4096, vocab=8192, micro_batch_size=2),
    "tiny-moe": ModelSpec("tiny-moe", layers=8, hidden=2048, heads=16, seq=4096, vocab=8192, experts=8, top_k=2,
                          micro_batch_size=2),
    "llama-8b-like": ModelSpec("llama-8b-like", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, seq=8192,
                               vocab=128256),
    "llama-70b-like": ModelSpec("llama-70b-like", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672,
                                seq=8192, vocab=128256),
    "moe-8x-like": ModelSpec("moe-8x-like", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, seq=4096,
                             vocab=32000, experts=8, top_k=2),
}


@dataclass(frozen=True)
class ClusterSpec:
    """hosts × gpus_per_host GPUs; bandwidths are NCCL-tests bus bandwidths (GB/s) per tier."""

    name: str = "custom"
    hosts: int = 1
    gpus_per_host: int = 8
    peak_tflops: float = 989.0  # dense bf16 per GPU
    efficiency: float = 0.45  # achieved fraction of peak in GEMM-heavy kernels
    intra_bw_gbs: float = 360.0  # NVLink-class bus bandwidth
    intra_lat_us: float = 8.0
    inter_bw_gbs: float = 45.0  # IB-class bus bandwidth per GPU
    inter_lat_us: float = 20.0
    hbm_gbs: float = 2600.0  # memory-bound kernels (norms, elementwise)
    hbm_gb: float = 80.0
    launch_us: float = 4.0  # cudaLaunchKernel on the host
    op_us: float = 6.0  # host time of an aten op around its launch
    device_name: str = "NVIDIA H100 80GB HBM3"
    compute_major: int = 9
    coll_costs: tuple[tuple[str, str, float, float], ...] = ()
    """Measured per-op costs (a calibrated cluster, e.g. gloo on CPU): (tier 'intra'|'inter', op, latency µs,
    bus bandwidth GB/s). An op listed here uses them on that tier instead of the tier's figures.
    Ops: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, sendrecv (P2P)."""
    coll_lat_per_hop: bool = False
    """`coll_costs` latencies are per ring hop: an op on n members pays it `ring_hops(op, n)` times. So
    calibrated from a CPU (gloo) run: gloo's ring algorithms send one TCP message per hop, so an 8-member
    all-gather waits 7 latencies where a 2-member one waits 1. False: the latency is per op, whatever the
    group size (the tier figures' NCCL-like model)."""

    @property
    def world(self) -> int:
        return self.hosts * self.gpus_per_host

    @classmethod
    def preset(cls, name: str) -> "ClusterSpec":
        if name in CLUSTER_PRESETS:
            return CLUSTER_PRESETS[name]
        import re

        m = re.fullmatch(r"(\d+)x(\d+)-(h100|a100)", name)
        if not m:
            raise ValueError(f"unknown cluster preset {name!r}; known: {', '.join(CLUSTER_PRESETS)} or HOSTSxGPUS-h100")
        base = CLUSTER_PRESETS["1x8-h100" if m.group(3) == "h100" else "1x8-a100"]
        return dataclasses.replace(base, name=name, hosts=int(m.group(1)), gpus_per_host=int(m.group(2)))


_H100 = ClusterSpec("1x8-h100")
_A100 = ClusterSpec("1x8-a100", peak_tflops=312.0, intra_bw_gbs=230.0, inter_bw_gbs=22.0, hbm_gbs=1900.0,
                    hbm_gb=80.0, device_name="NVIDIA A100-SXM4-80GB", compute_major=8)
CLUSTER_PRESETS: dict[str, ClusterSpec] = {
    "1x8-h100": _H100,
    "2x8-h100": dataclasses.replace(_H100, name="2x8-h100", hosts=2),
    "4x8-h100": dataclasses.replace(_H100, name="4x8-h100", hosts=4),
    "8x8-h100": dataclasses.replace(_H100, name="8x8-h100", hosts=8),
    "16x8-h100": dataclasses.replace(_H100, name="16x8-h100", hosts=16),
    "128x8-h100": dataclasses.replace(_H100, name="128x8-h100", hosts=128),
    "1x8-a100": _A100,
}


def validate_layout(layout: ParallelLayout, model: ModelSpec) -> None:
    """What the simulator needs of a layout beyond its own validation: a model it can split that way."""
    if layout.ep > 1 and (model.experts == 0 or model.experts % layout.ep):
        raise ValueError(f"ep {layout.ep} needs a MoE model whose experts ({model.experts}) it divides")
    if model.heads % layout.tp:
        raise ValueError(f"tp {layout.tp} must divide heads {model.heads}")
    if layout.num_stages > model.layers:
        raise ValueError(f"{layout.num_stages} pipeline stages for {model.layers} layers")
    if layout.schedule in MULTI_CHUNK_SCHEDULES and layout.pp > 1 and layout.microbatches % layout.pp:
        raise ValueError(f"schedule {layout.schedule} needs microbatches ({layout.microbatches}) a multiple of pp")


@dataclass
class Faults:
    """Injected faults. Each active one is written to .ground_truth.json with its answer.

    slow_gpu: rank → compute factor (> 1 is slower). slow_link: dim ('tp','dp','cp','ep','pp') → bandwidth
    divisor. slow_nic: host → bandwidth divisor for inter-host traffic touching that host. stage_layers:
    layers per (virtual) stage. router_bias: expert → router logit bias. host_stall: (rank, ms, every_k).
    slow_data: (rank, ms per step in the data loader). uneven_seq: (dp replica, factor). no_overlap: DDP
    buckets all-reduced after backward, synchronously. tp_across_hosts: the mesh is placed tp-outermost, so
    every tp group spans hosts."""

    slow_gpu: dict[int, float] = field(default_factory=dict)
    slow_link: dict[str, float] = field(default_factory=dict)
    slow_nic: dict[int, float] = field(default_factory=dict)
    stage_layers: tuple[int, ...] | None = None
    router_bias: dict[int, float] = field(default_factory=dict)
    host_stall: tuple[int, float, int] | None = None
    slow_data: tuple[int, float] | None = None
    uneven_seq: tuple[int, float] | None = None
    no_overlap: bool = False
    tp_across_hosts: bool = False

    def active(self) -> list[str]:
        """Names of the active faults (the fields that differ from their defaults)."""
        out = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v not in (None, False, {}, ()):
                out.append(f.name)
        return out

    def without(self, name: str) -> "Faults":
        default = Faults()
        return dataclasses.replace(self, **{name: getattr(default, name)})

    def to_dict(self) -> dict[str, Any]:
        d = {}
        for name in self.active():
            v = getattr(self, name)
            d[name] = {str(k): x for k, x in v.items()} if isinstance(v, dict) else (list(v) if isinstance(v, tuple) else v)
        return d


def parse_fault(text: str, faults: Faults) -> Faults:
    """CLI form → Faults: slow-gpu=R:F, slow-link=DIM:F, slow-nic=HOST:F, stage-layers=A,B,..,
    router-skew=E:BIAS, host-stall=R:MS[:EVERY], slow-data=R:MS, uneven-seq=DP:F, no-overlap, tp-across-hosts."""
    key, _, val = text.partition("=")
    key = key.strip().replace("_", "-")
    parts = [p for p in val.split(":")] if val else []
    try:
        if key == "slow-gpu":
            return dataclasses.replace(faults, slow_gpu={**faults.slow_gpu, int(parts[0]): float(parts[1])})
        if key == "slow-link":
            return dataclasses.replace(faults, slow_link={**faults.slow_link, parts[0]: float(parts[1])})
        if key == "slow-nic":
            return dataclasses.replace(faults, slow_nic={**faults.slow_nic, int(parts[0]): float(parts[1])})
        if key == "stage-layers":
            return dataclasses.replace(faults, stage_layers=tuple(int(x) for x in val.split(",")))
        if key == "router-skew":
            return dataclasses.replace(faults, router_bias={**faults.router_bias, int(parts[0]): float(parts[1])})
        if key == "host-stall":
            every = int(parts[2]) if len(parts) > 2 else 1
            return dataclasses.replace(faults, host_stall=(int(parts[0]), float(parts[1]), every))
        if key == "slow-data":
            return dataclasses.replace(faults, slow_data=(int(parts[0]), float(parts[1])))
        if key == "uneven-seq":
            return dataclasses.replace(faults, uneven_seq=(int(parts[0]), float(parts[1])))
        if key == "no-overlap":
            return dataclasses.replace(faults, no_overlap=True)
        if key == "tp-across-hosts":
            return dataclasses.replace(faults, tp_across_hosts=True)
    except (IndexError, ValueError) as e:
        raise ValueError(f"bad fault {text!r}: {e}") from None
    raise ValueError(f"unknown fault {key!r} (slow-gpu, slow-link, slow-nic, stage-layers, router-skew, "
                     "host-stall, slow-data, uneven-seq, no-overlap, tp-across-hosts)")


def ring_hops(op: str, n: int) -> int:
    """Sequential messages of `op` on a ring of `n` members: all_reduce 2(n−1) (reduce-scatter, then
    all-gather), all_gather / reduce_scatter / all_to_all / broadcast n−1, P2P 1."""
    if op == "sendrecv":
        return 1
    hops = max(n - 1, 1)
    return 2 * hops if op == "all_reduce" else hops
