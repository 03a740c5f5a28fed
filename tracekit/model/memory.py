"""Memory per rank of a transformer under a parallel layout: pure functions over dataclasses.

    peak(stage) = static + in_flight(stage) · activations_per_microbatch(stage) + transient
    static      = parameters + gradients + optimizer state of the rank's share of the model
                  (tp divides the block matrices, ep the experts, pp the layers, FSDP shards all three
                  over its dp ways; DDP replicates)
    activations = per micro-batch and layer, tokens / cp (/ tp for the sequence-parallel parts) times
                  the saved widths of a block; with activation checkpointing a block keeps only its input
    in flight   = micro-batches whose activations a stage holds at once (`in_flight_microbatches`)

`calibrate` fits the per-token constants of activations (block and head) to one measured run, so the
structure comes from the layout and the scale from the measurement. The counter the measurement comes
from matters: CUDA's is absolute, the CPU profiler's counts only what was allocated while it recorded
(parameters and optimizer state built before the window are not in it: `Calibration.counts_static`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

SCHEDULES_ALL_IN_FLIGHT = ("gpipe",)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelShape:
    """A decoder-only transformer."""

    num_layers: int
    d_model: int
    d_ff: int
    num_heads: int
    vocab_size: int
    seq_len: int
    """Tokens per sequence (before context parallelism)."""
    microbatch_size: int
    """Sequences per micro-batch per data-parallel replica."""
    max_seq_len: int | None = None
    """Rows of a learned position embedding (None: no position embedding)."""
    moe_layers: tuple[int, ...] = ()
    num_experts: int = 0
    top_k: int = 0
    bytes_per_value: int = 4
    """Bytes per parameter / activation element (4: float32, 2: bf16)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    dp_mode: str = "ddp"
    """ddp (replicated parameters) or fsdp (parameters, gradients, optimizer state sharded over dp·cp)."""
    schedule: str = "1f1b"
    microbatches: int = 1
    virtual_stages: int = 1
    activation_checkpointing: bool = False
    stage_layers: tuple[int, ...] | None = None
    """Layers per pipeline stage; None splits evenly (the first stages take the remainder)."""
    optimizer_states: int = 2
    """State tensors per parameter (Adam/AdamW 2, SGD with momentum 1)."""

    @property
    def num_stages(self) -> int:
        return self.pp * self.virtual_stages


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    block_scale: float = 1.0
    """Measured / analytic activation bytes of a block."""
    head_scale: float = 1.0
    """Measured / analytic activation bytes of the LM head and loss."""
    transient_bytes: float = 0.0
    """Scratch on top of the held memory at the peak (workspace, a layer's temporaries)."""
    counts_static: bool = True
    """Whether the measured counter includes parameters and optimizer state (CUDA: yes; CPU profiler: no)."""


@dataclass(frozen=True, slots=True)
class StageMemory:
    stage: int
    params: int
    grads: int
    optimizer: int
    activations_per_microbatch: int
    in_flight: int
    transient: int
    peak: int
    """Predicted peak of what the calibration's counter sees."""


def in_flight_microbatches(schedule: str, p: int, m: int, stage: int, v: int = 1) -> int:
    """Micro-batches whose activations stage `stage` (0-based, of p ranks) holds at its peak.

    GPipe runs every forward before any backward: m. 1F1B warms up with p − s forwards, then alternates
    one forward and one backward: min(p − s, m). Interleaved 1F1B with v chunks per rank: each rank's
    warm-up is (p − s − 1)·2 + (v − 1)·p + 1 chunk forwards, i.e. in units of whole micro-batches
    (one chunk holds 1/v of the rank's layers) about that over v, capped at m."""
    if p <= 1:
        return 1
    if schedule in SCHEDULES_ALL_IN_FLIGHT:
        return m
    if v > 1 and schedule in ("interleaved", "zb"):
        warm = (p - stage - 1) * 2 + (v - 1) * p + 1
        return max(1, min(m, math.ceil(warm / v)))
    return max(1, min(p - stage, m))


def split_layers(num_layers: int, num_stages: int, stage_layers: tuple[int, ...] | None = None) -> list[int]:
    if stage_layers is not None:
        return list(stage_layers)
    base, extra = divmod(num_layers, num_stages)
    return [base + (1 if s < extra else 0) for s in range(num_stages)]


def block_params(shape: ModelShape, layout: Layout, layer: int) -> int:
    """Parameters of one block on one rank: attention and dense MLP divided by tp, experts by ep."""
    d, f = shape.d_model, shape.d_ff
    attn = 4 * d * d // layout.tp
    norms = 4 * d
    if layer in shape.moe_layers:
        ffn = d * shape.num_experts + 2 * d * f * shape.num_experts // layout.ep
    else:
        ffn = 2 * d * f // layout.tp
    return attn + norms + ffn


