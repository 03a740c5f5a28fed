"""Synthetic multi-rank Kineto traces with a realistic event mix and cross-rank consistent collectives.

    python benchmarks/synth.py OUT_DIR --ranks 64 --events-per-rank 3000 [--steps 2] [--tp 8]
                               [--straggler 5] [--plain] [--measure TRACE]

The mix (cpu_op / cuda_runtime / kernel / memcpy / memset per runtime call, flow events per device
launch) comes from `measure_mix` over a real modern-schema trace (default: shared/traces'
hta_nccl_a100_rank0of2); `DEFAULT_MIX` holds the numbers measured there. Collectives are NCCL-style
`record_param_comms` ops with `Seq` and group args plus a comm kernel per call; every rank of a group
issues the same (pg, seq) and its kernel ends at the group's last arrival + transfer time, so arrival
skew is real and consistent. One optional straggler rank computes `straggler_factor` times slower.
`.ground_truth.json` records the configuration and the straggler.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TRACEKIT_SHARED_TRACES") or REPO.parent / "shared" / "traces")
MIX_SEED_TRACE = SHARED / "hta_nccl_a100_rank0of2" / "nccl_data.json.gz"


@dataclass(kw_only=True)
class TraceMix:
    """Events per host runtime call (cuda_runtime), as measured in a real trace."""

    cpu_op_per_runtime: float
    kernel_per_runtime: float
    memcpy_per_runtime: float
    memset_per_runtime: float
    flow_per_device_op: float
    """`s`/`f` flow events per kernel/memcpy/memset (Kineto links launches to device work)."""
    cpu_op_dur_ns: int
    kernel_dur_ns: int
    bytes_per_event: float
    source: str


# measure_mix(shared/traces/hta_nccl_a100_rank0of2/nccl_data.json.gz), rounded.
DEFAULT_MIX = TraceMix(cpu_op_per_runtime=1.641, kernel_per_runtime=0.309, memcpy_per_runtime=0.110,
                       memset_per_runtime=0.013, flow_per_device_op=3.604, cpu_op_dur_ns=41_700,
                       kernel_dur_ns=16_300, bytes_per_event=241.0, source="hta_nccl_a100_rank0of2 (built in)")


def measure_mix(path: str | Path) -> TraceMix:
    """The event mix of one real Kineto trace (plain json; exact enough for ratios)."""
    path = Path(path)
    raw = gzip.open(path).read() if path.read_bytes()[:2] == b"\x1f\x8b" else path.read_bytes()
    events = json.loads(raw)["traceEvents"]
    count: dict[str, int] = {}
    durs: dict[str, list[float]] = {}
    flows = 0
    for e in events:
        ph = e.get("ph")
        if ph in ("s", "f"):
            flows += 1
        if ph != "X":
            continue
        cat = str(e.get("cat")).lower()
        count[cat] = count.get(cat, 0) + 1
        durs.setdefault(cat, []).append(float(e.get("dur") or 0))
    rt = max(count.get("cuda_runtime", 0), 1)
    device = count.get("kernel", 0) + count.get("gpu_memcpy", 0) + count.get("gpu_memset", 0)
    return TraceMix(
        cpu_op_per_runtime=count.get("cpu_op", 0) / rt, kernel_per_runtime=count.get("kernel", 0) / rt,
        memcpy_per_runtime=count.get("gpu_memcpy", 0) / rt, memset_per_runtime=count.get("gpu_memset", 0) / rt,
        flow_per_device_op=flows / max(device, 1),
        cpu_op_dur_ns=int(1000 * float(np.median(durs.get("cpu_op", [40])))),
        kernel_dur_ns=int(1000 * float(np.median(durs.get("kernel", [16])))),
        bytes_per_event=len(raw) / max(len(events), 1), source=str(path))


@dataclass(kw_only=True)
class SynthConfig:
    """A synthetic run: ranks, size per rank, parallel layout, injected straggler."""

    num_ranks: int
    events_per_rank: int
    num_steps: int = 2
    tp: int = 8
    """Tensor-parallel group size (consecutive ranks); data-parallel groups stride by tp."""
    collectives_per_step: int = 6
    """dp all_reduce buckets and tp all_gathers, alternating."""
    straggler_rank: int | None = None
    straggler_factor: float = 1.3
    jitter_frac: float = 0.02
    ranks_per_host: int = 8
    seed: int = 0
    compress: bool = True
    mix: TraceMix = field(default_factory=lambda: DEFAULT_MIX)

    def __post_init__(self) -> None:
        if self.num_ranks < 1 or self.events_per_rank < 50:
            raise ValueError("need >= 1 rank and >= 50 events per rank")
        if self.num_ranks % min(self.tp, self.num_ranks):
            raise ValueError(f"num_ranks {self.num_ranks} is not a multiple of tp {self.tp}")
        self.tp = min(self.tp, self.num_ranks)


_BASE_NS = 4_458_676_000_000_000  # steady-clock µs scale like modern traces (13 integer digits of µs)
_PID, _TID, _DEV_STREAM, _COMM_STREAM = 2_910_249, 2_919_752, 7, 20
_CPU_OPS = ("aten::linear", "aten::addmm", "aten::mm", "aten::add_", "aten::mul", "aten::gelu",
            "aten::layer_norm", "aten::softmax", "aten::copy_", "aten::empty", "aten::view", "aten::t",
            "autograd::engine::evaluate_function: AddmmBackward0", "aten::native_layer_norm_backward")
_KERNELS = ("ampere_sgemm_128x64_tn", "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>",
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>",
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>",
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t>>")
_RUNTIMES = ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaStreamIsCapturing", "cudaGetDevice")
_COLL = {"all_reduce": ("allreduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
         "all_gather": ("allgather", "ncclDevKernel_AllGather_RING_LL")}


def _t(ns: int) -> str:
    """ns → µs text with 3 decimals (exact ns, as modern Kineto writes)."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def groups_of(cfg: SynthConfig) -> dict[str, dict]:
    """Process groups: tp groups (consecutive ranks) and dp groups (stride tp), with unique names."""
    n, tp = cfg.num_ranks, cfg.tp
    out: dict[str, dict] = {"0": {"desc": "default_pg", "ranks": list(range(n))}}
    for i in range(n // tp):
        out[str(1 + i)] = {"desc": "mesh_tp", "ranks": list(range(i * tp, (i + 1) * tp))}
    for j in range(tp):
        out[str(1 + n // tp + j)] = {"desc": "mesh_dp", "ranks": list(range(j, n, tp))}
    return out


def _my_groups(cfg: SynthConfig, rank: int) -> tuple[str, str]:
    n, tp = cfg.num_ranks, cfg.tp
    return str(1 + rank // tp), str(1 + n // tp + rank % tp)


@dataclass
class Schedule:
    """Times every rank agrees on: step starts, collective arrivals and ends (ns)."""

    step_start: np.ndarray  # [steps]
    step_end: np.ndarray  # [steps, ranks]
    arrive: np.ndarray  # [steps, colls, ranks]
    end: np.ndarray  # [steps, colls, ranks] (end of the rank's group instance)
    seg_ns: int
    units_per_seg: int


def _units_per_step(cfg: SynthConfig) -> float:
    m = cfg.mix
    dev = m.kernel_per_runtime + m.memcpy_per_runtime + m.memset_per_runtime
    per_unit = 1 + m.cpu_op_per_runtime + dev  # complete (X) events per runtime call
    coll_events = cfg.collectives_per_step * 3  # rpc + runtime + kernel
    return max((cfg.events_per_rank / cfg.num_steps - 1 - coll_events) / per_unit, cfg.collectives_per_step + 1)


def make_schedule(cfg: SynthConfig) -> Schedule:
    rng = np.random.default_rng(cfg.seed)
    n, k, s = cfg.num_ranks, cfg.collectives_per_step, cfg.num_steps
    units = int(round(_units_per_step(cfg)))
    units_per_seg = max(units // (k + 1), 1)
    unit_ns = cfg.mix.cpu_op_dur_ns * 3
    seg_ns = units_per_seg * unit_ns
    speed = np.ones(n)
    if cfg.straggler_rank is not None:
        speed[cfg.straggler_rank] = cfg.straggler_factor
    groups = groups_of(cfg)
    step_start = np.zeros(s, np.int64)
    step_end = np.zeros((s, n), np.int64)
    arrive = np.zeros((s, k, n), np.int64)
    end = np.zeros((s, k, n), np.int64)
    t0 = _BASE_NS
    for st in range(s):
        step_start[st] = t0
        for c in range(k):
            jitter = rng.normal(0, cfg.jitter_frac, n).clip(-0.1, 0.1)
            arrive[st, c] = t0 + ((c + 1) * seg_ns * speed * (1 + jitter)).astype(np.int64)
            kind = "dp" if c % 2 == 0 else "tp"
            transfer = 200_000 if kind == "dp" else 60_000
            for g in groups.values():
                if g["desc"] != f"mesh_{kind}":
                    continue
                idx = np.array(g["ranks"])
                end[st, c, idx] = arrive[st, c, idx].max() + transfer
        # the step ends when the rank's last segment and all its collectives are done
        last_compute = t0 + ((k + 1) * seg_ns * speed).astype(np.int64)
        step_end[st] = np.maximum(last_compute, end[st].max(axis=0)) + 20_000
        t0 = int(step_end[st].max()) + 50_000
    return Schedule(step_start, step_end, arrive, end, seg_ns, units_per_seg)


def _rank_json(cfg: SynthConfig, sched: Schedule, rank: int) -> bytes:
    m = cfg.mix
    tpg, dpg = _my_groups(cfg, rank)
    groups = groups_of(cfg)
    rng = np.random.default_rng(cfg.seed * 100_003 + rank)
    ev: list[str] = []
    add = ev.append
    corr = ext = 1
    acc_cpu = acc_k = acc_cp = acc_ms = acc_flow = 0.0
    host = f"node{rank // cfg.ranks_per_host}"
    seqs = {tpg: 0, dpg: 0}
    dev_free = 0
    for st in range(cfg.num_steps):
        s0, s1 = int(sched.step_start[st]), int(sched.step_end[st, rank])
        add(f'{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{st + 1}","pid":{_PID},"tid":{_TID},'
            f'"ts":{_t(s0)},"dur":{_t(s1 - s0)},"args":{{"External id":{ext}}}}}')
        ext += 1
        seg_start = s0 + 10_000
        for c in range(cfg.collectives_per_step + 1):
            seg_end = int(sched.arrive[st, c, rank]) if c < cfg.collectives_per_step else s1 - 20_000
            n_units = sched.units_per_seg
            unit = max((seg_end - seg_start) // n_units, 1000)
            for u in range(n_units):
                u0 = seg_start + u * unit
                # parent op, nested child ops, one runtime call in the last child
                acc_cpu += m.cpu_op_per_runtime
                n_cpu = int(acc_cpu)
                acc_cpu -= n_cpu
                n_cpu = max(n_cpu, 1)
                span = int(unit * 0.9)
                for d in range(n_cpu):
                    off = d * span // (4 * n_cpu)
                    add(f'{{"ph":"X","cat":"cpu_op","name":"{_CPU_OPS[int(rng.integers(len(_CPU_OPS)))]}",'
                        f'"pid":{_PID},"tid":{_TID},"ts":{_t(u0 + off)},"dur":{_t(span - 2 * off)},'
                        f'"args":{{"External id":{ext},"Record function id":{ext},"Ev Idx":{ext}}}}}')
                    ext += 1
                r0 = u0 + span // 2
                acc_k += m.kernel_per_runtime
                acc_cp += m.memcpy_per_runtime
                acc_ms += m.memset_per_runtime
                if acc_k >= 1:
                    acc_k -= 1
                    rt, cat, dname = "cudaLaunchKernel", "kernel", _KERNELS[int(rng.integers(len(_KERNELS)))]
                elif acc_cp >= 1:
                    acc_cp -= 1
                    rt, cat, dname = "cudaMemcpyAsync", "gpu_memcpy", "Memcpy HtoD (Pageable -> Device)"
                elif acc_ms >= 1:
                    acc_ms -= 1
                    rt, cat, dname = "cudaMemsetAsync", "gpu_memset", "Memset (Device)"
                else:
                    rt, cat, dname = _RUNTIMES[3 + int(rng.integers(2))], None, None
                add(f'{{"ph":"X","cat":"cuda_runtime","name":"{rt}","pid":{_PID},"tid":{_TID},"ts":{_t(r0)},'
                    f'"dur":{_t(3_000)},"args":{{"External id":{ext},"cbid":211,"correlation":{corr}}}}}')
                if cat is not None:
                    # device work runs in launch order on one stream, ~60% busy like a healthy step
                    k0 = max(r0 + 8_000, dev_free)
                    scale = unit / m.kernel_per_runtime * 0.6 if cat == "kernel" else m.kernel_dur_ns
                    kdur = max(min(int(scale * (0.5 + rng.random())), seg_end - k0), 1_000)
                    dev_free = k0 + kdur
                    add(f'{{"ph":"X","cat":"{cat}","name":"{dname}","pid":0,"tid":{_DEV_STREAM},"ts":{_t(k0)},'
                        f'"dur":{_t(kdur)},"args":{{"External id":{ext},"queued":0,"device":0,"context":1,'
                        f'"stream":{_DEV_STREAM},"correlation":{corr},"registers per thread":32,'
                        f'"grid":[80,1,1],"block":[256,1,1]}}}}')
                    acc_flow += m.flow_per_device_op / 2
                    while acc_flow >= 1:
                        acc_flow -= 1
                        add(f'{{"ph":"s","id":{corr},"pid":{_PID},"tid":{_TID},"ts":{_t(r0)},"cat":"ac2g","name":"ac2g"}}')
                        add(f'{{"ph":"f","id":{corr},"pid":0,"tid":{_DEV_STREAM},"ts":{_t(k0)},"cat":"ac2g",'
                            f'"name":"ac2g","bp":"e"}}')
                corr += 1
                ext += 1
            if c == cfg.collectives_per_step:
                break
            # the collective: record_param_comms + launch + comm kernel
            op = "all_reduce" if c % 2 == 0 else "all_gather"
            pg = dpg if op == "all_reduce" else tpg
            g = groups[pg]
            seq = seqs[pg]
            seqs[pg] += 1
            nel = 4_194_304 * (1 + c) if op == "all_reduce" else 524_288
            out_nel = nel * len(g["ranks"]) if op == "all_gather" else nel
            cname, kname = _COLL[op]
            a0 = int(sched.arrive[st, c, rank])
            e1 = int(sched.end[st, c, rank])
            cargs = (f'"Collective name":"{cname}","In msg nelems":{nel},"Out msg nelems":{out_nel},'
                     f'"Group size":{len(g["ranks"])},"dtype":"Float","In split size":"[]","Out split size":"[]",'
                     f'"Process Group Name":"{pg}","Process Group Description":"{g["desc"]}",'
                     f'"Process Group Ranks":"{json.dumps(g["ranks"])}","Seq":{seq}')
            add(f'{{"ph":"X","cat":"cpu_op","name":"record_param_comms","pid":{_PID},"tid":{_TID},"ts":{_t(a0 - 15_000)},'
                f'"dur":{_t(14_000)},"args":{{"External id":{ext},"Record function id":{ext},{cargs}}}}}')
            add(f'{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":{_PID},"tid":{_TID},'
                f'"ts":{_t(a0 - 8_000)},"dur":{_t(4_000)},"args":{{"External id":{ext},"cbid":211,"correlation":{corr}}}}}')
            add(f'{{"ph":"X","cat":"kernel","name":"{kname}","pid":0,"tid":{_COMM_STREAM},"ts":{_t(a0)},"dur":{_t(e1 - a0)},'
                f'"args":{{"External id":{ext},"queued":0,"device":0,"context":1,"stream":{_COMM_STREAM},'
                f'"correlation":{corr},{cargs}}}}}')
            add(f'{{"ph":"s","id":{corr},"pid":{_PID},"tid":{_TID},"ts":{_t(a0 - 8_000)},"cat":"ac2g","name":"ac2g"}}')
            add(f'{{"ph":"f","id":{corr},"pid":0,"tid":{_COMM_STREAM},"ts":{_t(a0)},"cat":"ac2g","name":"ac2g","bp":"e"}}')
            corr += 1
            ext += 1
            seg_start = a0 + 2_000
    meta = [
        f'{{"ph":"M","name":"process_name","pid":{_PID},"tid":0,"args":{{"name":"python"}}}}',
        f'{{"ph":"M","name":"thread_name","pid":{_PID},"tid":{_TID},"args":{{"name":"thread {_TID} (python)"}}}}',
        '{"ph":"M","name":"process_name","pid":0,"tid":0,"args":{"name":"GPU 0"}}',
        f'{{"ph":"M","name":"thread_name","pid":0,"tid":{_DEV_STREAM},"args":{{"name":"stream {_DEV_STREAM}"}}}}',
        f'{{"ph":"M","name":"thread_name","pid":0,"tid":{_COMM_STREAM},"args":{{"name":"stream {_COMM_STREAM}"}}}}',
    ]
    pg_config = [{"pg_name": name, "pg_desc": groups[name]["desc"], "backend_config": "cuda:nccl",
                  "pg_size": len(groups[name]["ranks"]), "ranks": groups[name]["ranks"]}
                 for name in ("0", tpg, dpg)]
    dist = {"backend": "nccl", "rank": rank, "world_size": cfg.num_ranks, "pg_count": 3, "pg_config": pg_config}
    head = (f'{{"schemaVersion":1,"deviceProperties":[{{"id":0,"name":"NVIDIA A100-SXM4-80GB"}}],'
            f'"distributedInfo":{json.dumps(dist, separators=(",", ":"))},"host_name":"{host}",\n"traceEvents":[\n')
    body = ",\n".join(meta + ev)
    return (head + body + '\n],"traceName":"synthetic","displayTimeUnit":"ms"}\n').encode()


def trace_path(out_dir: Path, rank: int, compress: bool) -> Path:
    return out_dir / f"rank{rank}.pt.trace.json{'.gz' if compress else ''}"


def write_rank(cfg: SynthConfig, sched: Schedule, out_dir: Path, rank: int) -> tuple[int, int]:
    """Write one rank's trace; returns (json bytes, complete events)."""
    data = _rank_json(cfg, sched, rank)
    path = trace_path(out_dir, rank, cfg.compress)
    if cfg.compress:
        from isal import igzip

        path.write_bytes(igzip.compress(data, compresslevel=1))
    else:
        path.write_bytes(data)
    return len(data), data.count(b'"ph":"X"')


def _write_job(args: tuple) -> tuple[int, int]:
    cfg, sched, out_dir, rank = args
    return write_rank(cfg, sched, Path(out_dir), rank)


def generate_run(cfg: SynthConfig, out_dir: str | Path, workers: int = 1) -> dict:
    """Write every rank's trace and .ground_truth.json under out_dir; returns the ground truth."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sched = make_schedule(cfg)
    jobs = [(cfg, sched, str(out_dir), r) for r in range(cfg.num_ranks)]
    if workers > 1 and cfg.num_ranks > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            sizes = list(pool.map(_write_job, jobs, chunksize=max(1, cfg.num_ranks // (4 * workers))))
    else:
        sizes = [_write_job(j) for j in jobs]
    truth = {
        "generator": "benchmarks/synth.py", "config": {k: v for k, v in asdict(cfg).items() if k != "mix"},
        "mix": asdict(cfg.mix), "straggler_rank": cfg.straggler_rank,
        "json_bytes": int(sum(s for s, _ in sizes)), "complete_events": int(sum(e for _, e in sizes)),
        "complete_events_per_rank": [int(e) for _, e in sizes],
    }
    (out_dir / ".ground_truth.json").write_text(json.dumps(truth, indent=1))
    return truth


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--events-per-rank", type=int, default=3000)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--straggler", type=int, default=None)
    ap.add_argument("--plain", action="store_true", help="write .json instead of .json.gz")
    ap.add_argument("--measure", default=None, help="take the mix from this real trace")
    ap.add_argument("--workers", type=int, default=1)
    a = ap.parse_args(argv)
    mix = measure_mix(a.measure) if a.measure else DEFAULT_MIX
    cfg = SynthConfig(num_ranks=a.ranks, events_per_rank=a.events_per_rank, num_steps=a.steps, tp=a.tp,
                      straggler_rank=a.straggler, compress=not a.plain, mix=mix)
    truth = generate_run(cfg, a.out_dir, workers=a.workers)
    print(json.dumps({k: truth[k] for k in ("json_bytes", "complete_events")}), file=sys.stderr)


if __name__ == "__main__":
    main()
