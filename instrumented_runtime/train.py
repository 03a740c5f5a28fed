"""The per-rank training loop: build, parallelize, train with the profiler on, write the run's files.

Loss accounting (why the numbers match a single process): every rank's loss is the *sum* of its tokens'
cross-entropy times dp*cp / tokens_per_step. DDP/FSDP average gradients over dp*cp, tensor/context/
expert parallel backward passes sum the contributions of every rank's tokens, so the gradient equals the
single-process gradient of the global mean loss. The reported loss of a step is the sum of all ranks'
token-loss sums over all tokens (gathered at the end from `metrics.rank{R}.jsonl`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.autograd.profiler import record_function

from tracekit.layout import ParallelLayout
from tracekit.record.commlog import CommLog, comms_log_path

from . import parallelize as par
from .comm import Comm, set_comm
from .config import RunConfig
from .data import SyntheticLoader
from .faults import ComputeSlowdown, slow_down_blocks
from .manifest import ANSWER_KEY_FILE, build_ground_truth, build_manifest, clock_sample, write_json
from .model import Transformer, token_loss_sum
from .parallel_dims import ParallelDims
from .pipeline import (LabelledPipelineStage, build_schedule, build_stage_module, route_pipeline_p2p_through,
                       stage_indices)
from .profiling import make_profiler, profiled_steps

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def metrics_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"metrics.rank{rank}.jsonl"


def routing_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"routing.rank{rank}.jsonl"


def build_full_model(cfg: RunConfig) -> Transformer:
    """The whole model, identical on every rank and in the single-process reference (seeded)."""
    torch.manual_seed(cfg.seed)
    model = Transformer(cfg.model, router_bias=cfg.faults.router_bias)
    return model.to(DTYPES[cfg.dtype])


@dataclass
class Parts:
    """What this rank trains: one module (or one per pipeline stage it holds) and how to step it."""

    modules: list[nn.Module]            # wrapped (DDP / FSDP) stage modules, in stage order
    raw: list[Transformer]              # the unwrapped modules
    stage_ids: list[int]
    schedule: Any = None
    params: list[nn.Parameter] = field(default_factory=list)


def build_parts(cfg: RunConfig, pd: ParallelDims, rank: int, comm: Comm | None,
                loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *, seq_len: int,
                device: torch.device = torch.device("cpu")) -> Parts:
    """This rank's model part(s), parallelized and wrapped; `seq_len` is this replica's sequence length."""
    full = build_full_model(cfg).to(device)
    coords = pd.layout.coords(rank)
    if pd.layout.enabled("pp"):
        stage_ids = stage_indices(coords["pp"], cfg.layout.pp, cfg.layout.stages_per_rank)
        layer_split = cfg.stage_split.stage_layer_ids(cfg.model.num_layers)
        raw = [build_stage_module(full, layer_split[s], s == 0, s == cfg.layout.num_stages - 1) for s in stage_ids]
    else:
        stage_ids, raw = [0], [full]
    for m in raw:
        m.par.seq_shard_index = coords["cp"] * cfg.layout.tp + coords["tp"]
        if pd.layout.enabled("tp"):
            par.apply_tp(m, pd, coords["tp"])
        if pd.layout.enabled("cp"):
            par.apply_cp(m, pd)
        if pd.layout.enabled("ep"):
            par.apply_ep(m, pd)
        par.mark_expert_params(m)
        for b in par.blocks(m):
            b.checkpoint = cfg.layout.activation_checkpointing
        par.set_aux_loss_scale(m, pd, cfg.layout.microbatches)
    tags = [{n: {t for t in (par.TP_SHARDED, par.EXPERT) if getattr(p, t, False)} for n, p in m.named_parameters()}
            for m in raw]
    modules: list[nn.Module] = list(raw)
    if pd.layout.dp_cp > 1:
        assert comm is not None
        if cfg.layout.dp_mode == "ddp":
            modules = [par.apply_ddp(m, pd, comm, no_overlap=cfg.faults.no_overlap,
                                     bucket_mb=cfg.ddp_bucket_mb) for m in raw]
        else:
            modules = [par.apply_fsdp(m, pd, comm, no_overlap=cfg.faults.no_overlap,
                                      reshard_after_forward=not pd.layout.enabled("pp")) for m in raw]
    for m, tag in zip(modules, tags):
        # fully_shard replaces parameters (DTensors): carry the tp-sharded / expert tags over by name.
        for n, p in m.named_parameters():
            for t in tag[n.removeprefix("module.")]:
                setattr(p, t, True)
    parts = Parts(modules=modules, raw=raw, stage_ids=stage_ids)
    parts.params = [p for m in modules for p in m.parameters()]
    if pd.layout.enabled("pp"):
        assert comm is not None
        route_pipeline_p2p_through(comm)
        # Static stage shapes: pipelining then skips its metadata inference (a real forward/backward on
        # uninitialised tensors, collectives included) and never calls the loss function outside a step.
        mb = cfg.global_batch_size // cfg.layout.dp // cfg.layout.microbatches
        T = seq_len // (cfg.layout.cp * cfg.layout.tp)
        dtype = DTYPES[cfg.dtype]
        hidden = torch.empty(mb, T, cfg.model.d_model, dtype=dtype, device="meta", requires_grad=True)
        tokens = torch.empty(mb, T, dtype=torch.int64, device="meta")
        logits = torch.empty(mb, T, cfg.model.vocab_size, dtype=dtype, device="meta", requires_grad=True)
        stages = [LabelledPipelineStage(m, s, cfg.layout.num_stages, device, group=pd.get_group("pp"),
                                        input_args=tokens if s == 0 else hidden,
                                        output_args=logits if s == cfg.layout.num_stages - 1 else hidden)
                  for m, s in zip(modules, stage_ids)]
        parts.schedule = build_schedule(cfg.layout.schedule, stages, cfg.layout.microbatches, loss_fn, cfg.layout.pp)
    return parts


class LossMeter:
    """The loss function handed to the model / schedule; remembers each micro-batch's token-loss sum."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.sum = 0.0
        self.tokens = 0

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        s = token_loss_sum(logits, targets)
        self.sum += float(s.detach())
        self.tokens += targets.numel()
        return s * self.scale

    def reset(self) -> tuple[float, int]:
        out = (self.sum, self.tokens)
        self.sum, self.tokens = 0.0, 0
        return out


