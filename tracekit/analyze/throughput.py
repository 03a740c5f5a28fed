"""Throughput: tokens/s for the job, per rank and per device; achieved FLOP/s and MFU per rank.

Tokens per step come from `config.tokens_per_step` (per data-parallel replica, × the dp degree) or the
manifest's `tokens_per_step` (the whole job). Step time = the slowest rank's step per step, averaged over
steps, where a rank's step is the breakdown's step window (one step denominator across the report: on GPU
ranks the device's step, from its first kernel to the next step's first kernel, not the host's
`ProfilerStep` annotation). FLOPs are the ops' counts in `events.flops` (torch.profiler with_flops=True),
summed per rank over its steps; achieved FLOP/s = FLOPs / summed step time. MFU = achieved / peak,
peak from `config.peak_tflops` or the device's dense bf16/fp16 tensor peak in the device table (analyze/hardware.py)
(matched on `ranks.device_names`); none for CPU ranks or unknown devices.

Section `throughput` (JSON):
{"tokens_per_step": int | null, "tokens_source": "config" | "manifest" | null, "dp_degree": int | null,
 "steps": int, "step_ns_mean": float | null, "tokens_per_s": float | null,
 "tokens_per_s_per_device": float | null, "world_size": int,
 "ranks": [{"rank", "device": str | null, "steps", "step_ns_mean", "tokens_per_s", "flops_per_step",
            "achieved_tflops", "peak_tflops", "peak_source": "config" | "device_table" | null,
            "mfu": float | null}]}
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc

from tracekit.analyze.breakdown import BreakdownResult
from tracekit.analyze.hardware import device_peaks
from tracekit.config import AnalysisConfig
from tracekit.derive.topology import LayoutResult
from tracekit.findings.result import AnalyzerResult, section_of
from tracekit.tables.store import RunStore

def device_peak_tflops(device_name: str | None) -> float | None:
    """Dense bf16 (else fp16) tensor peak of a device name, TFLOP/s, from the one device table
    (`analyze/hardware.py`, matched on the deviceProperties name), else None."""
    dev = device_peaks(device_name)
    if dev is None:
        return None
    return dev.peak_tflops("bf16") or dev.peak_tflops("fp16")


def _dp_degree(store: RunStore, layout: dict[str, Any]) -> int | None:
    shape = layout.get("mesh_shape") or {}
    if shape.get("dp") or shape.get("fsdp"):
        return int(shape.get("dp") or 1) * int(shape.get("fsdp") or 1)
    man = store.manifest or {}
    cfg = man.get("config") if isinstance(man.get("config"), dict) else {}
    if cfg.get("dp"):
        return int(cfg["dp"])
    return None


@dataclass(frozen=True)
class ThroughputResult(AnalyzerResult):
    pass


def _step_times(store: RunStore, breakdown: BreakdownResult | None) -> list[dict[str, Any]]:
    """(rank, step, dur) of every analysed step: the breakdown's step windows (the report's one step
    denominator: on GPU ranks the device's step, not the host's ProfilerStep annotation); the `steps` table
    only when the breakdown is missing."""
    rows = section_of(breakdown).get("steps") or []
    if rows:
        return [{"rank": r["rank"], "step": r["step"], "dur": r["step_ns"]} for r in rows if r.get("step") is not None]
    return store.table("steps", ["rank", "step", "dur"]).to_pylist()


def analyze_throughput(store: RunStore, layout: LayoutResult | None, config: AnalysisConfig,
                       breakdown: BreakdownResult | None = None) -> ThroughputResult:
    """Throughput section (no findings: the numbers feed the report and `tracekit diff`)."""
    man = store.manifest or {}
    ranks = store.table("ranks", ["rank", "device_names", "trace_kind"]).to_pylist()
    world = len(ranks)
    dp = _dp_degree(store, section_of(layout))
    if config.tokens_per_step is not None:
        if dp is None:
            tokens, source = None, "config (dp degree unknown: cannot scale per-replica tokens)"
        else:
            tokens, source = int(config.tokens_per_step) * dp, "config"
    elif man.get("tokens_per_step") is not None:
        tokens, source = int(man["tokens_per_step"]), "manifest"
    else:
        tokens, source = None, None

    steps = _step_times(store, breakdown)
    per_step: dict[int, int] = defaultdict(int)
    per_rank: dict[int, dict[int, int]] = defaultdict(dict)
    for s in steps:
        if s["dur"] is not None:
            per_step[s["step"]] = max(per_step[s["step"]], s["dur"])
            per_rank[s["rank"]][s["step"]] = s["dur"]
    step_mean = float(np.mean(list(per_step.values()))) if per_step else None

    # summed batch by batch over the events file: no rank's events are loaded as rows
    flops = store.grouped_sum("events", ["rank", "step"], "flops", pc.field("flops") > 0)

    rank_out = []
    for rk in ranks:
        r = rk["rank"]
        mine = per_rank.get(r, {})
        dev = (rk["device_names"] or [None])[0] if rk["device_names"] else None
        peak, peak_src = (config.peak_tflops, "config") if config.peak_tflops else \
            (device_peak_tflops(dev), "device_table")
        if peak is None:
            peak_src = None
        fl_steps = [s for s in mine if (r, s) in flops]
        total_flops = sum(flops[(r, s)] for s in fl_steps)
        total_ns = sum(mine[s] for s in fl_steps)
        achieved = total_flops / total_ns * 1e9 / 1e12 if total_ns else None  # TFLOP/s
        r_mean = float(np.mean(list(mine.values()))) if mine else None
        rank_out.append({
            "rank": r, "device": dev, "steps": len(mine), "step_ns_mean": r_mean,
            "tokens_per_s": (tokens / world) / (r_mean / 1e9) if tokens and r_mean and world else None,
            "flops_per_step": total_flops / len(fl_steps) if fl_steps else None,
            "achieved_tflops": achieved, "peak_tflops": peak, "peak_source": peak_src,
            "mfu": achieved / peak if achieved is not None and peak else None,
        })
    tps = tokens / (step_mean / 1e9) if tokens and step_mean else None
    section: dict[str, Any] = {
        "tokens_per_step": tokens, "tokens_source": source, "dp_degree": dp, "steps": len(per_step),
        "step_ns_mean": step_mean, "tokens_per_s": tps,
        "tokens_per_s_per_device": tps / world if tps and world else None, "world_size": world,
        "ranks": rank_out,
    }
    return ThroughputResult(findings=[], section=section)
