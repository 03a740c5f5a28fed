"""Memory per rank of a transformer under a parallel layout: pure functions over dataclasses.

    peak(stage) = static + in_flight · activations_per_microbatch + gradients (when a backward already
                  ran before the peak) + transient
    static      = parameters + optimizer state of the rank's share of the model (tp divides the block
                  matrices, ep the experts, pp the layers, FSDP shards everything over dp·cp; DDP keeps
                  one more gradient-sized set of bucket buffers)
    activations = per micro-batch: the blocks' saved tensors (tokens / cp, the sequence-parallel parts
                  / tp), the embedding output on the first stage, the head on the last; with activation
                  checkpointing a block keeps only its input
    in flight   = micro-batches whose activations a stage holds at once (`in_flight_microbatches`)
    transient   = the backward working set at the peak (the MLP's hidden gradients on inner stages, the
                  logits' on the last), a re-run block under checkpointing, FSDP's unsharded block, and
                  the outputs a pipeline's last stage keeps for the whole step (torch.distributed.pipelining)

`calibrate` scales the analytic activations and transients to one measured run (per-stage peaks,
held activations and per-micro-batch footprints from the memory analysis), so the structure comes from
the layout and the scale from the measurement. Measurements taken on CPU count only memory allocated
while the profiler recorded: parameters and optimizer state built before are not in them
(`Calibration.counts_static=False`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from tracekit.document import as_section
from tracekit.document.model import MemoryRanksRow, MemorySection, MemoryStagesRow
from tracekit.layout import ParallelLayout


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
    """Rows of a learned position embedding (None: none)."""
    moe_layers: tuple[int, ...] = ()
    num_experts: int = 0
    top_k: int = 0
    bytes_per_value: int = 4
    """Bytes per parameter / activation element (4: float32, 2: bf16)."""
    ring_attention_saves_probs: bool = False
    """Context-parallel attention keeps each ring step's probabilities (a ring without a flash kernel)."""
    mlp_matrices: int = 2
    """Weight matrices of a (dense or expert) MLP: 2 (up, down), 3 with a gated unit (SwiGLU)."""
    vocab_parallel: bool = False
    """The embedding and the LM head are split over tp (Megatron-LM's vocab-parallel layers)."""
    pipeline_keeps_outputs: bool = True
    """A pipeline's last stage keeps every micro-batch's output (logits) to the step's end
    (torch.distributed.pipelining); False: each is freed after its backward (Megatron-LM, the simulator)."""
    tp_saves_gathered_input: bool = True
    """Under tensor + sequence parallelism the column-parallel layers keep their all-gathered input (2 d
    per token, not divided by tp); False: they keep the sequence-parallel shard and gather it again in
    backward (Megatron-LM, the simulator)."""
    optimizer_states: int = 2
    """State tensors per parameter (Adam/AdamW 2, SGD with momentum 1)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    block_scale: float = 1.0
    """Measured / analytic activation bytes of a block (and the embedding output)."""
    head_scale: float = 1.0
    """Measured / analytic activation bytes of the final norm, LM head and loss."""
    transient_scale: float = 1.0
    """Measured / analytic backward working set at the peak."""
    counts_static: bool = True
    """Whether the measured counter includes parameters and optimizer state (CUDA: yes; CPU profiler: no)."""
    static_bytes_per_param: float | None = None
    """Measured bytes that outlive a step (parameters, gradients, optimizer state, master copies) per
    parameter the rank holds; None: the analytic parameters + optimizer states (+ DDP buckets, + gradients
    once a backward ran)."""


@dataclass(frozen=True, slots=True)
class StageMemory:
    stage: int
    params: int
    grads: int
    optimizer: int
    activations_per_microbatch: int
    in_flight: int
    grads_at_peak: int
    transient: int
    peak: int
    """Predicted peak of what the calibration's counter sees."""


