"""The user-script detection matrix (issue 32): every scenario of `SCENARIOS` recorded with
`tracekit record -- torchrun` faulty and clean, `--runs` times each (default 3), with a busy process
beside them (a `python -c` CPU burner at normal priority for the whole matrix), then `tracekit analyze`d.

Per faulty run it prints the top finding at warning or above (kind, severity, ranks), its replayed saving, the measured
difference (the run's step minus the mean clean step: per profiled step the longest `ProfilerStep#N` of
the ranks, read with plain gzip/json/Decimal, mean over the steps), the clean runs' spread (max − min of
their steps), and PASS/FAIL: the injected cause is the top finding at warning or above, and wherever the
difference exceeds the clean spread, its replayed saving is within 25% of the difference. Per clean run it
prints the warnings that name a fault (any is a FAIL).

    python benchmarks/user_scripts_matrix.py [--runs 3] [--only NAME ...] [--out DIR] [--no-busy] [--reuse]

`--reuse` analyzes the recordings already under `--out` again (after a change to the analysis).

Scenarios are declared in `SCENARIOS` (one `Scenario` each): another script's scenario is one more entry.
Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.record.conftest import box_made  # noqa: E402  (the rule the tests use for box-made warnings)

SCRIPTS = REPO / "tests" / "user_scripts"
PY = sys.executable


@dataclass(frozen=True)
class Scenario:
    name: str
    script: str
    nproc: int
    args: tuple[str, ...]          # both runs
    fault: tuple[str, ...]         # added to the faulty run only
    cause: str                     # what was injected, in words
    accept: dict[str, set[str] | None]
    """kind -> the causes accepted for it (evidence.cause; None: any) — the top finding's kind must be one."""
    ranks: tuple[int, ...] = (1,)  # the top finding's ranks must be these
    record: tuple[str, ...] = ("--wait", "1", "--warmup", "1", "--active", "4")
    """4 profiled steps: the measured difference is a mean over them (2 swung by 2x on a loaded box)."""
    steps: int = 8
    timeout_s: int = 300
    default: bool = True
    """False: run only when named with --only."""


HOST = {"idle_host_bound": None, "host_bound": None, "host_stall": None}
# The DDP toy model made to compute for real (~25-55 ms a step at 1x on this box, loaded): 2x the batch is
# work, not noise, and the step is not only gloo's all-reduce (the toy default computes ~1 ms a step, and
# beside a busy process its 165-float all-reduce took 4-7 ms: exposed communication, which the analysis
# reports, is then most of a clean step). FSDP2's as in tests/record/test_user_scripts.py.
DDP_WORK = ("--hidden", "2048", "--batch", "1024")
# The DataLoader job: the same compute with fewer, wider samples: 1024 samples a batch, each fetched by its own
# `__getitem__` call and stacked by default_collate, took 10-17 ms a step beside a busy process, a real
# data-loading cost (reported as such) in the clean run as well.
LOADER_WORK = ("--hidden", "8192", "--batch", "256")
FSDP2_WORK = ("--dim", "256", "--seq", "256", "--batch", "8", "--vocab", "256")

