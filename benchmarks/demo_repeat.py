"""Re-check issue 14's demo claim: `./scripts/demo.sh`'s injected fault (rank 5 computing 2x slower) is its
top finding in every run, some of them with an extra busy process on the box, and the report shows the
critical path through rank 5.

    python benchmarks/demo_repeat.py [--runs 5] [--busy 2,4] [--out DIR] [--summarize]

Runs the demo `--runs` times, one after the other; runs listed in `--busy` (1-based) have a
`python -c 'while True: pass'` process beside them for their whole length (killed after the run). Per run:
load average (1 min) before and after, the top finding (kind, ranks, severity, replayed saving per step),
where the rank-5 straggler stands in the list, rank 5's share of the critical path (analysis.json) and
whether the report's Critical path section names rank 5. Exit 1 when a run misses the claim.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAULT_RANK = 5


def section(analysis: dict) -> dict:
    return (analysis.get("sections") or {}).get("critical_path") or {}


def critical_path_ranks(analysis: dict) -> dict[int, float]:
    """Each rank's share of the shown step's critical path (the step with a timeline, as the report)."""
    steps = section(analysis).get("steps") or []
    shown = next((s for s in steps if isinstance(s.get("timeline"), dict)), steps[-1] if steps else None)
    comp = (shown or {}).get("composition") or {}
    by_rank, step_ns = comp.get("by_rank") or {}, comp.get("step_ns") or 0
    return {int(r): v / step_ns for r, v in by_rank.items()} if step_ns else {}


def report_names_rank_on_path(report_html: str, rank: int) -> bool:
    """The report's Critical path section (its 'By rank' line) lists `rank`."""
    m = re.search(r'id="critical-path".*?</section>', report_html, re.S)
    text = html.unescape(m.group(0)) if m else ""
    line = re.search(r"By rank: ([^<]*)", text)
    return bool(line) and re.search(rf"\brank {rank} ", line.group(1)) is not None


def one_run(out: Path, busy: bool) -> dict:
    """Run the demo into `out` (with a busy process beside it when `busy`); its load and time go to
    out/run_info.json, next to the demo's output."""
    load0 = os.getloadavg()[0]
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    t = time.time()
    try:
        proc = subprocess.run(["bash", "scripts/demo.sh", str(out)], cwd=REPO, capture_output=True, text=True)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    info = {"busy": busy, "load_before": round(load0, 1), "load_after": round(os.getloadavg()[0], 1),
            "wall_s": round(time.time() - t), "rc": proc.returncode}
    if proc.returncode != 0:
        info["error"] = proc.stderr[-2000:]
    out.mkdir(parents=True, exist_ok=True)
    (out / "run_info.json").write_text(json.dumps(info))
    return summarize(out)


def summarize(out: Path) -> dict:
    """The run's info and what its report shows about the injected fault."""
    row = json.loads((out / "run_info.json").read_text())
    if row["rc"] != 0:
        return row
    analysis = json.loads((out / "report" / "analysis.json").read_text())
    findings = analysis.get("findings") or []
    top = findings[0] if findings else {}
    hit = [i for i, f in enumerate(findings, 1) if f["kind"] == "straggler" and FAULT_RANK in (f.get("ranks") or [])]
    shares = critical_path_ranks(analysis)
    return {**row, "top": top.get("kind"), "top_ranks": top.get("ranks"), "severity": top.get("severity"),
            "saving_ms": round((top.get("est_saving_ns") or 0) / 1e6, 1),
            "step_ms": round((section(analysis).get("measured_step_ns") or 0) / 1e6, 1),
            "straggler_5_position": hit[0] if hit else None,
            "path_share_5": shares.get(FAULT_RANK), "path_top_rank": max(shares, key=shares.get, default=None),
            "report_path_names_5": report_names_rank_on_path((out / "report" / "report.html").read_text(), FAULT_RANK)}


def ok(r: dict) -> bool:
    return (r.get("rc") == 0 and r.get("straggler_5_position") == 1 and bool(r.get("path_share_5"))
            and r.get("report_path_names_5", False))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--busy", default="2,4", help="1-based runs with a busy process beside them")
    ap.add_argument("--out", default=None)
    ap.add_argument("--summarize", action="store_true", help="only print the table of the runs already in --out")
    opts = ap.parse_args()
    busy = {int(x) for x in opts.busy.split(",") if x}
    root = Path(opts.out or tempfile.mkdtemp(prefix="demo_repeat_"))
    rows = []
    for i in range(1, opts.runs + 1):
        out = root / f"run{i}"
        rows.append({"run": i, **(summarize(out) if opts.summarize else one_run(out, i in busy))})
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'run':>3s} {'busy':>4s} {'load':>10s} {'top finding':26s} {'sev':8s} {'saving':>9s} {'step':>9s} "
          f"{'rank 5 on path':>14s} {'ok':>3s}")
    for r in rows:
        share = r.get("path_share_5")
        top = f"{r.get('top')} {r.get('top_ranks')}" if r.get("rc") == 0 else f"FAILED rc={r['rc']}"
        print(f"{r['run']:3d} {'yes' if r['busy'] else 'no':>4s} {r['load_before']:4.1f}->{r['load_after']:<4.1f} "
              f"{top[:26]:26s} {str(r.get('severity')):8s} {r.get('saving_ms', 0):6.1f} ms {r.get('step_ms', 0):6.1f} ms "
              f"{'–' if share is None else f'{share:.0%}':>4s} {'top' if r.get('path_top_rank') == FAULT_RANK else '':3s} "
              f"{'html' if r.get('report_path_names_5') else '':4s} "
              f"{'yes' if ok(r) else 'NO':>3s}")
    met = sum(ok(r) for r in rows)
    print(f"\nfault (rank {FAULT_RANK} straggler) top finding with rank {FAULT_RANK} on the critical path: {met} of {len(rows)}")
    return 0 if met == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
