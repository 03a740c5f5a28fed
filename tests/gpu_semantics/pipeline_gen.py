"""Small multi-rank GPU (Kineto) traces of an unlabelled pipeline over the default NCCL group.

Each stage's compute order per step is the reference order of torch.distributed.pipelining's own
schedule classes (ScheduleGPipe / Schedule1F1B `_get_pipeline_order`). The device timeline is
simulated with exact integer nanoseconds: a forward waits for its activation, a backward for its
gradient; a send kernel starts when the compute that produced its tensor ends, the matching receive
kernel when the receiving stage gets to the op that needs it, and both end `p2p_ns` after both are
running (an NCCL rank waits inside the kernel). The host runs `host_lead_ns` ahead of its device and launches
every kernel, comm kernels inside `record_param_comms` (Collective name send/recv, Dst/Src Rank,
group "0" / default_pg) > `nccl:send|recv` > `cudaLaunchKernelExC`, as in real NCCL traces. No
record_function labels, no group named pp.

`PipelineTrace.kernels` keeps the generator's own intervals so tests compute the answers from them.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

US = 1_000
MS = 1_000_000
BASE_NS = 1_000_000_000_000  # device clock origin (1e9 µs: µs floats with 3 decimals stay exact)


@dataclass(frozen=True)
class Kernel:
    rank: int
    step: int
    kind: str  # compute | send | recv
    start: int
    end: int
    stage: int
    microbatch: int | None
    phase: str  # fwd | bwd | optimizer | act | grad
    peer: int | None = None


@dataclass
class PipelineTrace:
    stage_ranks: list[int]
    microbatches: int
    schedule: str
    kernels: list[Kernel] = field(default_factory=list)


def reference_order(schedule: str, p: int, m: int) -> dict[int, list[tuple[str, int]]]:
    """(phase, micro-batch) per stage in the order torch.distributed.pipelining runs them."""
    from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe, _ComputationType

    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    order = cls._get_pipeline_order(SimpleNamespace(_num_stages=p, _n_microbatches=m))
    phase = {_ComputationType.FORWARD: "fwd", _ComputationType.FULL_BACKWARD: "bwd"}
    out = {}
    for s, acts in order.items():
        # the k-th forward (backward) of a stage is micro-batch k: torch 2.13's Schedule1F1B order numbers
        # the last stage's forwards 1..m (its steady state increments before the first forward)
        seen = {"fwd": 0, "bwd": 0}
        seq = []
        for a in acts:
            if a is not None and a.computation_type in phase:
                ph = phase[a.computation_type]
                seq.append((ph, seen[ph]))
                seen[ph] += 1
        # torch 2.13's Schedule1F1B order also gives a stage p−1−s warm-up forwards even when m is smaller
        out[s] = seq if seen == {"fwd": m, "bwd": m} else _textbook_order(schedule, p, m, s)
    return out


def _textbook_order(schedule: str, p: int, m: int, s: int) -> list[tuple[str, int]]:
    """GPipe: every forward, then every backward; 1F1B: min(p−s−1, m) warm-up forwards, then one
    forward and one backward in turn, then the remaining backwards."""
    if schedule == "gpipe":
        return [("fwd", i) for i in range(m)] + [("bwd", i) for i in range(m)]
    warm = min(p - s - 1, m)
    ops, f = [("fwd", i) for i in range(warm)], warm
    for b in range(m):
        if f < m:
            ops.append(("fwd", f))
            f += 1
        ops.append(("bwd", b))
    return ops


def _simulate_step(p: int, m: int, schedule: str, fwd_ns: list[int], bwd_ns: list[int], p2p_ns: int,
                   opt_ns: int, stage_ranks: list[int], step: int, t0: int) -> list[Kernel]:
    order = reference_order(schedule, p, m)
    free = [t0] * p  # compute stream
    offered: dict[tuple[str, int, int], int] = {}  # (act|grad, receiving stage, mb) → send kernel start
    pos = [0] * p
    out: list[Kernel] = []
    while any(pos[s] < len(order[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if pos[s] >= len(order[s]):
                continue
            ph, mb = order[s][pos[s]]
            src = s - 1 if ph == "fwd" else s + 1
            need = ("act" if ph == "fwd" else "grad", s, mb) if 0 <= src < p else None
            if need is not None and need not in offered:
                continue
            start = free[s]
            if need is not None:
                # the receive is posted when the stage gets to this op; data moves once both sides are in
                s0, r0 = offered[need], free[s]
                start = max(s0, r0) + p2p_ns
                out.append(Kernel(stage_ranks[src], step, "send", s0, start, src, mb, need[0], stage_ranks[s]))
                out.append(Kernel(stage_ranks[s], step, "recv", r0, start, s, mb, need[0], stage_ranks[src]))
            end = start + (fwd_ns[s] if ph == "fwd" else bwd_ns[s])
            free[s] = end
            out.append(Kernel(stage_ranks[s], step, "compute", start, end, s, mb, ph))
            if ph == "fwd" and s < p - 1:
                offered[("act", s + 1, mb)] = end
            if ph == "bwd" and s > 0:
                offered[("grad", s - 1, mb)] = end
            pos[s] += 1
            progressed = True
        assert progressed, "schedule deadlocked"
    for s in range(p):
        last = max(k.end for k in out if k.rank == stage_ranks[s])
        out.append(Kernel(stage_ranks[s], step, "compute", last, last + opt_ns, s, None, "optimizer"))
    return out


def generate(p: int, m: int, schedule: str, *, fwd_ns: list[int] | None = None, bwd_ns: list[int] | None = None,
             p2p_ns: int = 50 * US, opt_ns: int = 200 * US, steps: int = 2, step_gap_ns: int = 1 * MS,
             stage_ranks: list[int] | None = None) -> PipelineTrace:
    """Device kernels of `steps` steps of a p-stage pipeline (stage s runs on rank stage_ranks[s])."""
    fwd_ns = fwd_ns or [2 * MS] * p
    bwd_ns = bwd_ns or [4 * MS] * p
    stage_ranks = stage_ranks or list(range(p))
    tr = PipelineTrace(stage_ranks=stage_ranks, microbatches=m, schedule=schedule)
    t0 = BASE_NS
    for step in range(steps):
        ks = _simulate_step(p, m, schedule, fwd_ns, bwd_ns, p2p_ns, opt_ns, stage_ranks, step, t0)
        tr.kernels.extend(ks)
        t0 = max(k.end for k in ks) + step_gap_ns
    return tr


def _us(ns: int) -> float:
    return float(f"{ns // 1000}.{ns % 1000:03d}")


def _ev(name: str, cat: str, ts: int, dur: int, pid: int, tid: int, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": _us(ts), "dur": _us(dur), "args": args}


def rank_trace(tr: PipelineTrace, rank: int, host_lead_ns: int = 5 * MS, first_step: int = 1) -> dict:
    """The Kineto document of one rank: host launches `host_lead_ns` before each kernel starts."""
    world = len(tr.stage_ranks)
    pid, tid, comm_stream, compute_stream = 100 + rank, 100 + rank, 20, 7
    events: list[dict] = []
    corr = 0
    mine = sorted((k for k in tr.kernels if k.rank == rank), key=lambda k: (k.start, k.kind != "compute"))
    last_launch = None
    per_step: dict[int, list[int]] = {}
    for k in mine:
        corr += 1
        launch = k.start - host_lead_ns
        if last_launch is not None:
            launch = max(launch, last_launch + 30 * US)
        assert launch <= k.start, "host lead too short for the launch rate"
        last_launch = launch
        per_step.setdefault(k.step, []).append(launch)
        if k.kind == "compute":
            name = {"fwd": "sm90_xmma_gemm_fwd", "bwd": "sm90_xmma_gemm_bwd",
                    "optimizer": "multi_tensor_apply_kernel"}[k.phase]
            events.append(_ev("aten::mm", "cpu_op", launch - 2 * US, 12 * US, pid, tid, **{"External id": corr}))
            events.append(_ev("cudaLaunchKernel", "cuda_runtime", launch, 5 * US, pid, tid,
                              correlation=corr, **{"External id": corr}))
            events.append(_ev(name, "kernel", k.start, k.end - k.start, 0, compute_stream, correlation=corr,
                              stream=compute_stream, device=0, **{"External id": corr}))
            continue
        op = k.kind  # send | recv
        peer_key = "Dst Rank" if op == "send" else "Src Rank"
        args = {"Collective name": op, "Process Group Name": "0", "Process Group Description": "default_pg",
                "Process Group Ranks": str(list(range(world))), "Group size": world, "In msg nelems": 4096,
                "Out msg nelems": 4096, "dtype": "BFloat16", "Global rank start": 0, "Global rank stride": 1,
                peer_key: k.peer, "External id": corr}
        events.append(_ev("record_param_comms", "cpu_op", launch - 8 * US, 20 * US, pid, tid, **args))
        events.append(_ev(f"nccl:{op}", "user_annotation", launch - 4 * US, 12 * US, pid, tid))
        events.append(_ev("cudaLaunchKernelExC", "cuda_runtime", launch, 5 * US, pid, tid,
                          correlation=corr, **{"External id": corr}))
        events.append(_ev("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "kernel", k.start,
                          k.end - k.start, 0, comm_stream, correlation=corr, stream=comm_stream, device=0,
                          **{"External id": corr, "Collective name": op}))
    for step, launches in per_step.items():
        a, b = min(launches) - 50 * US, max(launches) + 50 * US
        events.append(_ev(f"ProfilerStep#{first_step + step}", "user_annotation", a, b - a, pid, tid))
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": 1,
                                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                               "pg_size": world, "ranks": list(range(world))}],
                                "nccl_version": "2.21.5"},
            "traceEvents": sorted(events, key=lambda e: e["ts"])}


def write(tr: PipelineTrace, out: Path, host_lead_ns: int = 5 * MS) -> Path:
    """rank{R}.pt.trace.json.gz per rank into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for rank in sorted(set(tr.stage_ranks)):
        with gzip.open(out / f"rank{rank}.pt.trace.json.gz", "wt") as fh:
            json.dump(rank_trace(tr, rank, host_lead_ns), fh)
    return out
