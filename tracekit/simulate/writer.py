"""SimResult → one Kineto trace per rank, as torch.profiler + NCCL on GPUs write them, plus
.ground_truth.json and manifest.json.

Per launching op: the aten `cpu_op`, a `cudaLaunchKernel` (`cuda_runtime`, correlation id) inside it, an
`ac2g` flow (s on the host, f on the device), and the kernel (`kernel` / `gpu_memcpy`, pid = device,
tid = stream, External id + correlation). Collectives: `record_param_comms` with Collective name,
In/Out msg nelems, Group size, dtype, split sizes, Process Group Name/Description/Ranks, Seq; a
`nccl:<op>` annotation inside it; the `ncclDevKernel_*` kernel carries the same args. `[memory]`
instant events follow Kineto's memory-event format. Times: µs with ns decimals, relative to
`baseTimeNanoseconds` (exact integer arithmetic, never floats).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
from collections import defaultdict, deque
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from isal import isal_zlib

from tracekit.simulate.executor import COLL, HOST, KERNEL, MARK, MEMORY, SYNC, WAIT, Op
from tracekit.simulate.key import ANSWER_KEY_FILE
from tracekit.simulate.program import RPC_NAME

BASE_NS = 1_763_990_000_000_000_000  # baseTimeNanoseconds: ts are µs after it
NCCL_VERSION = "2.21.5"
_GEMM_ARGS = ('"registers per thread": 168, "shared memory": 213248, "blocks per SM": 1, "warps per SM": 12, '
              '"grid": [132, 1, 1], "block": [384, 1, 1], "est. achieved occupancy %": 19')
_EW_ARGS = ('"registers per thread": 32, "shared memory": 0, "blocks per SM": 8, "warps per SM": 64, '
            '"grid": [1056, 1, 1], "block": [256, 1, 1], "est. achieved occupancy %": 100')
_NCCL_ARGS = ('"registers per thread": 96, "shared memory": 4736, "blocks per SM": 0.12, "warps per SM": 2, '
              '"grid": [16, 1, 1], "block": [640, 1, 1], "est. achieved occupancy %": 3')


def _t(ns: int) -> str:
    """µs since BASE_NS with exact ns decimals."""
    d = ns - BASE_NS
    return f"{d // 1000}.{d % 1000:03d}"


def _d(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def _ranks_text(ranks) -> str:
    return "[" + ", ".join(map(str, ranks)) + "]"


class _Trace:
    def __init__(self, res, rank: int):
        self.res = res
        self.rank = rank
        topo = res.world.topo
        self.pid = 100000 + rank
        self.tid = self.pid
        self.dev = topo.local_device(rank)
        self.ext = 1
        self.corr = 100
        self.out: list[str] = []

    def cpu(self, cat: str, name: str, t0: int, dur: int, args: str = "") -> int:
        e = self.ext
        self.ext += 1
        extra = f", {args}" if args else ""
        self.out.append(f'{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": {self.pid}, "tid": {self.tid}, '
                        f'"ts": {_t(t0)}, "dur": {_d(dur)}, "args": {{"External id": {e}{extra}}}}}')
        return e

    def runtime(self, api: str, cbid: int, t0: int, dur: int) -> None:
        """A CUDA runtime call without a kernel (stream wait / synchronize): its own correlation id."""
        c = self.corr
        self.corr += 1
        self.out.append(f'{{"ph": "X", "cat": "cuda_runtime", "name": "{api}", "pid": {self.pid}, "tid": {self.tid}, '
                        f'"ts": {_t(t0)}, "dur": {_d(dur)}, "args": {{"cbid": {cbid}, "correlation": {c}}}}}')

    def launch(self, ext: int, t_launch: int, dur: int, api: str, cbid: int, op: Op, kcat: str, kargs: str) -> None:
        c = self.corr
        self.corr += 1
        pid, tid, dev, stream = self.pid, self.tid, self.dev, op.stream
        tl, td = _t(t_launch), _t(op.d0)
        self.out += (
            f'{{"ph": "X", "cat": "cuda_runtime", "name": "{api}", "pid": {pid}, "tid": {tid}, '
            f'"ts": {tl}, "dur": {_d(dur)}, "args": {{"External id": {ext}, "cbid": {cbid}, "correlation": {c}}}}}',
            f'{{"ph": "s", "id": {c}, "pid": {pid}, "tid": {tid}, "ts": {tl}, "cat": "ac2g", "name": "ac2g"}}',
            f'{{"ph": "f", "id": {c}, "pid": {dev}, "tid": {stream}, "ts": {td}, "cat": "ac2g", "name": "ac2g", "bp": "e"}}',
            f'{{"ph": "X", "cat": "{kcat}", "name": "{op.kname}", "pid": {dev}, "tid": {stream}, '
            f'"ts": {td}, "dur": {_d(op.d1 - op.d0)}, "args": {{"External id": {ext}, "queued": 0, '
            f'"device": {dev}, "context": 1, "stream": {stream}, "correlation": {c}, {kargs}}}}}')


def _coll_args(op: Op, rank: int) -> tuple[str, str]:
    """(record_param_comms args, nccl:<op> annotation name)."""
    c = op.coll
    g = c.pg
    if c.op == "sendrecv":
        kind, peer = op.peer
        n_in, n_out = c.nelems[rank]
        ranks = g.ranks
        peer_key = "Dst Rank" if kind == "send" else "Src Rank"
        a = (f'"Collective name": "{kind}", "In msg nelems": {n_in}, "Out msg nelems": {n_out}, '
             f'"Group size": {g.size}, "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]", '
             f'"Process Group Name": "{g.name}", "Process Group Description": "{g.desc}", '
             f'"Process Group Ranks": "{_ranks_text(ranks)}", "{peer_key}": {peer}')
        return a, f"nccl:{kind}"
    n_in, n_out = c.nelems[rank]
    sp_in, sp_out = c.splits.get(rank, ([], []))
    ranks = g.ranks
    stride = ranks[1] - ranks[0] if len(ranks) > 1 else 1
    if any(ranks[i + 1] - ranks[i] != stride for i in range(len(ranks) - 1)):
        stride = -1
    a = (f'"Collective name": "{RPC_NAME[c.op]}", "In msg nelems": {n_in}, "Out msg nelems": {n_out}, '
         f'"Group size": {g.size}, "dtype": "{c.dtype}", "In split size": "{_ranks_text(sp_in)}", '
         f'"Out split size": "{_ranks_text(sp_out)}", "Process Group Name": "{g.name}", '
         f'"Process Group Description": "{g.desc}", "Process Group Ranks": "{_ranks_text(ranks)}", '
         f'"Global rank start": {ranks[0]}, "Global rank stride": {stride}, "Seq": {c.seq}')
    return a, f"nccl:{c.op}"


class _Addresses:
    """Block addresses of `[memory]` events: an allocation gets a fresh one, a free the address of the
    oldest live allocation of its size (micro-batches run backward in the order they ran forward), so a
    reader can pair frees with allocations as on a real allocator's trace."""

    def __init__(self) -> None:
        self.next = 0x7F0000000000
        self.live: dict[int, deque[int]] = defaultdict(deque)

    def of(self, delta: int) -> int:
        if delta < 0 and self.live[-delta]:
            return self.live[-delta].popleft()
        self.next += 4096
        if delta > 0:
            self.live[delta].append(self.next)
        return self.next


