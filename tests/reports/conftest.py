"""Report fixtures: a hand-made analysis.json (every section, a hostile trace name) and a synthetic
many-rank one. Shapes follow the analyzers' docstrings (tracekit/analyze/*.py)."""

from __future__ import annotations

import copy
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

HOSTILE = "<img src=x onerror=alert(1)>"
"""A trace event / group name that must always show as text, never as markup."""
BREAKOUT = "</script><script>window.__xss=true</script>"
"""A name that would end the inline JSON <script> block if it were embedded unescaped."""


def _rank_row(rank: int, steps: int, compute: int, exposed: int, other: int, idle: int, comm: int) -> dict[str, Any]:
    step = compute + exposed + other + idle
    bound = "communication" if exposed > compute else ("idle" if idle > compute else "compute")
    return {"rank": rank, "steps": steps, "step_ns": step * steps, "compute_ns": compute * steps,
            "comm_ns": comm * steps, "exposed_comm_ns": exposed * steps, "other_ns": other * steps,
            "idle_ns": idle * steps, "overlap_ratio": round(1 - exposed / comm, 4) if comm else None, "bound": bound}


def build_analysis(num_ranks: int = 4, *, steps: int = 2, slow_rank: int | None = 1, seed: int = 0,
                   timeline_intervals_per_rank: int = 24, hostile: bool = True) -> dict[str, Any]:
    """A complete analysis dict: 2-D layout (tp × dp), per-rank numbers, a timeline, pipeline, experts,
    stragglers, bandwidth, findings. `slow_rank` gets a straggler finding (None: no fault)."""
    rng = random.Random(seed)
    grp = HOSTILE if hostile else "mesh_tp"
    tp = 2 if num_ranks % 2 == 0 else 1
    dp = num_ranks // tp
    ranks = []
    for r in range(num_ranks):
        compute = 60_000_000 + rng.randrange(0, 5_000_000)
        exposed = 25_000_000 + rng.randrange(0, 3_000_000) + (0 if r != slow_rank else -20_000_000)
        ranks.append(_rank_row(r, steps, compute, exposed, 3_000_000, 7_000_000 + rng.randrange(0, 999_999),
                               exposed + 10_000_000))
    lanes = ["compute", f"comm:{grp}", f"comm:{BREAKOUT}" if hostile else "comm:dp", "other", "idle"]
    intervals = []
    for r in range(num_ranks):
        t = 1_700_000_000_000_000_000
        for i in range(timeline_intervals_per_rank):
            lane = lanes[i % len(lanes)]
            dur = 1_000_000 + rng.randrange(0, 2_000_000)
            intervals.append([r, lane, t, t + dur])
            t += dur + 10_000
    findings = []
    if slow_rank is not None:
        findings.append({"kind": "straggler", "severity": "critical", "ranks": [slow_rank], "dim": "dp",
                         "summary": f"rank {slow_rank} arrives late to collectives on group {grp}",
                         "evidence": {"late_fraction": 0.97, "mean_lateness_ns": 41_000_000, "pg_name": grp},
                         "recommendation": f"Inspect rank {slow_rank}'s host ({grp}).", "est_saving_ns": 41_000_000})
    findings += [
        {"kind": "communication_bound", "severity": "warning", "ranks": list(range(num_ranks)), "dim": "tp",
         "summary": f"exposed {grp} all_reduce is 28% of the step", "evidence": {"exposed_ns": 25_000_000},
         "recommendation": "Overlap the TP all-reduce with compute (async TP).", "est_saving_ns": 25_000_000},
        {"kind": "pipeline_bubble", "severity": "warning", "ranks": [0, 1], "dim": "pp",
         "summary": "bubble 0.43 vs 0.20 theoretical", "evidence": {"measured_bubble": 0.43},
         "recommendation": "Use more micro-batches (m=8).", "est_saving_ns": 12_000_000},
        {"kind": "expert_routing_skew", "severity": "info", "ranks": [], "dim": "ep",
         "summary": "layer 1 expert 3 receives 2.4x the mean", "evidence": {"skew": 2.4},
         "recommendation": "Raise the auxiliary loss weight.", "est_saving_ns": 3_000_000},
    ]
    findings.sort(key=lambda f: -f["est_saving_ns"])
    layout_ranks = [{"rank": r, "coords": {"dp": r // tp, "tp": r % tp}} for r in range(num_ranks)]
    groups = [{"pg_name": f"{d}{i}", "pg_desc": (grp if d == "tp" else f"mesh_{d}"), "dim": d,
               "ranks": [r for r in range(num_ranks) if (r // tp if d == "tp" else r % tp) == i],
               "size": (tp if d == "tp" else dp), "inferred_from": "pg_desc", "confidence": "high"}
              for d, n in (("tp", dp), ("dp", tp)) for i in range(n)]
    return {
        "schema": "tracekit.analysis/1",
        "tracekit_version": "0.1.0",
        "command": f"tracekit analyze traces/{grp} --out out",
        "inputs": {"ranks": list(range(num_ranks)),
                   "skipped": [{"file": f"rank{num_ranks}.pt.trace.json.gz", "reason": f"truncated gzip; event {HOSTILE if hostile else 'x'}"}]},
        "ranks": ranks,
        "findings": findings,
        "sections": {
            "layout": {"world_size": num_ranks, "groups": groups, "ranks": layout_ranks,
                       "mesh_shape": {"dp": dp, "tp": tp}, "dims_inferred_from": {"dp": "pg_desc", "tp": "pg_desc"}},
            "breakdown": {"ranks": ranks, "timeline": {"lanes": lanes, "intervals": intervals,
                                                       "max_intervals": 20000, "min_gap_ns": 0, "truncated_ranks": []}},
            "unoverlapped": {
                "instances": 16 * num_ranks, "exposed_ns": 0, "transfer_exposed_ns": 0,
                "by_dim_op": [{"dim": "tp", "op": op, "instances": 8 * num_ranks, "comm_ns": 30_000_000 * num_ranks,
                               "exposed_ns": 12_000_000 * num_ranks, "transfer_exposed_ns": 11_000_000 * num_ranks,
                               "overlap_ratio": 0.6, "exposed_ns_per_step": 6_000_000,
                               "transfer_exposed_ns_per_step": 5_500_000, "share_of_step": 0.055,
                               "worst_rank": num_ranks - 1} for op in ("all_reduce", "all_gather")],
                "by_rank_dim_op": [{"rank": r, "dim": grp, "op": op, "instances": 8, "comm_ns": 30_000_000,
                                    "exposed_ns": 10_000_000 + 1_000_000 * r, "transfer_exposed_ns": 9_000_000,
                                    "steps": steps, "step_ns": 95_000_000}
                                   for r in range(num_ranks) for op in ("all_reduce", "all_gather")],
                "by_dim": [{"key": "tp", "instances": 16 * num_ranks, "exposed_ns": 1, "transfer_exposed_ns": 1}],
                "top_offenders": [{"rank": 0, "pg_name": grp, "dim": "tp", "op": "all_reduce", "bytes": 4_194_304,
                                   "caller": grp, "step": 3, "ts": 1_700_000_000_000_000_000, "dur_ns": 3_000_000,
                                   "exposed_ns": 2_500_000, "transfer_exposed_ns": 2_000_000, "share_of_step": 0.026}],
                "thresholds": {"info_fraction": 0.02}},
            "pipeline": {"source": "labels", "schedule": "1f1b", "num_stages": 2, "chunks_per_rank": 1,
                         "num_microbatches": 4, "theoretical_bubble": 0.2, "measured_bubble": 0.43, "imbalance": 1.1,
                         "stages": [{"stage": s, "ranks": [s], "compute_ns": 50_000_000, "fwd_ns": 20_000_000,
                                     "bwd_ns": 30_000_000, "layers": 2} for s in range(2)],
                         "diagram": {"step": 3, "ranks": [0, 1], "window_ns": 100_000_000, "intervals": [
                             {"rank": s, "stage": s, "microbatch": m, "phase": ph,
                              "start_ns": 5_000 + (m * 10 + s * 5 + (50 if ph == "bwd" else 0)) * 1_000_000,
                              "dur_ns": 4_000_000 if ph == "fwd" else 8_000_000}
                             for s in range(2) for m in range(4) for ph in ("fwd", "bwd")]}},
            "experts": {"source": "routing", "granularity": "expert",
                        "layers": [{"layer": l, "num_experts": 8, "skew": 1.2 + l, "skew_max": 1.3 + l, "hot_expert": 3,
                                    "hot_owner_ranks": [1], "tokens_total": 1000, "dropped_total": 10,
                                    "dropped_fraction": 0.01} for l in range(2)],
                        "heatmap": [{"step": st, "layer": l, "tokens": [100 + 40 * (e == 3) * l + st for e in range(8)],
                                     "dropped": [0] * 8, "skew": 1.2} for st in (3, 4) for l in range(2)],
                        "ranks": [{"rank": r, "a2a_ns": 4_000_000.0, "a2a_calls": 4.0, "a2a_recv_elems": 1e6,
                                   "a2a_bytes": 4e6, "tokens_received": 512.0, "expert_ns": 9e6} for r in range(num_ranks)]},
            "stragglers": {"steps_counted": steps, "mean_step_ns": 95_000_000,
                           "ranks": [{"rank": r, "instances": 32, "last_count": 30 if r == slow_rank else 1,
                                      "last_share": 0.94 if r == slow_rank else 0.03,
                                      "delay_ns_per_step": 40_000_000 if r == slow_rank else 500_000,
                                      "delay_fraction": 0.42 if r == slow_rank else 0.005,
                                      "dominance": 80.0 if r == slow_rank else 0.0, "by_dim": {"dp": 1}}
                                     for r in range(num_ranks)],
                           "stragglers": ([{"rank": slow_rank, "cause": "compute", "cause_evidence": {
                               "compute_excess_ns": 39_000_000, "data_load_excess_ns": 0, "host_idle_excess_ns": 0,
                               "delay_ns": 40_000_000, "instances_examined": 30}}] if slow_rank is not None else []),
                           "thresholds": {}},
            "clocks": {"method": "estimated", "reference_rank": 0,
                       "ranks": [{"rank": r, "offset_ns": 0, "mad_ns": 1000, "instances": 32, "applied": False,
                                  "status": "negligible"} for r in range(num_ranks)], "log_to_trace": [], "thresholds": {}},
            "bandwidth": {"time_basis": "transfer", "rows": [
                {"pg_name": grp, "dim": "tp", "op": "all_reduce", "group_size": 2, "bucket_bytes": 4_194_304, "count": 16,
                 "bytes_p50": 4_194_304, "time_ns_p50": 3_500_000, "algbw_gbps_p50": 1.2, "busbw_gbps_p50": 1.2,
                 "busbw_gbps_max": 1.4, "time_ns_per_step": 28_000_000, "reference_gbps": None, "reference": None,
                 "low": False}]},
            "throughput": {"tokens_per_step": 8192, "tokens_source": "manifest", "dp_degree": dp, "steps": steps,
                           "step_ns_mean": 95_000_000.0, "tokens_per_s": 86231.6, "tokens_per_s_per_device": 86231.6 / num_ranks,
                           "world_size": num_ranks, "ranks": []},
            "advice": _advice_section(dp, tp, grp),
        },
    }


def _candidate(dp: int, tp: int, step_ms: float, peak_gib: float, changes: list[str], why: str,
               current: bool = False) -> dict[str, Any]:
    layout = {"dp": dp, "tp": tp, "pp": 1, "cp": 1, "ep": 1, "fsdp": False, "schedule": None, "microbatches": 1,
              "interleave": 1, "activation_checkpointing": False}
    return {"layout": layout, "micro_batch_size": 2, "predicted_step_ns": int(step_ms * 1e6),
            "tokens_per_s_per_gpu": 1000.0, "mfu": 0.4, "peak_memory_bytes": int(peak_gib * 2**30),
            "fits_in_memory": peak_gib < 72, "breakdown_ns": {"compute": 60_000_000, "exposed_comm": 20_000_000, "idle": 1},
            "changes": changes, "why": why, "is_current": current}


def _advice_section(dp: int, tp: int, note: str) -> dict[str, Any]:
    """The layout advice of tracekit/assess/advice.py (advice.json's shape), with `note` in a calibration note."""
    cur = dict(_candidate(dp, tp, 95.0, 30.0, [], "", current=True), measured_step_ns=96_000_000)
    ranked = [_candidate(dp * tp, 1, 80.0, 50.0, [f"tp {tp}→1", f"dp {dp}→{dp * tp}"], "exposed communication −15.0 ms"),
              cur, _candidate(dp // 2 or 1, tp * 2, 99.0, 20.0, [f"tp {tp}→{tp * 2}"], "compute +4.0 ms"),
              _candidate(dp * tp, 1, 70.0, 90.0, ["FSDP"], "idle (bubble, waits) −25.0 ms")]
    doc = {"schema": "tracekit.advice/1", "model": {"seq": 4096},
           "target": {"gpus": dp * tp, "hosts": 1, "gpus_per_host": dp * tp, "global_batch": 16,
                      "gpu_memory_bytes": 80 * 2**30},
           "calibration": {"notes": [f"intra-host bus bandwidth 240 GB/s measured on {note}"]},
           "memory_calibration": {"calibrated": True, "note": "calibrated on the measured peaks"},
           "current": cur, "layouts_considered": 40, "layouts_simulated": 4, "ranked": ranked, "skipped": []}
    return {"available": True, "reason": None, "advice": doc}


@pytest.fixture
def handmade_analysis() -> dict[str, Any]:
    """4 ranks, every section, a straggler on rank 1, the hostile name in groups/lanes/findings/inputs."""
    return copy.deepcopy(_HANDMADE)


_HANDMADE = build_analysis()


@pytest.fixture(scope="session")
def analysis_builder() -> Callable[..., dict[str, Any]]:
    return build_analysis


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path of Debian's chromium; runs scripts/install_chromium.sh once if it is missing."""
    path = shutil.which("chromium")
    if path is None:
        repo = Path(__file__).resolve().parents[2]
        subprocess.run(["bash", str(repo / "scripts" / "install_chromium.sh")], check=False, timeout=900)
        path = shutil.which("chromium")
    if path is None:
        pytest.skip("chromium is not installed and scripts/install_chromium.sh could not install it")
    return path
