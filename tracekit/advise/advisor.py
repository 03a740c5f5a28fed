"""Which layout to run: every valid layout of the target GPU count, pre-ranked by a closed-form estimate,
the best `simulate_top` predicted by the calibrated simulator, ranked by step time among those that fit
in memory. The current layout's prediction sits next to its measured step time.

    advice = advise(analysis, ModelSpec.preset("llama-8b-like"), ClusterSpec.preset("4x8-h100"))
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tracekit.advise.calibrate import Calibrated, calibrate
from tracekit.advise.predict import StepPrediction, mfu, predict_step, tokens_per_step
from tracekit.advise.predict import model_flops_per_token
from tracekit.advise.predict import replicas_needed
from tracekit.advise.space import SearchSpace, enumerate_layouts
from tracekit.document import AnalysisDocument, as_document
from tracekit.model import memory as mem
from tracekit.layout import ParallelLayout
from tracekit.simulate import ClusterSpec, ModelSpec
from tracekit.simulate.executor import Deadlock

ADVICE_SCHEMA = "tracekit.advice/1"
MEMORY_RESERVE = 0.1
"""Device memory kept free (allocator fragmentation, workspaces, the CUDA context)."""


@dataclass(frozen=True)
class Candidate:
    layout: ParallelLayout
    micro_batch_size: int
    step_ns: int
    """Predicted step time, calibrated (residual applied)."""
    prediction: StepPrediction
    peak_memory_bytes: int
    fits: bool
    tokens_per_s_per_gpu: float
    mfu: float
    changes: list[str] = field(default_factory=list)
    why: str = ""


@dataclass(frozen=True)
class MemoryCalibration:
    calibration: mem.Calibration
    calibrated: bool
    note: str
    """How the memory model was calibrated, or why it was not (one line)."""


@dataclass
class Advice:
    calibration: Calibrated
    memory: MemoryCalibration
    cluster: ClusterSpec
    gpus: int
    global_batch: int
    current: Candidate | None
    ranked: list[Candidate]
    layouts_considered: int
    layouts_simulated: int
    skipped: list[str] = field(default_factory=list)
    """Shortlisted layouts the simulator could not run (with its reason)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where the model and the batch came from (`model`, `batch`, `global_batch`: one line each)."""


def model_shape(model: ModelSpec, micro_batch_size: int) -> mem.ModelShape:
    """The memory model's shape of `model` as the simulator (and Megatron-LM) builds it: gated MLPs,
    vocab-parallel embedding and head, sequence parallelism whose column-parallel layers keep their
    input's shard and gather it again in backward, pipeline outputs freed after their backward."""
    return mem.ModelShape(mlp_matrices=3, vocab_parallel=True, tp_saves_gathered_input=False,
                          pipeline_keeps_outputs=False, num_layers=model.layers, d_model=model.hidden, d_ff=model.ffn_dim, num_heads=model.heads,
                          vocab_size=model.vocab, seq_len=model.seq, microbatch_size=micro_batch_size,
                          moe_layers=tuple(i for i in range(model.layers) if model.is_moe(i)),
                          num_experts=model.experts, top_k=model.top_k if model.experts else 0,
                          bytes_per_value=model.dtype_bytes)


def peak_memory(model: ModelSpec, layout: ParallelLayout, mbs: int, calib: mem.Calibration = mem.Calibration()) -> int:
    return mem.peak_bytes(model_shape(model, mbs), layout, calib)