def rank_events(res, rank: int) -> list[str]:
    """The traceEvents of one rank as JSON text fragments."""
    tr = _Trace(res, rank)
    c = res.cluster
    launch_ns = int(c.launch_us * 1000)
    labels: list[list] = []  # open ranges: [name, h0, dmin, dmax]
    addrs = _Addresses()
    for op in res.programs[rank]:
        k = op.kind
        if k == KERNEL:
            if isinstance(op.extra, str):  # an autograd node's op: the node around it, the op just inside
                tr.cpu("cpu_op", f"autograd::engine::evaluate_function: {op.extra}", op.h0, op.h1 - op.h0)
                ext = tr.cpu("cpu_op", op.name, op.h0 + 300, op.h1 - op.h0 - 600)
            else:
                ext = tr.cpu("cpu_op", op.name, op.h0, op.h1 - op.h0)
            tl = op.h1 - launch_ns - 700
            if op.cat == "gpu_memcpy":
                kargs = f'"bytes": {op.extra}, "memory bandwidth (GB/s)": {op.extra / max(1, op.d1 - op.d0):.3f}'
                tr.launch(ext, tl, launch_ns, "cudaMemcpyAsync", 41, op, "gpu_memcpy", kargs)
            else:
                tr.launch(ext, tl, launch_ns, "cudaLaunchKernel", 211, op, "kernel",
                          _GEMM_ARGS if op.kname.startswith("nvjet") or "flash" in op.kname else _EW_ARGS)
        elif k == COLL:
            args, ann = _coll_args(op, rank)
            ext = tr.cpu("cpu_op", "record_param_comms", op.h0, op.h1 - op.h0, args)
            tr.cpu("user_annotation", ann, op.h0 + 1000, op.h1 - op.h0 - 2000)
            tr.launch(ext, op.h1 - launch_ns - 700, launch_ns, "cudaLaunchKernel", 211, op, "kernel",
                      args + ", " + _NCCL_ARGS)
        elif k == WAIT:
            tr.runtime("cudaStreamWaitEvent", 147, op.h0, op.h1 - op.h0)
            continue
        elif k == SYNC:
            tr.cpu("cpu_op", op.name, op.h0, op.h1 - op.h0)
            tr.runtime("cudaStreamSynchronize", 131, op.h0 + 500, op.d0 - op.h0)
            continue
        elif k == HOST:
            if op.cat:
                tr.cpu(op.cat, op.name, op.h0, op.h1 - op.h0)
            continue
        elif k == MARK:
            if op.extra:
                labels.append([op.name, op.h0, None, None])
            else:
                name, h0, dmin, dmax = labels.pop()
                tr.cpu("user_annotation", name, h0, op.h0 - h0)
                if dmin is not None and name.startswith("pp:"):
                    tr.out.append(f'{{"ph": "X", "cat": "gpu_user_annotation", "name": "{name}", "pid": {tr.dev}, '
                                  f'"tid": 7, "ts": {_t(dmin)}, "dur": {_d(dmax - dmin)}, '
                                  f'"args": {{"External id": {tr.ext - 1}}}}}')
            continue
        elif k == MEMORY:
            delta, total = op.extra
            addr = addrs.of(delta)
            reserved = -(-total // (2 << 20)) * (2 << 20)
            tr.out.append(f'{{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": {tr.pid}, '
                          f'"tid": {tr.tid}, "ts": {_t(op.h0)}, "args": {{"Total Reserved": {reserved}, '
                          f'"Total Allocated": {total}, "Bytes": {delta}, "Addr": {addr}, "Device Id": {tr.dev}, '
                          f'"Device Type": 1}}}}')
            continue
        if labels and op.stream == 7:
            for lab in labels:
                if lab[2] is None or op.d0 < lab[2]:
                    lab[2] = op.d0
                if lab[3] is None or op.d1 > lab[3]:
                    lab[3] = op.d1
    return tr.out


def _header(res, rank: int) -> str:
    topo = res.world.topo
    c = res.cluster
    groups = [g for g in topo.groups.values() if rank in g.ranks]
    pg_config = [{"pg_name": g.name, "pg_desc": g.desc, "backend_config": "cuda:nccl", "pg_size": g.size,
                  "ranks": list(g.ranks)} for g in groups]
    dist = {"backend": "nccl", "rank": rank, "world_size": topo.world, "pg_count": len(pg_config),
            "pg_config": pg_config, "nccl_version": NCCL_VERSION}
    dev = {"id": topo.local_device(rank), "name": c.device_name, "totalGlobalMem": int(c.hbm_gb * (1 << 30)),
           "computeMajor": c.compute_major, "computeMinor": 0, "maxThreadsPerBlock": 1024,
           "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152,
           "numSms": 132, "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448,
           "sharedMemPerMultiprocessor": 233472}
    return (f'{{\n  "schemaVersion": 1,\n  "deviceProperties": [{json.dumps(dev)}],\n'
            f'  "distributedInfo": {json.dumps(dist)},\n  "record_shapes": 1,\n  "with_stack": 0,\n'
            f'  "traceName": "{topo.hostname(rank)}_{100000 + rank}.pt.trace.json",\n  "displayTimeUnit": "ms",\n'
            f'  "baseTimeNanoseconds": {BASE_NS},\n  "traceEvents": [\n')


def _metadata(res, rank: int, streams: set[int]) -> list[str]:
    topo = res.world.topo
    pid, dev = 100000 + rank, topo.local_device(rank)
    t = _t(res.programs[rank][0].h0)
    out = [f'{{"name": "process_name", "ph": "M", "ts": {t}, "pid": {pid}, "tid": 0, "args": {{"name": "python"}}}}',
           f'{{"name": "process_labels", "ph": "M", "ts": {t}, "pid": {pid}, "tid": 0, "args": {{"labels": "CPU"}}}}',
           f'{{"name": "thread_name", "ph": "M", "ts": {t}, "pid": {pid}, "tid": {pid}, '
           f'"args": {{"name": "thread {pid} (python)"}}}}',
           f'{{"name": "process_name", "ph": "M", "ts": {t}, "pid": {dev}, "tid": 0, "args": {{"name": "python"}}}}',
           f'{{"name": "process_labels", "ph": "M", "ts": {t}, "pid": {dev}, "tid": 0, "args": {{"labels": "GPU {dev}"}}}}']
    for s in sorted(streams):
        out.append(f'{{"name": "thread_name", "ph": "M", "ts": {t}, "pid": {dev}, "tid": {s}, '
                   f'"args": {{"name": "stream {s} "}}}}')
    return out


def trace_bytes(res, rank: int) -> tuple[bytes, int]:
    """(gzip bytes, number of events) of one rank's trace."""
    ev = rank_events(res, rank)
    streams = {o.stream for o in res.programs[rank] if o.kind in (KERNEL, COLL)}
    ev += _metadata(res, rank, streams)
    text = _header(res, rank) + ",\n".join(ev) + "\n  ]\n}\n"
    z = isal_zlib.compressobj(1, isal_zlib.DEFLATED, 31)  # gzip; isal: ~4x zlib's speed at its level 1
    return z.compress(text.encode()) + z.flush(), len(ev)


def trace_name(rank: int) -> str:
    return f"rank{rank}.pt.trace.json.gz"


_FORKED: list = []
"""The SimResult a forked writer reads (inherited from the parent, never pickled: at 10,000 ranks the
programs are gigabytes)."""


def _write_forked(out_dir: str, ranks: list[int], traced: frozenset[int] | None, comms_logs: bool) -> int:
    return _write_range(_FORKED[0], out_dir, ranks, traced, comms_logs)


def _write_range(res, out_dir: str, ranks: list[int], traced: frozenset[int] | None = None,
                 comms_logs: bool = False) -> int:
    """Traces of `ranks` (only those in `traced`, when given) and, with `comms_logs`, every one's log."""
    n = 0
    for r in ranks:
        if traced is None or r in traced:
            data, k = trace_bytes(res, r)
            Path(out_dir, trace_name(r)).write_bytes(data)
            n += k
        if comms_logs:
            write_comms_log(res, out_dir, r)
    return n


def spread_ranks(world: int, count: int) -> list[int]:
    """`count` ranks spread evenly over `world` (rank i * world // count), as a partial recording would
    pick one rank every few nodes; all of them when count >= world."""
    if count <= 0:
        raise ValueError(f"--trace-ranks must be >= 1, got {count}")
    if count >= world:
        return list(range(world))
    return sorted({i * world // count for i in range(count)})


def write_comms_log(res, out_dir: str | os.PathLike, rank: int) -> None:
    """comms.rank{R}.jsonl in the Flight Recorder entry schema (as `tracekit record` writes it): created =
    the host's enqueue, started / completed = the NCCL kernel's start and end on the device; step = the
    profiler step (the trace's `ProfilerStep#N`), as `tracekit record` logs it."""
    from tracekit.record.commlog import CommLog, comms_log_path

    topo = res.world.topo
    groups = {g.name: {"name": g.name, "desc": g.desc, "ranks": list(g.ranks)}
              for g in topo.groups.values() if rank in g.ranks}
    log = CommLog(comms_log_path(out_dir, rank), rank, topo.world, groups)
    for op in res.programs[rank]:
        if op.kind != COLL:
            continue
        c, g = op.coll, op.coll.pg
        n_in, n_out = c.nelems[rank]
        p2p = c.op == "sendrecv"
        name = op.peer[0] if p2p else c.op
        dt = "BFloat16" if p2p else c.dtype
        sp_in, sp_out = c.splits.get(rank, (None, None))
        log.record(pg_name=g.name, pg_desc=g.desc, profiling_name=f"nccl:{name}", time_created_ns=op.h0,
                   time_started_ns=op.d0, time_completed_ns=op.d1, input_sizes=[[n_in]], input_dtypes=[dt],
                   output_sizes=[[n_out]], output_dtypes=[dt], is_p2p=p2p, peer=op.peer[1] if p2p else None,
                   group_ranks=list(g.ranks), in_split_sizes=sp_in, out_split_sizes=sp_out,
                   step=op.step + res.first_step,
                   seq=None if p2p else c.seq, pg_id=int(g.name))
    log.close()


def write_traces(res, out_dir: str | os.PathLike, *, workers: int = 1, manifest: bool = True,
                 comms_logs: bool = False, trace_ranks: list[int] | None = None) -> dict[str, Any]:
    """Write rank{R}.pt.trace.json.gz per rank, the answer key (ANSWER_KEY_FILE), (optionally) manifest.json and the
    comms.rank{R}.jsonl collective logs. Returns {"files", "events"}.

    `trace_ranks`: a partial recording (`tracekit record --profile-ranks`): full traces on these ranks only,
    collective logs on every rank (implies `comms_logs`); the manifest lists the traced ranks."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ranks = list(range(res.ranks))
    traced = None
    if trace_ranks is not None:
        bad = [r for r in trace_ranks if not 0 <= r < res.ranks]
        if bad:
            raise ValueError(f"--trace-ranks names ranks outside the world of {res.ranks}: {bad[:8]}")
        traced, comms_logs = frozenset(trace_ranks), True
    logs_here = traced is not None and workers > 1
    if logs_here:
        # a partial recording: the workers write the few traces, this process every rank's log (a worker
        # reading every rank's ops copies the whole simulation into itself: twice the memory at 256 ranks)
        ranks = sorted(traced)
    if workers > 1 and len(ranks) > 1:
        import multiprocessing as mp

        chunks = [ranks[i::workers] for i in range(workers)]
        _FORKED[:] = [res]
        gc.freeze()  # a collection in a worker would write to every object's header: a copy of the whole heap
        try:
            with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as ex:
                events = sum(ex.map(_write_forked, [str(out)] * workers, chunks, [traced] * workers,
                                    [comms_logs and not logs_here] * workers))
        finally:
            gc.unfreeze()
            _FORKED.clear()
    else:
        events = _write_range(res, str(out), ranks, traced, comms_logs and not logs_here)
    ranks = list(range(res.ranks))
    if logs_here:
        for r in ranks:
            write_comms_log(res, out, r)
    (out / ANSWER_KEY_FILE).write_text(json.dumps(res.ground_truth(), indent=1))
    if manifest:
        man = build_manifest(res)
        if comms_logs:
            man["files"]["comms_logs"] = "comms.rank{R}.jsonl"
        if traced is not None:
            man["traced_ranks"] = sorted(traced)
            man["log_only_ranks"] = [r for r in ranks if r not in traced]
        (out / "manifest.json").write_text(json.dumps(man, indent=1))
    return {"files": len(ranks) if traced is None else len(traced), "events": events}


def build_manifest(res) -> dict[str, Any]:
    topo, L = res.world.topo, res.layout
    return {
        "schema": "tracekit.manifest/1", "producer": "tracekit.simulate", "world_size": topo.world,
        "backend": "nccl", "hosts": {str(r): topo.hostname(r) for r in range(topo.world)},
        "ranks_per_host": res.cluster.gpus_per_host,
        "layout": {"mesh_dim_names": ["pp", "dp", "cp", "tp"], "mesh_shape": [L.pp, L.dp, L.cp, L.tp],
                   "ep": L.ep, "ep_from": "dp_cp", "schedule": L.schedule if L.pp > 1 else None,
                   "microbatches": L.microbatches, "virtual_stages": L.stages_per_rank, "num_stages": L.num_stages,
                   "stage_layers": [len(s) for s in res.world.stages], "fsdp": L.fsdp,
                   "num_experts": res.model.experts},
        "microbatches": L.microbatches, "schedule": L.schedule if L.pp > 1 else None, "steps": res.steps,
        "model": dataclasses.asdict(res.model), "seq_len": res.model.seq,
        "global_batch_size": L.dp * L.microbatches * res.model.micro_batch_size,
        "clock_offset_ns": {str(r): 0 for r in range(topo.world)},
        "files": {"traces": "rank{R}.pt.trace.json.gz"},
    }
