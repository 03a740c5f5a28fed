"""Memory: peak allocated per rank and device, when in the step it happens, static vs activations,
activation memory per pipeline stage against its in-flight micro-batches, and recomputation.

Definitions (from the `memory` table: the profiler's own allocation counter after each event):
    level(t)         = Total Allocated after the last memory event at or before t
    peak             = max Total Allocated on (rank, device) — the profiler's own number, unchanged
    step base        = level just before the step's first memory event (what outlives a step:
                       parameters, optimizer state, gradients kept between steps); static = the last
                       step's (a first step may still be creating optimizer state)
    activation peak  = max step peak − static: activations plus backward transients
    held activations = peak over time of the bytes allocated inside a forward phase and freed inside a
                       backward phase (allocations paired with their frees by address), i.e. what
                       backward consumes; phases are the pipeline rows, else labels ending in
                       fwd/forward and bwd/backward, else (unlabelled) each step's autograd engine
                       span as backward and the step's start up to it as forward
    per-micro-batch  = median bytes one forward phase leaves held at its end
    in flight        = held activations / per-micro-batch (1F1B: stage s of p holds p − s; interleaved:
                       counted in model-chunk forwards, rank r holds its warm-up (p−r−1)·2 + (v−1)·p + 1)
The counter is *absolute* on CUDA (the caching allocator's total) but counts, on CPU, only memory
allocated while the profiler recorded (`counter: "window"`): parameters and optimizer state built
before the window are then not in it, and the static estimate comes from the collectives' bytes
(gradients = the data-parallel all-reduce / reduce-scatter payload per step) and the optimizer's
kind (`Optimizer.step#<Name>.step`: Adam/AdamW keep two state tensors per parameter).

Recomputation: a forward op run again inside backward. Backward regions are the autograd engine's
`autograd::engine::evaluate_function:` events; inside them the outermost ops whose names are the
step's outermost forward ops and that do work (they nest more than view ops) are recomputed forward
(activation checkpointing); their time per step is the recompute cost. Not those under a custom autograd
Function's backward (a Python `Function`'s node, named without a formula number: `_RingAttentionBackward`),
which are that Function's own backward formula (ring attention's backward re-runs its matmuls), unless it
is the reentrant checkpoint's `CheckpointFunctionBackward`; nor FSDP's own `fsdp::` ops (the parameters
all-gathered again for backward).

Section `memory`:
  {"available": bool, "reason": str | null, "counter": "absolute" | "window" | null,
   "ranks_without_memory_events": [int],
   "ranks": [{"rank", "device_type", "device", "peak_allocated", "peak_reserved", "peak_ts", "peak_step",
              "at_peak": {"label", "op", "phase", "microbatch", "layer", "stage"},
              "static_bytes", "activation_peak_bytes", "activation_held_bytes", "per_microbatch_bytes",
              "in_flight_measured",
              "steps": [{"step", "base", "peak"}],
              "static_estimate": {"grad_bytes", "param_bytes", "optimizer", "optimizer_state_bytes"},
              "split": {"static_bytes", "activation_bytes", "static_source"},   # the stacked bar
              "timeline": {"t_ns": [..], "allocated": [..]}}],   # down-sampled, t from the first step start
   "stages": [{"stage", "ranks", "activation_peak_bytes", "activation_held_bytes", "per_microbatch_bytes", "in_flight_measured",
               "in_flight_schedule", "peak_allocated", "layers"}],
   "recompute": [{"rank", "recompute_ns_per_step", "ops_per_step", "names"}]}
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analyze.pipeline import PipelineResult
from tracekit.config import AnalysisConfig
from tracekit.derive.host_ops import parents
from tracekit.derive.topology import LayoutResult
from tracekit.findings.evidence import Evidence
from tracekit.findings.finding import Finding, FindingKind, Severity
from tracekit.findings.result import AnalyzerResult, section_of
from tracekit.model.memory import in_flight_chunks
from tracekit.parse.dict_columns import object_strings
from tracekit.tables.columns import table_rows
from tracekit.tables.store import RunStore

MEMORY_IMBALANCE_RATIO = 1.25
"""Peak of the fullest stage (or rank) over the mean peak at which the imbalance is reported: a quarter
more memory on one stage is a quarter of the device that the others could have used."""
ACTIVATION_DOMINATED_SHARE = 0.5
"""Activation share of the peak above which activation remedies are listed."""
HEADROOM_SHARE = 0.4
"""Free share of the device at the peak above which a faster, hungrier layout is suggested."""
CHECKPOINT_KEEPS = 1 / 16
"""Share of a block's saved activations that per-block checkpointing keeps: its input (d per token) of
the ~8 d + 2 d_ff a block saves (tracekit/model/memory.py) with d_ff = 4 d."""
TIMELINE_POINTS = 1500
_OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "nadam": 2, "radam": 2, "adamax": 2, "sgd": 1, "adagrad": 1,
                     "rmsprop": 1, "adadelta": 2, "lamb": 2, "lion": 1, "adafactor": 1}
"""Per-parameter state tensors each torch optimizer keeps (SGD: momentum buffer, when momentum is on)."""
_OPTIMIZER_RE = re.compile(r"^Optimizer\.step#(\w+)\.step$")
_MB_RE = re.compile(r"(?:^|[:/_])(?:mb|microbatch)[_-]?(\d+)")
_LAYER_RE = re.compile(r"(?:^|[:/_.])(?:layers?|block)[_.-]?(\d+)")
_BACKWARD_REGION = "autograd::engine::evaluate_function:"
EVENT_COLUMNS = ["name", "cat", "ts", "dur", "tid", "role"]
_VIEW_OPS = frozenset({
    "aten::view", "aten::_reshape_alias", "aten::as_strided", "aten::expand", "aten::t", "aten::transpose",
    "aten::permute", "aten::unsqueeze", "aten::squeeze", "aten::slice", "aten::select", "aten::detach",
    "aten::alias", "aten::_unsafe_view", "aten::reshape", "aten::numpy_T", "aten::split", "aten::chunk",
    "aten::narrow", "aten::unflatten", "aten::flatten", "aten::contiguous", "aten::resolve_conj",
    "aten::resolve_neg", "detach",
    # conversions and fills: the autograd engine itself calls them in backward
    "aten::to", "aten::_to_copy", "aten::copy_", "aten::fill_", "aten::zero_", "aten::zeros", "aten::empty",
    "aten::empty_like", "aten::empty_strided", "aten::zeros_like", "aten::ones_like", "aten::clone"})
"""torch's aliasing (view) ops, conversions and fills: an op that nests only these does no work worth
recomputing, and none of them is taken for a recomputed forward op."""
_NODE_RE = re.compile(r"^(?:autograd::engine::evaluate_function: )?(\w+?)Backward\d*$")


def _op_key(name: str) -> str:
    """aten::native_layer_norm / NativeLayerNorm → 'nativelayernorm' (in-place `_` dropped)."""
    return name.removeprefix("aten::").rstrip("_").replace("_", "").lower()


@dataclass(frozen=True)
class MemoryResult(AnalyzerResult):
    pass


def analyze_memory(store: RunStore, layout: LayoutResult | None, pipeline: PipelineResult | None,
                   config: AnalysisConfig) -> MemoryResult:
    mem_ranks = store.table("memory", columns=["rank"]).column("rank")
    all_ranks = store.ranks()
    with_mem = set(pc.unique(mem_ranks).to_pylist()) if len(mem_ranks) else set()
    section: dict[str, Any] = {"available": bool(with_mem), "reason": None, "counter": None,
                               "ranks_without_memory_events": [r for r in all_ranks if r not in with_mem],
                               "ranks": [], "stages": [], "recompute": []}
    pipeline_sec = section_of(pipeline)
    layout_sec = section_of(layout)
    for rank in all_ranks:  # one rank's events at a time, read once for every use
        if rank not in with_mem and store.rank_rows("events", rank) == 0:
            continue  # no events, no memory events (a log-only rank): nothing recomputed, nothing to read
        events = store.rank_table("events", rank, columns=EVENT_COLUMNS)
        rec = recompute_of_rank(store, rank, events)
        if rec is not None:
            section["recompute"].append(rec)
        if rank in with_mem:
            section["ranks"].extend(rank_memory(store, rank, store.rank_table("memory", rank), layout_sec, events))
        del events
    recompute = section["recompute"]
    findings = [_recompute_finding(recompute)] if recompute else []
    if not with_mem:
        section["reason"] = "no [memory] events in any trace (record with profile_memory=True)"
        return MemoryResult(findings=findings, section=section)
    section["counter"] = "absolute" if any(r["device_type"] != 0 for r in section["ranks"]) else "window"
    for r in section["ranks"]:
        r["split"] = memory_split(r, section["counter"])
    section["stages"] = stage_memory(section["ranks"], pipeline_sec)
    findings += _imbalance_findings(section)
    capacity = getattr(config, "device_memory_bytes", None) or device_capacity(store, section["ranks"])
    findings += _activation_findings(section, capacity, _faster_layouts(layout_sec, pipeline_sec, recompute))
    return MemoryResult(findings=findings, section=section)


# ----------------------------------------------------------------------------------------------
# per rank


def rank_memory(store: RunStore, rank: int, rows: pa.Table, layout: dict,
                events: pa.Table | None = None) -> list[dict[str, Any]]:
    """One summary per device the rank allocated on (the main device first: the largest peak)."""
    out = []
    rows = rows.take(pc.sort_indices(rows, [("ts", "ascending")]))
    dev_type = rows.column("device_type").fill_null(-1).to_numpy(zero_copy_only=False)
    dev = rows.column("device").fill_null(-1).to_numpy(zero_copy_only=False)
    for dt, d in sorted(set(zip(dev_type.tolist(), dev.tolist()))):
        sel = rows.filter(pa.array((dev_type == dt) & (dev == d)))
        out.append(_device_summary(store, rank, int(dt), int(d), sel, layout, events))
    return sorted(out, key=lambda x: -x["peak_allocated"])


def _device_summary(store: RunStore, rank: int, dev_type: int, dev: int, rows: pa.Table,
                    layout: dict, events: pa.Table | None) -> dict[str, Any]:
    ts = rows.column("ts").to_numpy()
    total = rows.column("total_allocated").to_numpy(zero_copy_only=False)
    nbytes = rows.column("bytes").to_numpy(zero_copy_only=False)
    reserved = rows.column("total_reserved").fill_null(0).to_numpy(zero_copy_only=False)
    step = rows.column("step").fill_null(-1).to_numpy(zero_copy_only=False)
    i = int(np.argmax(total))
    steps = []
    for s in sorted(set(step.tolist()) - {-1}):
        idx = np.flatnonzero(step == s)
        steps.append({"step": int(s), "base": int(total[idx[0]] - nbytes[idx[0]]), "peak": int(total[idx].max())})
    # steady state: the last step's base (a first step may still be creating optimizer state)
    static = steps[-1]["base"] if steps else int(total[0] - nbytes[0])
    act = max(0, max((x["peak"] for x in steps), default=int(total.max())) - static)
    addr = rows.column("addr").fill_null(-1).to_numpy(zero_copy_only=False)
    held, per_mb = held_activations(ts, nbytes, addr, phase_intervals(store, rank, False, events),
                                    phase_intervals(store, rank, True, events))
    t0 = _first_step_start(store, rank, int(ts[0]))
    return {
        "rank": rank, "device_type": dev_type, "device": dev,
        "peak_allocated": int(total[i]), "peak_reserved": int(reserved.max()), "peak_ts": int(ts[i]),
        "peak_step": None if step[i] < 0 else int(step[i]), "at_peak": where_in_step(store, rank, int(ts[i]), events),
        "static_bytes": int(static), "activation_peak_bytes": int(act), "activation_held_bytes": held,
        "per_microbatch_bytes": per_mb, "in_flight_measured": round(held / per_mb, 3) if per_mb else None,
        "steps": steps, "static_estimate": static_estimate(store, rank, layout, events),
        "timeline": _timeline(ts - t0, total, i),
    }


def memory_split(r: dict[str, Any], counter: str) -> dict[str, Any]:
    """Static vs activations at the rank's peak: the step base (absolute counter) or, when the counter
    started with the profiler, the estimate from collectives and the optimizer's kind."""
    if counter == "absolute" or r["device_type"] != 0:
        return {"static_bytes": r["static_bytes"], "activation_bytes": r["activation_peak_bytes"],
                "static_source": "step base"}
    est = r["static_estimate"]
    parts = [est[k] for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes") if est[k] is not None]
    return {"static_bytes": sum(parts) if parts else None, "activation_bytes": r["activation_peak_bytes"],
            "static_source": "estimate (collectives, optimizer)" if parts else "unknown (counter started with the profiler)"}


def device_capacity(store: RunStore, ranks: list[dict[str, Any]]) -> int | None:
    """Smallest memory of the devices the ranks allocated on (deviceProperties totalGlobalMem), if known."""
    if not store.has("ranks"):
        return None
    table = store.table("ranks")
    if "device_memory_bytes" not in table.column_names:
        return None
    per_rank = dict(zip(table.column("rank").to_pylist(), table.column("device_memory_bytes").to_pylist()))
    sizes = []
    for r in ranks:
        mem = per_rank.get(r["rank"]) or []
        if r["device_type"] != 0 and 0 <= r["device"] < len(mem) and mem[r["device"]]:
            sizes.append(int(mem[r["device"]]))
    return min(sizes) if sizes else None


def _first_step_start(store: RunStore, rank: int, default: int) -> int:
    steps = store.rank_table("steps", rank, columns=["ts"])
    return int(pc.min(steps.column("ts")).as_py()) if steps.num_rows else default


def _timeline(t: np.ndarray, total: np.ndarray, peak_i: int) -> dict[str, list[int]]:
    """At most TIMELINE_POINTS points: a regular subsample plus the peak itself."""
    keep = np.unique(np.concatenate([np.linspace(0, len(t) - 1, min(len(t), TIMELINE_POINTS)).astype(np.int64),
                                     [peak_i]]))
    return {"t_ns": t[keep].astype(np.int64).tolist(), "allocated": total[keep].astype(np.int64).tolist()}


def level_at(ts: np.ndarray, total: np.ndarray, nbytes: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Allocated bytes just after time t (before the first event: that event's starting level)."""
    i = np.searchsorted(ts, t, side="right") - 1
    return np.where(i >= 0, total[np.maximum(i, 0)], total[0] - nbytes[0])


def phase_intervals(store: RunStore, rank: int, backward: bool,
                    events: pa.Table | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (start, end) of the rank's forward (or backward) phases on the host, where the allocator's
    events are stamped: labels that end in fwd/forward (bwd/backward), else pipeline rows (on GPU traces
    these may be device time, which runs behind the host), else the autograd engine's span."""
    ev = events if events is not None else store.rank_table("events", rank, columns=EVENT_COLUMNS)
    names = pc.cast(ev.column("name"), pa.string())
    word = "(?:bwd|backward)(?:_input|_weight)?" if backward else "fwd|forward"
    rows = ev.filter(pc.and_(pc.equal(pc.cast(ev.column("cat"), pa.string()), "user_annotation"),
                             pc.match_substring_regex(names, rf"(?i)(?:^|[:/_])(?:{word})$")))
    if not rows.num_rows:
        pipe = store.rank_table("pipeline", rank, columns=["phase", "ts", "dur"])
        if not pipe.num_rows:
            return _autograd_phases(store, rank, ev, names, backward)
        phases = pc.cast(pipe.column("phase"), pa.string())
        rows = pipe.filter(pc.is_in(phases, pa.array(["bwd", "bwd_input", "bwd_weight"] if backward else ["fwd"])))
    start = rows.column("ts").to_numpy()
    order = np.argsort(start, kind="stable")
    return start[order], (start + rows.column("dur").fill_null(0).to_numpy(zero_copy_only=False))[order]


def _autograd_phases(store: RunStore, rank: int, ev: pa.Table, names: pa.Array,
                     backward: bool) -> tuple[np.ndarray, np.ndarray]:
    """Unlabelled traces: backward = from the first to the last autograd engine event of each step
    (any thread: on GPU hosts the engine runs on its own threads); forward = from the step's start to
    its backward."""
    steps = store.rank_table("steps", rank, columns=["ts", "dur"])
    bwd = ev.filter(pc.starts_with(names, _BACKWARD_REGION))
    if not steps.num_rows or not bwd.num_rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    s_start = steps.column("ts").to_numpy()
    s_end = s_start + steps.column("dur").fill_null(0).to_numpy(zero_copy_only=False)
    b_start = bwd.column("ts").to_numpy()
    b_end = b_start + bwd.column("dur").fill_null(0).to_numpy(zero_copy_only=False)
    starts, ends = [], []
    for a, z in sorted(zip(s_start.tolist(), s_end.tolist())):
        inside = (b_start >= a) & (b_start < z)
        if not inside.any():
            continue
        first, last = int(b_start[inside].min()), int(b_end[inside].max())
        starts.append(first if backward else a)
        ends.append(last if backward else first)
    return np.array(starts, np.int64), np.array(ends, np.int64)


def _inside(t: np.ndarray, iv: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(whether each time falls in one of the sorted, non-overlapping intervals; that interval's index)."""
    start, end = iv
    if not len(start):
        return np.zeros(len(t), bool), np.zeros(len(t), np.int64)
    k = np.searchsorted(start, t, side="right") - 1
    kc = np.maximum(k, 0)
    return (k >= 0) & (t <= end[kc]), kc


def _lifetimes(ts: np.ndarray, nbytes: np.ndarray, addr: np.ndarray) -> np.ndarray:
    """Index of the event that frees each allocation (-1: still alive at the end, or not an allocation)."""
    freed = np.full(len(ts), -1, np.int64)
    live: dict[int, int] = {}
    for i, (b, a) in enumerate(zip(nbytes.tolist(), addr.tolist())):
        if b > 0:
            live[a] = i
        elif b < 0 and a in live:
            freed[live.pop(a)] = i
    return freed


def held_activations(ts: np.ndarray, nbytes: np.ndarray, addr: np.ndarray, fwd: tuple[np.ndarray, np.ndarray],
                     bwd: tuple[np.ndarray, np.ndarray]) -> tuple[int, int | None]:
    """(peak of the activations held, median bytes one forward phase leaves held for backward).

    An activation is memory allocated inside a forward phase and freed inside a backward phase (what
    backward consumes); forward outputs a schedule keeps to the end of the step are not. (0, None)
    without forward phases."""
    if not len(fwd[0]):
        return 0, None
    in_fwd, k = _inside(ts, fwd)
    freed = _lifetimes(ts, nbytes, addr)
    free_t = ts[np.maximum(freed, 0)]
    in_bwd, _ = _inside(free_t, bwd)
    act = np.flatnonzero(in_fwd & (nbytes > 0) & (freed >= 0) & in_bwd)
    delta = np.zeros(len(ts), np.int64)
    np.add.at(delta, act, nbytes[act])
    np.add.at(delta, freed[act], -nbytes[act])
    peak = int(np.cumsum(delta).max())
    kept = np.zeros(len(fwd[0]), np.int64)
    alive_at_end = act[free_t[act] > fwd[1][k[act]]]
    np.add.at(kept, k[alive_at_end], nbytes[alive_at_end])
    per_mb = int(np.median(kept[kept > 0])) if (kept > 0).any() else 0
    return max(peak, 0), (per_mb if per_mb > 0 else None)


def where_in_step(store: RunStore, rank: int, t: int, events: pa.Table | None = None) -> dict[str, Any]:
    """The innermost label and op around time t, and the phase / micro-batch / layer / stage they name."""
    ev = events if events is not None else store.rank_table("events", rank, columns=EVENT_COLUMNS)
    ts = ev.column("ts").to_numpy()
    end = ts + ev.column("dur").fill_null(0).to_numpy(zero_copy_only=False)
    hit = np.flatnonzero((ts <= t) & (t <= end))
    names = ev.column("name").take(pa.array(hit)).to_pylist() if len(hit) else []
    cats = ev.column("cat").take(pa.array(hit)).to_pylist() if len(hit) else []
    order = np.argsort(ts[hit], kind="stable") if len(hit) else []
    label = op = None
    backward = False
    for j in order:  # outermost first: the last match is the innermost
        nm, cat = names[j], cats[j]
        if cat == "user_annotation" and not (nm or "").startswith("ProfilerStep#"):
            label = nm
        elif cat == "cpu_op":
            op = nm
            backward |= (nm or "").startswith(_BACKWARD_REGION)
    pipe = store.rank_table("pipeline", rank, columns=["stage", "microbatch", "phase", "ts", "dur"])
    info: dict[str, Any] = {"label": label, "op": op, "phase": None, "microbatch": None, "layer": None, "stage": None}
    if pipe.num_rows:
        pts = pipe.column("ts").to_numpy()
        pend = pts + pipe.column("dur").fill_null(0).to_numpy(zero_copy_only=False)
        inside = np.flatnonzero((pts <= t) & (t <= pend))
        if len(inside):
            row = pipe.slice(int(inside[-1]), 1).to_pylist()[0]
            info.update(phase=str(row["phase"]), microbatch=row["microbatch"], stage=row["stage"])
    text = " ".join(x for x in (label, op) if x)
    if info["microbatch"] is None and _MB_RE.search(text):
        info["microbatch"] = int(_MB_RE.search(text).group(1))
    if _LAYER_RE.search(text):
        info["layer"] = int(_LAYER_RE.search(text).group(1))
    if info["phase"] is None:
        info["phase"] = _phase_of(label, backward)
    return info


def _phase_of(label: str | None, backward: bool) -> str | None:
    low = (label or "").lower()
    if backward or "bwd" in low or "backward" in low:
        return "bwd"
    if "optim" in low:
        return "optimizer"
    if "fwd" in low or "forward" in low:
        return "fwd"
    return None


def static_estimate(store: RunStore, rank: int, layout: dict, events: pa.Table | None = None) -> dict[str, Any]:
    """Gradient bytes from the data-parallel collectives of one step, parameters alike (a DDP replica
    holds whole gradients; FSDP reduce-scatters to its shard), optimizer state from the optimizer's kind."""
    dims = {g["pg_name"]: g["dim"] for g in layout.get("groups", [])}
    coll = store.rank_table("collectives", rank, columns=["source", "pg_name", "op", "bytes", "in_nelems",
                                                         "out_nelems", "step"])
    grad = None
    if coll.num_rows:
        srcs = pc.cast(coll.column("source"), pa.string()).to_pylist()
        src = "kineto" if "kineto" in srcs else srcs[0]
        rows = [r for r, s in zip(table_rows(coll), srcs) if s == src and dims.get(r["pg_name"]) in ("dp", "fsdp")
                and r["op"] in ("all_reduce", "reduce_scatter") and r["bytes"] and r["step"] is not None]
        per_step: dict[int, int] = defaultdict(int)
        for r in rows:
            share = r["out_nelems"] / r["in_nelems"] if r["op"] == "reduce_scatter" and r["in_nelems"] else 1.0
            per_step[r["step"]] += int(r["bytes"] * share)
        grad = int(np.median(list(per_step.values()))) if per_step else None
    opt = _optimizer_name(events if events is not None else store.rank_table("events", rank, columns=["name"]))
    k = _OPTIMIZER_STATES.get((opt or "").lower())
    return {"grad_bytes": grad, "param_bytes": grad, "optimizer": opt,
            "optimizer_state_bytes": grad * k if grad is not None and k is not None else None}


def _optimizer_name(events: pa.Table) -> str | None:
    names = events.column("name")
    for nm in pc.unique(pc.cast(names, pa.string())).to_pylist():
        m = _OPTIMIZER_RE.match(nm or "")
        if m:
            return m.group(1)
    return None


# ----------------------------------------------------------------------------------------------
# pipeline stages


def stage_memory(ranks: list[dict[str, Any]], pipeline: dict) -> list[dict[str, Any]]:
    """Per pipeline stage: activation memory of its ranks against the micro-batches the schedule keeps
    in flight there (1F1B: stage s of p holds min(p − s, m); GPipe: all m)."""
    stages = pipeline.get("stages") or []
    if not stages or not pipeline.get("num_stages"):
        return []
    p, m = int(pipeline["num_stages"]), int(pipeline.get("num_microbatches") or 1)
    v = int(pipeline.get("chunks_per_rank") or 1)
    schedule = pipeline.get("schedule") or pipeline.get("schedule_detected") or "1f1b"
    main = {}
    for r in ranks:  # ranks are sorted with the main device first
        main.setdefault(r["rank"], r)
    out = []
    for st in stages:
        mine = [main[r] for r in st.get("ranks", []) if r in main]
        if not mine:
            continue
        per_mb = [x["per_microbatch_bytes"] for x in mine if x["per_microbatch_bytes"]]
        flight = [x["in_flight_measured"] for x in mine if x["in_flight_measured"] is not None]
        out.append({"stage": int(st["stage"]), "ranks": [x["rank"] for x in mine],
                    "activation_peak_bytes": int(np.mean([x["activation_peak_bytes"] for x in mine])),
                    "activation_held_bytes": int(np.mean([x["activation_held_bytes"] for x in mine])),
                    "per_microbatch_bytes": int(np.median(per_mb)) if per_mb else None,
                    "in_flight_measured": round(float(np.mean(flight)), 3) if flight else None,
                    # stages are virtual stages on interleaved schedules: stage s runs on pp rank s % p,
                    # and a forward phase is one model chunk's
                    "in_flight_schedule": in_flight_chunks(schedule, p, m, int(st["stage"]) % p, v),
                    "peak_allocated": int(max(x["peak_allocated"] for x in mine)), "layers": st.get("layers")})
    return out


def even_memory_split(stage_bytes: list[float], stage_layers: list[int]) -> list[int] | None:
    """Layers per stage that make the largest stage's memory smallest, with a stage's memory taken as
    proportional to its layers (each stage keeps its own per-layer cost: its in-flight micro-batches)."""
    if len(stage_bytes) != len(stage_layers) or min(stage_layers) < 1:
        return None
    per_layer = [b / n for b, n in zip(stage_bytes, stage_layers)]
    new = [1] * len(per_layer)
    for _ in range(sum(stage_layers) - len(new)):
        s = min(range(len(new)), key=lambda k: ((new[k] + 1) * per_layer[k], k))
        new[s] += 1
    return new


# ----------------------------------------------------------------------------------------------
# recomputation (activation checkpointing) from the op tree


def _nesting(ts: np.ndarray, end: np.ndarray, tid: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Parent row of each event on its thread (-1 at the top), by containment; and the rows in an
    order where every parent comes before its children."""
    o = np.lexsort((-(end - ts), ts, tid))
    # in that order, a row's parent is the nearest earlier row of its thread ending no earlier than it does
    # (what a call stack popping the rows that end before it leaves on top): host_ops.parents finds the
    # nearest earlier row whose end is past a threshold, here the row's own end - 1 (integer ns)
    e = np.asarray(end, np.int64)[o]
    at = parents(np.asarray(tid, np.int64)[o], e - 1, e)
    parent = np.full(len(ts), -1, np.int64)
    parent[o] = np.where(at >= 0, o[np.maximum(at, 0)], -1)
    return parent, o.tolist()


def recompute_of_rank(store: RunStore, rank: int, events: pa.Table | None = None) -> dict[str, Any] | None:
    """Forward ops re-run inside backward on this rank, with their time per step; None when none."""
    spans = recompute_spans(store, rank, events)
    if not spans:
        return None
    steps = max(1, store.rank_table("steps", rank, columns=["step"]).num_rows)
    total_ns = int(sum(e - t for t, e, _, _ in spans))
    return {"rank": rank, "recompute_ns_per_step": total_ns // steps, "ops_per_step": len(spans) / steps,
            "names": sorted({n for _, _, _, n in spans})[:12]}


def recompute_spans(store: RunStore, rank: int, events: pa.Table | None = None) -> list[tuple[int, int, int, str]]:
    """(start ns, end ns, tid, name) of each outermost forward op re-run inside backward on this rank (module
    docstring: Recomputation), in start order; [] when none."""
    ev = events if events is not None else store.rank_table("events", rank, columns=EVENT_COLUMNS)
    ev = ev.filter(pc.equal(pc.cast(ev.column("cat"), pa.string()), "cpu_op"))
    if not ev.num_rows or not pc.any(pc.starts_with(pc.unique(pc.cast(ev.column("name"), pa.string())),
                                                    _BACKWARD_REGION)).as_py():
        return []  # no autograd engine events: no backward to look into
    names = object_strings(ev.column("name")).tolist()
    compute = pc.fill_null(pc.equal(pc.cast(ev.column("role"), pa.string()), "compute"), True).to_numpy(
        zero_copy_only=False)
    ts = ev.column("ts").to_numpy()
    end = ts + ev.column("dur").fill_null(0).to_numpy(zero_copy_only=False)
    tid = ev.column("tid").fill_null(-1).to_numpy(zero_copy_only=False)
    parent, order = _nesting(ts, end, tid)
    bwd = [False] * len(ts)
    par = parent.tolist()
    for i in order:  # parents before children
        p = par[i]
        bwd[i] = names[i].startswith(_BACKWARD_REGION) or (p >= 0 and bwd[p])
    in_bwd = np.array(bwd, bool).reshape(-1)
    works = np.zeros(len(ts), bool)
    for i in np.flatnonzero(parent >= 0).tolist():
        if names[i] not in _VIEW_OPS:
            works[parent[i]] = True
    # composite forward ops only: an op with an autograd node of its own (SumBackward0 for aten::sum)
    # is one autograd formulas call too; composites (linear, layer_norm, sdpa) appear in backward only
    # when a forward is re-run
    nodes = {_op_key(m.group(1)) for m in map(_NODE_RE.match, set(names)) if m}
    forward = {names[i] for i in np.flatnonzero((parent < 0) & ~in_bwd & works).tolist()
               if names[i] not in _VIEW_OPS and _op_key(names[i]) not in nodes
               and not names[i].startswith(_NOT_MODEL_OPS)}
    cand = np.array([in_bwd[i] and compute[i] and names[i] in forward for i in range(len(ts))], bool)
    top = [i for i in np.flatnonzero(cand).tolist() if not _has_candidate_ancestor(i, parent, cand)]
    # a re-run forward is a run of several forward ops under one backward node (a checkpointed block);
    # a lone forward-named op there is a backward formula using it
    by_node: dict[int, list[int]] = defaultdict(list)
    for i in top:
        by_node[_backward_root(i, parent, names)].append(i)
    # ... but not under a custom autograd Function's backward (`_RingAttentionBackward`: a Python
    # Function's node has no formula number, built-in ones do: MmBackward0): there the forward-named ops are
    # that Function's own backward (ring attention re-runs its matmuls per ring step), not a checkpoint's
    # re-run; the reentrant checkpoint's own Function (CheckpointFunctionBackward) is a re-run
    top = [i for root, group in by_node.items() if len({names[j] for j in group}) >= 2
           and not (root >= 0 and _custom_function_backward(names[root])) for i in group]
    return sorted((int(ts[i]), int(end[i]), int(tid[i]), names[i]) for i in top)


_NOT_MODEL_OPS = ("fsdp::",)
"""Op namespaces that are a wrapper's machinery, not the model's forward: FSDP2 all-gathers a resharded
module's parameters again before its backward (`fsdp::all_gather_copy_in`, `fsdp::split_with_sizes_copy`),
which is no recompute."""
_CUSTOM_BACKWARD_RE = re.compile(r"^(\w+)Backward$")
_CHECKPOINT_FUNCTIONS = frozenset({"CheckpointFunction"})


def _custom_function_backward(name: str) -> bool:
    """An autograd engine event of a Python `torch.autograd.Function`'s backward (no formula number), other
    than the reentrant checkpoint's."""
    m = _CUSTOM_BACKWARD_RE.match(name.removeprefix(_BACKWARD_REGION).strip())
    return bool(m) and m.group(1) not in _CHECKPOINT_FUNCTIONS


def _backward_root(i: int, parent: np.ndarray, names: list[str]) -> int:
    """The innermost autograd engine event above row i (-1: none)."""
    p = parent[i]
    while p >= 0 and not names[p].startswith(_BACKWARD_REGION):
        p = parent[p]
    return int(p)


def _has_candidate_ancestor(i: int, parent: np.ndarray, cand: np.ndarray) -> bool:
    p = parent[i]
    while p >= 0:
        if cand[p]:
            return True
        p = parent[p]
    return False


# ----------------------------------------------------------------------------------------------
# findings


def _mib(b: float) -> str:
    return f"{b / 2**20:.1f} MiB"


def _imbalance_findings(section: dict) -> list[Finding]:
    """The fullest pipeline stage (or, without stages, rank) against the mean, with a layer re-split."""
    stages = section["stages"]
    if len(stages) > 1:
        peaks = [s["peak_allocated"] for s in stages]
        who, dim = [s["stage"] for s in stages], "pp"
    else:
        main = {}
        for r in section["ranks"]:
            main.setdefault(r["rank"], r)
        if len(main) < 2:
            return []
        peaks, who, dim = [x["peak_allocated"] for x in main.values()], list(main), None
    mean = float(np.mean(peaks))
    k = int(np.argmax(peaks))
    ratio = peaks[k] / mean if mean > 0 else 0.0
    if ratio < MEMORY_IMBALANCE_RATIO:
        return []
    evidence: dict[str, Any] = {"peak_allocated": dict(zip(map(str, who), peaks)), "max_over_mean": round(ratio, 3),
                                "threshold": MEMORY_IMBALANCE_RATIO}
    advice = "Balance memory across ranks (e.g. the sharding or the data each rank gets)."
    layers = [s["layers"] for s in stages] if dim == "pp" else None
    if layers and None not in layers:
        new = even_memory_split([float(x) for x in peaks], layers)
        if new and new != layers:
            per_layer = [b / n for b, n in zip(peaks, layers)]
            predicted = [int(n * u) for n, u in zip(new, per_layer)]
            evidence.update(stage_layers=layers, recommended_stage_layers=new, predicted_peak_allocated=predicted)
            advice = (f"Re-split the layers over the stages {','.join(map(str, layers))} → {','.join(map(str, new))}: "
                      f"the fullest stage would hold about {_mib(max(predicted))} instead of {_mib(peaks[k])} "
                      f"(stage memory taken as proportional to its layers).")
    ranks = tuple(stages[k]["ranks"]) if dim == "pp" else (who[k],)
    what = f"stage {who[k]}" if dim == "pp" else f"rank {who[k]}"
    return [Finding(kind=FindingKind.MEMORY_IMBALANCE, severity=Severity.WARNING, ranks=ranks, dim=dim,
                    summary=f"{what} peaks at {_mib(peaks[k])} allocated, {ratio:.2f}x the mean over "
                            f"{'stages' if dim == 'pp' else 'ranks'} ({_mib(mean)})",
                    evidence=Evidence(details=evidence), recommendation=advice)]


def _faster_layouts(layout: dict, pipeline: dict, recompute: list) -> list[str]:
    """What memory headroom could buy in this run's layout."""
    mesh = layout.get("mesh_shape") or {}
    out = []
    if (mesh.get("tp") or 1) > 1:
        out.append(f"fewer tensor-parallel ways (tp {mesh['tp']} → {mesh['tp'] // 2}: less communication, "
                   f"about twice the block parameters and activations per rank)")
    if pipeline.get("num_stages"):
        out.append("more micro-batches per step (a smaller pipeline bubble; 1F1B's in-flight count stays p − s)")
    if recompute:
        out.append("no activation checkpointing (saves the recompute time listed under recompute)")
    return out or ["a larger micro-batch (fewer, larger kernels per step)"]


def _activation_findings(section: dict, capacity: int | None, faster: list[str]) -> list[Finding]:
    """Activation-dominated peak (with what each remedy saves) and headroom for a hungrier layout."""
    main = {}
    for r in section["ranks"]:
        main.setdefault(r["rank"], r)
    top = max(main.values(), key=lambda x: x["peak_allocated"])
    act, peak = top["activation_peak_bytes"], top["peak_allocated"]
    static = top["static_bytes"]
    split = top.get("split") or {}
    static = split.get("static_bytes")  # None: the counter started with the profiler and nothing estimates it
    out = []
    total = act + (static or 0)
    if static is not None and total > 0 and act / total >= ACTIVATION_DOMINATED_SHARE:
        held = top["activation_held_bytes"] or act
        remedies = {"activation_checkpointing_saves_bytes": int(held * (1 - CHECKPOINT_KEEPS)),
                    "cp_or_sp_2_saves_bytes": int(act / 2), "half_microbatch_saves_bytes": int(act / 2)}
        out.append(Finding(
            kind=FindingKind.ACTIVATION_DOMINATED_PEAK, severity=Severity.INFO, ranks=(top["rank"],),
            summary=f"activations are {act / total:.0%} of rank {top['rank']}'s peak ({_mib(act)} of {_mib(total)})",
            evidence=Evidence(details={"activation_bytes": act, "static_bytes": static, "counter": section["counter"],
                                       "at_peak": top["at_peak"], **remedies}),
            recommendation=(f"To lower the peak: activation checkpointing per block (keeps block inputs only; "
                            f"about {_mib(remedies['activation_checkpointing_saves_bytes'])} of the held "
                            f"activations, for one extra forward in backward), context/sequence parallelism of 2 (halves the "
                            f"activations: {_mib(remedies['cp_or_sp_2_saves_bytes'])}), or half the micro-batch "
                            f"size ({_mib(remedies['half_microbatch_saves_bytes'])})")))
    if capacity and top["peak_reserved"] and (capacity - top["peak_reserved"]) / capacity >= HEADROOM_SHARE:
        free = capacity - top["peak_reserved"]
        out.append(Finding(
            kind=FindingKind.MEMORY_HEADROOM, severity=Severity.INFO, ranks=(top["rank"],),
            summary=(f"PyTorch's allocator on the fullest rank (rank {top['rank']}) held at most {_mib(top['peak_reserved'])} "
                     f"of the device's {_mib(capacity)}: {_mib(free)} ({free / capacity:.0%}) it never held (memory "
                     "outside the allocator, such as the CUDA context, NCCL buffers or other processes, is not in the trace)"),
            evidence=Evidence(details={"capacity_bytes": capacity, "peak_reserved": top["peak_reserved"]}),
            recommendation="Spend the headroom on speed: " + "; or ".join(faster) + "."))
    return out


def _recompute_finding(recompute: list[dict[str, Any]]) -> Finding:
    worst = max(recompute, key=lambda x: x["recompute_ns_per_step"])
    return Finding(
        kind=FindingKind.RECOMPUTE, severity=Severity.INFO, ranks=tuple(x["rank"] for x in recompute),
        summary=f"forward ops re-run inside backward (activation checkpointing) cost up to "
                f"{worst['recompute_ns_per_step'] / 1e6:.2f} ms per step (rank {worst['rank']})",
        evidence=Evidence(details={
                  "recompute_ns_per_step": {str(x["rank"]): x["recompute_ns_per_step"] for x in recompute},
                  "ops_per_step": {str(x["rank"]): x["ops_per_step"] for x in recompute},
                  "ops": worst["names"]}),
        recommendation="Where memory allows (see the memory section's headroom), checkpoint fewer blocks: each "
                       "block not checkpointed saves its share of this recompute time.",
        est_saving_ns=int(worst["recompute_ns_per_step"]))
