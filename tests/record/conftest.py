"""Helpers for running `tracekit record` on scripts that know nothing of tracekit."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def run_record(out: Path, command: list[str], *opts: str, env: dict[str, str] | None = None,
               timeout: float = 180, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m tracekit record --out OUT OPTS -- COMMAND` in a subprocess."""
    cmd = [PY, "-m", "tracekit", "record", "--out", str(out), *opts, "--", *command]
    return subprocess.run(cmd, env=env or child_env(), cwd=cwd, capture_output=True, text=True, timeout=timeout)


TEARDOWN_ABORT = "terminate called without an active exception"
"""PyTorch 2.13's CPU wheel: a gloo worker sometimes aborts in C++ at interpreter exit, after its program
ended (faulthandler: <no Python frame>). Measured beside one busy process: 1 of 30 plain torchrun jobs of
tests/user_scripts/ddp_loop.py, 6 of 40 with a barrier before destroy_process_group; not ours."""


def assert_job_ok(res: subprocess.CompletedProcess, out: Path) -> None:
    """The recorded job succeeded: exit 0, or PyTorch's teardown abort (`TEARDOWN_ABORT`) in a worker after
    every rank's recorder closed with status ok (`record.rank*.json`), which `record` then passes through."""
    if res.returncode == 0:
        return
    records = [json.loads(p.read_text()) for p in sorted(Path(out).glob("record.rank*.json"))]
    teardown = (TEARDOWN_ABORT in res.stderr and "exitcode: -6" in res.stderr and records
                and all(r.get("status") == "ok" for r in records))
    assert teardown, res.stderr[-3000:]


def torchrun(script: Path, nproc: int = 2, *args: str) -> list[str]:
    return [PY, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--max-restarts", "0",
            "--master-port", str(free_port()), str(script), *args]


def load_trace(path: Path) -> dict:
    """Independent read of a Kineto trace: plain gzip + json, exact numbers as Decimal."""
    with gzip.open(path, "rt") as fh:
        return json.loads(fh.read(), parse_float=Decimal)


def profiler_steps(trace: dict) -> list[int]:
    return sorted(int(e["name"].split("#")[1]) for e in trace["traceEvents"]
                  if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#"))


def load_comms(path: Path) -> tuple[dict, list[dict], dict | None]:
    """(header, entries, footer or None) of a comms.rank{R}.jsonl; a cut last line is dropped."""
    header, entries, footer = None, [], None
    for line in path.read_text().splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if obj.get("type") == "header":
            header = obj
        elif obj.get("type") == "footer":
            footer = obj
        else:
            entries.append(obj)
    return header, entries, footer


def expected_active_steps(wait: int, warmup: int, active: int, repeat: int, num_steps: int) -> list[int]:
    """The steps torch.profiler's own schedule keeps, for steps 1..num_steps-1 (step 0 is start-up)."""
    from torch.profiler import ProfilerAction, schedule

    fn = schedule(wait=wait, warmup=warmup, active=active, repeat=repeat)
    return [s for s in range(1, num_steps)
            if fn(s) in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)]


@pytest.fixture
def script_dir(tmp_path: Path) -> Path:
    d = tmp_path / "scripts"
    d.mkdir()
    return d


def box_made(f: dict) -> bool:
    """A warning the busy box made, not the job (the rule of test_user_scripts.py's symmetric runs; issue 12
    item 12: no severity cap for one host): said with the one-host caveat, and blaming no work and no data
    loading — host gaps with no op running (a descheduled process), or a straggler whose cause is host-side,
    contention, unknown, or longer compute on the same ops with no more counted work. Beside busy processes a
    clean MoE run's rank 1 was last at 47 of 55 collectives with its shape-free ops 0.55x its peer's time, and a
    clean DataLoader run's rank stalled 17 ms a step in gaps (a 1-minute load of 20 on the 2 cores)."""
    ev = f.get("evidence") or {}
    if "caveat" not in ev:
        return False
    if f["kind"] == "idle_host_bound":
        return ev.get("cause") == "host_gap"
    if f["kind"] != "straggler":
        return False
    if ev.get("cause") == "compute":
        return (ev.get("op_count_ratio") or 0.0) < 1.1 and (ev.get("work_ratio") or 0.0) < 1.1
    return ev.get("cause") in ("contention", "host_idle", "unknown")
