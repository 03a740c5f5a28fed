"""From one measured run (its analysis) to a calibrated simulator: what the run's layout was, how fast its
GPUs computed and its links moved bytes, and how far the simulator's replay of it is off.

Calibration, in order:
0. routing (MoE): the router skew (ModelSpec.router_skew) whose routing has the run's skew;
1. link tiers: the median NCCL-tests bus bandwidth of the run's large collectives (≥ 1 MiB, device-side
   transfer time) on groups inside one host sets the intra-host tier, across hosts the inter-host tier;
   a tier the run never used keeps the cluster description's figure;
1b. per-op costs of the backend the run used (gloo on CPU pays milliseconds where NCCL pays
   microseconds): for each op kind on each tier, latency + bus bytes ÷ bandwidth fitted to its
   measured transfer times (both when its sizes differ enough, else the latency against
   the tier's bandwidth); an op the run did not use on a tier takes the median latency of those it did;
2. compute: the simulator's compute time of the measured layout against the measured compute time per
   step (mean over ranks) scales the GEMM efficiency (repeated until they agree);
3. residual: measured step time ÷ the calibrated simulator's step time of the measured layout. It is
   reported and multiplies every prediction (the part of the step the model does not explain).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracekit.advise.predict import predict_step
from tracekit.document import AnalysisDocument, as_document, as_section
from tracekit.document.model import BandwidthRowsRow, PipelineSection, RankBreakdown
from tracekit.layout import SCHEDULES, ParallelLayout
from tracekit.simulate import ClusterSpec, Faults, ModelSpec
from tracekit.simulate import executor
from tracekit.simulate.api import T0_NS
from tracekit.simulate.key import answer_key
from tracekit.simulate.program import build_programs, make_world
from tracekit.simulate.specs import ring_hops
from tracekit.simulate.topology import build_topology

LARGE_BYTES = 1 << 20
P2P_OPS = ("send", "recv", "sendrecv")
SIM_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv")
"""The ops the simulator issues (P2P send/recv pairs are one `sendrecv` instance)."""


@dataclass(frozen=True)
class CollPoint:
    """One (group, op, size bucket) row of the bandwidth section: median bus bytes and transfer time."""

    dim: str
    op: str
    size: int
    bus_bytes: float
    time_ns: float
    count: int


@dataclass(frozen=True)
class MeasuredRun:
    """What the analysis says about the run the advice starts from."""

    layout: ParallelLayout
    world: int
    hosts: int
    step_ns: int
    """Mean step time (slowest rank)."""
    compute_ns: int
    """Mean compute time per step per rank."""
    busbw_gbps: dict[str, float] = field(default_factory=dict)
    """dim → median bus bandwidth of its large collectives (GB/s), as measured (latency included)."""
    transfers: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """dim → (bus bytes, transfer ns) of each (op, size) row of its large collectives (medians)."""
    coll_points: tuple[CollPoint, ...] = ()
    """Every collective row with known bytes (any size), P2P send/recv pairs as `sendrecv`."""
    cpu_only: bool = False
    """No rank's trace has device work (a gloo CPU run): its collectives' latency is per ring hop."""
    recorder_overhead: float = 1.0
    """Profiled / unprofiled step time measured by `tracekit record` (section `recording`); step_ns and
    compute_ns above are already divided by it."""


def _mean_per_step(ranks: list[RankBreakdown], key: str) -> list[float]:
    return [getattr(r, key) / r.steps for r in ranks if r.steps]


def _fsdp(bandwidth_rows: list[BandwidthRowsRow]) -> bool:
    ops = {r.op for r in bandwidth_rows if r.dim in ("dp", "fsdp", "dp_cp")}
    return "reduce_scatter" in ops and "all_gather" in ops


def _bandwidth_rows(doc: AnalysisDocument) -> list[BandwidthRowsRow]:
    return doc.sections.bandwidth.rows if doc.sections.bandwidth is not None else []


def coll_points(rows: list[BandwidthRowsRow | dict[str, Any]]) -> tuple[CollPoint, ...]:
    """Collective rows (the bandwidth section's) as points; a P2P row pair (send and recv of one group and
    size) becomes one `sendrecv` point at the lesser of the two sides' median times (either side may include
    waiting for the other, the lesser bounds the transfer)."""
    out: list[CollPoint] = []
    p2p: dict[tuple, list[BandwidthRowsRow]] = defaultdict(list)
    for r in (row if isinstance(row, BandwidthRowsRow) else as_section(BandwidthRowsRow, row) for row in rows):
        if r is None or not r.time_ns_p50 or not r.bytes_p50:
            continue
        if r.op in ("send", "recv"):
            p2p[(r.pg_name, r.bucket_bytes, r.dim)].append(r)
        elif r.op in SIM_OPS and r.busbw_gbps_p50:
            out.append(CollPoint(r.dim or "unknown", r.op, int(r.group_size or 2),
                                 float(r.busbw_gbps_p50) * float(r.time_ns_p50), float(r.time_ns_p50),
                                 int(r.count or 1)))
    for (_, _, dim), pair in p2p.items():
        best = min(pair, key=lambda r: r.time_ns_p50)
        out.append(CollPoint(dim or "unknown", "sendrecv", 2, float(best.bytes_p50), float(best.time_ns_p50),
                             min(int(r.count or 1) for r in pair)))
    return tuple(out)


def measured_layout(analysis: AnalysisDocument | dict[str, Any]) -> ParallelLayout:
    doc = as_document(analysis)
    lay, pipe = doc.sections.layout, doc.sections.pipeline or PipelineSection()
    shape = (lay.mesh_shape if lay is not None else None) or {}
    dims = {d: int(shape.get(d, 1)) for d in ("dp", "tp", "pp", "cp", "ep")}
    if dims["pp"] == 1 and pipe.num_stages:
        dims["pp"] = int(pipe.num_stages) // max(1, int(pipe.chunks_per_rank or 1))
    v = int(pipe.chunks_per_rank or 1)
    schedule = pipe.schedule_detected or pipe.schedule or "1f1b"
    if v > 1 and schedule not in ("interleaved", "zb"):
        schedule = "interleaved"
    m = int(pipe.num_microbatches or 1)
    world = int((lay.world_size if lay is not None else None) or len(doc.ranks) or 1)
    known = dims["tp"] * dims["pp"] * dims["cp"]
    if "dp" not in shape and world % known == 0:
        dims["dp"] = world // known
    return ParallelLayout(dp=dims["dp"], tp=dims["tp"], pp=dims["pp"], cp=dims["cp"], ep=dims["ep"],
                          dp_mode="fsdp" if _fsdp(_bandwidth_rows(doc)) else "ddp",
                          schedule=schedule if schedule in SCHEDULES else "1f1b", microbatches=m, virtual_stages=v)


def measured_run(analysis: AnalysisDocument | dict[str, Any]) -> MeasuredRun:
    doc = as_document(analysis)
    sec, ranks = doc.sections, doc.ranks
    if not ranks:
        raise ValueError("the analysis has no per-rank breakdown to calibrate from")
    layout = measured_layout(doc)
    hosts = int((sec.placement.num_hosts if sec.placement is not None else None) or 1)
    bw: dict[str, list[float]] = {}
    points: dict[str, list[tuple[float, float]]] = {}
    for row in _bandwidth_rows(doc):
        if row.op in P2P_OPS or not row.busbw_gbps_p50 or (row.bytes_p50 or 0) < LARGE_BYTES:
            continue
        dim = row.dim or "unknown"
        bw.setdefault(dim, []).append(float(row.busbw_gbps_p50))
        t = float(row.time_ns_p50)
        points.setdefault(dim, []).append((float(row.busbw_gbps_p50) * t, t))
    overhead = (sec.recording.recorder_overhead if sec.recording is not None else None) or {}
    slowed = float(overhead.get("ratio") or 1.0)
    return MeasuredRun(layout=layout, world=layout.world_size, hosts=hosts,
                       step_ns=int(max(_mean_per_step(ranks, "step_ns")) / slowed),
                       compute_ns=int(statistics.mean(_mean_per_step(ranks, "compute_ns")) / slowed),
                       recorder_overhead=slowed,
                       busbw_gbps={d: statistics.median(v) for d, v in bw.items()}, transfers=points,
                       coll_points=coll_points(_bandwidth_rows(doc)), cpu_only=_cpu_only(doc))


def _cpu_only(doc: AnalysisDocument) -> bool:
    details = doc.sections.breakdown.rank_details if doc.sections.breakdown is not None else []
    return {r.trace_kind for r in details} == {"cpu"}


@dataclass(frozen=True)
class Calibrated:
    model: ModelSpec
    cluster: ClusterSpec
    residual: float
    """Measured ÷ predicted step time of the measured layout, applied to every prediction."""
    measured: MeasuredRun
    predicted_measured_ns: int
    """The calibrated simulator's step time of the measured layout, before the residual."""
    notes: list[str] = field(default_factory=list)


