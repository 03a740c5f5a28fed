"""Whole-process cost of `tracekit analyze` on a small trace vs HTA's TraceAnalysis load, same run.

    python benchmarks/process_bench.py [TRACE] [--repeat N]

Each measurement is a fresh process (what a user or a CI gate runs): wall seconds, CPU seconds
(user + sys, less sensitive to a busy box than wall) and peak RSS, from os.wait4's rusage of that
process alone. The two commands alternate so load drifts hit both; medians are printed with the
ratio tracekit / HTA. Targets (DESIGN §6): analyze of a < 100 KB trace ≤ 0.5 s and ≤ 120 MB.
TRACE defaults to the smallest shared trace HTA loads (a lone trace is rank 0, as `--rank 0`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
DEFAULT = "hta_rank_non_gpu/rank_non_gpu.json.gz"
HTA_LOAD = """
import logging, sys, warnings
logging.disable(logging.CRITICAL); warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1])
"""


def installed_env(repo: Path, pycache: Path) -> dict[str, str]:
    """The environment of the measured commands: tracekit from `repo` with its bytecode cached (in
    `pycache`, compiled once here), as an installed package has it (pip compiles .pyc files, and HTA's
    are in site-packages) -- without it a shell with PYTHONDONTWRITEBYTECODE set recompiles tracekit's
    own modules in every run (~0.13 s of CPU per analyze)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(repo), PYTHONPYCACHEPREFIX=str(pycache))
    subprocess.run([PY, "-m", "compileall", "-q", str(repo / "tracekit"), str(repo / "reports")], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    return env


def measure(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}): {err[-2000:]}")
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "peak_mb": ru.ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="?", help="one trace file (default: shared/" + DEFAULT + ")")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    shared = os.environ.get("TRACEKIT_SHARED_TRACES", "")
    trace = Path(args.trace or Path(shared) / DEFAULT).resolve()
    repo = Path(__file__).resolve().parents[1]
    work = Path(tempfile.mkdtemp(prefix="process_bench_"))
    env = installed_env(repo, work / "pycache")
    try:
        hta_dir = work / "hta"
        hta_dir.mkdir()
        os.symlink(trace, hta_dir / trace.name)
        cmds = {"tracekit analyze": [PY, "-m", "tracekit", "analyze", str(trace), "--out", str(work / "out"), "-q"],
                "HTA TraceAnalysis load": [PY, "-c", HTA_LOAD, str(hta_dir)]}
        measure(cmds["tracekit analyze"], env)  # warm: caches (plotly.js), page cache
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in cmds}
        for _ in range(args.repeat):
            for name, cmd in cmds.items():
                runs[name].append(measure(cmd, env))
        print(f"trace: {trace} ({trace.stat().st_size / 1024:.0f} KB), {args.repeat} runs each, medians")
        med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
        for name, m in med.items():
            print(f"  {name:<24} wall {m['wall_s']:.2f} s   cpu {m['cpu_s']:.2f} s   peak {m['peak_mb']:.0f} MB")
        a, h = med["tracekit analyze"], med["HTA TraceAnalysis load"]
        print(f"  ratio tracekit/HTA       wall {a['wall_s'] / h['wall_s']:.2f}   cpu {a['cpu_s'] / h['cpu_s']:.2f}   "
              f"peak {a['peak_mb'] / h['peak_mb']:.2f}")
        print(f"  target: analyze <= 0.5 s and <= 120 MB -> wall {'met' if a['wall_s'] <= 0.5 else 'NOT met'}, "
              f"cpu {'met' if a['cpu_s'] <= 0.5 else 'NOT met'}, memory {'met' if a['peak_mb'] <= 120 else 'NOT met'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
