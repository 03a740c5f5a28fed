"""tracekit's own environment defaults: set only where the user set nothing, never passed to a recorded job."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_defaults_fill_only_what_the_user_left_unset(monkeypatch):
    from tracekit import process_env

    monkeypatch.setattr(process_env, "_SET", set())
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "7")  # the user's choice
    process_env.apply_defaults()
    assert os.environ.get("ARROW_DEFAULT_MEMORY_POOL") == process_env.DEFAULTS.get("ARROW_DEFAULT_MEMORY_POOL")
    assert os.environ["OPENBLAS_NUM_THREADS"] == "7"
    user = process_env.user_environ()
    assert "ARROW_DEFAULT_MEMORY_POOL" not in user and user["OPENBLAS_NUM_THREADS"] == "7"


def test_a_recorded_job_runs_without_them(tmp_path):
    """`tracekit record -- CMD` (whose own process applies the defaults): CMD sees the environment tracekit
    was started with."""
    env = {k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "OPENBLAS_NUM_THREADS")}
    probe = ("import json, os; json.dump({k: os.environ.get(k) for k in "
             "('ARROW_DEFAULT_MEMORY_POOL', 'OPENBLAS_NUM_THREADS')}, open(os.environ['PROBE_OUT'], 'w'))")
    out = tmp_path / "seen.json"
    subprocess.run([sys.executable, "-m", "tracekit", "record", "--out", str(tmp_path / "rec"), "--",
                    sys.executable, "-c", probe], env={**env, "PROBE_OUT": str(out)}, check=False,
                   capture_output=True, timeout=120)
    assert json.loads(out.read_text()) == {"ARROW_DEFAULT_MEMORY_POOL": None, "OPENBLAS_NUM_THREADS": None}


def _in_heap(address: int) -> bool:
    """Whether `address` lies in the process's brk heap (/proc/self/maps' [heap])."""
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith("[heap]"):
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= address < hi:
                    return True
    return False


def test_large_blocks_come_from_the_heap_unless_memory_comes_first():
    """`large_blocks`: a 64 MB array (over glibc's largest mmap threshold, so mapped by default) comes from the
    heap inside it, and is mapped again after it; inside `memory_first()` a 4 MB one is mapped (the threshold
    fixed at 1 MiB) where the default's dynamic threshold may have served it from the heap."""
    import sys

    import numpy as np
    import pytest

    from tracekit.process_env import LIBC, large_blocks, memory_first

    if not sys.platform.startswith("linux") or LIBC is None or not hasattr(LIBC, "mallopt"):
        pytest.skip("glibc only")
    with large_blocks(1 << 20):
        inside = np.ones(8_000_000)
        assert _in_heap(inside.ctypes.data)
    after = np.ones(8_000_000)
    assert not _in_heap(after.ctypes.data)
    with memory_first(), large_blocks(1 << 20):
        lean = np.ones(500_000)
        assert not _in_heap(lean.ctypes.data)
