"""Injected performance faults that need code on the ranks (the others are plain settings: stage
layers, router bias, slow link delays in Comm, micro-batch count, DP bucketing) and their ground truth.

`ComputeSlowdown` is the slow-rank fault. Each transformer block's forward and backward (and the optimizer
step) is a region; at the end of a region the rank pays (factor - 1) x the region's CPU time back as real
matrix multiplies, so its compute becomes about `factor` times its peers' and shows up in the trace as
ordinary `aten::mm` ops inside the block, not as idle time. Regions are measured in this thread's CPU
time: waiting in a collective costs none (so only compute is multiplied), and on a shared box a preempted
region is not paid back (factor - 1) times over. With simulated device time (ModelConfig.device_us_per_token)
the rank's device waits are `factor` times longer too (`slow_down_blocks`), as a slower accelerator runs each
kernel longer: a sleep costs no CPU time, so the regions never pay it back a second time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import torch

from .config import RunConfig
from .parallel_dims import ParallelDims


class ComputeSlowdown:
    """Busy-work proportional to the CPU time of marked regions (see `region`, `mark_block_*`)."""

    def __init__(self, factor: float, *, chunk: int = 96) -> None:
        if factor < 1.0:
            raise ValueError(f"slow factor must be >= 1, got {factor}")
        self.factor = factor
        self.extra = factor - 1.0
        self.paid_s = 0.0
        self._debt_s = 0.0
        self._starts = threading.local()
        self._a = torch.randn(chunk, chunk)
        self._b = torch.randn(chunk, chunk)

    def begin(self) -> None:
        self._starts.t = time.thread_time()

    def end(self) -> None:
        start = getattr(self._starts, "t", None)
        if start is None:
            return
        self._starts.t = None
        self._debt_s += self.extra * (time.thread_time() - start)
        t0 = time.thread_time()
        deadline = t0 + self._debt_s
        with torch.no_grad():
            while time.thread_time() < deadline:
                torch.mm(self._a, self._b)
        spent = time.thread_time() - t0
        self._debt_s -= spent           # overshoot carries over as negative debt
        self.paid_s += spent

    def region(self) -> "_Region":
        return _Region(self)


class _Region:
    def __init__(self, slow: ComputeSlowdown) -> None:
        self.slow = slow

    def __enter__(self) -> None:
        self.slow.begin()

    def __exit__(self, *exc: Any) -> None:
        self.slow.end()


class _Mark(torch.autograd.Function):
    """Identity whose backward opens (block output) or closes (block input) a slow-down region, so the
    block's backward is a region too (autograd reaches the output's node first)."""

    @staticmethod
    def forward(ctx, x, slow, closes_in_backward):  # type: ignore[override]
        ctx.slow, ctx.closes = slow, closes_in_backward
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        if ctx.closes:
            ctx.slow.end()
        else:
            ctx.slow.begin()
        return g, None, None


def slow_down_blocks(blocks: Iterable[Any], slow: ComputeSlowdown) -> None:
    """Make `blocks` the slow rank's: their host compute is paid back (factor - 1)x (regions) and their
    simulated device time, the blocks' own and their local experts', is `factor` times longer."""
    for b in blocks:
        b.slowdown = slow
        b.device_us *= slow.factor
        if b.is_moe:
            b.moe.cfg.device_us_per_token *= slow.factor


def mark_block_input(x: torch.Tensor, slow: ComputeSlowdown) -> torch.Tensor:
    """Call at the start of a block's forward: opens the forward region, closes the backward one."""
    slow.begin()
    return _Mark.apply(x, slow, True) if x.requires_grad else x


def mark_block_output(y: torch.Tensor, slow: ComputeSlowdown) -> torch.Tensor:
    """Call at the end of a block's forward: closes the forward region, opens the backward one."""
    slow.end()
    return _Mark.apply(y, slow, False) if y.requires_grad else y