SCENARIOS: list[Scenario] = [
    Scenario("ddp_sleep", "ddp_loop.py", 2, DDP_WORK, ("--slow-rank", "1", "--sleep-ms", "40"),
             "rank 1 sleeps 40 ms a step", {"straggler": {"host_idle", "unknown", "contention"}, **HOST}),
    Scenario("ddp_batch2", "ddp_loop.py", 2, DDP_WORK, ("--slow-rank", "1", "--batch-mult", "2"),
             "rank 1 has 2x the batch", {"straggler": {"compute", "uneven_work"}}),
    Scenario("ddp_no_sync_batch2", "ddp_no_sync.py", 2, (*DDP_WORK, "--accum", "2"),
             ("--slow-rank", "1", "--batch-mult", "2"),
             "rank 1 has 2x the batch (no_sync accumulation)", {"straggler": {"compute", "uneven_work"}}),
    Scenario("fsdp2_batch3", "fsdp2_clip.py", 2, FSDP2_WORK, ("--slow-rank", "1", "--batch-mult", "3"),
             "rank 1 has 3x the batch", {"straggler": {"compute", "uneven_work"}}),
    Scenario("dataloader_stall", "ddp_dataloader.py", 2, LOADER_WORK, ("--slow-rank", "1", "--loader-sleep-ms", "40"),
             "rank 1's DataLoader sleeps 40 ms a batch", {"straggler": {"data_load"}, **HOST}),
    # A worker process prefetches 2 batches: 40 ms a batch hid behind a loaded box's ~100 ms step (no
    # difference to find); 120 ms outpaces it. Not in the default list: a clean run's own worker process
    # shares the 2 cores too, and its main process waited 22-25 ms a step inside the DataLoader beside a
    # busy process (at a 1-minute load of 9), which the analysis reports (idle_host_bound, data loading).
    Scenario("dataloader_stall_workers", "ddp_dataloader.py", 2, (*LOADER_WORK, "--workers", "1"),
             ("--slow-rank", "1", "--loader-sleep-ms", "120"),
             "rank 1's DataLoader (1 worker process) sleeps 120 ms a batch", {"straggler": {"data_load"}, **HOST},
             default=False),
    # tests/record/test_record_moe.py's job (s-users2): 60% of the tokens choose expert 5 (on rank 1) first
    Scenario("moe_hot_expert", "moe_ep.py", 2, (), ("--hot-expert", "5", "--hot-frac", "0.6"),
             "the router sends 60% of the tokens to expert 5 (rank 1)", {"expert_routing_skew": None},
             record=("--wait", "1", "--warmup", "1", "--active", "3")),
    Scenario("pipeline_2_6_2_2", "pipelining_1f1b.py", 4,
             ("--layers", "12", "--microbatches", "4", "--block-ms", "10"), ("--split", "2,6,2,2"),
             "stage 1 holds 3x the blocks", {"pipeline_imbalance": None},
             record=("--wait", "1", "--warmup", "1", "--active", "2"), steps=5),  # as test_record_pipelining.py
]
NOT_A_FAULT = {"unstable_verdict"}
TOLERANCE = 0.25


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def record(sc: Scenario, faulty: bool, out: Path) -> None:
    cmd = [PY, "-m", "tracekit", "record", "--out", str(out), *sc.record, "--",
           PY, "-m", "torch.distributed.run", "--nproc-per-node", str(sc.nproc), "--max-restarts", "0",
           "--master-port", str(free_port()), str(SCRIPTS / sc.script), "--steps", str(sc.steps), *sc.args,
           *(sc.fault if faulty else ())]
    res = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=sc.timeout_s)
    ok = res.returncode == 0 or all(json.loads(p.read_text()).get("status") == "ok"
                                    for p in out.glob("record.rank*.json"))  # gloo's teardown abort
    if not ok:
        raise RuntimeError(f"record {sc.name} failed: {res.stderr[-2000:]}")


def analyze(traces: Path, out: Path) -> dict:
    res = subprocess.run([PY, "-m", "tracekit", "analyze", str(traces), "--out", str(out), "-q"],
                         env=child_env(), capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"analyze {traces} failed: {res.stderr[-2000:]}")
    return json.loads((out / "analysis.json").read_text())


def step_ns(traces: Path) -> int:
    """Mean over the profiled steps of the longest ProfilerStep#N among the ranks (integer ns, plain json)."""
    per_step: dict[int, int] = {}
    for path in sorted(traces.glob("rank*.pt.trace.json.gz")):
        with gzip.open(path, "rt") as fh:
            trace = json.loads(fh.read(), parse_float=Decimal)
        for e in trace["traceEvents"]:
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"):
                step = int(e["name"].split("#")[1])
                per_step[step] = max(per_step.get(step, 0), int(Decimal(str(e["dur"])) * 1000))
    return sum(per_step.values()) // max(1, len(per_step))


def cpu_pace(traces: Path) -> str:
    """The ranks' CPU time per profiled step and their threads' run-queue wait share, from the manifest's
    `cpu_window`s (tracekit record, plain json): the same work taking more CPU time in one run than in
    another is the box's pace (a VM's stolen time, memory bandwidth), which the difference carries too."""
    try:
        ranks = json.loads((traces / "manifest.json").read_text()).get("ranks") or []
    except (OSError, ValueError):
        return ""
    wins = [(r["cpu_window"], len(r.get("profiled_steps") or []) or 1) for r in ranks if r.get("cpu_window")]
    if not wins:
        return ""
    cpu = sum(w["cpu_ns"] / n for w, n in wins) / 1e6
    wait = sum(w["wait_ns"] for w, _ in wins) / max(1, sum(w["wait_ns"] + w["cpu_ns"] for w, _ in wins))
    return f"; ranks' CPU {cpu:.0f} ms/step, core wait {wait:.0%}"


def _saving(f: dict) -> int:
    ev = f.get("evidence") or {}
    replayed = ev.get("replayed_saving_ns")
    return int(replayed if replayed is not None else f.get("est_saving_ns") or 0)