def stage_params(shape: ModelShape, layout: Layout, stage: int) -> int:
    """Parameters held by the rank of `stage` before FSDP sharding (embeddings on the first, head last)."""
    counts = split_layers(shape.num_layers, layout.num_stages, layout.stage_layers)
    first = sum(counts[:stage])
    n = sum(block_params(shape, layout, i) for i in range(first, first + counts[stage]))
    if stage == 0:
        n += shape.vocab_size * shape.d_model + (shape.max_seq_len or 0) * shape.d_model
    if stage == layout.num_stages - 1:
        n += 2 * shape.d_model + shape.vocab_size * shape.d_model
    return n


def tokens_per_microbatch(shape: ModelShape, layout: Layout) -> int:
    """Tokens of one micro-batch on one rank (context parallelism divides the sequence)."""
    return shape.microbatch_size * shape.seq_len // layout.cp


def block_activation_bytes(shape: ModelShape, layout: Layout, layer: int) -> float:
    """Analytic bytes a block keeps for backward per micro-batch (before calibration).

    Per token: the residual-stream tensors (norm inputs/outputs, residual adds: ~6 of width d, the
    sequence-parallel ones divided by tp), q, k, v and the attention output (4 d / tp), the attention
    probabilities (heads / tp × attended tokens), and the MLP's two hidden tensors (2 d_ff / tp) — or,
    for an MoE layer, top_k routed copies of the expert hidden state. Checkpointed: the input only."""
    t = tokens_per_microbatch(shape, layout)
    d, b = shape.d_model, shape.bytes_per_value
    if layout.activation_checkpointing:
        return float(t * d * b)
    attended = shape.seq_len  # ring attention: every key block passes through each rank
    width = 6 * d / layout.tp + 4 * d / layout.tp + 2 * shape.num_heads / layout.tp * attended
    if layer in shape.moe_layers:
        width += shape.top_k * (2 * shape.d_ff + 2 * d) + shape.num_experts
    else:
        width += 2 * shape.d_ff / layout.tp
    return float(t * width * b)


def head_activation_bytes(shape: ModelShape, layout: Layout) -> float:
    """Final norm, logits and the loss's softmax per micro-batch (last stage)."""
    t = tokens_per_microbatch(shape, layout)
    return float(t * (2 * shape.d_model + 2 * shape.vocab_size) * shape.bytes_per_value)


def _stage_activations(shape: ModelShape, layout: Layout, stage: int) -> tuple[float, float]:
    counts = split_layers(shape.num_layers, layout.num_stages, layout.stage_layers)
    first = sum(counts[:stage])
    blocks = sum(block_activation_bytes(shape, layout, i) for i in range(first, first + counts[stage]))
    head = head_activation_bytes(shape, layout) if stage == layout.num_stages - 1 else 0.0
    return blocks, head


def predict(shape: ModelShape, layout: Layout, calib: Calibration = Calibration()) -> list[StageMemory]:
    """Predicted memory of each pipeline stage's rank (one entry when there is no pipeline)."""
    out = []
    shard = layout.dp * layout.cp if layout.dp_mode == "fsdp" else 1
    b = shape.bytes_per_value
    for s in range(layout.num_stages):
        params = stage_params(shape, layout, s) * b // shard
        grads = params
        opt = params * layout.optimizer_states
        blocks, head = _stage_activations(shape, layout, s)
        per_mb = blocks * calib.block_scale + head * calib.head_scale
        flight = in_flight_microbatches(layout.schedule, layout.pp, layout.microbatches, s % layout.pp,
                                        layout.virtual_stages)
        held = (params + opt if calib.counts_static else 0) + grads
        peak = held + flight * per_mb + calib.transient_bytes
        out.append(StageMemory(stage=s, params=params, grads=grads, optimizer=opt,
                               activations_per_microbatch=int(per_mb), in_flight=flight,
                               transient=int(calib.transient_bytes), peak=int(peak)))
    return out


def calibrate(shape: ModelShape, layout: Layout, measured_peaks: list[int], *, counts_static: bool) -> Calibration:
    """Fit block scale, head scale and transient bytes to measured per-stage peaks (least squares;
    with fewer stages than unknowns the head shares the block scale and the transient is zero)."""
    import numpy as np

    base = Calibration(block_scale=0.0, head_scale=0.0, transient_bytes=0.0, counts_static=counts_static)
    rows, rhs = [], []
    for s, sm in enumerate(predict(shape, layout, base)):
        blocks, head = _stage_activations(shape, layout, s)
        rows.append([sm.in_flight * blocks, sm.in_flight * head, 1.0])
        rhs.append(measured_peaks[s] - sm.peak)
    a, y = np.array(rows), np.array(rhs, float)
    if len(rows) >= 3 and np.linalg.matrix_rank(a) == 3:
        block, head, transient = np.linalg.lstsq(a, y, rcond=None)[0]
    else:
        merged = a[:, 0] + a[:, 1]
        block = head = float(merged @ y / (merged @ merged))
        transient = 0.0
    return Calibration(block_scale=float(block), head_scale=float(head), transient_bytes=float(max(transient, 0.0)),
                       counts_static=counts_static)
