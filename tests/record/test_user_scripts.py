"""`tracekit record -- torchrun ...` on user scripts that know nothing of tracekit (tests/user_scripts):
a DDP tutorial loop, an FSDP2 loop with clip_grad_norm_, a DTensor TP+SP loop; 2 gloo ranks.

Checked against the raw files read here with plain gzip/json/Decimal: every collective the profiler
recorded has a comms-log entry with its group and sequence; tracekit's own ranges (`tracekit::*`)
are not compute and the analysis reports their time; and (issue 12) a rank made slow is the top
straggler with about the injected delay, the symmetric runs have no straggler at warning, every
collective is one row.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import quiet_section
from tests.record.conftest import REPO, assert_job_ok, child_env, load_comms, load_trace, run_record, torchrun

# minutes of multi-process runs: in scripts/test.sh's second pass, after the suite (tests/conftest.py: `long`)
pytestmark = pytest.mark.long

USER_SCRIPTS = REPO / "tests" / "user_scripts"
WAIT, WARMUP, ACTIVE = 1, 1, 2
WINDOW = list(range(WAIT + WARMUP, WAIT + WARMUP + ACTIVE))
# a model that computes for real (~140 ms a step at 1x), so 3x the batch is work, not noise
FSDP2_WORK = ("--dim", "256", "--seq", "256", "--batch", "8", "--vocab", "256")
SCRIPTS = {"ddp": ("ddp_loop.py", ["--steps", "5"]),
           "fsdp2": ("fsdp2_clip.py", ["--steps", "5"]),
           "tp_sp": ("tp_sp_loop.py", ["--steps", "5"])}
# c10d op (as the profiler names it) -> the collective the log calls it (gloo:<name>); independent table
C10D_TO_LOG = {"allreduce_": "all_reduce", "_allgather_base_": "all_gather", "_reduce_scatter_base_": "reduce_scatter",
               "allgather_into_tensor_coalesced_": "all_gather_into_tensor_coalesced",
               "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced", "broadcast_": "broadcast",
               "allgather_": "all_gather", "alltoall_base_": "all_to_all", "barrier": "barrier"}


def _record(tmp: Path, name: str, *extra: str, active: int = ACTIVE) -> Path:
    script, args = SCRIPTS[name]
    out = tmp / f"rec_{name}"
    steps = ["--steps", str(max(5, WAIT + WARMUP + active + 2))]
    res = run_record(out, torchrun(USER_SCRIPTS / script, 2, *args, *steps, *extra),
                     "--wait", str(WAIT), "--warmup", str(WARMUP), "--active", str(active))
    assert_job_ok(res, out)
    return out


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("user_scripts")
    return {name: _record(tmp, name) for name in SCRIPTS}


@pytest.fixture(scope="module")
def analyses(recordings, tmp_path_factory):
    """name -> (analysis.json, run store) of each recording, analyzed once with `tracekit analyze`."""
    from tracekit.tables.store import RunStore

    tmp = tmp_path_factory.mktemp("user_scripts_analysis")
    cache = {}

    def get(name):
        if name not in cache:
            out = tmp / name
            cache[name] = (_analyze(recordings[name], out), RunStore(out / "tables"))
        return cache[name]

    return get


def _ns(x) -> int:
    return int(Decimal(str(x)) * 1000)


def _steps(trace: dict) -> dict[int, tuple[int, int]]:
    return {int(e["name"].split("#")[1]): (_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]))
            for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")}


def _step_of(ts: int, steps: dict[int, tuple[int, int]]) -> int | None:
    return next((s for s, (lo, hi) in steps.items() if lo <= ts < hi), None)


def _kineto_collectives(trace: dict) -> list[tuple[int | None, str, dict]]:
    """(step, c10d op name, event) of every top-level `c10d::*` call on the training threads."""
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"
          and e.get("name", "").startswith("c10d::")]
    steps = _steps(trace)
    out = []
    for e in ev:
        lo, hi = _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])
        nested = any(o is not e and o["tid"] == e["tid"] and _ns(o["ts"]) <= lo and hi <= _ns(o["ts"]) + _ns(o["dur"])
                     and (_ns(o["ts"]), -_ns(o["dur"])) < (lo, -(hi - lo)) for o in ev)
        if not nested:
            out.append((_step_of(lo, steps), e["name"].split("::", 1)[1], e))
    return out


def _analyze(trace_dir: Path, out: Path) -> dict:
    res = subprocess.run([sys.executable, "-m", "tracekit", "analyze", str(trace_dir), "--out", str(out), "-q"],
                         env=child_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((out / "analysis.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_every_profiled_collective_is_in_the_log_with_its_group(recordings, name):
    out = recordings[name]
    logs = {}
    for rank in (0, 1):
        trace = load_trace(out / f"rank{rank}.pt.trace.json.gz")
        kin = _kineto_collectives(trace)
        assert kin and all(step in WINDOW for step, _, _ in kin)
        header, entries, footer = load_comms(out / f"comms.rank{rank}.jsonl")
        assert footer["status"] == "ok"
        logs[rank] = entries
        got = Counter((e["step"], e["profiling_name"].split(":", 1)[1]) for e in entries)
        want = Counter((step, C10D_TO_LOG[op]) for step, op, _ in kin)
        assert got == want
        for e in entries:
            assert e["process_group"][0] and e["group_ranks"] == [0, 1] and e["source"] == "c10d_dispatcher"
            assert (e["collective_seq_id"] or e["p2p_seq_id"]) >= 1
        if name == "fsdp2":  # clip_grad_norm_'s all-reduce is a functional collective inside DTensor's dispatch
            functional = Counter(_step_of(_ns(e["ts"]), _steps(trace)) for e in trace["traceEvents"]
                                 if e.get("ph") == "X" and e.get("name") == "_c10d_functional::all_reduce")
            assert sorted(functional) == WINDOW
            assert Counter(e["step"] for e in entries if e["profiling_name"] == "gloo:all_reduce") == functional
    key = lambda e: (e["process_group"][0], e["collective_seq_id"])  # noqa: E731
    r0, r1 = ({key(e): e for e in logs[r]} for r in (0, 1))
    assert r0.keys() == r1.keys() and len(r0) == len(logs[0])
    for k in r0:
        assert (r0[k]["profiling_name"], r0[k]["step"]) == (r1[k]["profiling_name"], r1[k]["step"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "tp_sp"])
def test_our_ranges_are_overhead_not_compute(recordings, analyses, name):
    from tracekit.derive import intervals as iv
    from tracekit.derive.activity import load_rank_activity

    out = recordings[name]
    analysis, store = analyses(name)
    reported = {r["rank"]: r for r in analysis["sections"]["recording"]["overhead"]}
    for rank in (0, 1):
        trace = load_trace(out / f"rank{rank}.pt.trace.json.gz")
        steps = _steps(trace)
        ours = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in trace["traceEvents"]
                if e.get("ph") == "X" and e.get("name", "").startswith("tracekit::")]
        assert {e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("tracekit::")} >= {
            "tracekit::flush_collective_log", "tracekit::log_collective"}
        # Independent total: union of our ranges, clipped to the profiled steps (plain integer arithmetic).
        pts = sorted((max(lo, a), min(hi, b)) for lo, hi in ours for a, b in steps.values() if min(hi, b) > max(lo, a))
        total, cur = 0, None
        for a, b in pts:
            if cur is None or a > cur[1]:
                total += 0 if cur is None else cur[1] - cur[0]
                cur = [a, b]
            else:
                cur[1] = max(cur[1], b)
        total += 0 if cur is None else cur[1] - cur[0]
        assert total > 0 and reported[rank]["overhead_ns"] == total
        # The flushes are not compute: the breakdown's compute intervals never cover them.
        act = load_rank_activity(store, rank, {})
        flushes = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in trace["traceEvents"]
                   if e.get("ph") == "X" and e.get("name") == "tracekit::flush_collective_log"]

        fs = iv.union(np.array([a for a, _ in flushes], dtype=np.int64), np.array([b for _, b in flushes], dtype=np.int64))
        assert iv.total(iv.intersect(act.compute, fs)) == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "fsdp2", "tp_sp"])
def test_symmetric_run_has_no_straggler_and_each_collective_once(recordings, analyses, name):
    out = recordings[name]
    analysis, store = analyses(name)
    # Both ranks run the same work, so no straggler may be blamed on work (extra ops, uneven counts). The suite
    # shares two cores between two workers and these two ranks, and a rank the box really slowed is a straggler
    # (issue 12 item 12: no severity cap for one host) — allowed only with the one-host caveat and a cause not
    # blamed on work: host-side, or longer compute on the same ops and no more counted work (a process the box
    # descheduled inside its ops, whose views ran 1.35x slower, under `contention_slowdown`, in one run).
    def blames_work(ev):
        cause = ev.get("cause")
        if cause == "compute":
            return (ev.get("op_count_ratio") or 0.0) >= 1.1 or (ev.get("work_ratio") or 0.0) >= 1.1
        return cause not in ("contention", "host_idle", "unknown")
    bad = [f for f in analysis["findings"] if f["kind"] == "straggler" and f["severity"] in ("warning", "critical")
           and (blames_work(f["evidence"]) or "caveat" not in f["evidence"])]
    assert bad == [], bad
    coll = store.table("collectives").to_pylist()
    for rank in (0, 1):
        kin = _kineto_collectives(load_trace(out / f"rank{rank}.pt.trace.json.gz"))
        rows = [c for c in coll if c["rank"] == rank and c["source"] == "kineto"]
        assert len(rows) == len(kin)  # one row per collective call, none counted twice
        assert all(c["pg_name"] is not None and c["seq_source"] != "order" for c in rows)


def _slept_ns_per_step(log: Path) -> float:
    """What the slow rank really slept per profiled step, as the script timed it (perf_counter around
    its sleep, written to a side file the analyzers never see): the independent truth for its delay."""
    slept = {int(step): int(ns) for step, ns in (line.split() for line in log.read_text().splitlines())}
    assert set(WINDOW) <= set(slept)
    return sum(slept[s] for s in WINDOW) / len(WINDOW)


# FSDP2 issues ~9 collectives a step; on gloo the last arriver's collective also ends last, so it arrives
# last at the next one too. Its delay counts only its extra gap since its own previous collective (the
# comms log's rows take their ends from the profiler's record of the same call): 56.1 ms/step for 50.1
# slept (was 65.7-67.4 when every such queueing lag was added). DDP (one bucket all-reduce a step) reads
# 52.7 ms for 50.1 ms slept.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "fsdp2"])
def test_a_rank_sleeping_50ms_is_the_top_straggler(tmp_path, name):
    log = tmp_path / "slept.txt"
    # recorded with the box alone (a clean-clone CI run beside the other worker's jobs read FSDP2's lateness
    # 65.9 ms, 1.31x); its analysis beside other tests
    with quiet_section():
        out = _record(tmp_path, name, "--slow-rank", "1", "--sleep-ms", "50", "--sleep-log", str(log))
    slept = _slept_ns_per_step(log)
    analysis = _analyze(out, tmp_path / "ana")
    top = analysis["findings"][0]
    assert top["kind"] == "straggler" and top["ranks"] == [1], [
        (f["kind"], f["ranks"], f["est_saving_ns"], {k: f["evidence"].get(k) for k in (
            "cause", "whatif", "replayed_saving_ns", "absorbed_by", "explained_by")}) for f in analysis["findings"]]
    # what fixing it saves (the step replayed with rank 1 at its peers' pace) and its measured lateness: at
    # least 85% of what it slept; on a loaded box the slept rank is also descheduled more after waking, and
    # its peers' pace removes that too (FSDP2 beside two busy processes: 59.5 ms/step late, replayed saving
    # 53.3, for 50.1 slept; beside the file's other tests: saving 62.7 for 51.7). Quiet: within 4%.
    rank1 = next(r for r in analysis["sections"]["stragglers"]["ranks"] if r["rank"] == 1)
    for measured in (top["est_saving_ns"], rank1["delay_ns_per_step"]):
        assert 0.85 * slept <= measured <= 1.3 * slept, (top["est_saving_ns"], rank1["delay_ns_per_step"], slept)


def _aten_ns_per_step(trace: dict) -> float:
    """Mean per profiled step of the time the rank spent in `aten::` ops, each thread's outermost ones
    only (an op inside another is counted once), from the raw json."""
    steps = _steps(trace)
    ops = sorted(((e["tid"], _ns(e["ts"]), _ns(e["dur"])) for e in trace["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e.get("name", "").startswith("aten::")),
                 key=lambda t: (t[0], t[1], -t[2]))
    total, end = 0, {}
    for tid, ts, dur in ops:
        if ts >= end.get(tid, -1):
            end[tid] = ts + dur
            total += dur if _step_of(ts, steps) is not None else 0
    return total / len(steps)


@pytest.mark.slow
def test_fsdp2_rank_with_3x_batch_is_the_top_straggler(tmp_path):
    """The injected delay, measured independently: the extra time the rank with 3x the batch spends in
    aten ops over its peer's in the same run (FSDP2 makes the peer wait inside its post-backward hooks
    and copies, not only inside c10d calls, so time outside collectives is no measure of it; a re-run
    without the fault is none on this box either: its two ranks then compute at once and contend for the
    cores). The model computes for real (`FSDP2_WORK`): with the toy default (~1 ms of compute a step) 3x
    the batch was below the box's noise, and at 64 tokens per sequence a CI run under load saw the extra
    work (34.6 ms/step replayed) tie with the gloo transfers' (34.8): 256 tokens make the work, not the
    communication, grow. Measured beside two busy processes: replayed saving 209-280 ms/step within
    -8.5..+0.5% of this figure, the next finding at 29 ms; quiet: -1.4%, +1.8%. Both figures are means over
    the profiled steps, so 5 of them: over 2, a clean-clone CI run (the other worker's jobs beside it) read
    114 ms/step replayed for 157 measured (-27%), while 12 runs alone or beside busy processes were within 10%.
    Over 5 steps it still failed 3 of 7 clean-clone runs (-15..-19%), each with the other xdist worker's
    multi-process jobs beside it, which preempt the peer outside aten ops too: it is recorded with the box
    alone (`quiet_section`)."""
    with quiet_section():
        out = _record(tmp_path, "fsdp2", "--slow-rank", "1", "--batch-mult", "3", *FSDP2_WORK, active=5)
    t0, t1 = (_aten_ns_per_step(load_trace(out / f"rank{r}.pt.trace.json.gz")) for r in (0, 1))
    injected = t1 - t0
    assert injected > 0.5 * t0  # 3x the batch
    analysis = _analyze(out, tmp_path / "ana")
    top = analysis["findings"][0]
    assert top["kind"] == "straggler" and top["ranks"] == [1], [(f["kind"], f["ranks"]) for f in analysis["findings"]]
    assert abs(top["est_saving_ns"] - injected) <= 0.15 * injected, (top["est_saving_ns"], injected)