def in_flight_microbatches(schedule: str, p: int, m: int, stage: int, v: int = 1) -> int:
    """Micro-batches whose activations stage `stage` (0-based, of p ranks) holds at its peak.

    GPipe runs every forward before any backward: m. 1F1B warms up with p − s forwards, then alternates
    one forward and one backward: min(p − s, m). Interleaved 1F1B with v chunks per rank warms up with
    (p − s − 1)·2 + (v − 1)·p + 1 chunk forwards (a chunk is 1/v of the rank's layers), capped at m."""
    if p <= 1:
        return 1
    if schedule == "gpipe":
        return m
    if v > 1 and schedule in ("interleaved", "zb"):
        warm = (p - stage - 1) * 2 + (v - 1) * p + 1
        return max(1, min(m, -(-warm // v)))
    return max(1, min(p - stage, m))


def in_flight_chunks(schedule: str, p: int, m: int, rank: int, v: int) -> int:
    """Model-chunk forwards whose activations pp rank `rank` holds at its peak (interleaved schedules:
    its warm-up, (p − rank − 1)·2 + (v − 1)·p + 1, capped at m·v; otherwise one chunk per micro-batch)."""
    if v <= 1 or schedule not in ("interleaved", "zb"):
        return in_flight_microbatches(schedule, p, m, rank, 1)
    return max(1, min(m * v, (p - rank - 1) * 2 + (v - 1) * p + 1))


def _layers(layout: ParallelLayout, shape: ModelShape, stage: int) -> range:
    return layout.stage_layer_ids(shape.num_layers)[stage]


def block_params(shape: ModelShape, layout: ParallelLayout, layer: int) -> int:
    """Parameters of one block on one rank: attention and dense MLP divided by tp, experts by ep."""
    d, f, k = shape.d_model, shape.d_ff, shape.mlp_matrices
    ffn = (d * shape.num_experts + k * d * f * shape.num_experts // layout.ep if layer in shape.moe_layers
           else k * d * f // layout.tp)
    return 4 * d * d // layout.tp + 4 * d + ffn


def stage_params(shape: ModelShape, layout: ParallelLayout, stage: int) -> int:
    """Parameters held by the rank of `stage` before FSDP sharding (embeddings on the first, head last)."""
    n = sum(block_params(shape, layout, i) for i in _layers(layout, shape, stage))
    vocab = local_vocab(shape, layout) * shape.d_model
    if stage == 0:
        n += vocab + (shape.max_seq_len or 0) * shape.d_model
    if stage == layout.num_stages - 1:
        n += 2 * shape.d_model + vocab
    return n


def tokens_per_microbatch(shape: ModelShape, layout: ParallelLayout) -> int:
    """Tokens of one micro-batch on one rank (context parallelism divides the sequence)."""
    return shape.microbatch_size * shape.seq_len // layout.cp


def block_activation_bytes(shape: ModelShape, layout: ParallelLayout, layer: int,
                           checkpointed: bool | None = None) -> float:
    """Analytic bytes a block keeps for backward per micro-batch (before calibration).

    Per token: two norms' inputs and outputs (4 d), q, k, v and the attention output (4 d), the MLP's
    hidden tensors (2 d_ff) — all divided by tp under tensor(+sequence) parallelism, which adds the two
    gathered norm outputs the column-parallel layers keep (2 d). Context parallelism keeps every ring
    step's k, v (2 d · cp per local token) and, without a flash kernel, their probabilities
    (2 · heads · seq_len). An MoE layer keeps top_k routed copies of the expert hidden state instead of
    the MLP's. Checkpointed: the block input only."""
    t = tokens_per_microbatch(shape, layout)
    d, b, tp, cp = shape.d_model, shape.bytes_per_value, layout.tp, layout.cp
    if layout.activation_checkpointing if checkpointed is None else checkpointed:
        return float(t * d * b / tp)
    width = (6 * d + 2 * d * cp) / tp + (2 * d if tp > 1 and shape.tp_saves_gathered_input else 0)
    if cp > 1 and shape.ring_attention_saves_probs:
        width += 2 * shape.num_heads / tp * shape.seq_len
    if layer in shape.moe_layers:
        width += shape.top_k * (2 * shape.d_ff + 2 * d) + shape.num_experts
    else:
        width += 2 * shape.d_ff / tp
    return float(t * width * b)


def head_activation_bytes(shape: ModelShape, layout: ParallelLayout) -> float:
    """Final norm, logits and the loss's softmax per micro-batch (last stage)."""
    t = tokens_per_microbatch(shape, layout)
    return float(t * (2 * shape.d_model + 2 * local_vocab(shape, layout)) * shape.bytes_per_value)


def local_vocab(shape: ModelShape, layout: ParallelLayout) -> int:
    """Vocabulary entries (embedding rows, logits) on one rank."""
    return shape.vocab_size // (layout.tp if shape.vocab_parallel else 1)


def _activations(shape: ModelShape, layout: ParallelLayout, stage: int, calib: "Calibration") -> float:
    t, b = tokens_per_microbatch(shape, layout), shape.bytes_per_value
    blocks = sum(block_activation_bytes(shape, layout, i) for i in _layers(layout, shape, stage))
    if stage == 0:
        blocks += t * shape.d_model * b  # the embedding output (block 0's input)
    head = head_activation_bytes(shape, layout) if stage == layout.num_stages - 1 else 0.0
    return blocks * calib.block_scale + head * calib.head_scale


def _transient(shape: ModelShape, layout: ParallelLayout, stage: int, calib: "Calibration") -> float:
    """Backward working set at the peak plus what the layout adds for a moment (see the module doc)."""
    t, b = tokens_per_microbatch(shape, layout), shape.bytes_per_value
    last = stage == layout.num_stages - 1
    work = 2 * t * (local_vocab(shape, layout) if last else shape.d_ff / layout.tp) * b * calib.transient_scale
    layers = _layers(layout, shape, stage)
    if layout.activation_checkpointing and len(layers):
        work += max(block_activation_bytes(shape, layout, i, checkpointed=False) for i in layers) * calib.block_scale
    if layout.dp_mode == "fsdp" and layout.dp * layout.cp > 1 and len(layers):
        work += 2 * max(block_params(shape, layout, i) for i in layers) * b
    if last and layout.pp > 1 and shape.pipeline_keeps_outputs:
        work += layout.microbatches * t * local_vocab(shape, layout) * b
    return work


def _grads_at_peak(layout: ParallelLayout, flight: int) -> bool:
    """Whether a backward ran before the stage's peak: 1F1B past its warm-up (m > in flight)."""
    return layout.pp > 1 and layout.schedule != "gpipe" and layout.microbatches > flight


def predict(shape: ModelShape, layout: ParallelLayout, calib: Calibration = Calibration()) -> list[StageMemory]:
    """Predicted memory of each pipeline stage's rank (one entry when there is no pipeline)."""
    out = []
    shard = layout.dp * layout.cp if layout.dp_mode == "fsdp" else 1
    b = shape.bytes_per_value
    for s in range(layout.num_stages):
        params = rank_params(shape, layout, s % layout.pp) * b // shard  # all the rank's model chunks
        opt = params * shape.optimizer_states
        flight = in_flight_microbatches(layout.schedule, layout.pp, layout.microbatches, s % layout.pp,
                                        layout.stages_per_rank)
        per_mb = _activations(shape, layout, s, calib)
        transient = _transient(shape, layout, s, calib)
        if calib.static_bytes_per_param is None:
            buckets = params if layout.dp_mode == "ddp" and layout.dp * layout.cp > 1 else 0
            grads = params if _grads_at_peak(layout, flight) else 0
            static = (params + opt if calib.counts_static else 0) + buckets + grads
        else:  # the measured step base holds whatever outlives a step, gradients and buckets included
            grads, static = 0, int(calib.static_bytes_per_param * params / b)
        peak = static + flight * per_mb + transient
        out.append(StageMemory(stage=s, params=params, grads=params, optimizer=opt,
                               activations_per_microbatch=int(per_mb), in_flight=flight, grads_at_peak=grads,
                               transient=int(transient), peak=int(peak)))
    return out


def calibrate(shape: ModelShape, layout: ParallelLayout, *, peaks: list[int], per_microbatch: list[int | None],
              counts_static: bool, static_bytes_per_param: float | None = None) -> Calibration:
    """Scales from one measured run's stages: the block scale from the per-micro-batch footprint of stages
    without the head, the head scale from the last stage's, the transient scale from what the peaks hold
    beyond the prediction's held memory (with the static memory measured per parameter when given)."""
    unit = Calibration(block_scale=1.0, head_scale=1.0, transient_scale=1.0, counts_static=counts_static)
    last = layout.num_stages - 1
    ratios = [pm / _activations(shape, layout, s, unit) for s, pm in enumerate(per_microbatch)
              if pm and (s != last or last == 0)]
    block = statistics.median(ratios) if ratios else 1.0
    head = 1.0
    if last > 0 and per_microbatch[last]:
        body = _activations(shape, layout, last, Calibration(block_scale=block, head_scale=0.0))
        head = max(0.0, (per_microbatch[last] - body) / head_activation_bytes(shape, layout))
    partial = Calibration(block_scale=block, head_scale=head, transient_scale=0.0, counts_static=counts_static,
                          static_bytes_per_param=static_bytes_per_param)
    base = predict(shape, layout, partial)
    one = predict(shape, layout, replace(partial, transient_scale=1.0))
    scales = [(peaks[s] - base[s].peak) / (one[s].peak - base[s].peak) for s in range(len(base))
              if one[s].peak > base[s].peak]
    return replace(partial, transient_scale=max(0.0, statistics.median(scales)) if scales else 1.0)


def peak_bytes(shape: ModelShape, layout: ParallelLayout, calib: Calibration = Calibration()) -> int:
    """The largest predicted peak over the layout's pipeline stages (the rank that limits the layout)."""
    return max(s.peak for s in predict(shape, layout, calib))


def fits(shape: ModelShape, layout: ParallelLayout, capacity_bytes: int, calib: Calibration = Calibration(),
         reserve_fraction: float = 0.1) -> bool:
    """Whether every rank's predicted peak stays below the device memory less a reserve (allocator
    fragmentation, workspace, the CUDA context); for the layout advisor to rule layouts out.

    The calibration must count static memory (an absolute counter, e.g. CUDA's) for a capacity check."""
    if not calib.counts_static:
        raise ValueError("a capacity check needs a calibration that counts parameters and optimizer state")
    return peak_bytes(shape, layout, calib) <= capacity_bytes * (1 - reserve_fraction)


def _memory_section(memory_section: MemorySection | dict[str, Any]) -> MemorySection:
    if isinstance(memory_section, MemorySection):
        return memory_section
    return as_section(MemorySection, memory_section) or MemorySection()


def calibrate_from_analysis(shape: ModelShape, layout: ParallelLayout,
                            memory_section: MemorySection | dict[str, Any]) -> Calibration:
    """A calibration from an analysis' `memory` section (tracekit/analyze/memory.py; typed, or as analysis.json
    holds it) of a run of `layout`: per-stage peaks and per-micro-batch footprints (per rank when there is no
    pipeline); the section's counter says whether parameters and optimizer state are in the measured peaks."""
    sec = _memory_section(memory_section)
    if sec.stages:
        by_stage = {s.stage: s for s in sec.stages}
        rows = [by_stage.get(s, MemoryStagesRow()) for s in range(layout.num_stages)]
    else:
        rows = [max(sec.ranks or [MemoryRanksRow()], key=lambda r: r.peak_allocated or 0)]
    peaks = [int(r.peak_allocated or 0) for r in rows]
    if not all(peaks):
        raise ValueError("the memory section has no peak for every stage of the layout")
    absolute = sec.counter == "absolute"
    return calibrate(shape, layout, peaks=peaks, per_microbatch=[r.per_microbatch_bytes for r in rows],
                     counts_static=absolute,
                     static_bytes_per_param=measured_static_per_param(shape, layout, sec) if absolute else None)


def measured_static_per_param(shape: ModelShape, layout: ParallelLayout,
                              memory_section: MemorySection | dict[str, Any]) -> float | None:
    """Median over ranks of the measured step base (what outlives a step; an absolute counter) per
    parameter the rank holds (its pipeline rank's stages from the section's `stages`; the main device)."""
    sec = _memory_section(memory_section)
    pp_rank = {r: s.stage % layout.pp for s in sec.stages for r in s.ranks}
    shard = layout.dp * layout.cp if layout.dp_mode == "fsdp" else 1
    main: dict[int, MemoryRanksRow] = {}
    for r in sec.ranks:  # sorted with each rank's main device first
        main.setdefault(r.rank, r)
    ratios = [r.static_bytes * shard / rank_params(shape, layout, pp_rank.get(k, 0))
              for k, r in main.items() if r.static_bytes]
    return statistics.median(ratios) if ratios else None


def rank_params(shape: ModelShape, layout: ParallelLayout, pp_rank: int) -> int:
    """Parameters a pipeline rank holds before FSDP sharding: its stages (one, or v on interleaved schedules)."""
    return sum(stage_params(shape, layout, s) for s in range(pp_rank, layout.num_stages, layout.pp))
