"""A DDP job fed by a real `torch.utils.data.DataLoader` (tests/user_scripts/ddp_dataloader.py, 2 gloo ranks,
knows nothing of tracekit) recorded with `tracekit record -- torchrun` clean and then with rank 1's
DataLoader sleeping 40 ms a batch in its collate_fn, back to back (issue 32).

On the faulty run the data-loader stall of rank 1 is the top finding at warning or above, named as data
loading (a `straggler` whose cause is the data loader, or a host/data stall finding of rank 1), and its
replayed saving is (1) bounded by the injected stall as the trace shows it (the time rank 1 spends inside
PyTorch's `enumerate(DataLoader)#...` ranges beyond rank 0's, read from the raw files — the fix's documented
rule, the rank's loading at its peers' pace, docs/metrics.md §8): at most the stall (25% slack), at least the
stall less rank 0's CPU time per step — the stall held no core, so once it is gone the two ranks compute at
once on the box's two cores, which at worst serialises them (processor sharing, §8: a CI run with the cores
shared measured a 42.8 ms difference for 40.7 ms of stall, this box 33.0 for 40.3); and (2) within 25% of the measured
difference (the faulty run's step minus the clean runs': per profiled step the longest `ProfilerStep#N` of the
ranks, read with plain gzip/json/Decimal; per run the median of its steps) wherever that difference exceeds
the spread of the clean runs (max − min of all their steps, and of the faulty run's own). The clean runs have
no warning that names a fault.

Two clean runs, one before and one after the faulty one (the matrix harness's interleaving), and a median per
run: one clean run measured the box, not the job (a clean-clone CI run: clean steps 28.4, 45.0, 31.6 ms, its
rank 1 late at every all-reduce by 8-14 ms and its gloo record once outliving its peer's by 16.7 ms, so the
difference read 26.3 ms for a replayed 37.6 against 40.1 ms of loading beyond the peer's), and its step
spread (16.6 ms) understated the run-to-run spread that the must-show compares the difference with. A
median of three steps leaves out one preempted step, a mean does not.

Before the fix the cause read "unknown": gloo ends DDP's bucket all-reduce on its own thread after the rank
has already arrived at the next step's, so the peer was dropped from the comparison (no window before its
arrival) and a 2-rank instance had no peer left; the first collective of the window had no window at all.
"""

from __future__ import annotations

import json
from decimal import Decimal
from statistics import median
from pathlib import Path

import pytest

from tests.conftest import quiet_section
from tests.record.conftest import assert_job_ok, box_made, load_trace, run_record, torchrun
from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run

# minutes of multi-process runs: in scripts/test.sh's second pass, after the suite (tests/conftest.py: `long`)
pytestmark = pytest.mark.long

SCRIPT = Path(__file__).resolve().parents[1] / "user_scripts" / "ddp_dataloader.py"
# A model that computes for real (~15 ms a step here): the step is not only gloo's all-reduce. 256 wide samples
# a batch: at 1024 samples, each fetched by its own `__getitem__` call and stacked by default_collate, the
# clean run's loading took 10 ms a step (16%) beside a busy process, a real data-loading cost, reported.
WORK = ("--hidden", "4096", "--batch", "256", "--steps", "6")
RECORD_OPTS = ("--wait", "1", "--warmup", "1", "--active", "3")  # profile steps 2, 3, 4 of 0..5
FAULT = ("--slow-rank", "1", "--loader-sleep-ms", "40")
NOT_A_FAULT = {"unstable_verdict"}
HOST_STALL_KINDS = {"idle_host_bound", "host_bound", "host_stall"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (traces dir, analysis): clean, faulty, clean again, recorded back to back with the box alone
    (`quiet_section`: the test compares a replayed saving with a step difference measured on the box; the
    parse and analysis run beside other tests)."""
    out = {}
    for name, extra in (("clean", ()), ("faulty", FAULT), ("clean_after", ())):
        tmp = tmp_path_factory.mktemp(f"dataloader_{name}")
        with quiet_section():
            res = run_record(tmp / "traces", torchrun(SCRIPT, 2, *WORK, *extra), *RECORD_OPTS, timeout=240)
        assert_job_ok(res, tmp / "traces")
        store = parse_run(tmp / "traces", tmp / "store", progress=False).store
        out[name] = (tmp / "traces", analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False)))
    return out


CLEAN = ("clean", "clean_after")


def _ns(x) -> int:
    return int(Decimal(str(x)) * 1000)


def _events(traces: Path, rank: int) -> list[dict]:
    return [e for e in load_trace(traces / f"rank{rank}.pt.trace.json.gz")["traceEvents"] if e.get("ph") == "X"]


def step_ns(traces: Path) -> dict[int, int]:
    """Per profiled step the longest ProfilerStep#N among the ranks (integer ns)."""
    per_step: dict[int, int] = {}
    for rank in (0, 1):
        for e in _events(traces, rank):
            if str(e.get("name", "")).startswith("ProfilerStep#"):
                step = int(e["name"].split("#")[1])
                per_step[step] = max(per_step.get(step, 0), _ns(e["dur"]))
    assert sorted(per_step) == [2, 3, 4], per_step
    return per_step


def rank_cpu_ns_per_step(traces: Path, rank: int) -> float:
    """CPU time of the rank's threads per profiled step, as `tracekit record` read it from /proc (manifest)."""
    [r] = [r for r in json.loads((traces / "manifest.json").read_text())["ranks"] if r["rank"] == rank]
    return r["cpu_window"]["cpu_ns"] / len(r["profiled_steps"])


def loader_ns_per_step(traces: Path, rank: int) -> float:
    """The rank's time inside PyTorch's `enumerate(DataLoader)#...` ranges within its profiled steps, per step."""
    ev = _events(traces, rank)
    steps = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in ev if e["name"].startswith("ProfilerStep#")]
    total = 0
    for e in ev:
        if e["name"].startswith("enumerate(DataLoader)#"):
            lo, hi = _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])
            total += sum(max(0, min(hi, b) - max(lo, a)) for a, b in steps)
    return total / len(steps)


