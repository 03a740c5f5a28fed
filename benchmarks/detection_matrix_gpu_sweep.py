"""The GPU-semantics detection matrix at every seed (tests/simulate/gpu_matrix.py: the suite runs the
64-rank layout at fewer seeds: its `SWEEP_ONLY`): every layout × fault kind × seed and the clean runs,
simulated, written, parsed and analyzed by the normal path, judged by the matrix module's own checks.

    python benchmarks/detection_matrix_gpu_sweep.py [--only LAYOUT ...] [--out DIR]

Prints one line per cell (layout, fault, seed, top finding, PASS/FAIL and why; `suite` marks the cells the
test suite runs too) and the CPU seconds of each layout; exits 1 when a cell fails.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.simulate.gpu_matrix import (LAYOUTS, Runs, cases, clean_cases, clean_cell_loud,  # noqa: E402
                                      fault_cell_error)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=list(LAYOUTS), help="layouts to run (default all)")
    ap.add_argument("--out", type=Path, help="where the runs are written and kept (default: a temporary folder, each "
                    "run's files removed once judged)")
    args = ap.parse_args()
    layouts = args.only or list(LAYOUTS)
    root = args.out or Path(tempfile.mkdtemp(prefix="gpu_matrix_sweep_"))
    runs = Runs(root)
    in_suite = set(cases()) | {(lay, "clean", seed) for lay, seed in clean_cases()}
    failed = 0
    for lay in layouts:
        t0 = time.process_time()
        cells = [c for c in cases(sweep=True) if c[0] == lay] + [(lay, "clean", s) for l, s in clean_cases(sweep=True)
                                                                  if l == lay]
        for cell in cells:
            run = runs.get(*cell)
            if cell[1] == "clean":
                loud = clean_cell_loud(run)
                top, error = None, "; ".join(loud) or None
            else:
                top, error = fault_cell_error(run)
            failed += error is not None
            said = f"{top['kind']} {top['severity']} ranks={top['ranks'][:8]} dim={top['dim']}" if top else "-"
            print(f"{cell[0]:8s} {cell[1]:24s} seed {cell[2]}  {'suite' if cell in in_suite else 'sweep'}  "
                  f"{'PASS' if error is None else 'FAIL'}  {said}{'  ' + error if error else ''}", flush=True)
            runs.cache.pop(cell)  # one run's analysis at a time in memory
            if not args.out:  # its files too
                name = f"{cell[0]}-{cell[1]}-{cell[2]}"
                shutil.rmtree(root / name, ignore_errors=True)
                shutil.rmtree(root / f"{name}.store", ignore_errors=True)
        print(f"{lay}: {len(cells)} runs, {time.process_time() - t0:.0f} s CPU in this process", flush=True)
    print(f"{failed} cell(s) failed" if failed else "every cell passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
