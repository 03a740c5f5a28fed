"""A generator of small multi-rank GPU Kineto traces whose answers are known exactly.

The event structure is copied from real NCCL traces (HTA's nccl_data / negative_queue_length ranks):
`distributedInfo` with `pg_config`; `ProfilerStep#N` user annotations on the main thread; `aten::*`
cpu_ops each launching one compute kernel on stream 7 through `cudaLaunchKernel` (correlation + an
`ac2g` flow); collectives as `c10d::<op>` > `record_param_comms` (Collective name, In/Out msg nelems,
Group size, dtype, Process Group Name/Description/Ranks, Seq) > `nccl:<op>` > `cudaLaunchKernelExC`,
the `ncclDevKernel_*` kernel on its own stream (20) carrying the same args.

Device semantics (NCCL): each rank's device runs its ops in program order; a collective kernel starts
on a rank when that rank's device reaches it (its arrival) and every member's kernel ends at
last member's start + transfer_ns. The host launches each op `host_ahead_ns` before the device starts
it (host ahead of the device by a fixed amount, causal for any amount ≥ 0).

With `host_independent` the host runs at its own pace instead, as a GPU's host does: per device op an
`aten::view` (`VIEW_NS`, plus `host_stretch` where the thread was preempted), then the op that launches it,
then `host_gap_ns`; the host begins `host_ahead_ns` before the device is free, and the device starts each op
at max(its launch's end, the previous op's end + `gap_ns`) — so the device runs back to back while the host
is ahead and waits on launches where the host fell behind (a starved host thread).

Everything the tests assert is computed from `Trace.kernels` / `Trace.collectives` (the intervals laid
here) with integer arithmetic; nothing is read back from tracekit.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

BASE_US = 1_763_000_000_000_000  # epoch-scale µs: float64 cannot hold these with ns fractions
HOST_OP_NS = 20_000  # host duration of one aten op (< every kernel's duration)
HOST_COLL_NS = 40_000
VIEW_NS = 3_000  # host duration of the aten::view before each launching op (independent host)
QUEUE_RETURN_NS = 2_000  # a launch blocked on a full queue returns this long after a slot freed
COMM_STREAM = 20
COMPUTE_STREAM = 7
ELEMENT_BYTES = {"Float": 4, "BFloat16": 2, "Half": 2, "Int": 4, "Long": 8, "Double": 8, "Byte": 1}

# op -> (Collective name in record_param_comms, c10d op, nccl annotation, kernel name part)
OPS = {
    "all_reduce": ("allreduce", "c10d::allreduce_", "nccl:all_reduce", "AllReduce_Sum_f32_RING_LL"),
    "all_gather": ("_allgather_base", "c10d::_allgather_base_", "nccl:_all_gather_base", "AllGather_RING_LL"),
    "reduce_scatter": ("_reduce_scatter_base", "c10d::_reduce_scatter_base_", "nccl:_reduce_scatter_base",
                       "ReduceScatter_Sum_f32_RING_LL"),
    "all_to_all": ("all_to_all", "c10d::alltoall_base_", "nccl:all_to_all", "SendRecv"),
    "broadcast": ("broadcast", "c10d::broadcast_", "nccl:broadcast", "Broadcast_RING_LL"),
    "gather": ("gather", "c10d::gather_", "nccl:gather", "SendRecv"),
    "scatter": ("scatter", "c10d::scatter_", "nccl:scatter", "SendRecv"),
}


@dataclass(frozen=True)
class Compute:
    dur_ns: int
    name: str = "aten::mm"


@dataclass(frozen=True)
class Coll:
    op: str
    in_nelems: int
    out_nelems: int
    transfer_ns: int
    dtype: str = "Float"
    record_dims: bool = True
    """False: the op's sizes were not recorded (bucketed TensorList), In/Out msg nelems absent."""