def _accepts(sc: Scenario, f: dict) -> bool:
    if f["kind"] not in sc.accept or f["severity"] not in ("warning", "critical"):
        return False
    causes = sc.accept[f["kind"]]
    cause = (f.get("evidence") or {}).get("cause")
    return tuple(f.get("ranks") or ()) == sc.ranks and (causes is None or cause in causes)


def clean_warnings(analysis: dict) -> tuple[list[str], list[str]]:
    """(warnings that name a fault, stragglers the busy box made) of a clean run."""
    warn = [f for f in analysis["findings"]
            if f["severity"] in ("warning", "critical") and f["kind"] not in NOT_A_FAULT]
    name = lambda f: f"{f['kind']}{f['ranks']}({(f.get('evidence') or {}).get('cause')})"  # noqa: E731
    return [name(f) for f in warn if not box_made(f)], [name(f) for f in warn if box_made(f)]


def run_scenario(sc: Scenario, runs: int, root: Path, reuse: bool = False) -> tuple[list[str], bool]:
    clean, faulty = [], []
    for i in range(runs):  # interleaved: the box's load drifts alike over both
        for kind, bucket in (("clean", clean), ("faulty", faulty)):
            traces = root / f"{sc.name}_{kind}{i}"
            if not (reuse and (traces / "manifest.json").exists()):
                record(sc, kind == "faulty", traces)
            bucket.append((traces, analyze(traces, root / f"{sc.name}_{kind}{i}_out")))
    steps = [step_ns(t) for t, _ in clean]
    mean_clean, spread = sum(steps) // len(steps), max(steps) - min(steps)
    lines, ok = [], True
    for i, (traces, analysis) in enumerate(faulty):
        # the must-show's "top finding at warning or above" (as tests/analyze/test_detection_matrix.py `_top`
        # and tests/record/test_record_moe.py read it): findings are sorted by saving, and an info finding
        # (the box's own exposed all_to_all) may out-save a warning
        loud = [f for f in analysis["findings"] if f["severity"] in ("warning", "critical")]
        top = loud[0] if loud else None
        above = analysis["findings"].index(top) if top is not None else len(analysis["findings"])
        diff = step_ns(traces) - mean_clean
        saving = _saving(top) if top else 0
        hit = top is not None and _accepts(sc, top)
        close = diff <= spread or abs(saving - diff) <= TOLERANCE * diff
        ok &= hit and close
        desc = "none" if top is None else (f"{top['kind']}/{top['severity']} ranks {top['ranks']} "
                                           f"cause {(top.get('evidence') or {}).get('cause')}"
                                           + (f" (below {above} info finding(s))" if above else ""))
        off = f"{(saving - diff) / diff:+.0%}" if diff > 0 else "n/a"
        lines.append(f"  faulty {i}: top {desc}; saving {saving / 1e6:.1f} ms, difference {diff / 1e6:.1f} ms "
                     f"({off}), clean spread {spread / 1e6:.1f} ms{cpu_pace(traces)} -> {'PASS' if hit and close else 'FAIL'}"
                     + ("" if hit else " (top is not the injected cause)")
                     + ("" if close else " (saving off by more than 25%)"))
    for i, (traces, analysis) in enumerate(clean):
        warn, box = clean_warnings(analysis)
        ok &= not warn
        lines.append(f"  clean {i}: step {steps[i] / 1e6:.1f} ms{cpu_pace(traces)}; warnings naming a fault: "
                     f"{warn or 'none'}"
                     + (f"; stragglers the box made (caveat): {box}" if box else "")
                     + f" -> {'FAIL' if warn else 'PASS'}")
    return lines, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-busy", action="store_true", help="no CPU burner beside the recordings")
    ap.add_argument("--reuse", action="store_true", help="re-analyze the recordings already under --out")
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="user_scripts_matrix_"))
    root.mkdir(parents=True, exist_ok=True)
    busy = None if args.no_busy or args.reuse else subprocess.Popen([PY, "-c", "while True: pass"])
    ok_all = True
    try:
        for sc in SCENARIOS:
            if (args.only and sc.name not in args.only) or (not args.only and not sc.default):
                continue
            t0 = time.monotonic()
            try:
                lines, ok = run_scenario(sc, args.runs, root, args.reuse)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                lines, ok = [f"  error: {exc}"], False
            ok_all &= ok
            print(f"{sc.name}: {sc.cause} ({sc.script}, {sc.nproc} ranks; {time.monotonic() - t0:.0f} s, "
                  f"1-min load at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
                  f" -> {'PASS' if ok else 'FAIL'}")
            print("\n".join(lines), flush=True)
    finally:
        if busy is not None:
            busy.terminate()
            busy.wait()
    print(f"recordings under {root}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