def _tiers(m: MeasuredRun, cluster: ClusterSpec) -> dict[str, bool]:
    """dim → whether its groups span hosts in the measured run."""
    topo = build_topology(m.layout, cluster)
    out: dict[str, bool] = {}
    for g in topo.groups.values():
        d = "dp" if g.dim == "dp_cp" else g.dim
        out[d] = out.get(d, False) or g.hosts > 1
    return out


def link_bandwidth(points: list[tuple[float, float]], latency_ns: float) -> float:
    """Bus bandwidth (GB/s) of a tier from (bus bytes, transfer ns) points: the slope of time over bytes
    when the sizes differ enough to fit it, else each point less the tier's latency (median)."""
    xs = [b for b, _ in points]
    if len(points) >= 2 and max(xs) >= 2 * min(xs):
        mx, my = statistics.mean(xs), statistics.mean(t for _, t in points)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (t - my) for x, t in points) / sxx
        if slope > 0 and my - slope * mx >= 0:
            return 1.0 / slope
    return statistics.median(b / max(1.0, t - latency_ns) for b, t in points)


def _with_links(m: MeasuredRun, cluster: ClusterSpec, notes: list[str]) -> ClusterSpec:
    tiers = _tiers(m, cluster)
    intra = [p for d, ps in m.transfers.items() if d in tiers and not tiers[d] for p in ps]
    inter = [p for d, ps in m.transfers.items() if tiers.get(d) for p in ps]
    changes = {}
    if intra:
        changes["intra_bw_gbs"] = link_bandwidth(intra, cluster.intra_lat_us * 1e3)
        notes.append(f"intra-host bus bandwidth {changes['intra_bw_gbs']:.0f} GB/s measured")
    if inter:
        changes["inter_bw_gbs"] = link_bandwidth(inter, cluster.inter_lat_us * 1e3)
        notes.append(f"inter-host bus bandwidth {changes['inter_bw_gbs']:.0f} GB/s measured")
    return dataclasses.replace(cluster, **changes)


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, cum[-1] / 2)])


