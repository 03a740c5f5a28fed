"""Start the ranks: fork them locally (gloo on CPU, DESIGN §8) or join a torchrun job (RANK/WORLD_SIZE set).

Local launch forks after torch is imported and one throwaway optimizer is built in the parent (that pulls
in torch._dynamo once for all children; spawn would cost ~40 s), with no torch ops run before the fork.
Ranks rendezvous on a FileStore in a private temp dir. A rank that fails takes the others down (by pid).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

PG_TIMEOUT_S = 120   # trace export inside prof.step() takes 6-15 s at 16 ranks; keep well above


def _warm_parent_imports() -> None:
    import torch

    from . import train  # noqa: F401  (imports pipelining, FSDP, DDP, the model once, before the fork)

    torch.optim.AdamW([torch.nn.Parameter(torch.empty(1))])


def _backend() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def _child(cfg_dict: dict, rank: int, world_size: int, store_path: str, command: list[str],
           stderr_fds: tuple[int, int] | None = None) -> None:
    code = 0
    if stderr_fds is not None:  # this rank's stderr goes through the parent's filter (_StderrFilter)
        os.close(stderr_fds[0])
        os.dup2(stderr_fds[1], 2)
        os.close(stderr_fds[1])
    try:
        import torch
        import torch.distributed as dist

        from .config import RunConfig
        from .train import train_rank

        torch.set_num_threads(1)
        cfg = RunConfig.from_dict(cfg_dict)
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(_backend(), store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=PG_TIMEOUT_S))
        train_rank(cfg, rank, world_size, command=command, launcher="fork")
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - report and exit non-zero
        sys.stderr.write(f"[rank {rank}] failed:\n{traceback.format_exc()}")
        code = 1
    finally:
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code)


class _StderrFilter(threading.Thread):
    """Reads each rank's stderr (a pipe per rank, so lines written in pieces do not interleave) and passes
    every line on to ours, except PyTorch's notices about the profiler the runtime turned on
    (tracekit.record.notices), which it counts."""

    def __init__(self, read_fds: list[int]) -> None:
        super().__init__(name="instrumented_runtime-stderr", daemon=True)
        from tracekit.record.notices import NoticeFilter

        self.read_fds = read_fds
        self.notices = NoticeFilter()

    def _emit(self, line: bytes) -> None:
        if self.notices.keep(line):
            sys.stderr.write(line.decode("utf-8", errors="replace"))
            sys.stderr.flush()

    def run(self) -> None:
        import selectors

        sel = selectors.DefaultSelector()
        pending: dict[int, bytes] = {}
        for fd in self.read_fds:
            sel.register(fd, selectors.EVENT_READ)
            pending[fd] = b""
        while pending:  # until every rank has exited (EOF on each pipe)
            for key, _ in sel.select():
                fd = key.fd
                chunk = os.read(fd, 65536)
                if not chunk:
                    if pending[fd]:
                        self._emit(pending[fd])
                    del pending[fd]
                    sel.unregister(fd)
                    os.close(fd)
                    continue
                *lines, pending[fd] = (pending[fd] + chunk).split(b"\n")
                for line in lines:
                    self._emit(line + b"\n")
        sel.close()


def launch_local(cfg, command: list[str], *, show_progress: bool = True) -> float:
    """Fork cfg.world_size ranks, wait for them, return the wall time in seconds."""
    _warm_parent_imports()
    world = cfg.world_size
    tmp = tempfile.mkdtemp(prefix="instrumented_runtime_")
    ctx = mp.get_context("fork")
    t0 = time.perf_counter()
    procs, read_fds = [], []
    for r in range(world):  # a pipe per rank, made just before its fork: no rank holds another's write end
        read_fd, write_fd = os.pipe()
        p = ctx.Process(target=_child, args=(cfg.to_dict(), r, world, os.path.join(tmp, "store"), command,
                                             (read_fd, write_fd)))
        p.start()
        os.close(write_fd)
        procs.append(p)
        read_fds.append(read_fd)
    stderr_filter = _StderrFilter(read_fds)
    stderr_filter.start()
    failed: list[int] = []
    try:
        _wait(procs, cfg, failed, show_progress)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        stderr_filter.join(timeout=10)  # EOF once every rank is gone
        shutil.rmtree(tmp, ignore_errors=True)
        summary = stderr_filter.notices.summary("instrumented_runtime")
        if summary:
            print(summary, file=sys.stderr)
    if failed:
        raise RuntimeError(f"ranks {failed} of {world} failed (see their tracebacks above)")
    return time.perf_counter() - t0


def _wait(procs, cfg, failed: list[int], show_progress: bool) -> None:
    from .train import metrics_path

    metrics0 = metrics_path(cfg.out, 0)
    progress = None
    if show_progress and sys.stderr.isatty():
        from rich.progress import Progress

        progress = Progress(transient=True)
        progress.start()
        task = progress.add_task(f"training {cfg.world_size} ranks", total=cfg.steps)
    try:
        while any(p.is_alive() for p in procs):
            for r, p in enumerate(procs):
                if p.exitcode not in (None, 0) and r not in failed:
                    failed.append(r)
            if failed:
                return
            if progress is not None and metrics0.exists():
                progress.update(task, completed=sum(1 for _ in open(metrics0)))
            time.sleep(0.2)
        failed.extend(r for r, p in enumerate(procs) if p.exitcode != 0)
    finally:
        if progress is not None:
            progress.stop()


def run_under_torchrun(cfg, command: list[str]) -> None:
    import torch
    import torch.distributed as dist

    from .train import train_rank

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != cfg.world_size:
        raise ValueError(f"WORLD_SIZE {world} != pp*dp*cp*tp = {cfg.world_size}")
    torch.set_num_threads(1)
    backend = _backend()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=timedelta(seconds=PG_TIMEOUT_S))
    try:
        train_rank(cfg, rank, world, command=command, launcher="torchrun")
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    from .config import parse_args

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = parse_args(argv)
    except ValueError as e:
        print(f"python -m instrumented_runtime: error: {e}", file=sys.stderr)
        return 2
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "instrumented_runtime", *argv]
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        run_under_torchrun(cfg, command)
        return 0
    try:
        wall_s = launch_local(cfg, command)
    except RuntimeError as e:
        print(f"python -m instrumented_runtime: {e}", file=sys.stderr)
        return 1
    import json

    log = json.loads((Path(cfg.out) / "train_log.json").read_text())
    losses = ", ".join(f"{x:.4f}" for x in log["loss"])
    print(f"[instrumented_runtime] {cfg.world_size} ranks, {cfg.steps} steps in {wall_s:.1f} s; "
          f"loss per step: {losses}; wrote {cfg.out}", file=sys.stderr)
    return 0