@pytest.mark.slow
def test_data_loader_stall_is_top_with_the_measured_saving(runs):
    traces, analysis = runs["faulty"]
    stall = loader_ns_per_step(traces, 1) - loader_ns_per_step(traces, 0)
    assert stall >= 35e6, stall  # the injected 40 ms a batch is there, inside the DataLoader's ranges
    top = analysis["findings"][0]
    rows = [(f["kind"], f["severity"], f["ranks"], f["est_saving_ns"], f["evidence"].get("cause"))
            for f in analysis["findings"][:5]]
    assert top["severity"] in ("warning", "critical") and top["ranks"] == [1], rows
    if top["kind"] == "straggler":
        assert top["evidence"]["cause"] == "data_load" and "data loader" in top["summary"], rows
    else:
        assert top["kind"] in HOST_STALL_KINDS and top["evidence"].get("cause") == "data_load", rows
    saving = top["evidence"].get("replayed_saving_ns")
    assert saving is not None and top["est_saving_ns"] == saving > 0, top
    # (1) the fix removes the loading beyond the peer's, not more (nor rank 1's compute): at most the stall.
    # And at least the stall less rank 0's CPU time per step (the recorder's schedstat, all its threads): the
    # stall held no core, so without it the ranks compute at once and share the cores, which at worst runs
    # their compute one after the other — the faulty step loses the stall, gains at most rank 0's work.
    cpu0 = rank_cpu_ns_per_step(traces, 0)
    assert stall - cpu0 <= saving <= 1.25 * stall, (saving, stall, cpu0)
    clean_steps = [step_ns(runs[name][0]) for name in CLEAN]
    faulty_steps = step_ns(traces)
    clean = sum(median(s.values()) for s in clean_steps) / len(clean_steps)
    diff = median(faulty_steps.values()) - clean
    every_clean = [v for s in clean_steps for v in s.values()]
    spread = max(max(every_clean) - min(every_clean), max(faulty_steps.values()) - min(faulty_steps.values()))
    print(f"\ndata loader +40 ms on rank 1: steps {[s / 1e6 for s in faulty_steps.values()]} vs clean "
          f"{[[v / 1e6 for v in s.values()] for s in clean_steps]} ms; difference {diff / 1e6:.1f} ms (spread "
          f"{spread / 1e6:.1f}), stall in the DataLoader {stall / 1e6:.1f} ms, rank 0's CPU {cpu0 / 1e6:.1f} ms, "
          f"replayed saving {saving / 1e6:.1f} ms")
    if diff > spread:  # (2) the must-show's check, where the box's noise is below the difference
        assert abs(saving - diff) <= 0.25 * diff, (saving, diff)


@pytest.mark.slow
@pytest.mark.parametrize("name", CLEAN)
def test_clean_run_names_no_fault(runs, name):
    analysis = runs[name][1]
    warn = [(f["kind"], f["ranks"], f["summary"]) for f in analysis["findings"]
            if f["severity"] in ("warning", "critical") and f["kind"] not in NOT_A_FAULT and not box_made(f)]
    assert warn == [], warn
    # no data loading is blamed on either rank of the clean run, at any severity
    assert not [f for f in analysis["findings"] if f["evidence"].get("cause") == "data_load"
                and f["severity"] in ("warning", "critical")]