def fit_op_cost(points: list[CollPoint], bw_gbs: float, per_hop: bool = False) -> tuple[float, float]:
    """(latency µs, bus bandwidth GB/s) of one op on one tier from its points: a count-weighted
    least-squares fit of time = latency × hops + bus bytes ÷ bandwidth when the sizes differ enough (≥ 2×)
    to give a positive slope, else the latency alone against `bw_gbs` (weighted median). `per_hop`: hops =
    ring_hops(op, group size), so a group of another size pays its own number of hops
    (`ClusterSpec.coll_lat_per_hop`); else 1."""
    x = np.array([p.bus_bytes for p in points])
    y = np.array([p.time_ns for p in points])
    h = np.array([ring_hops(p.op, p.size) if per_hop else 1 for p in points], dtype=float)
    w = np.array([p.count for p in points], dtype=float)
    if x.max() >= 2 * x.min():
        sw = np.sqrt(w)
        (lat, nspb), *_ = np.linalg.lstsq(np.c_[h, x] * sw[:, None], y * sw, rcond=None)
        if lat >= 0 and nspb > 0:
            return float(lat) / 1e3, 1.0 / float(nspb)
    return _weighted_median(np.maximum(y - x / bw_gbs, 0.0) / h, w) / 1e3, bw_gbs


