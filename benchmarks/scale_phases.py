"""`tracekit analyze` exactly as the command runs it, with the wall and CPU seconds of each phase recorded.

    python benchmarks/scale_phases.py PHASES.json analyze TRACE_DIR --out OUT -j 2 -q

Runs the `tracekit` command in this process (tracekit.cli.main) after wrapping, for timing only: the
parse (`analysis._store_for`), each analyzer (`engine._run_step`, by analyzer name), the critical path's
replay and rescoring (`critical_path.replay_steps`, `critical_path.rescore`) and the output writing
(`analysis.write_outputs`); a step run on a worker (runner.measure's `submit`) by the time this process waited
for its result. Each phase gets wall seconds and this process's CPU seconds, of them those in the kernel (parse workers
are other processes: their CPU is in the tree total `scale_bench.run_measured` reports, not here), and this
process's resident memory at its end and peak so far.
PHASES.json is written when `analyze_run` returns; PHASES.json.partial after each phase (a run stopped part way).
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _memory() -> dict:
    """This process's resident memory now and its peak so far (MB)."""
    import os
    import resource

    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {"rss_mb": round(rss / 1e6), "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3)}


_PARTIAL: list[Path] = []
"""Where each finished phase is written as it ends (PHASES.json.partial): what a run stopped part way (killed
over a memory limit) got through."""


def _kernel_s() -> float:
    """This process's CPU seconds in the kernel so far (page faults and clearing, reads)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def _timed(phases: list[dict], name_of, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        w, c, k = time.perf_counter(), time.process_time(), _kernel_s()
        try:
            return fn(*args, **kwargs)
        finally:
            phases.append({"phase": name_of(*args, **kwargs), "wall_s": round(time.perf_counter() - w, 3),
                           "cpu_s": round(time.process_time() - c, 3), "kernel_s": round(_kernel_s() - k, 3),
                           **_memory()})
            if _PARTIAL:
                _PARTIAL[0].write_text(json.dumps({"phases": phases}))
    return wrapper


def main() -> None:
    out_json, argv = Path(sys.argv[1]), sys.argv[2:]
    _PARTIAL[:] = [out_json.with_name(out_json.name + ".partial")]
    from tracekit.process_env import apply_defaults

    apply_defaults()  # as the command does, before numpy and pyarrow load (the wrapping below imports them)
    from tracekit import analysis
    import tracekit.assess as assess
    from tracekit.analyze import runner
    from tracekit.assess import critical_path

    phases: list[dict] = []
    analysis._store_for = _timed(phases, lambda *a, **k: "parse", analysis._store_for)
    analysis.write_outputs = _timed(phases, lambda *a, **k: "write outputs", analysis.write_outputs)
    runner._run_step = _timed(phases, lambda step, *a, **k: f"analyzer {step.name}", runner._run_step)
    runner._remote_result = _timed(phases, lambda step, *a, **k: f"analyzer {step.name} (on a worker: waited)",
                                   runner._remote_result)
    for name in ("analyze_advice", "analyze_recommendations", "analyze_critical_path"):
        setattr(assess, name, _timed(phases, lambda *a, n=name, **k: f"assessment {n[len('analyze_'):]}",
                                     getattr(assess, name)))
    critical_path.replay_steps = _timed(phases, lambda *a, **k: "  critical_path: build + replay",
                                        critical_path.replay_steps)
    critical_path.rescore = _timed(phases, lambda *a, **k: "  critical_path: rescore", critical_path.rescore)
    run = analysis.analyze_run

    def analyze_run(*args, **kwargs):
        w, c = time.perf_counter(), time.process_time()
        res = run(*args, **kwargs)
        out_json.write_text(json.dumps({"phases": phases, "total": {
            "wall_s": round(time.perf_counter() - w, 3), "cpu_s": round(time.process_time() - c, 3)}}))
        return res

    analysis.analyze_run = analyze_run
    sys.argv = ["tracekit", *argv]
    from tracekit.cli.main import main as tracekit_main

    tracekit_main()


if __name__ == "__main__":
    main()
