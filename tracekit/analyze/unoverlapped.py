"""Unoverlapped (exposed) collectives: which communication the rank sat waiting on, and what hiding it could save.

Exposed time of a collective instance = the part of its interval [ts, ts+dur) (device kernel / gloo
worker time, Kineto source, trace clock) covered by no compute on that rank and inside the analysis
windows (DESIGN §3). Part of that is not transfer at all but waiting for a late peer (its arrival
before the group's last arrival, from matching.py), or finishing after the first member had finished
(transfer = first member's end − last arrival: past it the data was delivered and the rank's own thread
was late, `MatchedCollectives.late_finish`); `transfer_exposed_ns` leaves both out, and that is what
overlap could hide, so it is the estimated saving — the waiting belongs to the straggler.
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
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analyze.breakdown import BreakdownResult, breakdown_ranks
from tracekit.derive import intervals as iv
from tracekit.derive.activity import RankActivities, RankActivity, activities_of
from tracekit.derive.matching import MatchingResult, matched_of
from tracekit.derive.topology import LayoutResult, dims_of
from tracekit.findings.evidence import CollectiveEvidence, Evidence
from tracekit.findings.finding import Finding, FindingKind, Severity
from tracekit.findings.recommend import advise_collective
from tracekit.findings.result import AnalyzerResult
from tracekit.parse.dict_columns import text_test
from tracekit.tables.columns import argsort_desc, python_values
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
    if nbytes is None or nbytes != nbytes:  # unknown (None / NaN)
        return "unknown"
    for limit, label in SIZE_BUCKETS:
        if limit is None or nbytes < limit:
            return label
    return "unknown"


INSTANCE_SCHEMA = pa.schema([
    ("rank", pa.int64()), ("pg_name", pa.string()), ("dim", pa.string()), ("op", pa.string()),
    ("bytes", pa.int64()), ("caller", pa.string()), ("step", pa.int64()), ("ts", pa.int64()), ("dur", pa.int64()),
    ("exposed_ns", pa.int64()), ("transfer_exposed_ns", pa.int64()), ("size", pa.string()),
    ("share_of_step", pa.float64()), ("steps", pa.int64())])
"""`UnoverlappedResult.instances`: one row per collective instance and rank (null: unknown)."""
INSTANCE_COLUMNS = INSTANCE_SCHEMA.names


def _instances(store: RunStore, rank: int) -> tuple[dict[str, list], str]:
    """Communication intervals on the trace clock, as columns (pg_name, op, bytes, caller, step, ts,
    dur; None: unknown): Kineto collectives, else comm kernels; and which of the two."""
    t = store.rank_table("collectives", rank, ["source", "pg_name", "op", "bytes", "caller", "step", "ts", "dur"])
    t = t.filter(pc.and_(pc.fill_null(text_test(t["source"], pc.equal, "kineto"), False),
                         pc.is_valid(t["dur"])))
    source = "kineto collectives"
    if t.num_rows == 0:
        source = "comm kernels"
        t = store.rank_table("kernels", rank, ["kind", "pg_name", "collective_op", "step", "ts", "dur"])
        t = t.filter(pc.and_(pc.fill_null(text_test(t["kind"], pc.equal, "comm"), False),
                             pc.is_valid(t["dur"])))
        t = t.rename_columns(["kind", "pg_name", "op", "step", "ts", "dur"])
    cols = {c: python_values(t.column(c).cast(pa.string()) if c in ("pg_name", "op") else t.column(c))
            for c in ("pg_name", "op", "step", "ts", "dur")}
    none = [None] * t.num_rows
    cols["bytes"] = python_values(t.column("bytes")) if "bytes" in t.column_names else none
    cols["caller"] = python_values(t.column("caller")) if "caller" in t.column_names else none
    cols["op"] = ["unknown" if o is None else o for o in cols["op"]]
    return cols, source


def _agg(inst: dict[str, Any], col: str) -> list[dict[str, Any]]:
    """Per value of `col` (unknown last): instances and summed exposure, most exposed first."""
    groups: dict[Any, list[int]] = {}
    for i, k in enumerate(inst[col]):
        groups.setdefault(k, []).append(i)
    keys = sorted((k for k in groups if k is not None), key=str) + ([None] if None in groups else [])
    exp, xfer = inst["exposed_ns"], inst["transfer_exposed_ns"]
    rows = [{"key": None if k is None else str(k), "instances": len(groups[k]),
             "exposed_ns": int(exp[groups[k]].sum()), "transfer_exposed_ns": int(xfer[groups[k]].sum())}
            for k in keys]
    return [rows[i] for i in argsort_desc(np.array([r["exposed_ns"] for r in rows], np.int64))]


@dataclass(frozen=True)
class UnoverlappedResult(AnalyzerResult):
    instances: pa.Table = field(default_factory=INSTANCE_SCHEMA.empty_table)
    """One row per collective instance and rank: INSTANCE_SCHEMA (with the rank's profiled `steps`)."""


@dataclass
class _RankExposure:
    instances: dict[str, Any] | None
    """INSTANCE_COLUMNS as lists / int64 arrays (exposed_ns, transfer_exposed_ns)."""
    by_dim_op: list[dict[str, Any]]
    total: tuple[int, int]
    """(exposed, exposed transfer) of all the rank's communication in its windows."""
    source: str = ""


def _rank_exposure(store: RunStore, rank: int, act: RankActivity, br_row: dict[str, Any],
                   wait_all: iv.IntervalSet, dims: dict[str, str]) -> _RankExposure:
    steps = max(br_row["steps"], 1)
    step_ns = br_row["step_ns"] / steps
    win = iv.union([w[1] for w in act.windows], [w[2] for w in act.windows])
    comp = iv.intersect(act.compute, win)
    wait = iv.subtract(iv.intersect(wait_all, win), comp)
    inst, source = _instances(store, rank)
    n = len(inst["ts"])
    if n == 0:
        return _RankExposure(None, [], (0, 0))
    s = np.asarray(inst["ts"], np.int64)
    e = s + np.asarray(inst["dur"], np.int64)
    exposed = iv.covered(win, s, e) - iv.covered(comp, s, e)
    inst.update(rank=[rank] * n, steps=[steps] * n, exposed_ns=exposed,
                transfer_exposed_ns=exposed - iv.covered(wait, s, e),
                dim=["unknown" if p is None else dims.get(p, "unknown") for p in inst["pg_name"]],
                size=[size_bucket(b) for b in inst["bytes"]],
                share_of_step=(exposed / step_ns) if step_ns else np.zeros(n))
    per_dim_op = [_dim_op_exposure(inst, rows, s, e, win, comp, wait, rank, steps, step_ns)
                  for rows in _groups(inst["dim"], inst["op"])]
    exp_all = iv.subtract(iv.intersect(act.comm, win), comp)
    total = (iv.total(exp_all), iv.total(exp_all) - iv.total(iv.intersect(exp_all, wait)))
    return _RankExposure(inst, per_dim_op, total, source)


def _groups(*keys: list[Any]) -> list[np.ndarray]:
    """Row positions per distinct key tuple, in sorted key order."""
    out: dict[tuple, list[int]] = {}
    for i, k in enumerate(zip(*keys)):
        out.setdefault(k, []).append(i)
    return [np.array(out[k], np.int64) for k in sorted(out)]


def _dim_op_exposure(inst: dict[str, Any], rows: np.ndarray, start: np.ndarray, end: np.ndarray,
                     win: iv.IntervalSet, comp: iv.IntervalSet, wait: iv.IntervalSet, rank: int, steps: int,
                     step_ns: float) -> dict[str, Any]:
    """Exact exposure of one (dim, op) on a rank (`start`, `end`: of every instance of the rank, int64): the
    union of its intervals in the windows, minus compute."""
    u = iv.intersect(iv.union(start[rows], end[rows]), win)
    exp = iv.subtract(u, comp)
    exposed = iv.total(exp)
    sizes = [inst["bytes"][i] for i in rows if inst["bytes"][i] is not None]
    return {"rank": rank, "dim": inst["dim"][rows[0]], "op": inst["op"][rows[0]], "instances": len(rows),
            "comm_ns": iv.total(u), "exposed_ns": exposed,
            "transfer_exposed_ns": exposed - iv.total(iv.intersect(exp, wait)),
            "steps": steps, "step_ns": int(step_ns), "bytes_p50": float(np.median(sizes)) if sizes else None}


def _concat(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The ranks' instance columns end to end (INSTANCE_COLUMNS)."""
    out: dict[str, Any] = {}
    for c in INSTANCE_COLUMNS:
        vals = [p[c] for p in parts]
        out[c] = (np.concatenate(vals) if vals and isinstance(vals[0], np.ndarray)
                  else [v for part in vals for v in part])
    return out


def _top_offenders(inst: dict[str, Any], n: int) -> list[dict[str, Any]]:
    return [{
        "rank": int(inst["rank"][i]), "pg_name": inst["pg_name"][i], "dim": inst["dim"][i], "op": inst["op"][i],
        "bytes": inst["bytes"][i], "caller": inst["caller"][i], "step": inst["step"][i], "ts": int(inst["ts"][i]),
        "dur_ns": int(inst["dur"][i]), "exposed_ns": int(inst["exposed_ns"][i]),
        "transfer_exposed_ns": int(inst["transfer_exposed_ns"][i]),
        "share_of_step": round(float(inst["share_of_step"][i]), 6)} for i in argsort_desc(inst["exposed_ns"])[:n]]


def analyze_unoverlapped(store: RunStore, layout: LayoutResult | None, breakdown: BreakdownResult | None,
                         matching: MatchingResult | None, activity: RankActivities | None,
                         thresholds: UnoverlappedConfig | None = None) -> UnoverlappedResult:
    cfg = thresholds or UnoverlappedConfig()
    dims = dims_of(layout)
    br_ranks = {r["rank"]: r for r in breakdown_ranks(breakdown)}
    matched = matched_of(matching)
    # not transfer: waiting for the last arrival, and finishing after the first member had (the data was
    # delivered; DESIGN §3's transfer ends at the first member's end)
    waits = ({r: iv.merge(*(x for x in (matched.wait_intervals.get(r), matched.late_finish.get(r)) if x is not None))
              for r in set(matched.wait_intervals) | set(matched.late_finish)} if matched is not None else {})
    activity = activities_of(store, activity)
    parts = []
    per_rank_dim_op: list[dict[str, Any]] = []
    per_rank_total: dict[int, tuple[int, int]] = {}
    sources: dict[str, int] = {}
    for rank in store.ranks():
        if rank not in br_ranks:
            continue
        ex = _rank_exposure(store, rank, activity.get(rank), br_ranks[rank], waits.get(rank, iv.empty()), dims)
        if ex.instances is None:
            continue
        sources[ex.source] = sources.get(ex.source, 0) + 1
        parts.append(ex.instances)
        per_rank_dim_op.extend(ex.by_dim_op)
        per_rank_total[rank] = ex.total
    inst = _concat(parts) if parts else {c: np.zeros(0, np.int64) for c in INSTANCE_COLUMNS}
    by_dim_op = _dim_op_rows(per_rank_dim_op)
    findings = _dim_op_findings(by_dim_op, cfg) + _comm_bound_findings(br_ranks, per_rank_total,
                                                                        per_rank_dim_op, cfg)
    section = {
        "exposure_source": {"ranks_by_source": sources,
                            "times": "device kernel / gloo worker time on each rank's trace clock"},
        "instances": len(inst["rank"]),
        "exposed_ns": int(inst["exposed_ns"].sum()),
        "transfer_exposed_ns": int(inst["transfer_exposed_ns"].sum()),
        "by_dim_op": by_dim_op,
        "by_rank_dim_op": per_rank_dim_op,
        "by_dim": _agg(inst, "dim"), "by_op": _agg(inst, "op"), "by_size": _agg(inst, "size"),
        "by_caller": _agg(inst, "caller"),
        "top_offenders": _top_offenders(inst, cfg.top_offenders),
        "thresholds": asdict(cfg),
    }
    # per-instance exposure for later analyzers (bandwidth bounds a slow collective's cost by it)
    return UnoverlappedResult(findings=findings, section=section,
                              instances=pa.table(inst, schema=INSTANCE_SCHEMA) if parts
                              else INSTANCE_SCHEMA.empty_table())


def _dim_op_rows(per_rank: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (dim, op) over ranks: sums, and the per-step figures of the rank most exposed per step."""
    out = []
    for rows in _groups([r["dim"] for r in per_rank], [r["op"] for r in per_rank]):
        g = [per_rank[i] for i in rows]
        worst = max(g, key=lambda r: r["transfer_exposed_ns"] / r["steps"])  # the first of equals
        per_step = worst["transfer_exposed_ns"] / worst["steps"]
        comm, exposed = sum(r["comm_ns"] for r in g), sum(r["exposed_ns"] for r in g)
        sizes = [r["bytes_p50"] for r in g if r["bytes_p50"] is not None]
        calls = sum(r["instances"] for r in g)
        out.append({
            "dim": g[0]["dim"], "op": g[0]["op"], "instances": calls, "comm_ns": comm, "exposed_ns": exposed,
            "transfer_exposed_ns": sum(r["transfer_exposed_ns"] for r in g),
            "overlap_ratio": round(1 - exposed / comm, 6) if comm else None,
            "exposed_ns_per_step": int(worst["exposed_ns"] / worst["steps"]),
            "transfer_exposed_ns_per_step": int(per_step),
            "share_of_step": round(float(per_step / worst["step_ns"]), 6) if worst["step_ns"] else 0.0,
            "worst_rank": int(worst["rank"]),
            "bytes_p50": float(np.median(sizes)) if sizes else None,
            "calls_per_step": round(float(calls / max(sum(r["steps"] for r in g), 1)), 2),
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