def _tier_bw(cluster: ClusterSpec, tier: str) -> float:
    return cluster.inter_bw_gbs if tier == "inter" else cluster.intra_bw_gbs


def _complete_tier(costs: dict[tuple[str, str], tuple[float, float]], tier: str, bw_gbs: float,
                   notes: list[str]) -> None:
    """Bound the tier's P2P latency by its collectives' median latency (a P2P op's time runs from its own
    start, so it holds the wait for its peer: nothing marks the peer's arrival as for collectives), and
    give the ops the run did not use on the tier that median latency at the tier's bandwidth."""
    coll = [c[0] for (t, o), c in costs.items() if t == tier and o != "sendrecv"]
    lat = statistics.median(coll) if coll else costs[(tier, "sendrecv")][0]
    if (tier, "sendrecv") in costs and lat < costs[(tier, "sendrecv")][0]:
        costs[(tier, "sendrecv")] = (lat, costs[(tier, "sendrecv")][1])
        notes.append(f"{tier}-host sendrecv: P2P times include waiting for the peer; "
                     f"the tier's collective latency, {lat:.1f} µs, used instead")
    for op in SIM_OPS:
        if (tier, op) not in costs:
            costs[(tier, op)] = (lat, bw_gbs)
            notes.append(f"{tier}-host {op} not in the run: the median latency of its ops, {lat:.1f} µs")


def _with_op_costs(m: MeasuredRun, cluster: ClusterSpec, notes: list[str]) -> ClusterSpec:
    """The cluster with the measured run's per-op collective costs per tier (`ClusterSpec.coll_costs`)."""
    tiers = _tiers(m, cluster)
    by: dict[tuple[str, str], list[CollPoint]] = defaultdict(list)
    for p in m.coll_points:
        if p.dim in tiers:
            by[("inter" if tiers[p.dim] else "intra", p.op)].append(p)
    costs: dict[tuple[str, str], tuple[float, float]] = {}
    for (tier, op), pts in sorted(by.items()):
        lat, bw = costs[(tier, op)] = fit_op_cost(pts, _tier_bw(cluster, tier), m.cpu_only)
        notes.append(f"{tier}-host {op}: {lat:.1f} µs{' per ring hop' if m.cpu_only else ''} + bus bytes at "
                     f"{bw:.3g} GB/s ({sum(p.count for p in pts)} measured)")
    for tier in sorted({t for t, _ in costs}):
        _complete_tier(costs, tier, _tier_bw(cluster, tier), notes)
    if m.cpu_only and costs:
        notes.append("CPU run (gloo): collective latency per ring hop, so groups of other sizes pay their own hops")
    return dataclasses.replace(cluster, coll_costs=tuple((t, o, c[0], c[1]) for (t, o), c in sorted(costs.items())),
                               coll_lat_per_hop=m.cpu_only)