def _train_step(cfg: RunConfig, pd: ParallelDims, parts: Parts, batch: Any, meter: LossMeter,
                comm: Comm | None) -> None:
    if parts.schedule is not None:
        kwargs: dict[str, Any] = {}
        if parts.stage_ids[-1] == cfg.layout.num_stages - 1:
            kwargs.update(target=batch.targets, losses=[])
        args = (batch.inputs,) if parts.stage_ids[0] == 0 else ()
        parts.schedule.step(*args, **kwargs)
    else:
        (module,) = parts.modules
        M = cfg.layout.microbatches
        for mb, (x, y) in enumerate(zip(batch.inputs.chunk(M), batch.targets.chunk(M))):
            last = mb == M - 1
            _set_grad_sync(module, last)
            with record_function(f"train:mb{mb}:fwd"):
                loss = meter(module(x), y)
            with record_function(f"train:mb{mb}:bwd"):
                loss.backward()
        _set_grad_sync(module, True)
    if comm is not None:
        par.sync_extra_grads(parts.params, pd, comm)


def _set_grad_sync(module: nn.Module, on: bool) -> None:
    if hasattr(module, "require_backward_grad_sync"):      # DDP
        module.require_backward_grad_sync = on
    elif hasattr(module, "set_requires_gradient_sync"):    # FSDP2
        module.set_requires_gradient_sync(on)


def _gather_json(obj: Any, comm: Comm, device: torch.device) -> list[Any]:
    """All-gather one JSON-serialisable object per rank (no pickle), via Comm."""
    data = torch.tensor(list(json.dumps(obj).encode()), dtype=torch.uint8)
    n = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    world = dist.get_world_size()
    sizes = torch.empty(world, dtype=torch.int64, device=device)
    comm.all_gather_into_tensor(sizes, n, None, label="runtime:gather_metadata")
    sizes = sizes.cpu()
    width = int(sizes.max())
    padded = torch.zeros(width, dtype=torch.uint8)
    padded[:data.numel()] = data
    out = torch.empty(world * width, dtype=torch.uint8, device=device)
    comm.all_gather_into_tensor(out, padded.to(device), None, label="runtime:gather_metadata")
    out = out.cpu()
    return [json.loads(bytes(out[r * width:r * width + int(sizes[r])].tolist())) for r in range(world)]


