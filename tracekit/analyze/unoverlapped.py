"""Unoverlapped (exposed) collectives: which communication the rank sat waiting on, and what hiding it could save.

Exposed time of a collective instance = the part of its interval [ts, ts+dur) (device kernel / gloo
worker time, Kineto source, trace clock) covered by no compute on that rank and inside the analysis
windows (DESIGN §3). Part of that is not transfer at all but waiting for a late peer (its arrival
before the group's last arrival, from matching.py); `transfer_exposed_ns` leaves it out, and that
is what overlap could hide, so it is the estimated saving — the waiting belongs to the straggler.
Instances of one group can run concurrently, so per-instance numbers may sum to more than the
union; dim/op totals and findings use the union.

Section `unoverlapped`:
    {"exposure_source": {"ranks_by_source": {"kineto collectives" | "comm kernels": n}, "times": str},
     "instances": int, "exposed_ns": int, "transfer_exposed_ns": int,
     "by_dim_op": [{"dim", "op", "instances", "comm_ns", "exposed_ns", "transfer_exposed_ns",
                    "overlap_ratio", "exposed_ns_per_step", "transfer_exposed_ns_per_step",
                    "share_of_step", "worst_rank"}],          # per-step numbers: the worst rank's
     "by_rank_dim_op": [{"rank", "dim", "op", "instances", "comm_ns", "exposed_ns", "transfer_exposed_ns",
                         "steps", "step_ns"}],      # per rank (union per dim/op), for the report's heatmap
     "by_dim" / "by_op" / "by_size" / "by_caller": [{"key", "instances", "exposed_ns",
                    "transfer_exposed_ns"}],                   # per-instance sums over all ranks
     "top_offenders": [{"rank", "pg_name", "dim", "op", "bytes", "caller", "step", "ts", "dur_ns",
                        "exposed_ns", "transfer_exposed_ns", "share_of_step"}],
     "thresholds": {...}}
Findings: `unoverlapped_collective` per (dim, op) and `communication_bound` for ranks whose exposed
communication is the largest part of the step. Result for later analyzers: `UnoverlappedResult.instances`, one row per
collective instance and rank with its `transfer_exposed_ns` and the rank's profiled `steps`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analyze import intervals as iv
from tracekit.analyze.base import AnalyzerResult
from tracekit.analyze.breakdown import BreakdownResult, RankActivities, RankActivity, activities_of, breakdown_ranks
from tracekit.analyze.evidence import CollectiveEvidence, Evidence
from tracekit.analyze.findings import Finding, FindingKind, Severity
from tracekit.analyze.layout import LayoutResult, dims_of
from tracekit.analyze.matching import MatchingResult, matched_of
from tracekit.analyze.recommend import advise_collective
from tracekit.tables.store import RunStore

SIZE_BUCKETS = ((1 << 10, "<1KiB"), (64 << 10, "1KiB-64KiB"), (1 << 20, "64KiB-1MiB"),
                (16 << 20, "1MiB-16MiB"), (256 << 20, "16MiB-256MiB"), (None, ">=256MiB"))


@dataclass(frozen=True, kw_only=True)
class UnoverlappedConfig:
    """Thresholds on the exposed transfer of one (dim, op) per step, as a fraction of the step.
    Measured on the 2-core box: clean DDP runs expose 2-15% of the step in dp all-reduce with
    9-33% of it overlapped; --no-overlap exposes 8-15% with 0% overlapped."""

    info_fraction: float = 0.02
    """Report at all (info)."""
    warning_fraction: float = 0.05
    """Warning when the collective is (almost) never overlapped (overlap ratio ≤ `max_overlap_ratio`)..."""
    max_overlap_ratio: float = 0.05
    overlappable_dims: tuple[str, ...] = ("dp", "fsdp", "cp")
    """Dims whose communication frameworks routinely overlap (gradient buckets, prefetch, ring P2P):
    never overlapping them is a defect. TP/EP collectives sit on the critical path by design in most
    implementations (hand-written Megatron TP here: 0% overlap), so they warn only on a large share."""
    warning_fraction_any: float = 0.30
    """... or when this much of the step is exposed however much is overlapped."""
    critical_fraction: float = 0.40
    """Critical."""
    comm_bound_fraction: float = 0.25
    """Exposed transfer share of the step above which a communication-bound rank is a warning."""
    top_offenders: int = 20


_RECOMMEND = {
    "dp": "Overlap gradient all-reduce with backward: keep DDP's bucketed overlap on (no_sync only on "
          "accumulation steps), tune bucket_cap_mb, or use gradient_as_bucket_view.",
    "fsdp": "Prefetch the next layer's all-gather (set_modules_to_forward_prefetch / "
            "set_modules_to_backward_prefetch) and keep reduce-scatter in backward overlapped.",
    "tp": "Tensor-parallel collectives sit on the critical path: use sequence parallelism / async TP, "
          "a smaller TP degree, or keep TP inside the fastest interconnect.",
    "pp": "Pipeline send/recv is exposed: use more micro-batches or an interleaved schedule.",
    "cp": "Overlap ring-attention P2P with the attention compute of the current block.",
    "ep": "Overlap expert all-to-all with shared-expert/dense compute or reduce capacity/padding.",
}
_DEFAULT_RECOMMEND = ("Issue this collective asynchronously and overlap it with independent compute, "
                      "or shrink/batch the messages.")


def size_bucket(nbytes: Any) -> str:
    if nbytes is None or pd.isna(nbytes):
        return "unknown"
    for limit, label in SIZE_BUCKETS:
        if limit is None or nbytes < limit:
            return label
    return "unknown"


def _instances(store: RunStore, rank: int) -> pd.DataFrame:
    """Communication intervals on the trace clock: Kineto collectives, else comm kernels."""
    t = store.rank_table("collectives", rank, ["source", "pg_name", "op", "bytes", "caller", "step", "ts", "dur"])
    t = t.filter(pc.and_(pc.fill_null(pc.equal(t["source"].cast(pa.string()), "kineto"), False),
                         pc.is_valid(t["dur"])))
    if t.num_rows == 0:
        k = store.rank_table("kernels", rank, ["kind", "pg_name", "collective_op", "step", "ts", "dur"])
        k = k.filter(pc.and_(pc.fill_null(pc.equal(k["kind"].cast(pa.string()), "comm"), False),
                             pc.is_valid(k["dur"])))
        df = pd.DataFrame({
            "pg_name": k.column("pg_name").to_pylist(),
            "op": k.column("collective_op").cast(pa.string()).to_pylist(),
            "bytes": [None] * k.num_rows, "caller": [None] * k.num_rows,
            "step": k.column("step").to_pylist(), "ts": k.column("ts").to_pylist(),
            "dur": k.column("dur").to_pylist()})
    else:
        df = pd.DataFrame({
            "pg_name": t.column("pg_name").to_pylist(),
            "op": t.column("op").cast(pa.string()).to_pylist(),
            "bytes": t.column("bytes").to_pylist(), "caller": t.column("caller").to_pylist(),
            "step": t.column("step").to_pylist(), "ts": t.column("ts").to_pylist(),
            "dur": t.column("dur").to_pylist()})
    df["op"] = df["op"].fillna("unknown")
    df.attrs["source"] = "kineto collectives" if t.num_rows else "comm kernels"
    return df


def _agg(df: pd.DataFrame, col: str) -> list[dict[str, Any]]:
    if df.empty:
        return []
    g = df.groupby(col, dropna=False).agg(instances=("exposed_ns", "size"), exposed_ns=("exposed_ns", "sum"),
                                          transfer_exposed_ns=("transfer_exposed_ns", "sum"))
    g = g.sort_values("exposed_ns", ascending=False)
    return [{"key": (None if pd.isna(k) else str(k)), "instances": int(r.instances),
             "exposed_ns": int(r.exposed_ns), "transfer_exposed_ns": int(r.transfer_exposed_ns)}
            for k, r in g.iterrows()]


INSTANCE_COLUMNS = ["rank", "pg_name", "dim", "op", "bytes", "caller", "step", "ts", "dur", "exposed_ns",
                    "transfer_exposed_ns", "size", "share_of_step"]


@dataclass(frozen=True)
class UnoverlappedResult(AnalyzerResult):
    instances: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=INSTANCE_COLUMNS))
    """One row per collective instance and rank: INSTANCE_COLUMNS plus the rank's `steps`."""


