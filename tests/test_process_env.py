"""tracekit's own environment defaults: set only where the user set nothing, never passed to a recorded job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


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
    names = ("ARROW_DEFAULT_MEMORY_POOL", "OPENBLAS_NUM_THREADS", "NUMPY_MADVISE_HUGEPAGE")
    env = {k: v for k, v in os.environ.items() if k not in names}
    probe = ("import json, os; json.dump({k: os.environ.get(k) for k in "
             f"{names!r}}}, open(os.environ['PROBE_OUT'], 'w'))")
    out = tmp_path / "seen.json"
    subprocess.run([sys.executable, "-m", "tracekit", "record", "--out", str(tmp_path / "rec"), "--",
                    sys.executable, "-c", probe], env={**env, "PROBE_OUT": str(out)}, check=False,
                   capture_output=True, timeout=120)
    assert json.loads(out.read_text()) == dict.fromkeys(names)


def test_the_command_asks_numpy_for_no_huge_pages():
    """On Linux the CLI sets NUMPY_MADVISE_HUGEPAGE=0 before numpy loads (process_env.DEFAULTS): numpy then
    advises no transparent huge pages for its arrays (numpy's own switch, read at import)."""
    from tracekit import process_env

    if sys.platform != "linux":  # numpy's default stays elsewhere
        assert "NUMPY_MADVISE_HUGEPAGE" not in process_env.DEFAULTS
        return
    probe = ("import sys\n"
             "import tracekit.cli.main\n"
             "assert 'numpy' not in sys.modules  # main() applies the defaults before numpy loads\n"
             "from tracekit.process_env import apply_defaults\n"
             "apply_defaults()\n"
             "from numpy._core import multiarray as ma\n"
             "print('HUGE', ma._set_madvise_hugepage(False))\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    got = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert "HUGE False" in got.stdout, got.stdout + got.stderr



_HEAP_CHECK = """
import numpy as np
from tracekit.process_env import large_blocks, memory_first

def in_heap(address):
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith("[heap]"):
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= address < hi:
                    return True
    return False

with large_blocks(1 << 20):
    inside = np.ones(8_000_000)
after = np.ones(8_000_000)
with memory_first(), large_blocks(1 << 20):
    lean = np.ones(500_000)
print(in_heap(inside.ctypes.data), in_heap(after.ctypes.data), in_heap(lean.ctypes.data))
"""


def test_large_blocks_come_from_the_heap_unless_memory_comes_first():
    """`large_blocks`, in a fresh process (a process that ran anything large has free heap chunks, which glibc
    serves before any mapping): a 64 MB array (over glibc's largest mmap threshold, so mapped by default) comes
    from the heap inside it and is mapped after it; inside `memory_first()` a 4 MB one is mapped (the threshold
    fixed at 1 MiB) where the default's dynamic threshold may have served it from the heap."""
    import pytest

    from tracekit.process_env import LIBC

    if not sys.platform.startswith("linux") or LIBC is None or not hasattr(LIBC, "mallopt"):
        pytest.skip("glibc only")
    out = subprocess.run([sys.executable, "-c", _HEAP_CHECK], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout.split()
    assert out == ["True", "False", "False"]