def expected_skew(sigma: float, experts: int, routed: int, samples: int = 2000, seed: int = 0) -> float:
    """Mean max/mean routed tokens per expert of `routed` token slots whose expert probabilities are the
    softmax of N(0, σ) logits (ModelSpec.router_skew), multinomial draws."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, sigma, (samples, experts)) if sigma > 0 else np.zeros((samples, experts))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    counts = rng.multinomial(routed, p)
    return float(np.mean(counts.max(axis=1) / counts.mean(axis=1)))


def router_skew(analysis: AnalysisDocument | dict[str, Any], experts: int) -> float | None:
    """ModelSpec.router_skew that reproduces the run's routing skew (mean over its MoE layers of the
    per-step max/mean tokens per expert), by bisection on `expected_skew`; None without routing data."""
    ex = as_document(analysis).sections.experts
    layers = [x for x in (ex.layers if ex is not None else []) if x.skew and x.num_experts == experts]
    heat = ex.heatmap if ex is not None else []
    if not layers or not heat:
        return None
    target = statistics.mean(x.skew for x in layers)
    routed = int(statistics.median(sum(h.tokens) for h in heat))
    lo, hi = 0.0, 4.0
    if expected_skew(lo, experts, routed) >= target:
        return 0.0
    for _ in range(16):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_skew(mid, experts, routed) < target else (lo, mid)
    return (lo + hi) / 2


def _simulate(model: ModelSpec, cluster: ClusterSpec, layout: ParallelLayout, steps: int = 2) -> dict[str, Any]:
    w = make_world(model, cluster, layout, Faults(), 0)
    progs = build_programs(w, steps)
    executor.run(progs, T0_NS)
    executor.finish_colls(progs)
    return answer_key(progs, (), steps)


def _compute_per_step(key: dict[str, Any]) -> float:
    per = [statistics.mean(s["compute_ns"] for s in r["steps"]) for r in key["ranks"]]
    return statistics.mean(per)


def _with_compute(m: MeasuredRun, model: ModelSpec, cluster: ClusterSpec, rounds: int = 6) -> ClusterSpec:
    """The cluster whose GEMM efficiency makes the simulated compute per step the measured one. Repeated
    until they agree within 0.5%: kernels at their minimum duration (the tiny GEMMs of a small model) do
    not scale with the efficiency, so one proportional step undershoots where they dominate."""
    for _ in range(rounds if m.compute_ns else 0):
        scale = _compute_per_step(_simulate(model, cluster, m.layout)) / m.compute_ns
        cluster = dataclasses.replace(cluster, efficiency=cluster.efficiency * scale)
        if abs(scale - 1) < 0.005:
            break
    return cluster


def calibrate(analysis: AnalysisDocument | dict[str, Any], model: ModelSpec, cluster: ClusterSpec) -> Calibrated:
    """Calibrate `cluster` (the description's figures are the starting point) to the measured run (the
    typed analysis document, or a dict analysis.json holds: read as the document)."""
    analysis = as_document(analysis)
    m = measured_run(analysis)
    notes: list[str] = []
    if m.recorder_overhead != 1.0:
        notes.append(f"recorded steps ran x{m.recorder_overhead:.3f} slower than unprofiled ones (tracekit record's "
                     "timing): step and compute times divided by it before calibrating")
    mb = model.micro_batch_size
    cluster = dataclasses.replace(cluster, hosts=m.hosts, gpus_per_host=-(-m.world // m.hosts))
    sigma = router_skew(analysis, model.experts) if model.experts else None
    if sigma is not None:
        model = dataclasses.replace(model, router_skew=sigma)
        notes.append(f"router logits σ {sigma:.2f} shared per step and layer (the run's routing skew)")
    cl = _with_op_costs(m, _with_links(m, cluster, notes), notes)
    cl = _with_compute(m, model, cl)
    notes.append(f"GEMM efficiency {cl.efficiency:.3g} of peak (compute {m.compute_ns / 1e6:.2f} ms/step measured)")
    key = _simulate(model, cl, m.layout)
    pred = int(key["mean_step_ns"])
    residual = m.step_ns / pred if pred else 1.0
    notes.append(f"the calibrated model replays the measured layout at {pred / 1e6:.2f} ms vs "
                 f"{m.step_ns / 1e6:.2f} ms measured (residual ×{residual:.3f}, applied to every prediction)")
    return Calibrated(model=dataclasses.replace(model, micro_batch_size=mb), cluster=cl, residual=residual,
                      measured=m, predicted_measured_ns=pred, notes=notes)


def predicted_step_ns(cal: Calibrated, layout: ParallelLayout, micro_batch_size: int,
                      cluster: ClusterSpec | None = None) -> int:
    """Calibrated prediction of `layout`'s step (ns) at `micro_batch_size` sequences per micro-batch, on
    `cluster` (default: the calibrated one), residual applied."""
    model = dataclasses.replace(cal.model, micro_batch_size=micro_batch_size)
    return int(predict_step(model, cluster or cal.cluster, layout).step_ns * cal.residual)