def ground_truth_faults(cfg: RunConfig, pd: ParallelDims) -> list[dict[str, Any]]:
    """Every active fault with its parameters and the ranks / groups / stages / experts it affects."""
    f = cfg.faults
    groups = pd.layout.groups()
    coords = pd.layout.coords
    out: list[dict[str, Any]] = []
    if f.slow_rank is not None and f.slow_factor > 1.0:
        c = coords(f.slow_rank)
        out.append({"kind": "slow_rank", "ranks": [f.slow_rank], "factor": f.slow_factor,
                    "coords": c, "expected_findings": ["straggler"],
                    "description": f"rank {f.slow_rank} does ~{f.slow_factor}x the compute of its peers"})
    if f.stage_layers is not None and cfg.layout.pp > 1 and len(set(f.stage_layers)) > 1:
        heavy = max(range(len(f.stage_layers)), key=lambda s: f.stage_layers[s])
        out.append({"kind": "stage_imbalance", "stage_layers": list(f.stage_layers), "stages": [heavy],
                    "ranks": [r for r in range(pd.world_size) if coords(r)["pp"] == heavy % cfg.layout.pp],
                    "expected_findings": ["pipeline_imbalance"],
                    "description": f"stage {heavy} holds {f.stage_layers[heavy]} of {sum(f.stage_layers)} layers"})
    if f.router_bias:
        moe_layers = [i for i in range(cfg.model.num_layers) if cfg.model.is_moe_layer(i)]
        out.append({"kind": "router_skew", "experts": sorted(f.router_bias),
                    "router_bias": {str(k): v for k, v in sorted(f.router_bias.items())}, "layers": moe_layers,
                    "ranks": list(range(pd.world_size)), "expected_findings": ["expert_routing_skew"],
                    "description": "router logits biased toward experts " + ",".join(map(str, sorted(f.router_bias)))})
    if f.no_overlap and (cfg.layout.dp * cfg.layout.cp > 1):
        out.append({"kind": "no_overlap", "dim": "dp", "dp_mode": cfg.layout.dp_mode, "groups": groups["dp_cp"],
                    "ranks": list(range(pd.world_size)),
                    "expected_findings": ["unoverlapped_collective", "communication_bound"],
                    "description": ("DDP: one bucket, all-reduce after backward, synchronous"
                                    if cfg.layout.dp_mode == "ddp"
                                    else "FSDP2: no explicit prefetch")})
    if cfg.layout.pp > 1 and cfg.layout.microbatches < cfg.layout.pp:
        out.append({"kind": "too_few_microbatches", "microbatches": cfg.layout.microbatches, "stages": cfg.layout.pp,
                    "ranks": list(range(pd.world_size)), "expected_findings": ["pipeline_bubble"],
                    "theoretical_bubble": (cfg.layout.pp - 1) / (cfg.layout.microbatches + cfg.layout.pp - 1),
                    "description": f"{cfg.layout.microbatches} micro-batches for {cfg.layout.pp} stages"})
    for dim, delay_s in sorted(f.slow_links.items()):
        gdim = "dp_cp" if dim == "dp" else dim
        gs = [g for g in groups.get(gdim, []) if len(g) > 1]
        out.append({"kind": "slow_link", "dim": dim, "pg_desc": f"mesh_{gdim}", "delay_s": delay_s,
                    "groups": gs, "ranks": sorted({r for g in gs for r in g}),
                    "expected_findings": ["low_bus_bandwidth", "communication_bound"],
                    "description": f"every collective in the {dim} groups is delayed {delay_s * 1e3:.1f} ms"})
    if f.host_stall_rank is not None and f.host_stall_ms > 0:
        out.append({"kind": "host_stall", "ranks": [f.host_stall_rank], "stall_ms": f.host_stall_ms,
                    "label": "data:load", "expected_findings": ["idle_host_bound", "straggler"],
                    "description": f"rank {f.host_stall_rank} sleeps {f.host_stall_ms} ms in data:load every step"})
    if f.uneven_seq_rank is not None and f.uneven_seq_factor > 1:
        dp_i = coords(f.uneven_seq_rank)["dp"]
        ranks = [r for r in range(pd.world_size) if coords(r)["dp"] == dp_i]
        out.append({"kind": "uneven_sequence_length", "dp_replica": dp_i, "ranks": ranks,
                    "seq_factor": f.uneven_seq_factor, "seq_len": cfg.seq_len * f.uneven_seq_factor,
                    "expected_findings": ["straggler"],
                    "description": f"dp replica {dp_i} trains on sequences {f.uneven_seq_factor}x longer"})
    if cfg.ranks_per_host:
        hosts = {r: r // cfg.ranks_per_host for r in range(pd.world_size)}
        spanning = {dim: [g for g in gs if len({hosts[r] for r in g}) > 1]
                    for dim, gs in groups.items() if dim in ("tp", "cp", "ep", "pp", "dp")}
        spanning = {d: g for d, g in spanning.items() if g}
        if spanning:
            out.append({"kind": "groups_span_hosts", "ranks_per_host": cfg.ranks_per_host, "groups": spanning,
                        "ranks": sorted({r for gs in spanning.values() for g in gs for r in g}),
                        "expected_findings": [],
                        "description": "groups crossing virtual hosts: " + ", ".join(sorted(spanning))})
    return out
