"""A tiny decoder-only transformer with MoE feed-forward layers, readable in one sitting (nanoGPT style).

The model is always built whole and identically on every rank (same seed), then `parallelize.py` cuts it:
tensor parallelism slices the attention / MLP weights in place (Megatron column / row parallel with
sequence parallelism), pipeline parallelism deletes the layers a stage does not own, context parallelism
swaps local attention for B2's ring attention, expert parallelism hands each MoE its ep group. The model
reads its parallel state from `self.par` (a `ParallelState`), so one forward serves every layout.

Shapes: B = micro-batch, T = tokens on this rank (sequence / (cp * tp)), D = d_model, H = heads on this
rank (num_heads / tp), Dh = head dim, V = vocab.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig
from .device_time import device_wait


@dataclass
class ParallelState:
    """What the forward pass needs to know about the layout (all None/1 for a single process)."""

    tp_group: Any = None
    cp_group: Any = None
    ep_group: Any = None
    tp: int = 1
    cp: int = 1
    seq_shard_index: int = 0
    """This rank's sequence chunk among cp * tp chunks (cp-major): its first position is index * T."""

    @property
    def sequence_parallel(self) -> bool:
        return self.tp > 1


class AuxLossToGrad(torch.autograd.Function):
    """Identity on `x` whose backward also back-propagates `aux * scale` (Megatron's aux-loss auto-scaler).

    Lets every pipeline stage add its MoE load-balancing loss without threading it to the last stage.
    """

    @staticmethod
    def forward(ctx, x, aux, scale):  # type: ignore[override]
        ctx.save_for_backward(aux)
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        (aux,) = ctx.saved_tensors
        return g, torch.full_like(aux, ctx.scale), None


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads          # becomes num_heads / tp after apply_tp
        self.head_dim = cfg.d_model // cfg.num_heads
        # Separate q/k/v so column-parallel slicing is one row range per matrix.
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)   # column parallel
        self.wk = nn.Linear(cfg.d_model, cfg.d_model, bias=False)   # column parallel
        self.wv = nn.Linear(cfg.d_model, cfg.d_model, bias=False)   # column parallel
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)   # row parallel

    def forward(self, x: torch.Tensor, par: ParallelState) -> torch.Tensor:
        from . import comm

        if par.sequence_parallel:
            x = comm.gather_from_sp(x, par.tp_group, dim=1, label="tp:attn:sp_all_gather")  # (B, T*tp, D)
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)         # (B, H, T', Dh)
        k = self.wk(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        if par.cp > 1:
            from .ring_attention import ring_attention

            y = ring_attention(q, k, v, par.cp_group, causal=True)                      # (B, H, T', Dh)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = self.wo(y.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim))    # (B, T', D) partial
        if par.sequence_parallel:
            y = comm.reduce_scatter_to_sp(y, par.tp_group, dim=1, label="tp:attn:sp_reduce_scatter")
        return y                                                                         # (B, T, D)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)   # column parallel
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)   # row parallel

    def forward(self, x: torch.Tensor, par: ParallelState) -> torch.Tensor:
        from . import comm

        if par.sequence_parallel:
            x = comm.gather_from_sp(x, par.tp_group, dim=1, label="tp:mlp:sp_all_gather")   # (B, T*tp, D)
        y = self.fc2(F.gelu(self.fc1(x)))                                                     # (B, T', D) partial
        if par.sequence_parallel:
            y = comm.reduce_scatter_to_sp(y, par.tp_group, dim=1, label="tp:mlp:sp_reduce_scatter")
        return y


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, router_bias: dict[int, float] | None = None) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.d_model)
        self.is_moe = cfg.is_moe_layer(layer_id)
        self.device_us = cfg.device_us_per_token
        self.aux_loss_scale = 1.0   # set by parallelize: 1 / (routing calls covering one global batch)
        self.slowdown: Any = None   # a faults.ComputeSlowdown on the slow rank
        self.checkpoint = False     # --activation-checkpointing (set by train.build_parts)
        if self.is_moe:
            from .moe import MoE, MoEConfig

            self.moe = MoE(cfg.d_model, cfg.d_ff,
                           MoEConfig(num_experts=cfg.num_experts, top_k=cfg.top_k,
                                     capacity_factor=cfg.capacity_factor, aux_loss_weight=cfg.aux_loss_weight,
                                     router_bias=dict(router_bias or {}), router=cfg.router,
                                     device_us_per_token=cfg.device_us_per_token),
                           layer_id, None)
        else:
            self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, par: ParallelState) -> torch.Tensor:   # x: (B, T, D)
        if self.checkpoint and torch.is_grad_enabled():
            # activation checkpointing: keep only the block input; backward re-runs the block's forward
            return torch.utils.checkpoint.checkpoint(self._run, x, par, use_reentrant=False)
        return self._run(x, par)

    def _run(self, x: torch.Tensor, par: ParallelState) -> torch.Tensor:
        if self.slowdown is not None:   # the slow-rank fault (faults.ComputeSlowdown)
            from .faults import mark_block_input, mark_block_output

            return mark_block_output(self._forward(mark_block_input(x, self.slowdown), par), self.slowdown)
        return self._forward(x, par)

    def _forward(self, x: torch.Tensor, par: ParallelState) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), par)
        h = self.ffn_norm(x)
        if self.is_moe:
            # Tokens of this rank's sequence shard are routed here (experts are not tensor-parallel).
            y, aux = self.moe(h)
            y = AuxLossToGrad.apply(y, aux, self.aux_loss_scale)
        else:
            y = self.mlp(h, par)
        out = x + y
        return device_wait(out, out.shape[0] * out.shape[1], self.device_us)


class Transformer(nn.Module):
    """Token + learned position embedding, `num_layers` blocks, final norm, LM head (untied).

    Pipeline stages keep a subset of `layers` (a ModuleDict keyed by global layer id, so parameter names
    stay stable) and set the parts they do not own to None.
    """

    def __init__(self, cfg: ModelConfig, router_bias: dict[int, float] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb: nn.Embedding | None = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.layers = nn.ModuleDict({str(i): Block(cfg, i, router_bias) for i in range(cfg.num_layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(cfg.d_model)
        self.lm_head: nn.Linear | None = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.par = ParallelState()
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """First stage: x = token ids (B, T); later stages: hidden states (B, T, D).

        Returns hidden states (B, T, D), or logits (B, T, V) on the stage that holds the LM head.
        """
        if self.tok_emb is not None:
            T = x.shape[1]
            start = self.par.seq_shard_index * T
            if start + T > self.cfg.max_seq_len:
                raise ValueError(f"positions up to {start + T} exceed max_seq_len {self.cfg.max_seq_len}")
            pos = torch.arange(start, start + T, device=x.device)
            x = self.tok_emb(x) + self.pos_emb(pos)                                  # (B, T, D)
        for layer in self.layers.values():
            x = layer(x, self.par)
        if self.norm is not None:
            x = self.norm(x)
        if self.lm_head is not None:
            x = self.lm_head(x)                                                      # (B, T, V)
        return x


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropy over the tokens given (scaled to a global mean by the caller)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def describe(cfg: ModelConfig) -> str:
    moe = [i for i in range(cfg.num_layers) if cfg.is_moe_layer(i)]
    return (f"{cfg.num_layers} layers d={cfg.d_model} heads={cfg.num_heads} ff={cfg.d_ff} vocab={cfg.vocab_size}"
            f" moe_layers={moe} experts={cfg.num_experts} top{cfg.top_k}")

