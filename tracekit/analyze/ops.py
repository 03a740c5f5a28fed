"""Ops and kernels: what each op costs on the device and how close it runs to the hardware.

Reads the `ops` and `kernel_summary` tables (parse/ops.py: one row per CPU op that launched kernels, its
kernels' summed time, FLOPs and bytes from its recorded shapes). Per op group (name, input shapes, dtype,
across ranks and steps): achieved TFLOP/s = FLOPs / kernel time, TB/s = bytes / kernel time, arithmetic
intensity = FLOPs / bytes, and the roofline: attainable = min(peak FLOP/s of the dtype, intensity × peak
bandwidth); bound = compute when intensity ≥ ridge (peak FLOP/s / peak bandwidth) else memory; % of roof
= achieved / attainable. Peaks come from `--peak-tflops` / `--peak-bandwidth` or the device table
(analyze/hardware.py) matched on the rank's deviceProperties name. Per rank: model FLOPs = the ops'
FLOPs inside the breakdown's step windows, less those of ops launched inside a forward op re-run in backward
(activation checkpointing: analyze/memory.py recompute_spans); achieved = model FLOPs / summed step time;
MFU = achieved / the peak of the dtype carrying most GEMM/attention FLOPs; HFU the same with the recomputed
FLOPs counted (hardware FLOPs: what the device ran). FLOPs of ops without a formula (Triton
kernels, unknown ops) are not counted: `flops_coverage` says what share of op time has a count.

Section `ops`:
{"available": bool, "reason": str | null, "top_n": int,
 "ranks": [{"rank", "device", "device_match", "peak_dtype", "peak_tflops", "hbm_tbps", "peak_source",
            "steps", "step_ns", "time_basis", "model_flops", "flops_per_step", "achieved_tflops", "mfu",
            "hardware_flops", "recompute_flops", "recompute_ops", "hardware_tflops", "hfu",
            "kernel_ns", "op_kernel_ns", "flops_coverage"}],
 "categories": [{"category", "kernel_ns", "share", "ops", "flops"}],
 "top_ops": [{"name", "category", "dtype", "input_dims", "gemm": [batch, M, N, K] | null, "formula",
              "count", "ranks", "kernel_ns", "share", "flops", "bytes", "tflops", "tbps", "intensity",
              "peak_tflops", "roof_tflops", "bound", "pct_of_roof"}],
 "gemm": {"shapes", "count", "kernel_ns", "flops", "tflops"},   # time-weighted over GEMMs with FLOPs
 "kernels": [{"name", "category", "kind", "count", "total_ns", "mean_ns", "max_ns", "share", "streams"}],
 "roofline": {"peak_tflops", "hbm_tbps", "ridge", "dtype", "points": [{"name", "category", "intensity",
              "tflops", "kernel_ns"}]} | null,
 "worst": [top_ops rows: heavy (share ≥ 5%) with the lowest % of roof],
 "notes": [str]}
Findings: `low_op_efficiency` (a GEMM / attention / conv op group taking ≥ 10% of the kernel time runs
below 40% of its roof; saving bound: its time at 70% of roof), `launch_bound_kernels` (a kernel launched
≥ 50 times per step with a mean under 10 µs making ≥ 20% of the rank's launches).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.analyze.breakdown import BreakdownResult
from tracekit.analyze.hardware import device_peaks
from tracekit.config import AnalysisConfig
from tracekit.findings.evidence import Evidence
from tracekit.findings.finding import Finding, FindingKind, Severity
from tracekit.findings.result import AnalyzerResult, section_of
from tracekit.process_env import gc_paused
from tracekit.tables.columns import table_rows
from tracekit.tables.store import RunStore

TOP_N = 25
HEAVY_SHARE = 0.05
LOW_ROOF_FINDING = 0.40
FINDING_SHARE = 0.10
TARGET_ROOF = 0.70
TINY_KERNEL_NS = 10_000
TINY_LAUNCHES_PER_STEP = 50
TINY_LAUNCH_SHARE = 0.20
MODEL_CATEGORIES = ("gemm", "attention", "conv")
_OP_COLUMNS = ["rank", "step", "name", "category", "dtype", "input_dims", "kernel_count", "kernel_ns", "flops",
               "bytes", "gemm_batch", "gemm_m", "gemm_n", "gemm_k", "formula", "launch", "ts"]


@dataclass(frozen=True)
class OpsResult(AnalyzerResult):
    pass


@dataclass(frozen=True)
class RankPeaks:
    device: str | None
    device_match: str | None
    tflops: dict[str, float]
    hbm_tbps: float | None
    source: str | None
    override_tflops: float | None

    def peak(self, dtype: str | None) -> float | None:
        if self.override_tflops:
            return self.override_tflops
        return self.tflops.get(dtype or "")


def rank_peaks(device: str | None, config: AnalysisConfig) -> RankPeaks:
    """The peaks of a rank's device, with the user's overrides."""
    dev = device_peaks(device)
    bw = config.peak_bandwidth_tbps or (dev.hbm_tbps if dev else None)
    src = "config" if (config.peak_tflops or config.peak_bandwidth_tbps) else ("device_table" if dev else None)
    return RankPeaks(device, dev.name if dev else None, dict(dev.tflops) if dev else {}, bw, src,
                     config.peak_tflops)


def roofline(flops: int | None, nbytes: int | None, kernel_ns: int, peak_tflops: float | None,
             hbm_tbps: float | None) -> dict[str, Any]:
    """Achieved TFLOP/s and TB/s, intensity, roof and bound of one op group (nulls where unknown)."""
    tflops = flops / kernel_ns / 1e3 if flops is not None and kernel_ns > 0 else None
    tbps = nbytes / kernel_ns / 1e3 if nbytes and kernel_ns > 0 else None
    intensity = flops / nbytes if flops is not None and nbytes else None
    roof = bound = pct = None
    if peak_tflops and hbm_tbps and intensity is not None:
        ridge = peak_tflops / hbm_tbps
        roof = min(peak_tflops, intensity * hbm_tbps)
        bound = "compute" if intensity >= ridge else "memory"
    elif peak_tflops and flops:
        roof, bound = peak_tflops, "compute"
    if roof and tflops is not None:
        pct = tflops / roof
    elif bound == "memory" and tbps is not None and hbm_tbps:
        pct = tbps / hbm_tbps
    return {"tflops": tflops, "tbps": tbps, "intensity": intensity, "roof_tflops": roof, "bound": bound,
            "pct_of_roof": pct}


def _rank_devices(store: RunStore) -> dict[int, str | None]:
    rows = store.table("ranks", ["rank", "device_names"]).to_pylist()
    return {r["rank"]: (r["device_names"] or [None])[0] if r["device_names"] else None for r in rows}


def _groups(ops: list[dict[str, Any]], out: dict[tuple, dict[str, Any]] | None = None
            ) -> dict[tuple, dict[str, Any]]:
    """Op rows grouped by (name, input dims, dtype): counts, times, FLOPs, bytes, ranks (added to `out`)."""
    out = {} if out is None else out
    for r in ops:
        key = (r["name"], r["input_dims"], r["dtype"])
        g = out.get(key)
        if g is None:
            gemm = [r["gemm_batch"], r["gemm_m"], r["gemm_n"], r["gemm_k"]] if r["gemm_m"] is not None else None
            g = out[key] = {"name": r["name"], "category": r["category"], "dtype": r["dtype"],
                            "input_dims": r["input_dims"], "gemm": gemm, "formula": r["formula"], "count": 0,
                            "ranks": set(), "kernel_ns": 0, "flops": 0, "bytes": 0, "flops_known": True,
                            "bytes_known": True}
        g["count"] += 1
        g["ranks"].add(r["rank"])
        g["kernel_ns"] += r["kernel_ns"] or 0
        g["flops_known"] &= r["flops"] is not None
        g["bytes_known"] &= r["bytes"] is not None
        g["flops"] += r["flops"] or 0
        g["bytes"] += r["bytes"] or 0
    return out


def _group_rows(groups: dict[tuple, dict[str, Any]], peaks: dict[int, RankPeaks], total_ns: int) -> list[dict]:
    rows = []
    for g in groups.values():
        p = peaks.get(min(g["ranks"]))
        flops = g["flops"] if g["flops_known"] else None
        nbytes = g["bytes"] if g["bytes_known"] else None
        peak = p.peak(g["dtype"]) if p else None
        rows.append({**{k: g[k] for k in ("name", "category", "dtype", "input_dims", "gemm", "formula", "count",
                                          "kernel_ns")},
                     "ranks": sorted(g["ranks"]), "share": g["kernel_ns"] / total_ns if total_ns else None,
                     "flops": flops, "bytes": nbytes, "peak_tflops": peak,
                     **roofline(flops, nbytes, g["kernel_ns"], peak, p.hbm_tbps if p else None)})
    rows.sort(key=lambda r: -r["kernel_ns"])
    return rows


def _step_windows(breakdown: dict[str, Any]) -> dict[int, tuple[set | None, int, int]]:
    """rank → (analyzed steps (None: the whole trace), step count, summed step time)."""
    out: dict[int, tuple[set | None, int, int]] = {}
    steps: dict[int, set] = defaultdict(set)
    whole: set[int] = set()
    for s in breakdown.get("steps") or []:
        if s.get("step") is None:
            whole.add(s["rank"])
        else:
            steps[s["rank"]].add(s["step"])
    for r in breakdown.get("ranks") or []:
        rk = r["rank"]
        out[rk] = (None if rk in whole or not steps.get(rk) else steps[rk], int(r.get("steps") or 0),
                   int(r.get("step_ns") or 0))
    return out


def mark_recompute(store: RunStore, ops_by_rank: dict[int, list[dict[str, Any]]]) -> None:
    """Set `recompute` on each op row whose host start lies inside a forward op re-run in backward
    (activation checkpointing: analyze/memory.py recompute_spans, from the rank's op tree). Ranks with no
    FLOPs counted are not looked into."""
    from tracekit.analyze.memory import recompute_spans

    for rk, rows in ops_by_rank.items():
        for r in rows:
            r["recompute"] = False
        if not any(r["flops"] for r in rows):
            continue
        spans = recompute_spans(store, rk)
        if not spans:
            continue
        starts = np.array([t for t, _, _, _ in spans], np.int64)
        ends = np.maximum.accumulate(np.array([e for _, e, _, _ in spans], np.int64))
        for r in rows:
            if r["ts"] is None:
                continue
            j = int(np.searchsorted(starts, r["ts"], side="right")) - 1
            r["recompute"] = j >= 0 and r["ts"] < ends[j]


def _mfu_dtype(ops: list[dict[str, Any]], by: Counter | None = None) -> str | None:
    """The dtype carrying most GEMM / attention / conv FLOPs (`by`: the FLOPs per dtype so far, added to)."""
    by = Counter() if by is None else by
    for r in ops:
        if r["category"] in MODEL_CATEGORIES and r["flops"] and r["dtype"]:
            by[r["dtype"]] += r["flops"]
    return by.most_common(1)[0][0] if by else None


def _rank_totals(mine: list[dict[str, Any]], window: tuple[set | None, int, int]) -> dict[str, Any]:
    """One rank's op rows (`recompute` marked) summed for its `ranks` row of the section (`_rank_rows`)."""
    steps = window[0]
    inside = [r for r in mine if steps is None or r["step"] in steps]
    return {"hw_flops": sum(r["flops"] or 0 for r in inside),
            "rec_flops": sum(r["flops"] or 0 for r in inside if r.get("recompute")),
            "recompute_ops": sum(1 for r in inside if r.get("recompute")),
            "op_ns": sum(r["kernel_ns"] or 0 for r in mine),
            "counted_ns": sum(r["kernel_ns"] or 0 for r in mine if r["flops"] is not None),
            "dtype": _mfu_dtype(mine)}


def _rank_rows(totals: dict[int, dict[str, Any]], peaks: dict[int, RankPeaks], windows: dict, kernel_ns: dict
               ) -> list[dict[str, Any]]:
    out = []
    for rk in sorted(peaks):
        steps, num_steps, step_ns = windows.get(rk, (None, 0, 0))
        t = totals.get(rk) or _rank_totals([], (steps, num_steps, step_ns))
        hw_flops, rec_flops = t["hw_flops"], t["rec_flops"]
        flops = hw_flops - rec_flops
        op_ns, counted_ns, dtype = t["op_ns"], t["counted_ns"], t["dtype"]
        p = peaks[rk]
        peak = p.peak(dtype)
        achieved = flops / step_ns / 1e3 if step_ns and flops else None
        hw_achieved = hw_flops / step_ns / 1e3 if step_ns and hw_flops else None
        out.append({"rank": rk, "device": p.device, "device_match": p.device_match, "peak_dtype": dtype,
                    "peak_tflops": peak, "hbm_tbps": p.hbm_tbps, "peak_source": p.source,
                    "steps": num_steps, "step_ns": step_ns or None,
                    "time_basis": "whole trace" if steps is None else "steps", "model_flops": flops or None,
                    "flops_per_step": flops / num_steps if flops and num_steps else None,
                    "achieved_tflops": achieved, "mfu": achieved / peak if achieved and peak else None,
                    "hardware_flops": hw_flops or None, "recompute_flops": rec_flops,
                    "recompute_ops": t["recompute_ops"],
                    "hardware_tflops": hw_achieved, "hfu": hw_achieved / peak if hw_achieved and peak else None,
                    "kernel_ns": kernel_ns.get(rk, 0), "op_kernel_ns": op_ns,
                    "flops_coverage": counted_ns / op_ns if op_ns else None})
    return out


def _add_categories(acc: dict[str, list], ops: list[dict[str, Any]]) -> None:
    for r in ops:
        a = acc.setdefault(r["category"], [0, 0, 0])
        a[0] += r["kernel_ns"] or 0
        a[1] += 1
        a[2] += r["flops"] or 0


def _categories(acc: dict[str, list]) -> list[dict[str, Any]]:
    total = sum(a[0] for a in acc.values()) or 1
    return sorted(({"category": c, "kernel_ns": a[0], "share": a[0] / total, "ops": a[1], "flops": a[2]}
                   for c, a in acc.items()), key=lambda x: -x["kernel_ns"])


def _gemm_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    gemms = [r for r in rows if r["category"] == "gemm" and r["flops"] is not None]
    ns = sum(r["kernel_ns"] for r in gemms)
    flops = sum(r["flops"] for r in gemms)
    return {"shapes": len(gemms), "count": sum(r["count"] for r in gemms), "kernel_ns": ns, "flops": flops,
            "tflops": flops / ns / 1e3 if ns else None}


def _kernels(store: RunStore, top_n: int) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """Kernel summary across ranks (by name) and each rank's rows."""
    rows = table_rows(store.table("kernel_summary")) if store.has("kernel_summary") else []
    by_rank: dict[int, list] = defaultdict(list)
    acc: dict[str, dict[str, Any]] = {}
    for r in rows:
        by_rank[r["rank"]].append(r)
        a = acc.setdefault(r["name"], {"name": r["name"], "category": r["category"], "kind": r["kind"], "count": 0,
                                       "total_ns": 0, "max_ns": 0, "streams": set()})
        a["count"] += r["count"]
        a["total_ns"] += r["total_ns"]
        a["max_ns"] = max(a["max_ns"], r["max_ns"])
        a["streams"].add(r["stream"])
    total = sum(a["total_ns"] for a in acc.values()) or 1
    out = sorted(acc.values(), key=lambda a: -a["total_ns"])[:top_n]
    for a in out:
        a["mean_ns"] = a["total_ns"] / a["count"] if a["count"] else None
        a["share"] = a["total_ns"] / total
        a["streams"] = sorted(s for s in a["streams"] if s is not None)
    return out, by_rank


def _roofline_section(rows: list[dict[str, Any]], peaks: dict[int, RankPeaks], dtype: str | None
                      ) -> dict[str, Any] | None:
    p = peaks.get(min(peaks)) if peaks else None
    peak = p.peak(dtype) if p else None
    if not p or not peak or not p.hbm_tbps:
        return None
    points = [{"name": r["name"], "category": r["category"], "intensity": r["intensity"], "tflops": r["tflops"],
               "kernel_ns": r["kernel_ns"]} for r in rows
              if r["intensity"] and r["tflops"] and r["flops"]][:60]
    return {"peak_tflops": peak, "hbm_tbps": p.hbm_tbps, "ridge": peak / p.hbm_tbps, "dtype": dtype,
            "device": p.device_match or p.device, "points": points}


GRAPH_LAUNCHES = ("graph_unmatched", "graph")


def _add_graph_launches(acc: dict[str, list], ops: list[dict[str, Any]]) -> None:
    """Per graph launch kind: [op rows, their kernel time, their kernels] (added to `acc`)."""
    for r in ops:
        launch = r.get("launch")
        if launch in GRAPH_LAUNCHES:
            a = acc.setdefault(launch, [0, 0, 0])
            a[0] += 1
            a[1] += r["kernel_ns"] or 0
            a[2] += r["kernel_count"] or 0


def _graph_notes(acc: dict[str, list], op_ns: int) -> list[str]:
    total = op_ns or 1
    out = []
    for launch, text in (("graph_unmatched", "ran from CUDA/HIP-graph replays whose capture is not here: grouped "
                                             "under their graph launch; pass --capture CAPTURE_DIR (the capture "
                                             "trace) to name them by the ops that captured them"),
                         ("graph", "ran from CUDA/HIP-graph replays and are named by the ops of the capture trace")):
        rows, ns, kernels = acc.get(launch, (0, 0, 0))
        if rows:
            out.append(f"{kernels} kernels ({ns / total:.0%} of op device time) " + text)
    return out


def _notes(rank_rows: list[dict[str, Any]], peaks: dict[int, RankPeaks]) -> list[str]:
    notes = []
    unknown = sorted({p.device for p in peaks.values() if p.device_match is None and not p.override_tflops})
    if unknown:
        notes.append("no peak for device(s) " + ", ".join(repr(d) if d else "(unnamed)" for d in unknown)
                     + ": pass --peak-tflops / --peak-bandwidth for roofline and MFU")
    low = [r["rank"] for r in rank_rows if r["flops_coverage"] is not None and r["flops_coverage"] < 0.5]
    if low:
        notes.append(f"ranks {low}: under half of the op time has a FLOP count (ops without shapes or formula, "
                     "e.g. Triton kernels): MFU counts only the ops with one")
    return notes


def _findings(rows: list[dict[str, Any]], kernels_by_rank: dict[int, list], windows: dict) -> list[Finding]:
    out = []
    for r in rows:
        pct = r["pct_of_roof"]
        if (r["category"] in MODEL_CATEGORIES and r["share"] and r["share"] >= FINDING_SHARE and pct is not None
                and pct < LOW_ROOF_FINDING and r["roof_tflops"] and r["flops"]):
            steps = max(1, sum(windows.get(rk, (None, 0, 0))[1] or 1 for rk in r["ranks"]))
            target_ns = r["flops"] / (TARGET_ROOF * r["roof_tflops"] * 1e3)
            saving = max(0, int((r["kernel_ns"] - target_ns) / steps))
            out.append(Finding(
                kind=FindingKind.LOW_OP_EFFICIENCY, severity=Severity.WARNING, ranks=tuple(r["ranks"]),
                summary=(f"{r['name']} {_shape_text(r)} takes {r['share']:.0%} of the kernel time at "
                         f"{r['tflops']:.0f} TFLOP/s, {pct:.0%} of its {r['bound']}-bound roof "
                         f"({r['roof_tflops']:.0f} TFLOP/s)"),
                evidence=Evidence(details={k: r[k] for k in ("name", "input_dims", "dtype", "count", "kernel_ns",
                                                             "flops", "bytes", "tflops", "intensity", "roof_tflops",
                                                             "bound", "pct_of_roof", "share")}),
                recommendation=_RECOMMENDATION.get(r["category"], _RECOMMENDATION["gemm"]),
                est_saving_ns=saving))
    return out + _launch_findings(kernels_by_rank, windows)


_RECOMMENDATION = {
    "gemm": "check the kernel chosen for this shape (tile sizes, M/N/K multiples of 64/128, transposed operands), "
            "the dtype (bf16/fp8 tensor cores), and whether small GEMMs can be batched or fused",
    "attention": "check that a flash / fused attention kernel tuned for this head size and sequence length runs "
                 "(backend selection, head size a multiple of 64, causal masks passed as is_causal, not as a tensor)",
    "conv": "check the convolution algorithm and memory format (channels_last, cudnn.benchmark) for this shape",
}


def _shape_text(r: dict[str, Any]) -> str:
    if r["gemm"]:
        b, m, n, k = r["gemm"]
        return f"(M,N,K = {m},{n},{k}{'' if b == 1 else f', batch {b}'})"
    return dims_text(r["input_dims"])


def dims_text(input_dims: str | None) -> str:
    """The tensor shapes of an Input Dims text, scalars' empty lists left out."""
    import json

    try:
        dims = json.loads(input_dims) if input_dims else []
    except ValueError:
        return (input_dims or "")[:80]
    shapes = [d for d in dims if d] if isinstance(dims, list) else []
    return " ".join(str(d).replace(" ", "") for d in shapes)[:120]


def _launch_findings(kernels_by_rank: dict[int, list], windows: dict) -> list[Finding]:
    out = []
    for rk, rows in kernels_by_rank.items():
        launches = sum(r["count"] for r in rows)
        steps = max(1, windows.get(rk, (None, 0, 0))[1])
        for r in rows:
            if (r["count"] / steps >= TINY_LAUNCHES_PER_STEP and r["mean_ns"] < TINY_KERNEL_NS
                    and launches and r["count"] / launches >= TINY_LAUNCH_SHARE and r["kind"] == "compute"):
                out.append(Finding(
                    kind=FindingKind.LAUNCH_BOUND_KERNELS, severity=Severity.INFO, ranks=(rk,),
                    summary=(f"rank {rk}: {r['name'][:80]} is launched {r['count'] / steps:.0f} times per step "
                             f"({r['count'] / launches:.0%} of the launches) at {r['mean_ns'] / 1e3:.1f} µs each"),
                    evidence=Evidence(details={"kernel": r["name"], "count": r["count"], "steps": steps,
                                               "mean_ns": r["mean_ns"], "total_ns": r["total_ns"],
                                               "launch_share": r["count"] / launches}),
                    recommendation=("fuse the small ops (torch.compile, foreach/fused optimizers) or capture the "
                                    "step in a CUDA graph so launch overhead stops pacing the device")))
    return out


def _op_chunks(store: RunStore) -> Any:
    """The ops table's rows (dicts) in file order, one rank's rows at a time when each rank's rows are
    contiguous (what the writer does): memory holds one rank's rows, not a 1,024-rank run's (~0.7 GB as
    dicts). Else (or a store lacking a column) the whole table in one chunk."""
    ranks = store.table("ops", ["rank"]).column("rank").to_numpy()
    if ranks.size == 0:
        return
    first = ranks[np.flatnonzero(np.r_[True, ranks[1:] != ranks[:-1]])]
    if np.unique(first).size == first.size and set(_OP_COLUMNS) <= set(store.columns("ops")):
        for rk in first.tolist():
            yield table_rows(store.rank_table("ops", rk, _OP_COLUMNS))
        return
    yield table_rows(store.table("ops", _OP_COLUMNS))


def analyze_ops(store: RunStore, breakdown: BreakdownResult | None, config: AnalysisConfig) -> OpsResult:
    """Section `ops` and its findings (module docstring)."""
    if not store.has("ops"):
        return OpsResult(section={"available": False, "reason": "the run store has no ops table (parsed by "
                                  "an older tracekit: parse the traces again)", "top_n": TOP_N})
    kernels, kernels_by_rank = _kernels(store, TOP_N)
    devices = _rank_devices(store)
    peaks = {rk: rank_peaks(dev, config) for rk, dev in devices.items()}
    windows = _step_windows(section_of(breakdown))
    groups: dict[tuple, dict[str, Any]] = {}
    categories: dict[str, list] = {}
    graph_launches: dict[str, list] = {}
    mfu_flops: Counter = Counter()
    totals: dict[int, dict[str, Any]] = {}
    op_ns = n_ops = 0
    with gc_paused():  # a rank's op rows are dicts without cycles: collections would rescan them (DESIGN §9)
        for chunk in _op_chunks(store):  # every sum below runs over the rows in the table's order
            n_ops += len(chunk)
            op_ns += sum(r["kernel_ns"] or 0 for r in chunk)
            _groups(chunk, groups)
            _add_categories(categories, chunk)
            _add_graph_launches(graph_launches, chunk)
            _mfu_dtype(chunk, mfu_flops)
            ops_by_rank: dict[int, list] = defaultdict(list)
            for r in chunk:
                ops_by_rank[r["rank"]].append(r)
            mark_recompute(store, ops_by_rank)
            for rk, mine in ops_by_rank.items():
                totals[rk] = _rank_totals(mine, windows.get(rk, (None, 0, 0)))
    kernel_ns = {rk: sum(r["total_ns"] for r in rows) for rk, rows in kernels_by_rank.items()}
    rows = _group_rows(groups, peaks, op_ns)
    rank_rows = _rank_rows(totals, peaks, windows, kernel_ns)
    heavy = [r for r in rows if (r["share"] or 0) >= HEAVY_SHARE and r["pct_of_roof"] is not None]
    section = {
        "available": bool(n_ops), "reason": None if n_ops else "no CPU op launched device work (CPU trace, or "
                                                               "kernels without launches)",
        "top_n": TOP_N, "ranks": rank_rows, "categories": _categories(categories), "top_ops": rows[:TOP_N],
        "gemm": _gemm_summary(rows), "kernels": kernels,
        "roofline": _roofline_section(rows, peaks, mfu_flops.most_common(1)[0][0] if mfu_flops else None),
        "worst": sorted(heavy, key=lambda r: r["pct_of_roof"])[:5],
        "notes": _graph_notes(graph_launches, op_ns) + _notes(rank_rows, peaks)}
    return OpsResult(findings=_findings(rows, kernels_by_rank, windows) if n_ops else [], section=section)