@dataclass
class _RankExposure:
    instances: pd.DataFrame | None
    by_dim_op: list[dict[str, Any]]
    total: tuple[int, int]
    """(exposed, exposed transfer) of all the rank's communication in its windows."""


def _rank_exposure(store: RunStore, rank: int, act: RankActivity, br_row: dict[str, Any],
                   wait_all: iv.IntervalSet, dims: dict[str, str]) -> _RankExposure:
    steps = max(br_row["steps"], 1)
    step_ns = br_row["step_ns"] / steps
    win = iv.union([w[1] for w in act.windows], [w[2] for w in act.windows])
    comp = iv.intersect(act.compute, win)
    wait = iv.subtract(iv.intersect(wait_all, win), comp)
    df = _instances(store, rank)
    if df.empty:
        return _RankExposure(None, [], (0, 0))
    s = df["ts"].to_numpy(np.int64)
    e = s + df["dur"].to_numpy(np.int64)
    in_win = iv.covered(win, s, e)
    df["exposed_ns"] = in_win - iv.covered(comp, s, e)
    df["transfer_exposed_ns"] = df["exposed_ns"] - iv.covered(wait, s, e)
    df["rank"] = rank
    df["steps"] = steps
    df["dim"] = df["pg_name"].map(lambda p: dims.get(p, "unknown") if p is not None else "unknown")
    df["size"] = df["bytes"].map(size_bucket)
    df["share_of_step"] = df["exposed_ns"] / step_ns if step_ns else 0.0
    per_dim_op = []
    # exact per (dim, op) exposure on this rank: union of its intervals, minus compute
    for (dim, op), g in df.groupby(["dim", "op"]):
        gs = g["ts"].to_numpy(np.int64)
        u = iv.intersect(iv.union(gs, gs + g["dur"].to_numpy(np.int64)), win)
        exp = iv.subtract(u, comp)
        exposed = iv.total(exp)
        transfer = exposed - iv.total(iv.intersect(exp, wait))
        sizes = pd.to_numeric(g["bytes"], errors="coerce").dropna()
        per_dim_op.append({"rank": rank, "dim": dim, "op": op, "instances": len(g),
                           "comm_ns": iv.total(u), "exposed_ns": exposed, "transfer_exposed_ns": transfer,
                           "steps": steps, "step_ns": int(step_ns),
                           "bytes_p50": float(sizes.median()) if len(sizes) else None})
    exp_all = iv.subtract(iv.intersect(act.comm, win), comp)
    total = (iv.total(exp_all), iv.total(exp_all) - iv.total(iv.intersect(exp_all, wait)))
    return _RankExposure(df, per_dim_op, total)


