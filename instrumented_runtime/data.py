"""Seeded synthetic token data: every rank derives its own slice of the same global batch.

Sequences follow a noisy arithmetic progression (next = prev + stride mod V, with 10% random tokens), so the
loss can fall below log(V). The global batch of a step depends only on (seed, step): a single process and
any parallel layout see the same tokens, which is what the numerics tests compare.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.autograd.profiler import record_function

from .config import RunConfig


def global_batch(cfg: RunConfig, step: int, seq_len: int) -> torch.Tensor:
    """Token ids (global_batch_size, seq_len + 1) for `step`; identical on every rank."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    B, V = cfg.global_batch_size, cfg.model.vocab_size
    start = torch.randint(0, V, (B, 1), generator=g)
    stride = torch.randint(1, 8, (B, 1), generator=g)
    seq = (start + stride * torch.arange(seq_len + 1)) % V
    noise = torch.rand(B, seq_len + 1, generator=g) < 0.1
    return torch.where(noise, torch.randint(0, V, (B, seq_len + 1), generator=g), seq)


@dataclass
class LocalBatch:
    inputs: torch.Tensor    # (B_replica, T_local) token ids
    targets: torch.Tensor   # (B_replica, T_local) next-token ids


class SyntheticLoader:
    """This rank's (inputs, targets): its dp replica's rows, its cp x tp sequence chunk.

    `stall_s` > 0 sleeps inside `data:load` (the host/input-stall fault); `seq_factor` > 1 makes this
    replica's sequences longer (the uneven-sequence fault).
    """

    def __init__(self, cfg: RunConfig, dp_index: int, seq_shard_index: int, num_seq_shards: int,
                 *, stall_s: float = 0.0, seq_factor: int = 1) -> None:
        self.cfg = cfg
        self.dp_index = dp_index
        self.shard = seq_shard_index
        self.num_shards = num_seq_shards
        self.stall_s = stall_s
        self.seq_len = cfg.seq_len * seq_factor
        if self.seq_len % num_seq_shards:
            raise ValueError(f"sequence length {self.seq_len} is not divisible by cp*tp = {num_seq_shards}")

    def load(self, step: int) -> LocalBatch:
        with record_function("data:load"):
            if self.stall_s > 0:
                time.sleep(self.stall_s)
            tokens = global_batch(self.cfg, step, self.seq_len)
            rows = self.cfg.global_batch_size // self.cfg.layout.dp
            tokens = tokens[self.dp_index * rows:(self.dp_index + 1) * rows]
            T = self.seq_len // self.num_shards
            lo = self.shard * T
            return LocalBatch(inputs=tokens[:, lo:lo + T].contiguous(),
                              targets=tokens[:, lo + 1:lo + T + 1].contiguous())
