"""From one measured run (its analysis) to a calibrated simulator: what the run's layout was, how fast its
GPUs computed and its links moved bytes, and how far the simulator's replay of it is off.

Calibration, in order:
1. link tiers: the median NCCL-tests bus bandwidth of the run's large collectives (≥ 1 MiB, device-side
   transfer time) on groups inside one host sets the intra-host tier, across hosts the inter-host tier;
   a tier the run never used keeps the cluster description's figure;
2. compute: the simulator's compute time of the measured layout against the measured compute time per
   step (mean over ranks) scales the GEMM efficiency;
3. residual: measured step time ÷ the calibrated simulator's step time of the measured layout. It is
   reported and multiplies every prediction (the part of the step the model does not explain).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any

from tracekit.simulate import ClusterSpec, Faults, Layout, ModelSpec
from tracekit.simulate import engine
from tracekit.simulate.api import T0_NS
from tracekit.simulate.key import answer_key
from tracekit.simulate.program import build_programs, make_world
from tracekit.simulate.topology import build_topology

LARGE_BYTES = 1 << 20
P2P_OPS = ("send", "recv", "sendrecv")


@dataclass(frozen=True)
class MeasuredRun:
    """What the analysis says about the run the advice starts from."""

    layout: Layout
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


def _mean_per_step(ranks: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] / r["steps"] for r in ranks if r.get("steps")]


def _fsdp(bandwidth_rows: list[dict[str, Any]]) -> bool:
    ops = {r.get("op") for r in bandwidth_rows if r.get("dim") in ("dp", "fsdp", "dp_cp")}
    return "reduce_scatter" in ops and "all_gather" in ops


def measured_layout(analysis: dict[str, Any]) -> Layout:
    sec = analysis.get("sections", {})
    shape = (sec.get("layout") or {}).get("mesh_shape") or {}
    pipe = sec.get("pipeline") or {}
    rows = (sec.get("bandwidth") or {}).get("rows", [])
    dims = {d: int(shape.get(d, 1)) for d in ("dp", "tp", "pp", "cp", "ep")}
    if dims["pp"] == 1 and pipe.get("num_stages"):
        dims["pp"] = int(pipe["num_stages"]) // max(1, int(pipe.get("chunks_per_rank") or 1))
    v = int(pipe.get("chunks_per_rank") or 1)
    schedule = pipe.get("schedule_detected") or pipe.get("schedule") or "1f1b"
    if v > 1 and schedule not in ("interleaved", "zb"):
        schedule = "interleaved"
    m = int(pipe.get("num_microbatches") or 1)
    world = int((sec.get("layout") or {}).get("world_size") or len(analysis.get("ranks", [])) or 1)
    known = dims["tp"] * dims["pp"] * dims["cp"]
    if "dp" not in shape and world % known == 0:
        dims["dp"] = world // known
    return Layout(dp=dims["dp"], tp=dims["tp"], pp=dims["pp"], cp=dims["cp"], ep=dims["ep"], fsdp=_fsdp(rows),
                  schedule=schedule if schedule in ("gpipe", "1f1b", "interleaved", "zb") else "1f1b",
                  microbatches=m, interleave=v)


def measured_run(analysis: dict[str, Any]) -> MeasuredRun:
    sec = analysis.get("sections", {})
    ranks = analysis.get("ranks", [])
    if not ranks:
        raise ValueError("the analysis has no per-rank breakdown to calibrate from")
    layout = measured_layout(analysis)
    hosts = int((sec.get("placement") or {}).get("num_hosts") or 1)
    bw: dict[str, list[float]] = {}
    points: dict[str, list[tuple[float, float]]] = {}
    for row in (sec.get("bandwidth") or {}).get("rows", []):
        if row.get("op") in P2P_OPS or not row.get("busbw_gbps_p50") or (row.get("bytes_p50") or 0) < LARGE_BYTES:
            continue
        dim = row.get("dim") or "unknown"
        bw.setdefault(dim, []).append(float(row["busbw_gbps_p50"]))
        t = float(row["time_ns_p50"])
        points.setdefault(dim, []).append((float(row["busbw_gbps_p50"]) * t, t))
    return MeasuredRun(layout=layout, world=layout.world, hosts=hosts,
                       step_ns=int(max(_mean_per_step(ranks, "step_ns"))),
                       compute_ns=int(statistics.mean(_mean_per_step(ranks, "compute_ns"))),
                       busbw_gbps={d: statistics.median(v) for d, v in bw.items()}, transfers=points)


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


def _simulate(model: ModelSpec, cluster: ClusterSpec, layout: Layout, steps: int = 2) -> dict[str, Any]:
    w = make_world(model, cluster, layout, Faults(), 0)
    progs = build_programs(w, steps)
    engine.run(progs, T0_NS)
    engine.finish_colls(progs)
    return answer_key(progs, (), steps)


def _compute_per_step(key: dict[str, Any]) -> float:
    per = [statistics.mean(s["compute_ns"] for s in r["steps"]) for r in key["ranks"]]
    return statistics.mean(per)


def calibrate(analysis: dict[str, Any], model: ModelSpec, cluster: ClusterSpec) -> Calibrated:
    """Calibrate `cluster` (the description's figures are the starting point) to the measured run."""
    m = measured_run(analysis)
    notes: list[str] = []
    mb = model.micro_batch_size
    cluster = dataclasses.replace(cluster, hosts=m.hosts, gpus_per_host=-(-m.world // m.hosts))
    cl = _with_links(m, cluster, notes)
    key = _simulate(model, cl, m.layout)
    scale = _compute_per_step(key) / m.compute_ns if m.compute_ns else 1.0
    cl = dataclasses.replace(cl, efficiency=cl.efficiency * scale)
    notes.append(f"GEMM efficiency {cl.efficiency:.3f} of peak (compute {m.compute_ns / 1e6:.2f} ms/step measured)")
    key = _simulate(model, cl, m.layout)
    pred = int(key["mean_step_ns"])
    residual = m.step_ns / pred if pred else 1.0
    notes.append(f"the calibrated model replays the measured layout at {pred / 1e6:.2f} ms vs "
                 f"{m.step_ns / 1e6:.2f} ms measured (residual ×{residual:.3f}, applied to every prediction)")
    return Calibrated(model=dataclasses.replace(model, micro_batch_size=mb), cluster=cl, residual=residual,
                      measured=m, predicted_measured_ns=pred, notes=notes)
