"""Mixture-of-experts feed-forward with expert parallelism: top-k routing, capacity, dispatch/combine all-to-all.

Per forward on each rank: the router (softmax over experts, top-k, gates renormalised when k > 1) assigns
each local token to k experts; each expert takes at most `capacity = ceil(capacity_factor · tokens · k / E)`
assignments from this rank (first choices before second choices, then token order, as GShard), the rest
are dropped (they contribute zero; the block's residual carries them). With an ep group the E experts are
sharded contiguously (E/ep per rank): kept tokens travel to their expert's rank with a differentiable
`all_to_all_single` (uneven, possibly zero splits), run through the expert MLPs, and come back the same
way; gates are applied on the routing rank. Without a group the same code runs with no communication, so
an EP run equals the single-process one.

The aux loss is Switch/GShard load balancing, `aux_loss_weight · E · Σ_e f_e · P_e` over this rank's tokens
(f_e: share of the N·k assignments routed to e before capacity; P_e: mean router probability of e).
`MoEConfig.router_bias` (expert → logit bias) is the routing-skew fault; `MoEConfig.router = "hash"` routes
token i's j-th choice to expert (i·k + j) mod E instead (every expert the same load: a balanced re-run).

Routing statistics go to the module-level `RoutingRecorder` (`get_routing_recorder()`): per forward, per
global expert, tokens routed here before capacity, dropped, capacity. Forwards run inside autograd's
backward (activation recomputation) are not counted.

Profiler labels: `ep:router`, `ep:dispatch`, `ep:experts`, `ep:combine`; the all-to-alls carry callers
`ep:dispatch:counts`, `ep:dispatch`, `ep:combine` (backward: `...:bwd`).
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from instrumented_runtime.comm import Comm, all_to_all_autograd, get_comm
from instrumented_runtime.device_time import device_wait


@dataclass(kw_only=True, slots=True)
class MoEConfig:
    """Routing of one MoE layer."""

    num_experts: int
    """Experts in the layer (global count); divisible by the ep degree."""
    top_k: int
    """Experts each token is routed to."""
    capacity_factor: float
    """Per-expert capacity = ceil(capacity_factor · tokens · top_k / num_experts) on the routing rank."""
    aux_loss_weight: float
    """Weight of the Switch/GShard load-balancing loss."""
    router_bias: dict[int, float] = field(default_factory=dict)
    """Fault knob: global expert id → bias added to its router logit."""
    router: str = "learned"
    """"learned" (top-k of the router's softmax) or "hash" (even: token i's j-th choice is (i·k + j) mod E)."""
    device_us_per_token: float = 0.0
    """Simulated accelerator time per routed token in the local experts (device_time.device_wait)."""

    def __post_init__(self) -> None:
        if self.num_experts < 1 or not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"MoEConfig: need 1 <= top_k ({self.top_k}) <= num_experts ({self.num_experts})")
        if self.capacity_factor <= 0:
            raise ValueError(f"MoEConfig: capacity_factor must be > 0, got {self.capacity_factor}")
        bad = [e for e in self.router_bias if not 0 <= int(e) < self.num_experts]
        if bad:
            raise ValueError(f"MoEConfig: router_bias names experts {bad} outside 0..{self.num_experts - 1}")


# ---- routing statistics ------------------------------------------------------------------------------

def routing_log_path(out_dir: str | os.PathLike, rank: int) -> Path:
    return Path(out_dir) / f"routing.rank{rank}.jsonl"


class RoutingRecorder:
    """Accumulates (step, layer, expert) routing counts; the train loop sets `step`/`profiled` and flushes.

    Several forwards of one layer in one step (micro-batches) add up: tokens, dropped and capacity are
    sums, `forwards` counts them.
    """

    def __init__(self) -> None:
        self.step: int | None = None
        self.profiled: bool = False
        self.enabled: bool = True
        self._lock = threading.Lock()
        self._rows: dict[tuple[int | None, int, int], dict[str, Any]] = {}

    def record(self, layer: int, tokens: list[int], dropped: list[int], capacity: int) -> None:
        """One routing call of `layer`: per global expert, tokens routed before capacity and dropped."""
        if not self.enabled or torch._C._current_graph_task_id() != -1:  # inside backward: recomputation
            return
        with self._lock:
            for expert, (n, d) in enumerate(zip(tokens, dropped)):
                key = (self.step, layer, expert)
                row = self._rows.get(key)
                if row is None:
                    row = self._rows[key] = {"step": self.step, "layer": layer, "expert": expert, "tokens": 0,
                                             "dropped": 0, "capacity": 0, "forwards": 0,
                                             "profiled": self.profiled}
                row["tokens"] += int(n)
                row["dropped"] += int(d)
                row["capacity"] += int(capacity)
                row["forwards"] += 1
                row["profiled"] = row["profiled"] or self.profiled

    def rows(self) -> list[dict[str, Any]]:
        """Rows not yet flushed, ordered by (step, layer, expert)."""
        with self._lock:
            keys = sorted(self._rows, key=lambda key: (-1 if key[0] is None else key[0], key[1], key[2]))
            return [dict(self._rows[key]) for key in keys]

    def flush(self, path: str | os.PathLike) -> int:
        """Append the accumulated rows to `path` (one JSON line each), clear them; returns rows written."""
        rows = self.rows()
        with open(path, "a") as fh:
            for row in rows:
                fh.write(json.dumps(row, separators=(",", ":")) + "\n")
        with self._lock:
            self._rows.clear()
        return len(rows)

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()


_RECORDER = RoutingRecorder()


def get_routing_recorder() -> RoutingRecorder:
    return _RECORDER


# ---- the layer ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Routing:
    """What the router decided for this rank's tokens (kept assignments sorted by global expert)."""

    token: torch.Tensor       # (M,) local token index of each kept assignment
    gate: torch.Tensor        # (M,) its gate weight (differentiable)
    kept_per_expert: torch.Tensor  # (E,) kept assignments per global expert
    tokens_per_expert: torch.Tensor  # (E,) assignments before capacity
    capacity: int
    aux_loss: torch.Tensor


