"""Typed configuration of one reference-runtime run: parallel layout, training, profiling and faults.

`parse_args` turns the command line of `python -m instrumented_runtime` (DESIGN §7) into a `RunConfig`;
every rank and the launcher read the same `RunConfig`, and `.ground_truth.json` serialises it verbatim.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tracekit.layout import DP_MODES, SCHEDULES, ParallelLayout

LAYOUT_OPTIONS = ("pp", "dp", "cp", "tp", "ep", "dp_mode", "schedule", "microbatches", "virtual_stages",
                  "activation_checkpointing")
"""The command line's layout options (ParallelLayout fields), in the order .ground_truth.json lists them."""
SLOW_LINK_DIMS = ("dp", "tp", "cp", "ep", "pp", "edp")
ROUTERS = ("learned", "hash")


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Shape of the tiny decoder-only MoE transformer (see model.py)."""

    vocab_size: int = 256
    """Number of token ids."""
    d_model: int = 64
    """Residual stream width."""
    num_heads: int = 4
    """Attention heads; must be divisible by tp."""
    num_layers: int = 4
    """Transformer blocks (split over pipeline stages)."""
    d_ff: int = 128
    """Hidden width of the dense MLP and of each expert."""
    max_seq_len: int = 256
    """Learned positional embedding length (>= the longest sequence, including --uneven-seq-rank)."""
    moe_every: int = 2
    """Block i uses an MoE feed-forward when (i + 1) % moe_every == 0; 0 means no MoE at all."""
    num_experts: int = 4
    """Experts per MoE layer; must be divisible by ep."""
    top_k: int = 2
    """Experts each token is routed to."""
    capacity_factor: float = 1.25
    """Per-expert capacity = ceil(capacity_factor * tokens * top_k / num_experts) on the routing rank."""
    aux_loss_weight: float = 0.01
    """Weight of the load-balancing auxiliary loss."""
    device_us_per_token: float = 0.0
    """Simulated accelerator time (µs per token per block, and per routed token in each expert; backward
    twice as long): ranks wait it out as a host waits on its GPU, so pipeline stages and expert-parallel
    ranks work side by side even on a box with fewer cores than ranks. 0: off."""
    router: str = "learned"
    """MoE routing: "learned" (softmax router, top-k) or "hash" (token i's j-th choice is expert (i·k + j) mod
    E, gates 1/k, as Hash Layers route: every expert gets the same load; the router still runs)."""

    def __post_init__(self) -> None:
        if self.device_us_per_token < 0:
            raise ValueError("device_us_per_token must be >= 0")
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {self.router!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}")
        if self.moe_every < 0 or self.num_layers < 1:
            raise ValueError("num_layers must be >= 1 and moe_every >= 0")

    def is_moe_layer(self, layer_id: int) -> bool:
        return self.moe_every > 0 and (layer_id + 1) % self.moe_every == 0


@dataclass(kw_only=True, slots=True)
class FaultConfig:
    """Injected performance faults; each one that is active is listed in .ground_truth.json."""

    slow_rank: int | None = None
    """Global rank whose compute is slowed (busy-work proportional to its own op times)."""
    slow_factor: float = 1.0
    """Target compute multiplier on slow_rank (>= 1)."""
    stage_layers: list[int] | None = None
    """Layers per pipeline (virtual) stage, e.g. [3, 1]; None splits evenly."""
    router_bias: dict[int, float] = field(default_factory=dict)
    """Expert id -> logit bias added by every router (routing skew)."""
    no_overlap: bool = False
    """Data-parallel gradient communication forced after backward and synchronous."""
    slow_links: dict[str, float] = field(default_factory=dict)
    """Group dim (tp, cp, ep, dp, pp, edp) -> extra seconds per collective in that dim's groups."""
    host_stall_rank: int | None = None
    """Global rank whose data loader sleeps inside `data:load`."""
    host_stall_ms: float = 0.0
    """Milliseconds slept per step on host_stall_rank."""
    uneven_seq_rank: int | None = None
    """Global rank whose data-parallel replica gets sequences uneven_seq_factor times longer."""
    uneven_seq_factor: int = 2
    """Sequence-length multiplier of the uneven replica."""


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """Everything one run needs; identical on every rank."""

    layout: ParallelLayout = field(default_factory=lambda: ParallelLayout(virtual_stages=2))
    """The parallel layout (--dp --tp --pp --cp --ep --dp-mode --schedule --microbatches --virtual-stages
    --activation-checkpointing); ep's groups are drawn from the dp x cp ranks (torchtitan style)."""
    steps: int = 4
    profile_steps: int = 2
    """Active profiler steps; they are the last steps of the run, after one warm-up step (0: no profiler)."""
    global_batch_size: int | None = None
    """Sequences per step over all dp replicas; default dp * microbatches * 2."""
    seq_len: int = 64
    """Tokens per sequence (before context-parallel sharding)."""
    ddp_bucket_mb: float = 0.1
    """DDP gradient bucket size (MB); small so a tiny model still gets several buckets to overlap."""
    seed: int = 0
    lr: float = 3e-3
    dtype: str = "float32"
    ranks_per_host: int | None = None
    """Virtual host size for topology studies: rank r is on host `host{r // N}`."""
    out: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {self.steps}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"--dtype must be float32 or float64, got {self.dtype!r}")
        lay = self.layout
        if self.global_batch_size is None:
            self.global_batch_size = lay.dp * lay.microbatches * 2
        if self.global_batch_size % (lay.dp * lay.microbatches):
            raise ValueError(f"global batch {self.global_batch_size} is not divisible by dp*microbatches"
                             f" = {lay.dp * lay.microbatches}")
        if lay.tp > 1 and self.model.num_heads % lay.tp:
            raise ValueError(f"--num-heads {self.model.num_heads} is not divisible by --tp {lay.tp}")
        if lay.tp > 1 and self.model.d_ff % lay.tp:
            raise ValueError(f"--d-ff {self.model.d_ff} is not divisible by --tp {lay.tp}")
        if self.model.moe_every and self.model.num_experts % lay.ep:
            raise ValueError(f"--num-experts {self.model.num_experts} is not divisible by --ep {lay.ep}")
        if self.seq_len % (lay.cp * lay.tp):
            raise ValueError(f"--seq-len {self.seq_len} is not divisible by cp*tp = {lay.cp * lay.tp}")
        stages = lay.num_stages
        layers = self.faults.stage_layers
        if layers is not None and lay.pp > 1 and (len(layers) != stages or sum(layers) != self.model.num_layers
                                                  or min(layers) < 1):
            raise ValueError(f"--stage-layers {layers} must list {stages} counts >= 1 summing to "
                             f"{self.model.num_layers} layers")
        if layers is None and self.model.num_layers < stages:
            raise ValueError(f"{self.model.num_layers} layers cannot fill {stages} pipeline stages")
        if self.faults.slow_rank is not None and not 0 <= self.faults.slow_rank < self.world_size:
            raise ValueError(f"--slow-rank {self.faults.slow_rank} is not a rank of a {self.world_size}-rank job")
        for knob in ("host_stall_rank", "uneven_seq_rank"):
            r = getattr(self.faults, knob)
            if r is not None and not 0 <= r < self.world_size:
                raise ValueError(f"--{knob.replace('_', '-')} {r} is not a rank of a {self.world_size}-rank job")
        bad = [e for e in self.faults.router_bias if not 0 <= e < self.model.num_experts]
        if bad:
            raise ValueError(f"--router-bias names experts {bad} outside 0..{self.model.num_experts - 1}")
        longest = self.seq_len * (self.faults.uneven_seq_factor if self.faults.uneven_seq_rank is not None else 1)
        if longest > self.model.max_seq_len:
            raise ValueError(f"sequences of {longest} tokens exceed --max-seq-len {self.model.max_seq_len}")
        if self.profile_steps < 0 or (self.profile_steps and self.profile_steps + 1 > self.steps):
            raise ValueError(f"need steps >= profile_steps + 1 (one warm-up step); got steps={self.steps}, "
                             f"profile_steps={self.profile_steps}")

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def stage_split(self) -> ParallelLayout:
        """The layout with the stage-imbalance fault's layers per stage (`--stage-layers`, pipelines only)."""
        layers = self.faults.stage_layers if self.layout.pp > 1 else None
        return dataclasses.replace(self.layout, stage_layers=None if layers is None else tuple(layers))

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step over the whole job (counting the uneven replica's longer sequences)."""
        per_replica = self.global_batch_size // self.layout.dp * self.seq_len
        total = per_replica * self.layout.dp
        if self.faults.uneven_seq_rank is not None:
            total += per_replica * (self.faults.uneven_seq_factor - 1)
        return total

    def to_dict(self) -> dict[str, Any]:
        """Flat, as the command line spells it (the layout's options at the top level): .ground_truth.json
        and the trip to forked ranks."""
        d = dataclasses.asdict(self)
        lay = d.pop("layout")
        return {**{k: lay[k] for k in LAYOUT_OPTIONS}, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        d = dict(d)
        model = ModelConfig(**d.pop("model", {}))
        faults_d = dict(d.pop("faults", {}))
        faults_d["router_bias"] = {int(k): float(v) for k, v in faults_d.get("router_bias", {}).items()}
        return cls.build(model=model, faults=FaultConfig(**faults_d), **d)

    @classmethod
    def build(cls, **kw: Any) -> "RunConfig":
        """A RunConfig from flat keyword arguments: the layout's options (LAYOUT_OPTIONS; virtual_stages
        defaults to 2) go into `layout`, the rest are RunConfig's own."""
        lay = {k: kw.pop(k) for k in LAYOUT_OPTIONS if k in kw}
        return cls(layout=ParallelLayout(**{"virtual_stages": 2, **lay}), **kw)


def _parse_kv(text: str, what: str, key_type: type, allowed: tuple[str, ...] | None = None) -> dict:
    out: dict = {}
    for item in filter(None, text.split(",")):
        if "=" not in item:
            raise argparse.ArgumentTypeError(f"{what}: expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        k = k.strip()
        if allowed is not None and k not in allowed:
            raise argparse.ArgumentTypeError(f"{what}: {k!r} is not one of {allowed}")
        out[key_type(k)] = float(v)
    return out


_EPILOG = """examples:
  python -m instrumented_runtime --dp 2 --out runs/ddp                      # 2-rank DDP
  python -m instrumented_runtime --pp 2 --microbatches 4 --schedule 1f1b --out runs/pp
  python -m instrumented_runtime --pp 2 --dp 2 --cp 2 --tp 2 --ep 4 --slow-rank 5 --slow-factor 2 --out runs/demo
  tracekit analyze runs/demo --out runs/demo-report
The output dir holds rank{R}.pt.trace.json.gz, comms.rank{R}.jsonl, routing.rank{R}.jsonl,
manifest.json and .ground_truth.json (config and injected faults)."""


def _field_doc(cls: type, name: str) -> str:
    """The docstring written under a dataclass field (used as its --help text)."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name
                and isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)):
            return str(nxt.value.value).replace("%", "%%")
    return ""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m instrumented_runtime",
                                description="Instrumented reference training runtime (tiny MoE transformer, "
                                            "pp x dp x cp x tp with ep over dp x cp). Launches its own gloo "
                                            "ranks (or runs under torchrun), profiles them and writes traces, "
                                            "collective logs, routing stats, manifest and ground truth.",
                                epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    dim_help = {"dp": "data-parallel degree (DDP or FSDP2 replicas)",
                "tp": "tensor(+sequence)-parallel degree (Megatron column/row parallel)",
                "pp": "pipeline-parallel stages (torch.distributed.pipelining)",
                "cp": "context-parallel degree (ring attention over the sequence)",
                "ep": "expert-parallel degree (experts sharded over dp x cp ranks; divides dp*cp)"}
    for dim in ("dp", "tp", "pp", "cp", "ep"):
        p.add_argument(f"--{dim}", type=int, default=1, help=dim_help[dim] + " (default 1)")
    p.add_argument("--dp-mode", choices=DP_MODES, default="ddp", help="data parallelism: DDP or FSDP2 fully_shard")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="pipeline schedule (default 1f1b)")
    p.add_argument("--microbatches", type=int, default=None, help="pipeline micro-batches (default: pp, or 1 without pp)")
    p.add_argument("--virtual-stages", type=int, default=2, help="model chunks per rank for interleaved/zb")
    p.add_argument("--steps", type=int, default=4, help="training steps (default 4)")
    p.add_argument("--profile-steps", type=int, default=2, help="profiled (active) steps at the end of the run; 0 = no profiler")
    p.add_argument("--global-batch-size", type=int, default=None, help="sequences per step over all replicas")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (default 64)")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="checkpoint every block (recompute its forward in backward; less activation memory)")
    p.add_argument("--ddp-bucket-mb", type=float, default=0.1, help="DDP gradient bucket size in MB")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and synthetic data")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="parameter/activation dtype")
    p.add_argument("--ranks-per-host", type=int, default=None,
                   help="label rank r with virtual host host{r // N} in the manifest (topology studies)")
    p.add_argument("--out", required=True, help="output directory for traces, logs, manifest and ground truth")
    m = p.add_argument_group("model")
    defaults = ModelConfig()
    for f in dataclasses.fields(ModelConfig):
        m.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(defaults, f.name)),
                       default=getattr(defaults, f.name), dest="model_" + f.name,
                       choices=ROUTERS if f.name == "router" else None,
                       help=f"{_field_doc(ModelConfig, f.name)} (default {getattr(defaults, f.name)})")
    f_ = p.add_argument_group("fault knobs (each recorded in .ground_truth.json)")
    doc = lambda name: _field_doc(FaultConfig, name)  # noqa: E731
    f_.add_argument("--slow-rank", type=int, default=None, help=doc("slow_rank"))
    f_.add_argument("--slow-factor", type=float, default=2.0, help=doc("slow_factor") + " (default 2.0)")
    f_.add_argument("--stage-layers", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help=doc("stage_layers") + " Given as e.g. 3,1.")
    f_.add_argument("--router-bias", type=lambda s: _parse_kv(s, "--router-bias", int), default={},
                    help=doc("router_bias") + " Given as EXPERT=BIAS[,EXPERT=BIAS], e.g. 3=2.0.")
    f_.add_argument("--no-overlap", action="store_true", help=doc("no_overlap"))
    f_.add_argument("--slow-link", type=lambda s: _parse_kv(s, "--slow-link", str, SLOW_LINK_DIMS), default={},
                    help=doc("slow_links") + " Given as DIM=SECONDS, e.g. tp=0.005.")
    f_.add_argument("--host-stall-rank", type=int, default=None, help=doc("host_stall_rank"))
    f_.add_argument("--host-stall-ms", type=float, default=50.0, help=doc("host_stall_ms") + " (default 50)")
    f_.add_argument("--uneven-seq-rank", type=int, default=None, help=doc("uneven_seq_rank"))
    f_.add_argument("--uneven-seq-factor", type=int, default=2, help=doc("uneven_seq_factor") + " (default 2)")
    return p


def parse_args(argv: list[str] | None = None) -> RunConfig:
    a = build_parser().parse_args(argv)
    model = ModelConfig(**{f.name: getattr(a, "model_" + f.name) for f in dataclasses.fields(ModelConfig)})
    faults = FaultConfig(
        slow_rank=a.slow_rank, slow_factor=a.slow_factor if a.slow_rank is not None else 1.0,
        stage_layers=a.stage_layers, router_bias=a.router_bias, no_overlap=a.no_overlap,
        slow_links=a.slow_link, host_stall_rank=a.host_stall_rank,
        host_stall_ms=a.host_stall_ms if a.host_stall_rank is not None else 0.0,
        uneven_seq_rank=a.uneven_seq_rank, uneven_seq_factor=a.uneven_seq_factor)
    microbatches = a.microbatches if a.microbatches is not None else max(a.pp, 1)
    return RunConfig.build(pp=a.pp, dp=a.dp, cp=a.cp, tp=a.tp, ep=a.ep, dp_mode=a.dp_mode, schedule=a.schedule,
                     microbatches=microbatches, virtual_stages=a.virtual_stages, steps=a.steps,
                     profile_steps=a.profile_steps, global_batch_size=a.global_batch_size, seq_len=a.seq_len,
                     ddp_bucket_mb=a.ddp_bucket_mb, activation_checkpointing=a.activation_checkpointing,
                     seed=a.seed, lr=a.lr, dtype=a.dtype, ranks_per_host=a.ranks_per_host, out=a.out,
                     model=model, faults=faults)
