"""Run a function on N gloo ranks in forked processes and collect each rank's result (test helper).

Fork, not spawn (spawn costs ~40 s of start-up, DESIGN §8): the parent must have imported torch but run no
torch ops that start thread pools; children use one thread. Results travel back as `torch.save` bytes and are
loaded with `weights_only=True` (tensors, numbers, strings, lists, dicts); a failing rank's traceback is
re-raised in the parent and the other ranks are terminated.
"""

from __future__ import annotations

import io
import os
import queue
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PG_TIMEOUT_S = 60
RESULT_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(rank: int, world_size: int, port: int, q: Any, fn: Callable[..., Any], args: tuple) -> None:
    try:
        torch.set_num_threads(1)
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=PG_TIMEOUT_S))
        result = fn(rank, world_size, *args)
        buf = io.BytesIO()
        torch.save(result, buf)
        q.put((rank, "ok", buf.getvalue()))
    except BaseException:  # noqa: BLE001 - everything must reach the parent
        q.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(world_size: int, fn: Callable[..., Any], *args: Any,
                    timeout_s: float = RESULT_TIMEOUT_S) -> list[Any]:
    """Run `fn(rank, world_size, *args)` on `world_size` gloo ranks; return the results in rank order.

    `fn` must be a module-level function (forked, so closures work too) whose result `torch.save` can store.
    """
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(r, world_size, port, q, fn, args), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    finished = False
    try:
        while len(results) + len(errors) < world_size:
            try:
                rank, status, payload = q.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"run_distributed: ranks {sorted(set(range(world_size)) - set(results))} "
                                   f"sent nothing within {timeout_s} s") from None
            if status == "ok":
                results[rank] = torch.load(io.BytesIO(payload), weights_only=True)
            else:
                errors[rank] = payload
                break  # the others may hang in a collective waiting for this rank
        finished = not errors
    finally:
        for p in procs:
            if not finished:  # a rank failed, timed out, or we were interrupted: stop the rest now
                p.terminate()
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if errors:
        rank, tb = min(errors.items())
        raise RuntimeError(f"rank {rank} of {world_size} failed:\n{tb}")
    return [results[r] for r in range(world_size)]