@dataclass
class Spec:
    world: int
    steps: int
    step_ops: list  # Compute | Coll, same on every rank
    slow: dict[int, Fraction] = field(default_factory=dict)
    """rank -> factor on its compute kernel durations (a slower GPU)."""
    host_ahead_ns: int = 0
    carry_over: list[int] = field(default_factory=list)
    """Durations of kernels running before the first launched one, launched before the trace began."""
    first_step: int = 10
    gap_ns: int = 0
    """Device gap before every op (launch latency on the device)."""
    memset_ns: int = 0
    """A memset on the compute stream at the start of every step (other device work)."""
    start_ns: int = 100_000_000
    host_independent: bool = False
    """The host runs at its own pace (see the module doc) instead of `host_ahead_ns` before each device op."""
    host_gap_ns: int = 5_000
    """Independent host: host time between one launching op's end and the next op's aten::view."""
    launch_queue: int = 0
    """Independent host: launches a rank's device may hold pending (0: unbounded); a launch beyond it blocks
    until the op that many places earlier ended, so the host stays a bounded lead ahead."""
    host_stretch: dict = field(default_factory=dict)
    """Independent host: (rank, step, op index in the step) -> ns added to that op's aten::view (the
    thread lost its core inside it)."""


@dataclass
class Kernel:
    rank: int
    step: int | None
    kind: str  # compute | comm | memset | carry
    ts: int
    end: int
    correlation: int | None


@dataclass
class CollInstance:
    step: int
    seq: int
    op: str
    bytes: int | None
    starts: dict[int, int]
    ends: dict[int, int]


@dataclass
class Trace:
    spec: Spec
    kernels: list[Kernel]
    collectives: list[CollInstance]
    host_steps: dict[int, dict[int, tuple[int, int]]]
    """rank -> step -> (start, end) of the ProfilerStep annotation (host)."""
    events: dict[int, list[dict]]


