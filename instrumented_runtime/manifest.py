"""`manifest.json` (run facts every tool reads) and `.ground_truth.json` (config + injected faults).

Written by rank 0 after gathering every rank's facts (clock anchors, host, stage layers, step times).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from .config import RunConfig
from .faults import ground_truth_faults
from .parallel_dims import ParallelDims
from .pipeline import effective_schedule, stage_indices
from .profiling import profiled_steps

MANIFEST_SCHEMA = "tracekit.manifest/1"
GROUND_TRUTH_SCHEMA = "tracekit.ground_truth/1"
ANSWER_KEY_FILE = ".ground_truth.json"
"""The answer key (config + injected faults): a hidden file, which trace discovery never reads."""


def clock_sample() -> dict[str, int]:
    """One (wall, monotonic, perf_counter) triple taken back to back, in ns."""
    return {"time_ns": time.time_ns(), "monotonic_ns": time.monotonic_ns(), "perf_counter_ns": time.perf_counter_ns()}


def host_of(cfg: RunConfig, rank: int) -> str:
    """Virtual host name (`--ranks-per-host`), else the machine's."""
    if cfg.ranks_per_host:
        return f"host{rank // cfg.ranks_per_host}"
    return platform.node()


def host_cpus(cfg: RunConfig) -> dict[str, int]:
    """CPU cores the ranks may run on, per host (the launcher's affinity; its ranks inherit it). None for
    virtual hosts (`--ranks-per-host`): they share the machine's cores, how is not recorded."""
    if cfg.ranks_per_host:
        return {}
    return {platform.node(): len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1}


def layout_of(cfg: RunConfig, pd: ParallelDims) -> dict[str, Any]:
    """Parallel layout with every group's rank list, the mesh and the pipeline stage map."""
    lay = pd.manifest_layout()
    L = cfg.layout
    stages = cfg.stage_split.stage_layer_ids(cfg.model.num_layers)
    lay.update({
        "dp_mode": L.dp_mode,
        "schedule": L.schedule if L.pp > 1 else None,
        "schedule_effective": effective_schedule(L.schedule, L.microbatches, L.pp) if L.pp > 1 else None,
        "microbatches": L.microbatches,
        "virtual_stages": L.stages_per_rank,
        "num_stages": L.num_stages,
        "stage_layers": [len(s) for s in stages],
        "stage_layer_ids": [list(s) for s in stages],
        "stage_pp_rank": {str(s): s % L.pp for s in range(L.num_stages)},
        "pp_rank_stages": {str(r): stage_indices(r, L.pp, L.stages_per_rank) for r in range(L.pp)},
        "mesh_dim_names": ["pp", "dp", "cp", "tp"],
        "mesh_shape": [L.pp, L.dp, L.cp, L.tp],
        "ep_from": "dp_cp",
        "moe_layers": [i for i in range(cfg.model.num_layers) if cfg.model.is_moe_layer(i)],
        "num_experts": cfg.model.num_experts,
        "global_batch_size": cfg.global_batch_size,
    })
    return lay


def build_manifest(cfg: RunConfig, pd: ParallelDims, *, command: list[str], backend: str, torch_version: str,
                   per_rank: list[dict[str, Any]], launcher: str) -> dict[str, Any]:
    hosts = {str(r): host_of(cfg, r) for r in range(pd.world_size)}
    anchors = {str(p["rank"]): {"start": p["clock_start"], "post_barrier": p["clock_post_barrier"]}
               for p in per_rank}
    ref = per_rank[0]["clock_post_barrier"]["time_ns"]
    return {
        "schema": MANIFEST_SCHEMA,
        "producer": "instrumented_runtime",
        "command": command,
        "launcher": launcher,
        "world_size": pd.world_size,
        "backend": backend,
        "hosts": hosts,
        "host_cpus": host_cpus(cfg),
        "ranks_per_host": cfg.ranks_per_host,
        "torch_version": torch_version,
        "python_version": sys.version.split()[0],
        "layout": layout_of(cfg, pd),
        "tokens_per_step": cfg.tokens_per_step,
        "global_batch_size": cfg.global_batch_size,
        "seq_len": cfg.seq_len,
        "microbatches": cfg.layout.microbatches,
        "schedule": cfg.layout.schedule if cfg.layout.pp > 1 else None,
        "steps": cfg.steps,
        "profiled_steps": profiled_steps(cfg),
        "model": cfg.to_dict()["model"],
        "config": cfg.to_dict(),
        "clock_anchors": anchors,
        "clock_anchor_note": ("per rank: 'start' sampled after init_process_group, 'post_barrier' right after a "
                              "world barrier (all ranks leave it within ~the barrier's exit jitter); "
                              "clock_offset_ns = post_barrier.time_ns - rank 0's"),
        "clock_offset_ns": {str(p["rank"]): p["clock_post_barrier"]["time_ns"] - ref for p in per_rank},
        "files": {"traces": "rank{R}.pt.trace.json.gz", "comms": "comms.rank{R}.jsonl",
                  "routing": "routing.rank{R}.jsonl", "metrics": "metrics.rank{R}.jsonl"},
    }


def build_ground_truth(cfg: RunConfig, pd: ParallelDims) -> dict[str, Any]:
    return {"schema": GROUND_TRUTH_SCHEMA, "config": cfg.to_dict(), "layout": layout_of(cfg, pd),
            "faults": ground_truth_faults(cfg, pd)}


def write_json(path: str | Path, obj: Any) -> None:
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)