def train_rank(cfg: RunConfig, rank: int, world_size: int, *, command: list[str], launcher: str) -> dict[str, Any]:
    """Run the whole job on this (already initialised) rank; rank 0 writes manifest and ground truth."""
    torch.set_num_threads(1)
    out = Path(cfg.out)
    clock_start = clock_sample()
    pd = ParallelDims.from_config(cfg, world_size)
    # CUDA (nccl) when present: one device per rank on its node; otherwise gloo on CPU.
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    pd.build_mesh(device.type)
    coords = pd.layout.coords(rank)
    log = CommLog(comms_log_path(out, rank), rank, world_size,
                  pg_config={dim: groups for dim, groups in pd.layout.groups().items()})
    slow_groups = {f"mesh_{'dp_cp' if d == 'dp' else d}": s for d, s in cfg.faults.slow_links.items()}
    comm = Comm(log, rank, slow_groups)
    set_comm(comm)
    routing = _Routing(cfg, rank)

    dtype = DTYPES[cfg.dtype]
    torch.set_default_dtype(dtype)
    meter = LossMeter(scale=pd.layout.dp_cp / cfg.tokens_per_step)
    f = cfg.faults
    stall_s = f.host_stall_ms / 1e3 if f.host_stall_rank == rank else 0.0
    uneven = f.uneven_seq_rank is not None and pd.layout.coords(f.uneven_seq_rank)["dp"] == coords["dp"]
    lay = cfg.layout
    loader = SyntheticLoader(cfg, coords["dp"], coords["cp"] * lay.tp + coords["tp"], lay.cp * lay.tp,
                             stall_s=stall_s, seq_factor=f.uneven_seq_factor if uneven else 1)
    parts = build_parts(cfg, pd, rank, comm, meter, seq_len=loader.seq_len, device=device)
    opt = torch.optim.AdamW(parts.params, lr=cfg.lr, weight_decay=0.0)
    slowdown = ComputeSlowdown(f.slow_factor) if (f.slow_rank == rank and f.slow_factor > 1.0) else None
    if slowdown is not None:
        for m in parts.raw:
            slow_down_blocks(par.blocks(m), slowdown)

    comm.barrier(None, label="runtime:barrier")
    clock_post_barrier = clock_sample()
    prof = make_profiler(cfg, out, rank)
    window = set(profiled_steps(cfg))
    metrics = open(metrics_path(out, rank), "w")
    if prof is not None:
        prof.start()
    for step in range(cfg.steps):
        comm.step = step
        routing.set_step(step, step in window)
        t0 = time.perf_counter_ns()
        batch = loader.load(step)
        if device.type != "cpu":
            batch = type(batch)(inputs=batch.inputs.to(device), targets=batch.targets.to(device))
        _train_step(cfg, pd, parts, batch, meter, comm)
        with record_function("optimizer:step"):
            if slowdown is not None:
                with slowdown.region():
                    opt.step()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter_ns()
        loss_sum, tokens = meter.reset()
        metrics.write(json.dumps({"step": step, "loss_sum": loss_sum, "tokens": tokens, "step_ns": t1 - t0,
                                  "profiled": step in window}) + "\n")
        metrics.flush()
        routing.flush()
        log.flush()
        if prof is not None:
            prof.step()
    if prof is not None:
        prof.stop()
    metrics.close()
    comm.step = None
    comm.drain()

    facts = {"rank": rank, "clock_start": clock_start, "clock_post_barrier": clock_post_barrier,
             "host": os.uname().nodename, "stages": parts.stage_ids, "coords": coords,
             "slow_paid_s": slowdown.paid_s if slowdown else 0.0}
    everyone = _gather_json(facts, comm, device)
    log.close()
    if rank == 0:
        backend = dist.get_backend()
        write_json(out / "manifest.json", build_manifest(cfg, pd, command=command, backend=backend,
                                                         torch_version=torch.__version__, per_rank=everyone,
                                                         launcher=launcher))
        write_json(out / ANSWER_KEY_FILE, build_ground_truth(cfg, pd))
        write_json(out / "train_log.json", summarize_losses(cfg, out, world_size))
    return facts


def summarize_losses(cfg: RunConfig, out: Path, world_size: int) -> dict[str, Any]:
    """Global loss per step = sum of every rank's token-loss sums / tokens (each token is on one last-stage rank)."""
    sums = [0.0] * cfg.steps
    toks = [0] * cfg.steps
    step_ns: dict[str, list[int]] = {}
    for r in range(world_size):
        lines = [json.loads(x) for x in metrics_path(out, r).read_text().splitlines() if x.strip()]
        if len(lines) != cfg.steps:
            raise RuntimeError(f"{metrics_path(out, r)}: {len(lines)} steps, expected {cfg.steps}")
        for rec in lines:
            sums[rec["step"]] += rec["loss_sum"]
            toks[rec["step"]] += rec["tokens"]
        step_ns[str(r)] = [rec["step_ns"] for rec in lines]
    if any(t != cfg.tokens_per_step for t in toks):
        raise RuntimeError(f"tokens per step {toks} != tokens_per_step {cfg.tokens_per_step}")
    return {"loss": [s / t for s, t in zip(sums, toks)], "tokens": toks, "step_ns": step_ns}


def run_reference(cfg: RunConfig) -> list[float]:
    """The same model, data and optimizer in one process, no parallelism: the numerics oracle."""
    from .data import global_batch

    torch.set_default_dtype(DTYPES[cfg.dtype])
    try:
        model = build_full_model(cfg)
        ref_pd = ParallelDims(layout=ParallelLayout(), world_size=1)
        par.set_aux_loss_scale(model, ref_pd, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        losses = []
        for step in range(cfg.steps):
            tokens = global_batch(cfg, step, cfg.seq_len)
            logits = model(tokens[:, :-1])
            s = token_loss_sum(logits, tokens[:, 1:])
            (s / tokens[:, 1:].numel()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(s.detach()) / tokens[:, 1:].numel())
        return losses
    finally:
        torch.set_default_dtype(torch.float32)


# ---- routing statistics (B2's recorder) -----------------------------------------------------------

class _Routing:
    """Drives B2's module-level RoutingRecorder: step / profiled flag, flush to routing.rank{R}.jsonl."""

    def __init__(self, cfg: RunConfig, rank: int) -> None:
        from .moe import get_routing_recorder

        self.rec = get_routing_recorder()
        self.rec.clear()
        self.path = routing_path(cfg.out, rank)
        self.path.write_text("")

    def set_step(self, step: int, profiled: bool) -> None:
        self.rec.step, self.rec.profiled = step, profiled

    def flush(self) -> None:
        self.rec.flush(self.path)