class MoE(nn.Module):
    """Top-k MoE FFN; experts are GELU MLPs stacked as `w1` (E_local, d_model, d_ff), `w2` (E_local, d_ff, d_model)."""

    def __init__(self, d_model: int, d_ff: int, cfg: MoEConfig, layer_id: int, ep_group: Any | None) -> None:
        super().__init__()
        self.d_model, self.d_ff, self.cfg, self.layer_id = d_model, d_ff, cfg, layer_id
        self.router = nn.Linear(d_model, cfg.num_experts, bias=False)
        # All experts are initialised, then sliced: an EP rank holds exactly its slice of the 1-rank layer.
        self.w1 = nn.Parameter(torch.randn(cfg.num_experts, d_model, d_ff) * 0.02)
        self.w2 = nn.Parameter(torch.randn(cfg.num_experts, d_ff, d_model) * 0.02)
        self.ep_group: Any | None = None
        self.ep_size, self.ep_rank = 1, 0
        if ep_group is not None:
            self.shard_experts(ep_group)

    @property
    def num_local_experts(self) -> int:
        return self.cfg.num_experts // self.ep_size

    def expert_parameters(self) -> list[nn.Parameter]:
        """Parameters that differ across ep ranks (synced over expert-data-parallel, not ep)."""
        return [self.w1, self.w2]

    def shard_experts(self, group: Any) -> None:
        """Keep only this rank's experts of `group` (contiguous slice) and dispatch over it from now on."""
        if self.ep_group is not None:
            raise RuntimeError(f"MoE layer {self.layer_id}: experts already sharded")
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if self.cfg.num_experts % size:
            raise ValueError(f"MoE layer {self.layer_id}: {self.cfg.num_experts} experts not divisible by ep={size}")
        per = self.cfg.num_experts // size
        with torch.no_grad():
            self.w1 = nn.Parameter(self.w1[rank * per:(rank + 1) * per].clone())
            self.w2 = nn.Parameter(self.w2[rank * per:(rank + 1) * per].clone())
        self.ep_group, self.ep_size, self.ep_rank = group, size, rank

    # ---- phases ----

    def route(self, x: torch.Tensor) -> Routing:
        """Router logits → top-k → capacity; x: (N, d_model)."""
        cfg, n = self.cfg, x.shape[0]
        num_e, k = cfg.num_experts, cfg.top_k
        logits = self.router(x)                                                # (N, E)
        if cfg.router_bias:
            bias = torch.zeros(num_e, dtype=logits.dtype, device=logits.device)
            for e, b in cfg.router_bias.items():
                bias[int(e)] = float(b)
            logits = logits + bias
        probs = torch.softmax(logits, dim=-1)
        gate, expert = probs.topk(k, dim=-1)                                   # (N, k)
        if k > 1:
            gate = gate / gate.sum(dim=-1, keepdim=True)
        if cfg.router == "hash":  # every expert the same load (k <= E choices per token are distinct)
            expert = (torch.arange(n, device=x.device)[:, None] * k + torch.arange(k, device=x.device)) % num_e
            gate = torch.full_like(gate, 1.0 / k)
        capacity = math.ceil(cfg.capacity_factor * n * k / num_e)
        # Slot-major order: every token's first choice claims capacity before any second choice.
        flat_expert = expert.t().reshape(-1)                                   # (k·N,)
        flat_token = torch.arange(n, device=x.device).repeat(k)
        flat_gate = gate.t().reshape(-1)
        onehot = F.one_hot(flat_expert, num_e)                                 # (k·N, E)
        position = (onehot.cumsum(0) * onehot).sum(-1) - 1                      # place in its expert's queue
        keep = position < capacity
        tokens_per_expert = onehot.sum(0)
        kept = keep.nonzero().squeeze(1)
        order = torch.sort(flat_expert[kept], stable=True).indices
        kept = kept[order]
        f = tokens_per_expert.to(probs.dtype) / (n * k)
        aux = cfg.aux_loss_weight * num_e * (f * probs.mean(0)).sum()
        return Routing(token=flat_token[kept], gate=flat_gate[kept],
                       kept_per_expert=torch.bincount(flat_expert[kept], minlength=num_e),
                       tokens_per_expert=tokens_per_expert, capacity=capacity, aux_loss=aux)

    def _run_experts(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x rows grouped by local expert (counts[e] rows each) → expert MLP outputs, same order."""
        outs = []
        for e, part in enumerate(torch.split(x, counts)):
            outs.append(torch.matmul(F.gelu(torch.matmul(part, self.w1[e])), self.w2[e]))
        y = torch.cat(outs) if outs else x[:0]
        return device_wait(y, int(x.shape[0]), self.cfg.device_us_per_token)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (..., d_model) → (y of the same shape, aux loss scalar)."""
        shape = x.shape
        xf = x.reshape(-1, self.d_model)
        size, per = self.ep_size, self.num_local_experts
        with record_function("ep:router"):
            r = self.route(xf)
            dropped = (r.tokens_per_expert - r.capacity).clamp(min=0)
            get_routing_recorder().record(self.layer_id, r.tokens_per_expert.tolist(), dropped.tolist(), r.capacity)
        with record_function("ep:dispatch"):
            x_sorted = xf[r.token]                                             # (M, D), grouped by global expert
            if self.ep_group is not None:
                comm = get_comm()
                recv_counts = _exchange_counts(comm, r.kept_per_expert, self.ep_group)   # (ep, E_local)
                in_splits = r.kept_per_expert.view(size, per).sum(1).tolist()
                out_splits = recv_counts.sum(1).tolist()
                x_recv = all_to_all_autograd(x_sorted, out_splits, in_splits, self.ep_group, comm=comm,
                                             label="ep:dispatch")
            else:
                recv_counts = r.kept_per_expert.view(1, per)
                x_recv = x_sorted
            perm = _source_to_expert_order(recv_counts)
            x_local = x_recv[perm]                                             # grouped by local expert
        with record_function("ep:experts"):
            y_local = self._run_experts(x_local, recv_counts.sum(0).tolist())
        with record_function("ep:combine"):
            y_recv = y_local[torch.argsort(perm)]                              # back to source-major order
            if self.ep_group is not None:
                y_sorted = all_to_all_autograd(y_recv, in_splits, out_splits, self.ep_group, comm=comm,
                                               label="ep:combine")
            else:
                y_sorted = y_recv
            y = torch.zeros_like(xf).index_add(0, r.token, y_sorted * r.gate.unsqueeze(-1))
        return y.reshape(shape), r.aux_loss


def _exchange_counts(comm: Comm, kept_per_expert: torch.Tensor, group: Any) -> torch.Tensor:
    """All-to-all of per-expert counts: row s of the result = rows source rank s sends to each local expert."""
    size = dist.get_world_size(group)
    per = kept_per_expert.numel() // size
    send = kept_per_expert.to(torch.int64).contiguous()
    recv = torch.empty_like(send)
    comm.all_to_all_single(recv, send, [per] * size, [per] * size, group, label="ep:dispatch:counts")
    return recv.view(size, per)


def _source_to_expert_order(counts: torch.Tensor) -> torch.Tensor:
    """Permutation taking rows laid out (source, expert) to (expert, source); counts: (sources, experts)."""
    sources, experts = counts.shape
    starts = torch.cumsum(counts.reshape(-1), 0) - counts.reshape(-1)
    starts = starts.view(sources, experts)
    pieces = [torch.arange(int(starts[s, e]), int(starts[s, e] + counts[s, e]))
              for e in range(experts) for s in range(sources)]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)
