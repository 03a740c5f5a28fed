"""Record small real GPU traces (CUDA + NCCL) for tracekit's GPU-semantics fixtures.

Run on a machine with one CUDA GPU (the project has no GPU; this was run on a lent H100):

    python scripts/capture_gpu_traces.py --out fixtures/gpu_h100   (see fixtures/GPU_README.md for the variants)

It trains a small model in a single-rank NCCL process group (world size 1: NCCL still launches its
`ncclDevKernel_*` kernels and PyTorch records `record_param_comms` with the collective's arguments),
with torch.profiler over 3 active steps, `record_shapes` and `profile_memory` on. Each step is
GPU-bound on purpose (large matrix products, no host sync), so the host runs ahead of the device and
kernels of step N run while the host is already in step N+1: the case where binning kernels into the
CPU's ProfilerStep windows is wrong. Besides DDP's bucket all-reduce, each step issues collectives of
several dtypes (int32 all_to_all_single, bf16 all_gather_into_tensor, float reduce_scatter_tensor,
int64 broadcast) whose byte sizes are known from the code. Writes:

- `rank0.pt.trace.json.gz`   the Kineto trace (memory events included)
- `memory_snapshot.rank0.pickle`  the CUDA caching allocator's snapshot with its history
- `capture.json`             what was run (torch/CUDA/NCCL versions, device, sizes) — not an answer key
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule


def build_model(width: int, depth: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def extra_collectives(dev: torch.device) -> None:
    """Collectives of several dtypes with sizes known from this code (world size 1)."""
    a2a_in = torch.arange(4096, dtype=torch.int32, device=dev)
    a2a_out = torch.empty_like(a2a_in)
    dist.all_to_all_single(a2a_out, a2a_in)                       # 16384 bytes, int32
    ag_in = torch.ones(8192, dtype=torch.bfloat16, device=dev)
    ag_out = torch.empty(8192, dtype=torch.bfloat16, device=dev)
    dist.all_gather_into_tensor(ag_out, ag_in)                    # 16384 bytes, bf16
    rs_in = torch.ones(16384, dtype=torch.float32, device=dev)
    rs_out = torch.empty(16384, dtype=torch.float32, device=dev)
    dist.reduce_scatter_tensor(rs_out, rs_in)                     # 65536 bytes, float
    bc = torch.zeros(1024, dtype=torch.int64, device=dev)
    dist.broadcast(bc, src=0)                                     # 8192 bytes, int64


class _SlowDataset(torch.utils.data.Dataset):
    def __init__(self, batch: int, width: int, stall_ms: float) -> None:
        self.batch, self.width, self.stall_s = batch, width, stall_ms / 1e3

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        import time
        time.sleep(self.stall_s)
        return torch.randn(self.batch, self.width)


def _slow_loader(batch: int, width: int, stall_ms: float) -> torch.utils.data.DataLoader:
    """One ready batch per item (batch_size=None); `enumerate(DataLoader)#...` annotates each fetch."""
    return torch.utils.data.DataLoader(_SlowDataset(batch, width, stall_ms), batch_size=None, num_workers=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--host-stall-ms", type=float, default=0.0,
                    help="feed batches through a DataLoader whose dataset sleeps this long per batch, and call "
                         "loss.item() every step: a host-bound job whose GPU waits for data")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl", rank=0, world_size=1)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.manual_seed(0)
    model = DDP(build_model(args.width, args.depth).to(dev), bucket_cap_mb=25)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, device=dev)
    batches = iter(_slow_loader(args.batch, args.width, args.host_stall_ms)) if args.host_stall_ms else None
    torch.cuda.memory._record_memory_history(max_entries=20000)
    trace_tmp = Path(tmp) / "trace.json"
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                   schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                   on_trace_ready=lambda p: p.export_chrome_trace(str(trace_tmp)),
                   record_shapes=True, profile_memory=True, with_flops=True)
    with prof:
        for _ in range(6):
            if batches is not None:
                x = next(batches).to(dev, non_blocking=True)
            loss = model(x).float().pow(2).mean()
            loss.backward()
            if batches is not None:
                loss.item()
            extra_collectives(dev)
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(str(out / "memory_snapshot.rank0.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(trace_tmp, "rb") as src, gzip.open(out / "rank0.pt.trace.json.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    info = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "device": torch.cuda.get_device_name(0), "width": args.width, "depth": args.depth,
            "batch": args.batch, "host_stall_ms": args.host_stall_ms, "world_size": 1, "profiled_steps": 3,
            "extra_collectives_bytes": {"all_to_all_single/int32": 16384, "all_gather_into_tensor/bf16": 16384,
                                        "reduce_scatter_tensor/float": 65536, "broadcast/int64": 8192}}
    (out / "capture.json").write_text(json.dumps(info, indent=2) + "\n")
    dist.destroy_process_group()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