def memory_calibration(analysis: AnalysisDocument | dict[str, Any], cal: Calibrated) -> MemoryCalibration:
    """The memory model calibrated on the measured run's memory section (tracekit/analyze/memory.py):
    activation and transient scales from its per-stage peaks and per-micro-batch footprints, static
    memory per parameter from its step base when the counter is absolute (CUDA); predictions always
    count static memory (what a device must hold)."""
    section = as_document(analysis).sections.memory
    if section is None or not section.available:
        return MemoryCalibration(mem.Calibration(), False, "uncalibrated (the trace has no memory events)")
    shape = model_shape(cal.model, cal.model.micro_batch_size)
    try:
        c = mem.calibrate_from_analysis(shape, cal.measured.layout, section)
    except (ValueError, ZeroDivisionError) as exc:
        return MemoryCalibration(mem.Calibration(), False, f"uncalibrated ({exc})")
    static = (f"static {c.static_bytes_per_param:.1f} B per parameter measured" if c.static_bytes_per_param
              else "static memory analytic (the counter started with the profiler)")
    return MemoryCalibration(dataclasses.replace(c, counts_static=True), True,
                             f"calibrated on the measured peaks: activations ×{c.block_scale:.2f}, "
                             f"head ×{c.head_scale:.2f}, transients ×{c.transient_scale:.2f}, {static}")


def rough_step_ns(model: ModelSpec, cluster: ClusterSpec, layout: ParallelLayout, mbs: int) -> float:
    """Closed form for pre-ranking: compute at calibrated efficiency × (1 + bubble) + tp/ep collectives."""
    m = dataclasses.replace(model, micro_batch_size=mbs)
    flops = model_flops_per_token(m) * tokens_per_step(m, layout) / layout.world_size
    comp = flops / (cluster.peak_tflops * 1e3 * cluster.efficiency) * (4 / 3 if layout.activation_checkpointing else 1)
    p, v, mb = layout.pp, layout.stages_per_rank, layout.microbatches
    bubble = (p - 1) / (v * mb + p - 1) * (0.5 if layout.schedule == "zb" else 1.0)
    tp_bw = cluster.intra_bw_gbs if layout.tp * layout.cp <= cluster.gpus_per_host else cluster.inter_bw_gbs
    tokens = m.seq * mbs // layout.cp
    tp_bytes = 8 * tokens * m.hidden * m.dtype_bytes * (layout.tp - 1) / layout.tp * model.layers / layout.pp * mb
    return comp / (1 - bubble) + tp_bytes / tp_bw


def _changes(cur: ParallelLayout, new: ParallelLayout) -> list[str]:
    """What differs from the measured layout."""
    out = [f"{k} {getattr(cur, k)}→{getattr(new, k)}" for k in ("tp", "pp", "cp", "ep", "dp")
           if getattr(cur, k) != getattr(new, k)]
    if new.pp > 1 and (cur.schedule, cur.microbatches) != (new.schedule, new.microbatches):
        out.append(f"{new.schedule} with {new.microbatches} micro-batches")
    if cur.fsdp != new.fsdp:
        out.append("FSDP" if new.fsdp else "DDP")
    if cur.activation_checkpointing != new.activation_checkpointing:
        out.append("activation checkpointing " + ("on" if new.activation_checkpointing else "off"))
    return out


WHY_PARTS = (("compute", "compute_ns"), ("exposed communication", "exposed_comm_ns"),
             ("idle (bubble, waits)", "idle_ns"))
WHY_MIN_SHARE = 0.02
"""A part of the step that moves by less than this share of the current step is not named."""


def _why(cur: Candidate | None, new: Candidate) -> str:
    """The parts of the step (mean rank, per step) that move from the current layout's, largest first."""
    if cur is None:
        return ""
    deltas = [(name, getattr(new.prediction, k) - getattr(cur.prediction, k)) for name, k in WHY_PARTS]
    moved = sorted((d for d in deltas if abs(d[1]) >= WHY_MIN_SHARE * cur.step_ns), key=lambda d: -abs(d[1]))
    if not moved:
        return f"no part of the step moves by {100 * WHY_MIN_SHARE:.0f}% of the current step"
    return ", ".join(f"{name} {'+' if d > 0 else '−'}{abs(d) / 1e6:.1f} ms" for name, d in moved)