def simulate(spec: Spec) -> Trace:
    """Lay every rank's device intervals with NCCL semantics, then the host events that launched them."""
    n = spec.world
    dev = {r: spec.start_ns for r in range(n)}
    kernels: list[Kernel] = []
    colls: list[CollInstance] = []
    for r in range(n):
        for d in spec.carry_over:
            kernels.append(Kernel(r, None, "carry", dev[r], dev[r] + d, None))
            dev[r] += d
    corr = 1000
    seq = 0
    # per rank: list of (step, kind, device start, correlation, payload, host start, view stretch)
    launches: dict[int, list[tuple]] = {r: [] for r in range(n)}
    host = {r: dev[r] - spec.host_ahead_ns for r in range(n)}

    dev_ends: dict[int, list[int]] = {r: [] for r in range(n)}

    def launch(r: int, s: int, i: int, kind: str) -> tuple[tuple | None, int]:
        """Independent host: ((host start of the op's aten::view, its stretch, its launch call's end), that
        end); else (None, 0). With `launch_queue` Q the call returns only once the rank's device op Q places
        earlier ended (CUDA's launch queue is full)."""
        if not spec.host_independent:
            return None, 0
        t = host[r]
        stretch = spec.host_stretch.get((r, s, i), 0)
        op_t = t + VIEW_NS + stretch
        call = (6_000, 14_000) if kind == "comm" else (5_000, 10_000)
        call_end = op_t + call[1]
        j = len(dev_ends[r])
        if spec.launch_queue and j >= spec.launch_queue:
            call_end = max(call_end, dev_ends[r][j - spec.launch_queue] + QUEUE_RETURN_NS)
        own = HOST_COLL_NS if kind == "comm" else HOST_OP_NS
        host[r] = call_end + (own - call[1]) + spec.host_gap_ns
        return (t, stretch, call_end), call_end

    for s in range(spec.first_step, spec.first_step + spec.steps):
        if spec.memset_ns:
            for r in range(n):
                corr += 1
                h, ready = launch(r, s, -1, "memset")
                st = max(dev[r] + spec.gap_ns, ready)
                kernels.append(Kernel(r, s, "memset", st, st + spec.memset_ns, corr))
                launches[r].append((s, "memset", st, corr, None, h))
                dev[r] = st + spec.memset_ns
                dev_ends[r].append(dev[r])
        for i, op in enumerate(spec.step_ops):
            if isinstance(op, Compute):
                for r in range(n):
                    corr += 1
                    d = int(op.dur_ns * spec.slow.get(r, Fraction(1)))
                    h, ready = launch(r, s, i, "compute")
                    st = max(dev[r] + spec.gap_ns, ready)
                    kernels.append(Kernel(r, s, "compute", st, st + d, corr))
                    launches[r].append((s, "compute", st, corr, op, h))
                    dev[r] = st + d
                    dev_ends[r].append(dev[r])
            else:
                seq += 1
                hosts = {r: launch(r, s, i, "comm") for r in range(n)}
                starts = {r: max(dev[r] + spec.gap_ns, hosts[r][1]) for r in range(n)}
                end = max(starts.values()) + op.transfer_ns
                esize = ELEMENT_BYTES[op.dtype]
                nbytes = max(op.in_nelems, op.out_nelems) * esize if op.record_dims else None
                colls.append(CollInstance(s, seq, op.op, nbytes, starts, {r: end for r in range(n)}))
                for r in range(n):
                    corr += 1
                    kernels.append(Kernel(r, s, "comm", starts[r], end, corr))
                    launches[r].append((s, "comm", starts[r], corr, (op, seq, end), hosts[r][0]))
                    dev[r] = end
                    dev_ends[r].append(end)
    events = {r: _host_events(spec, r, launches[r], kernels) for r in range(n)}
    host_steps = {r: {} for r in range(n)}
    for r, evs in events.items():
        for e in evs:
            m = re.match(r"ProfilerStep#(\d+)", e["name"])
            if m:
                host_steps[r][int(m.group(1))] = (e["ts"], e["ts"] + e["dur"])
    return Trace(spec, kernels, colls, host_steps, events)


def _args_for(op: Coll, n: int, seq: int) -> dict:
    name = OPS[op.op][0]
    a = {"Collective name": name, "Group size": n, "dtype": op.dtype,
         "Process Group Name": "0", "Process Group Description": "default_pg",
         "Process Group Ranks": json.dumps(list(range(n))), "Global rank start": 0, "Global rank stride": 1,
         "In split size": "[]", "Out split size": "[]", "Seq": seq}
    if op.record_dims:
        a["In msg nelems"], a["Out msg nelems"] = op.in_nelems, op.out_nelems
    return a


