"""A real 2-rank gloo job for parser tests: Kineto traces, comms logs and Flight Recorder dumps.

Run as a script (`python tests/parse/gloo_run.py OUT`) so the fork of the ranks happens in a fresh
process. `gloo_run_dir()` runs it once per test session and returns OUT:
  OUT/trace/rank{R}.pt.trace.json.gz, OUT/trace/comms.rank{R}.jsonl, OUT/trace/manifest.json
  OUT/fr_json/fr.rank{R}.json      (`_dump_fr_trace_json()`)
  OUT/fr_pickle/fr_trace_rank_{R}  (`_dump_fr_trace()`, no extension: detected by content)
  OUT/expected/ops.rank{R}.json    (what the test issued, in order: the independent reference)
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORLD = 2
PROFILED_STEPS = 2


def _issue(rank: int, log, expected: list, name: str, pg, fn, *, in_sizes, out_sizes, step=None,
           caller=None, is_p2p=False, peer=None, in_split=None, out_split=None) -> None:
    """Run one collective, log it with CommLog (FR entry schema) and remember it as issued."""
    import torch.distributed as dist

    pg_name = dist.distributed_c10d._get_process_group_name(pg) if pg is not None else "0"
    pg_desc = pg.group_desc if pg is not None else "default_pg"
    created = time.time_ns()
    fn()
    done = time.time_ns()
    dtypes = ["Float"] * len(in_sizes)
    log.record(pg_name=pg_name, pg_desc=pg_desc, profiling_name=f"gloo:{name}", time_created_ns=created,
               time_started_ns=created, time_completed_ns=done, input_sizes=in_sizes, input_dtypes=dtypes,
               output_sizes=out_sizes, output_dtypes=["Float"] * len(out_sizes), is_p2p=is_p2p, peer=peer,
               group_ranks=list(range(WORLD)), in_split_sizes=in_split, out_split_sizes=out_split,
               caller=caller, step=step)
    expected.append({"pg_name": pg_name, "pg_desc": pg_desc, "op": name, "in_sizes": in_sizes,
                     "out_sizes": out_sizes, "is_p2p": is_p2p, "step": step, "created": created, "done": done})


def _worker(rank: int, out: str, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from tracekit.record.commlog import CommLog, comms_log_path

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    pair = dist.new_group([0, 1], group_desc="pair")
    trace = Path(out) / "trace"
    log = CommLog(comms_log_path(trace, rank), rank, WORLD,
                  pg_config={"0": {"name": "0", "desc": "default_pg", "ranks": [0, 1]},
                             "1": {"name": "1", "desc": "pair", "ranks": [0, 1]}})
    expected: list = []
    world = dist.group.WORLD

    def one_round(step, caller):
        t = torch.ones(4, 3)
        _issue(rank, log, expected, "all_reduce", world, lambda: dist.all_reduce(t),
               in_sizes=[[4, 3]], out_sizes=[[4, 3]], step=step, caller=caller)
        o = torch.empty(8, 3)
        _issue(rank, log, expected, "all_gather", world, lambda: dist.all_gather_into_tensor(o, t),
               in_sizes=[[4, 3]], out_sizes=[[2, 4, 3]], step=step, caller=caller)
        _issue(rank, log, expected, "broadcast", pair, lambda: dist.broadcast(t, src=0, group=pair),
               in_sizes=[[4, 3]], out_sizes=[[4, 3]], step=step, caller=caller)
        a = torch.arange(6.0)
        in_split = [2, 4] if rank == 0 else [3, 3]
        out_split = [2, 3] if rank == 0 else [4, 3]
        b = torch.empty(sum(out_split))
        _issue(rank, log, expected, "all_to_all", world,
               lambda: dist.all_to_all_single(b, a, out_split, in_split),
               in_sizes=[[6]], out_sizes=[[sum(out_split)]], step=step, caller=caller,
               in_split=in_split, out_split=out_split)
        _issue(rank, log, expected, "barrier", pair, lambda: dist.barrier(group=pair),
               in_sizes=[], out_sizes=[], step=step, caller=caller)
        peer = 1 - rank
        p = torch.ones(5)

        def p2p():
            w = dist.isend(p, peer) if rank == 0 else dist.irecv(p, peer)
            w.wait()

        _issue(rank, log, expected, "send" if rank == 0 else "recv", world, p2p, in_sizes=[[5]],
               out_sizes=[[5]], step=step, caller=caller, is_p2p=True, peer=peer)

    one_round(None, None)  # before the profiled window: in the logs, not in the traces
    trace_file = str(trace / f"rank{rank}.pt.trace.json.gz")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=0, active=PROFILED_STEPS, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(trace_file)) as prof:
        for step in range(PROFILED_STEPS):
            label = f"pp:stage{rank}:mb{step}:fwd"
            with record_function(label):
                one_round(step, label)
            prof.step()
    log.close()
    (Path(out) / "fr_json").mkdir(exist_ok=True)
    (Path(out) / "fr_pickle").mkdir(exist_ok=True)
    (Path(out) / "expected").mkdir(exist_ok=True)
    js = torch._C._distributed_c10d._dump_fr_trace_json()
    (Path(out) / "fr_json" / f"fr.rank{rank}.json").write_bytes(js if isinstance(js, bytes) else js.encode())
    (Path(out) / "fr_pickle" / f"fr_trace_rank_{rank}").write_bytes(torch._C._distributed_c10d._dump_fr_trace())
    (Path(out) / "expected" / f"ops.rank{rank}.json").write_text(json.dumps(expected))
    dist.barrier()
    dist.destroy_process_group()


def main(out: str) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (Path(out) / "trace").mkdir(parents=True, exist_ok=True)
    mp.start_processes(_worker, args=(out, port), nprocs=WORLD, start_method="fork")
    (Path(out) / "trace" / "manifest.json").write_text(json.dumps(
        {"world_size": WORLD, "command": ["tests/parse/gloo_run.py"], "backend": "gloo"}))


_CACHE: dict[str, Path] = {}


def gloo_run_dir() -> Path:
    """Run the job once per session (in a subprocess) and return its output folder."""
    if "dir" not in _CACHE:
        out = Path(tempfile.mkdtemp(prefix="tracekit-gloo-run-"))
        atexit.register(shutil.rmtree, out, ignore_errors=True)
        repo = Path(__file__).resolve().parents[2]
        env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
        proc = subprocess.run([sys.executable, __file__, str(out)], env=env, capture_output=True,
                              text=True, timeout=240)
        if proc.returncode != 0:
            raise RuntimeError(f"gloo job failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        _CACHE["dir"] = out
    return _CACHE["dir"]


if __name__ == "__main__":
    main(sys.argv[1])