def _predicted(cal: Calibrated, mcal: mem.Calibration, cluster: ClusterSpec, picks: list[tuple[ParallelLayout, int]],
               capacity: int | None, cur: Candidate | None, skipped: list[str]) -> list[Candidate]:
    """A candidate per pick; a layout the simulator cannot run is left out and named in `skipped`."""
    out = []
    for L, mbs in picks:
        try:
            out.append(_candidate(cal, mcal, cluster, L, mbs, capacity, cur))
        except Deadlock as exc:
            skipped.append(f"{layout_name(L)}: the simulator could not run it ({exc})")
    return out


def layout_name(L: ParallelLayout) -> str:
    return (f"dp{L.dp} tp{L.tp} pp{L.pp} cp{L.cp} ep{L.ep}" + (f" {L.schedule} m{L.microbatches} v{L.stages_per_rank}"
            if L.pp > 1 else "") + (" fsdp" if L.fsdp else "") + (" ac" if L.activation_checkpointing else ""))


def _candidate(cal: Calibrated, mcal: mem.Calibration, cluster: ClusterSpec, layout: ParallelLayout, mbs: int,
               capacity: int | None, cur: Candidate | None) -> Candidate:
    model = dataclasses.replace(cal.model, micro_batch_size=mbs)
    pred = predict_step(model, cluster, layout)
    step = int(pred.step_ns * cal.residual)
    peak = peak_memory(cal.model, layout, mbs, mcal)
    fits = capacity is None or peak <= capacity * (1 - MEMORY_RESERVE)
    tps = tokens_per_step(model, layout) / (step * 1e-9) / layout.world_size
    c = Candidate(layout, mbs, step, pred, peak, fits, tps, mfu(model, cluster, layout, step),
                  changes=_changes(cal.measured.layout, layout))
    return dataclasses.replace(c, why=_why(cur, c))


def _degrees(L: ParallelLayout) -> tuple[int, ...]:
    return (L.dp, L.tp, L.pp, L.cp, L.ep)


def _simulated_ranks(L: ParallelLayout) -> int:
    return replicas_needed(L) * L.tp * L.pp * L.cp


def _shortlist(model: ModelSpec, cluster: ClusterSpec, pool: list[tuple[ParallelLayout, int]], n: int,
               current: ParallelLayout | None, near: int) -> list[tuple[ParallelLayout, int]]:
    """The closed form's best variant of each (dp, tp, pp, cp, ep), best first: the simulator sees every
    degree combination the closed form ranks high, not 24 variants of one; then the best `near` of the
    others that change one or two degrees of the current layout (the changes a user would try first)."""
    best: dict[tuple[int, ...], tuple[float, ParallelLayout, int]] = {}
    for L, mbs in pool:
        est = rough_step_ns(model, cluster, L, mbs)
        k = _degrees(L)
        if k not in best or est < best[k][0]:
            best[k] = (est, L, mbs)
    ranked = sorted(best.values(), key=lambda t: t[0])
    picked = ranked[:n]
    if current is not None:
        cur = _degrees(current)
        picked += [t for t in ranked[n:] if sum(a != b for a, b in zip(cur, _degrees(t[1]))) <= 2][:near]
    return [(L, mbs) for _, L, mbs in picked if L != current]


def _variants(model: ModelSpec, cluster: ClusterSpec, pool: list[tuple[ParallelLayout, int]], groups: set, done: set,
              per_group: int) -> list[tuple[ParallelLayout, int]]:
    """More schedule / micro-batch / FSDP / checkpointing variants of the best degree combinations."""
    out = []
    for g in groups:
        opts = sorted((o for o in pool if _degrees(o[0]) == g and o not in done),
                      key=lambda o: rough_step_ns(model, cluster, o[0], o[1]))
        out += opts[:per_group]
    return out