def _host_events(spec: Spec, rank: int, launches: list[tuple], kernels: list[Kernel]) -> list[dict]:
    """Host ops launch each device op `host_ahead_ns` before it starts; the device rows follow."""
    pid, tid = 1000 + rank, 1000 + rank
    out: list[dict] = []
    ext = 0
    step_first: dict[int, int] = {}
    last_end = 0
    for s, kind, dstart, corr, payload, host in launches:
        t = dstart - spec.host_ahead_ns
        blocked = 0  # how much longer than its own time the launch call took (a full launch queue)
        if host is not None:  # independent host: the aten::view, then the launching op
            host_t, stretch, call_end = host
            step_first.setdefault(s, host_t)
            ext += 1
            out.append(_x("cpu_op", "aten::view", pid, tid, host_t, VIEW_NS + stretch, {"External id": ext}))
            t = host_t + VIEW_NS + stretch
            blocked = call_end - (t + (14_000 if kind == "comm" else 10_000))
        step_first.setdefault(s, t - 5_000)
        ext += 1
        if kind in ("compute", "memset"):
            name = payload.name if kind == "compute" else "aten::zero_"
            out.append(_x("cpu_op", name, pid, tid, t, HOST_OP_NS + blocked, {"External id": ext}))
            launch = "cudaLaunchKernel" if kind == "compute" else "cudaMemsetAsync"
            out.append(_x("cuda_runtime", launch, pid, tid, t + 5_000, 5_000 + blocked,
                          {"External id": ext, "correlation": corr}))
            last_end = t + HOST_OP_NS + blocked
        else:
            op, seq, _ = payload
            cname, c10d, nccl, _k = OPS[op.op]
            args = _args_for(op, spec.world, seq)
            out.append(_x("cpu_op", c10d, pid, tid, t, HOST_COLL_NS + blocked, {"External id": ext}))
            out.append(_x("cpu_op", "record_param_comms", pid, tid, t + 2_000, 34_000 + blocked,
                          {"External id": ext + 1, **args}))
            out.append(_x("user_annotation", nccl, pid, tid, t + 4_000, 20_000 + blocked, {"External id": ext + 2}))
            out.append(_x("cuda_runtime", "cudaLaunchKernelExC", pid, tid, t + 6_000, 8_000 + blocked,
                          {"External id": ext + 2, "correlation": corr}))
            ext += 2
            last_end = t + HOST_COLL_NS + blocked
        out.append({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": _ns(t + 5_000), "cat": "ac2g",
                    "name": "ac2g"})
    steps = sorted(step_first)
    for i, s in enumerate(steps):
        lo = step_first[s]
        hi = step_first[steps[i + 1]] if i + 1 < len(steps) else last_end + 5_000
        out.append(_x("user_annotation", f"ProfilerStep#{s}", pid, pid, lo, hi - lo, {"External id": 0}))
    for k in kernels:
        if k.rank != rank:
            continue
        dur = k.end - k.ts
        if k.kind == "comm":
            op, seq = next((x[4][0], x[4][1]) for x in launches if x[3] == k.correlation)
            name = f"ncclDevKernel_{OPS[op.op][3]}(ncclDevComm*, unsigned long, ncclWork*)"
            args = {"device": rank, "stream": COMM_STREAM, "correlation": k.correlation,
                    **_args_for(op, spec.world, seq)}
            out.append(_x("kernel", name, rank, COMM_STREAM, k.ts, dur, args))
        elif k.kind == "memset":
            out.append(_x("gpu_memset", "Memset (Device)", rank, COMPUTE_STREAM, k.ts, dur,
                          {"device": rank, "stream": COMPUTE_STREAM, "correlation": k.correlation}))
        else:
            corr = k.correlation if k.correlation is not None else 9_000_000 + k.ts % 1_000_000  # carry-over: no launch
            out.append(_x("kernel", "void gemm_kernel<float>(float*)", rank, COMPUTE_STREAM, k.ts, dur,
                          {"device": rank, "stream": COMPUTE_STREAM, "correlation": corr}))
        if k.correlation is not None and k.kind != "carry":
            out.append({"ph": "f", "id": k.correlation, "pid": rank,
                        "tid": COMM_STREAM if k.kind == "comm" else COMPUTE_STREAM,
                        "ts": _ns(k.ts), "cat": "ac2g", "name": "ac2g", "bp": "e"})
    return out


def covered(intervals, lo: int, hi: int) -> int:
    """Length of the union of [a, b) intervals clipped to [lo, hi) (integer ns; the tests' own arithmetic)."""
    total, cur = 0, lo
    for a, b in sorted(intervals):
        a, b = max(a, cur), min(b, hi)
        if b > a:
            total += b - a
            cur = b
    return total


def _ns(ns: int) -> str:
    return f"__NS__{ns}"


def _x(cat: str, name: str, pid: int, tid: int, ts: int, dur: int, args: dict) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": _ns(ts), "dur": _ns(dur),
            "args": args}


def _fmt(ns: int) -> str:
    us = BASE_US * 1000 + ns
    return f"{us // 1000}.{us % 1000:03d}"