def _top_offenders(inst: pd.DataFrame, n: int) -> list[dict[str, Any]]:
    top = inst.sort_values("exposed_ns", ascending=False).head(n)
    return [{
        "rank": int(r.rank), "pg_name": r.pg_name, "dim": r.dim, "op": r.op,
        "bytes": None if pd.isna(r.bytes) else int(r.bytes), "caller": r.caller,
        "step": None if pd.isna(r.step) else int(r.step), "ts": int(r.ts), "dur_ns": int(r.dur),
        "exposed_ns": int(r.exposed_ns), "transfer_exposed_ns": int(r.transfer_exposed_ns),
        "share_of_step": round(float(r.share_of_step), 6)} for r in top.itertuples()]


def analyze_unoverlapped(store: RunStore, layout: LayoutResult | None, breakdown: BreakdownResult | None,
                         matching: MatchingResult | None, activity: RankActivities | None,
                         thresholds: UnoverlappedConfig | None = None) -> UnoverlappedResult:
    cfg = thresholds or UnoverlappedConfig()
    dims = dims_of(layout)
    br_ranks = {r["rank"]: r for r in breakdown_ranks(breakdown)}
    matched = matched_of(matching)
    waits = matched.wait_intervals if matched is not None else {}
    activity = activities_of(store, activity)
    frames = []
    per_rank_dim_op: list[dict[str, Any]] = []
    per_rank_total: dict[int, tuple[int, int]] = {}
    sources: dict[str, int] = {}
    for rank in store.ranks():
        if rank not in br_ranks:
            continue
        ex = _rank_exposure(store, rank, activity.get(rank), br_ranks[rank], waits.get(rank, iv.empty()), dims)
        if ex.instances is None:
            continue
        sources[ex.instances.attrs["source"]] = sources.get(ex.instances.attrs["source"], 0) + 1
        frames.append(ex.instances)
        per_rank_dim_op.extend(ex.by_dim_op)
        per_rank_total[rank] = ex.total
    inst = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=INSTANCE_COLUMNS)
    by_dim_op = _dim_op_rows(per_rank_dim_op)
    findings = _dim_op_findings(by_dim_op, cfg) + _comm_bound_findings(br_ranks, per_rank_total,
                                                                        per_rank_dim_op, cfg)
    section = {
        "exposure_source": {"ranks_by_source": sources,
                            "times": "device kernel / gloo worker time on each rank's trace clock"},
        "instances": int(len(inst)),
        "exposed_ns": int(inst["exposed_ns"].sum()) if len(inst) else 0,
        "transfer_exposed_ns": int(inst["transfer_exposed_ns"].sum()) if len(inst) else 0,
        "by_dim_op": by_dim_op,
        "by_rank_dim_op": per_rank_dim_op,
        "by_dim": _agg(inst, "dim"), "by_op": _agg(inst, "op"), "by_size": _agg(inst, "size"),
        "by_caller": _agg(inst, "caller"),
        "top_offenders": _top_offenders(inst, cfg.top_offenders),
        "thresholds": asdict(cfg),
    }
    # per-instance exposure for later analyzers (bandwidth bounds a slow collective's cost by it)
    return UnoverlappedResult(findings=findings, section=section, instances=inst)