def target_cluster(cal: Calibrated, hosts: int | None, gpus_per_host: int | None, gpus: int | None) -> ClusterSpec:
    c = cal.cluster
    gph = gpus_per_host or c.gpus_per_host
    if hosts is None:
        total = gpus or cal.measured.world
        hosts = max(1, -(-total // gph))
    return dataclasses.replace(c, hosts=hosts, gpus_per_host=gph)


def advise(analysis: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, *, gpus: int | None = None,
           hosts: int | None = None, gpus_per_host: int | None = None, global_batch: int | None = None,
           gpu_memory_bytes: int | None = None, top: int = 10, simulate_top: int = 16,
           space: SearchSpace | None = None, max_simulated_ranks: int = 64, variants_per_layout: int = 4,
           near_current: int = 4, sources: dict[str, str] | None = None) -> Advice:
    """Rank the layouts for the target GPU count from the measured run described by `analysis`: the
    closed form's best `simulate_top` degree combinations and `near_current` more that change one or two
    of the current layout's degrees, then `variants_per_layout` schedule / micro-batch / FSDP /
    checkpointing variants of the three best, are simulated. The current layout is ranked with them."""
    cal = calibrate(analysis, model, cluster)
    mc = memory_calibration(analysis, cal)
    m = cal.measured
    target = target_cluster(cal, hosts, gpus_per_host, gpus)
    n = gpus or target.world
    batch = global_batch or m.layout.dp * m.layout.microbatches * model.micro_batch_size
    capacity = gpu_memory_bytes or int(target.hbm_gb * (1 << 30))
    space = space or SearchSpace(gpus=n, global_batch=batch)
    current = None
    if m.layout.world_size == n and batch % (m.layout.dp * m.layout.microbatches) == 0:
        mbs_cur = batch // (m.layout.dp * m.layout.microbatches)
        current = _candidate(cal, mc.calibration, target, m.layout, mbs_cur, capacity, None)
    options = list(enumerate_layouts(cal.model, space))
    fitting = [(L, mbs) for L, mbs in options
               if peak_memory(cal.model, L, mbs, mc.calibration) <= capacity * (1 - MEMORY_RESERVE)]
    pool = [o for o in (fitting or options) if _simulated_ranks(o[0]) <= max_simulated_ranks]
    picked = _shortlist(cal.model, target, pool, simulate_top, current.layout if current else None,
                        near=near_current)
    skipped: list[str] = []
    ranked = _predicted(cal, mc.calibration, target, picked, capacity, current, skipped)
    best = sorted(ranked + ([current] if current else []), key=lambda c: c.step_ns)[:3]
    extra = _variants(cal.model, target, pool, {_degrees(c.layout) for c in best}, set(picked),
                      per_group=variants_per_layout)
    extra = [o for o in extra if current is None or o != (current.layout, current.micro_batch_size)]
    ranked += _predicted(cal, mc.calibration, target, extra, capacity, current, skipped)
    ranked += [current] if current else []
    ranked.sort(key=lambda c: (not c.fits, c.step_ns))
    src = dict(sources or {})
    if global_batch is None and "batch" not in src:
        src["global_batch"] = (f"global batch {batch} sequences = the measured run's dp {m.layout.dp} x "
                                   f"{m.layout.microbatches} micro-batches x micro-batch {model.micro_batch_size}")
    return Advice(cal, mc, target, n, batch, current, ranked[:top], len(options), len(picked) + len(extra),
                  skipped, src)


def layout_json(layout: ParallelLayout) -> dict[str, Any]:
    return {"dp": layout.dp, "tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep,
            "fsdp": layout.fsdp, "schedule": layout.schedule if layout.pp > 1 else None,
            "microbatches": layout.microbatches, "interleave": layout.stages_per_rank,
            "activation_checkpointing": layout.activation_checkpointing}


def candidate_json(c: Candidate, current: Candidate | None = None) -> dict[str, Any]:
    return {"layout": layout_json(c.layout), "micro_batch_size": c.micro_batch_size,
            "predicted_step_ns": c.step_ns, "tokens_per_s_per_gpu": c.tokens_per_s_per_gpu, "mfu": c.mfu,
            "peak_memory_bytes": c.peak_memory_bytes, "fits_in_memory": c.fits,
            "breakdown_ns": {"compute": c.prediction.compute_ns, "exposed_comm": c.prediction.exposed_comm_ns,
                             "idle": c.prediction.idle_ns},
            "changes": c.changes, "why": c.why, "is_current": c is current}


RESIDUAL_PLAUSIBLE = (0.5, 2.0)
"""A calibrated model that replays the measured layout more than 2x off is not describing this run."""


def plausibility_warnings(doc: dict[str, Any]) -> list[str]:
    """Why the advice cannot be trusted as it stands (an advice document's calibration and predictions):
    a residual far from 1, an efficiency outside (0, 1], negative predicted times."""
    cal, out = doc["calibration"], []
    res = cal.get("residual")
    lo, hi = RESIDUAL_PLAUSIBLE
    if isinstance(res, (int, float)) and not lo <= res <= hi:
        out.append(f"the calibrated model replays the measured layout {max(res, 1 / res) if res > 0 else float('inf'):.1f}x "
                   f"off (residual x{res:.3g}): the model (--model) or the batch (--micro-batch-size, "
                   "--global-batch) is probably not the run's; predictions are scaled by that residual")
    eff = cal.get("efficiency")
    if isinstance(eff, (int, float)) and not 0 < eff <= 1:
        out.append(f"GEMM efficiency {eff:.3g} is outside (0, 1]: the model's FLOPs do not match the measured compute")
    rows = [r for r in (doc.get("ranked") or []) + ([doc["current"]] if doc.get("current") else []) if r]
    negative = sorted({k for r in rows for k, v in (r.get("breakdown_ns") or {}).items()
                       if isinstance(v, (int, float)) and v < 0})
    if negative or any((r.get("predicted_step_ns") or 0) <= 0 for r in rows):
        out.append("negative or zero predicted times (" + (", ".join(negative) or "step") + "): the calibration "
                   "does not fit this run")
    return out


def advice_json(a: Advice) -> dict[str, Any]:
    m = a.calibration.measured
    cur = candidate_json(a.current) if a.current else None
    if cur is not None:
        cur["measured_step_ns"] = m.step_ns
    mc = a.memory
    doc = {
        "schema": ADVICE_SCHEMA,
        "target": {"gpus": a.gpus, "hosts": a.cluster.hosts, "gpus_per_host": a.cluster.gpus_per_host,
                   "global_batch": a.global_batch, "gpu_memory_bytes": int(a.cluster.hbm_gb * (1 << 30))},
        "model": dataclasses.asdict(a.calibration.model),
        "inputs": dict(a.sources),
        "calibration": {"measured_layout": layout_json(m.layout), "measured_step_ns": m.step_ns,
                        "measured_compute_ns": m.compute_ns, "busbw_gbps": m.busbw_gbps,
                        "efficiency": a.calibration.cluster.efficiency,
                        "intra_bw_gbs": a.calibration.cluster.intra_bw_gbs,
                        "inter_bw_gbs": a.calibration.cluster.inter_bw_gbs,
                        "residual": a.calibration.residual,
                        "collective_costs": [{"tier": t, "op": o, "latency_us": lat, "bus_bw_gbs": bw}
                                             for t, o, lat, bw in a.calibration.cluster.coll_costs],
                        "collective_latency_per_ring_hop": a.calibration.cluster.coll_lat_per_hop,
                        "router_skew": a.calibration.model.router_skew,
                        "predicted_measured_step_ns": a.calibration.predicted_measured_ns,
                        "notes": a.calibration.notes},
        "memory_calibration": {"calibrated": mc.calibrated, "note": mc.note,
                               "activation_scale": mc.calibration.block_scale, "head_scale": mc.calibration.head_scale,
                               "transient_scale": mc.calibration.transient_scale,
                               "static_bytes_per_param": mc.calibration.static_bytes_per_param},
        "current": cur,
        "layouts_considered": a.layouts_considered, "layouts_simulated": a.layouts_simulated,
        "ranked": [candidate_json(c, a.current) for c in a.ranked],
        "skipped": a.skipped,
    }
    doc["warnings"] = plausibility_warnings(doc)
    return doc