def write(trace: Trace, out: Path, comms_log: bool = False) -> Path:
    """One `rank{R}.pt.trace.json.gz` per rank; timestamps written as exact µs with ns fractions.
    `comms_log`: also a `comms.rank{R}.jsonl` per rank (Flight Recorder entry schema) holding only the
    enqueue times, as NCCL's recorder without timing enabled does (state "scheduled", no start/end)."""
    out.mkdir(parents=True, exist_ok=True)
    n = trace.spec.world
    if comms_log:
        for r in range(n):
            _write_comms_log(trace, r, out / f"comms.rank{r}.jsonl")
    for r, evs in trace.events.items():
        meta = [{"name": "process_name", "ph": "M", "pid": 1000 + r, "tid": 0, "args": {"name": "python"}},
                {"name": "process_labels", "ph": "M", "pid": r, "tid": 0, "args": {"labels": f"GPU {r}"}},
                {"name": "thread_name", "ph": "M", "pid": 1000 + r, "tid": 1000 + r,
                 "args": {"name": f"thread {1000 + r} (pt_main_thread)"}},
                {"name": "thread_name", "ph": "M", "pid": r, "tid": COMPUTE_STREAM, "args": {"name": "stream 7 "}},
                {"name": "thread_name", "ph": "M", "pid": r, "tid": COMM_STREAM, "args": {"name": "stream 20 "}}]
        doc = {"schemaVersion": 1,
               "distributedInfo": {"backend": "nccl", "rank": r, "world_size": n, "pg_count": 1,
                                   "pg_config": [{"pg_name": "0", "pg_desc": "default_pg",
                                                  "backend_config": "cuda:nccl", "pg_size": n,
                                                  "ranks": list(range(n))}],
                                   "nccl_version": "2.21.5"},
               "deviceProperties": [{"id": r, "name": "NVIDIA H100 80GB HBM3"}],
               "traceEvents": meta + evs, "displayTimeUnit": "ms"}
        text = json.dumps(doc)
        # durations are plain µs, timestamps epoch µs: both exact decimal text
        text = re.sub(r'"__NS__(\d+)"(?=, "args")', lambda m: _dur(m), text)
        text = re.sub(r'"__NS__(\d+)"', lambda m: _fmt(int(m.group(1))), text)
        (out / f"rank{r}.pt.trace.json.gz").write_bytes(gzip.compress(text.encode(), compresslevel=1))
    return out


def _dur(m: re.Match) -> str:
    # only "dur" values are followed by `, "args"`; keep them as exact µs without the epoch base
    ns = int(m.group(1))
    return f"{ns // 1000}.{ns % 1000:03d}"


def _write_comms_log(trace: Trace, rank: int, path: Path) -> None:
    n = trace.spec.world
    enqueue = {c.seq: c.starts[rank] - trace.spec.host_ahead_ns for c in trace.collectives}
    lines = [{"type": "header", "version": "tracekit.comms/1", "rank": rank, "world_size": n,
              "pg_config": {"default_pg": [list(range(n))]}, "time_ns": BASE_US * 1000}]
    for c in trace.collectives:
        t = BASE_US * 1000 + enqueue[c.seq]
        nel = (c.bytes or 4) // 4
        lines.append({"record_id": c.seq, "pg_id": None, "process_group": ["0", "default_pg"],
                      "collective_seq_id": c.seq, "p2p_seq_id": 0, "op_id": c.seq,
                      "profiling_name": f"nccl:{c.op}", "time_created_ns": t,
                      "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
                      "input_sizes": [[nel]], "input_dtypes": ["Float"], "output_sizes": [[nel]],
                      "output_dtypes": ["Float"], "state": "scheduled", "is_p2p": False, "peer": None,
                      "group_ranks": list(range(n)), "in_split_sizes": None, "out_split_sizes": None,
                      "caller": None, "step": c.step, "rank": rank})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