def _dim_op_rows(per_rank: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not per_rank:
        return []
    df = pd.DataFrame(per_rank)
    out = []
    for (dim, op), g in df.groupby(["dim", "op"]):
        g = g.assign(per_step=g["transfer_exposed_ns"] / g["steps"], exp_step=g["exposed_ns"] / g["steps"])
        worst = g.loc[g["per_step"].idxmax()]
        comm = int(g["comm_ns"].sum())
        out.append({
            "dim": dim, "op": op, "instances": int(g["instances"].sum()), "comm_ns": comm,
            "exposed_ns": int(g["exposed_ns"].sum()), "transfer_exposed_ns": int(g["transfer_exposed_ns"].sum()),
            "overlap_ratio": round(1 - g["exposed_ns"].sum() / comm, 6) if comm else None,
            "exposed_ns_per_step": int(worst["exp_step"]),
            "transfer_exposed_ns_per_step": int(worst["per_step"]),
            "share_of_step": round(float(worst["per_step"] / worst["step_ns"]), 6) if worst["step_ns"] else 0.0,
            "worst_rank": int(worst["rank"]),
            "bytes_p50": float(g["bytes_p50"].dropna().median()) if "bytes_p50" in g and g["bytes_p50"].notna().any() else None,
            "calls_per_step": round(float(g["instances"].sum() / max(int(g["steps"].sum()), 1)), 2),
        })
    out.sort(key=lambda x: -x["transfer_exposed_ns_per_step"])
    return out


def _severity(frac: float, overlap: float | None, dim: str, cfg: UnoverlappedConfig) -> Severity | None:
    if frac >= cfg.critical_fraction:
        return Severity.CRITICAL
    if frac >= cfg.warning_fraction_any or (
            dim in cfg.overlappable_dims and frac >= cfg.warning_fraction
            and (overlap or 0.0) <= cfg.max_overlap_ratio):
        return Severity.WARNING
    if frac >= cfg.info_fraction:
        return Severity.INFO
    return None


def _dim_op_findings(rows: list[dict[str, Any]], cfg: UnoverlappedConfig) -> list[Finding]:
    out = []
    for row in rows:
        sev = _severity(row["share_of_step"], row["overlap_ratio"], row["dim"], cfg)
        if sev is None:
            continue
        dim = row["dim"]
        out.append(Finding(
            kind=FindingKind.UNOVERLAPPED_COLLECTIVE, severity=sev, ranks=(row["worst_rank"],),
            dim=dim,
            summary=(f"{row['op']} on {dim} is exposed {row['transfer_exposed_ns_per_step'] / 1e6:.2f} ms per step "
                     f"({100 * row['share_of_step']:.1f}% of the step on rank {row['worst_rank']}); "
                     + (f"{row['overlap_ratio']:.0%} of its time overlapped" if row['overlap_ratio'] is not None
                        else "overlap unknown (no communication time recorded)")),
            evidence=CollectiveEvidence.of({k: row[k] for k in (
                                          "op", "instances", "comm_ns", "exposed_ns", "transfer_exposed_ns",
                                          "overlap_ratio", "exposed_ns_per_step",
                                          "transfer_exposed_ns_per_step", "share_of_step", "worst_rank",
                                          "bytes_p50", "calls_per_step")}),
            recommendation=advise_collective(dim=dim, op=row["op"], overlap_ratio=row["overlap_ratio"],
                                             bytes_p50=row["bytes_p50"], calls_per_step=row["calls_per_step"])
            if dim in ("dp", "fsdp", "tp") or row["bytes_p50"] else _RECOMMEND.get(dim, _DEFAULT_RECOMMEND),
            est_saving_ns=int(row["transfer_exposed_ns_per_step"])))
    return out


def _comm_bound_findings(br_ranks: dict[int, dict[str, Any]], totals: dict[int, tuple[int, int]],
                         per_dim_op: list[dict[str, Any]], cfg: UnoverlappedConfig) -> list[Finding]:
    bound = []
    for r, row in br_ranks.items():
        if row["bound"] != "communication" or r not in totals:
            continue
        steps = max(row["steps"], 1)
        transfer = totals[r][1] / steps
        frac = transfer / (row["step_ns"] / steps) if row["step_ns"] else 0.0
        bound.append((r, transfer, frac, row))
    if not bound:
        return []
    worst = max(bound, key=lambda b: b[1])
    frac = worst[2]
    if frac >= cfg.critical_fraction:
        sev = Severity.CRITICAL
    elif frac >= cfg.comm_bound_fraction:
        sev = Severity.WARNING
    else:
        sev = Severity.INFO
    ranks = tuple(sorted(b[0] for b in bound))
    by_dim: dict[str, int] = {}
    for row in per_dim_op:  # the worst rank's exposed transfer per dim, per step
        if row["rank"] == worst[0]:
            by_dim[row["dim"]] = by_dim.get(row["dim"], 0) + int(row["transfer_exposed_ns"] / max(row["steps"], 1))
    dim = max(by_dim, key=by_dim.get) if by_dim else None
    return [Finding(
        kind=FindingKind.COMMUNICATION_BOUND, severity=sev, ranks=ranks, dim=dim,
        summary=(f"{len(ranks)} rank(s) spend more of the step in exposed communication than in compute or idle; "
                 f"worst rank {worst[0]}: {worst[1] / 1e6:.2f} ms per step of exposed transfer ({100 * frac:.1f}%)"),
        evidence=Evidence(details={"ranks": [{"rank": b[0], "exposed_transfer_ns_per_step": int(b[1]),
                             "share_of_step": round(b[2], 6),
                             "exposed_comm_ns": b[3]["exposed_comm_ns"], "compute_ns": b[3]["compute_ns"],
                             "step_ns": b[3]["step_ns"], "steps": b[3]["steps"]} for b in bound],
                  "worst_rank_by_dim_ns_per_step": by_dim}),
        recommendation=(f"Most of the exposed transfer is on {dim or 'one dimension'}: see that dimension's "
                        "unoverlapped-collective finding for the lever that fits it (already-asynchronous "
                        "collectives, message size, activation vs gradient traffic)."),
        est_saving_ns=int(worst[1]))]
