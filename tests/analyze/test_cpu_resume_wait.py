"""Issue 32 (user scripts on a loaded box): what the trace shows around a blocking gloo collective wrapped in
a user's op, and the severity of a root finding that absorbs its symptom.

A user's autograd Function around `all_to_all_single` (tests/user_scripts/moe_ep.py's `AllToAll`) records
the wrapper on the training thread and `gloo:all_to_all` on gloo's thread. On a loaded box the wrapper ends
1-9 ms after gloo's record (measured on the MoE job: 4-8 ms on the rank that arrived last), with no op
recorded in between: the thread waking up, not work. The replay keeps that time as a gap after the
collective's release, not as compute a fix would scale. Expected values come from the intervals written.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from tracekit.findings.evidence import HostStallEvidence, StragglerEvidence
from tracekit.findings.finding import Finding, FindingKind, Severity

US, MS = 1_000, 1_000_000
T0 = 1_000_000_000_000  # ns
STEP = 40 * MS
WORK = {0: 10 * MS, 1: 20 * MS}  # aten::mm before the collective
TAIL = {0: 100 * US, 1: 6 * MS}  # the wrapper's own time after gloo's record ended
GLOO_END = 20 * MS + 500 * US  # the exchange ends after the last arrival (rank 1 at 20 ms)
AFTER = 50 * US  # from the wrapper's end to the next op
ADD = 4 * MS


def _x(name: str, cat: str, ts: int, dur: int, tid: int = 7) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": (T0 + ts) / 1000, "dur": dur / 1000,
            "args": {}}


AR_END = 5 * MS  # an asynchronous all_reduce issued at the step's start ends inside the mm's own time
MM_AT = 200 * US  # where the mm starts when the all_reduce is there, its child copy_ 100 µs long


def _write_run(root: Path, async_all_reduce: bool = False) -> Path:
    for rank in (0, 1):
        evs = []
        for k in range(3):
            t, work, tail = k * STEP, WORK[rank], TAIL[rank]
            evs.append(_x(f"ProfilerStep#{k + 1}", "user_annotation", t, STEP))
            if async_all_reduce:
                evs += [_x("c10d::allreduce_", "cpu_op", t, 100 * US),
                        _x("gloo:all_reduce", "user_annotation", t + 50 * US, AR_END - 50 * US, tid=10),
                        _x("aten::mm", "cpu_op", t + MM_AT, work - MM_AT),
                        _x("aten::copy_", "cpu_op", t + MM_AT, 100 * US)]
            else:
                evs.append(_x("aten::mm", "cpu_op", t, work))
            evs += [_x("AllToAll", "cpu_op", t + work, GLOO_END + tail - work),
                    _x("c10d::alltoall_base_", "cpu_op", t + work + 10 * US, 100 * US),
                    _x("gloo:all_to_all", "user_annotation", t + work + 50 * US, GLOO_END - work - 50 * US, tid=9),
                    _x("aten::add", "cpu_op", t + GLOO_END + tail + AFTER, ADD)]
        doc = {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 2, "backend": "gloo"},
               "traceEvents": evs}
        (root / "t").mkdir(parents=True, exist_ok=True)
        with gzip.open(root / "t" / f"rank{rank}.pt.trace.json.gz", "wt") as fh:
            json.dump(doc, fh)
    return root / "t"


def test_a_wrappers_time_after_its_collective_ended_is_a_gap_not_compute(tmp_path):
    from tracekit.assess.whatif import run_whatif
    from tracekit.parse.run import parse_run
    from tracekit.whatif.graph import Category

    store = parse_run(_write_run(tmp_path), tmp_path / "s", progress=False).store
    out = run_whatif(store, [])
    assert [(s["measured_ns"], s["replayed_ns"]) for s in out["steps"]] == [(STEP, STEP)] * 3
    g = out["results"][0].graph
    for rank in (0, 1):
        mine = np.flatnonzero((g.rank == rank) & (g.category == Category.COMPUTE))
        # compute per step: the mm, the wrapper's own time before its call (10 µs), the add; not the tail
        assert int(g.dur[mine].sum()) == 3 * (WORK[rank] + 10 * US + ADD), rank
        add = mine[[g.name[i] == "aten::add" for i in mine.tolist()]]
        # the add follows the collective's release: its gap is the wrapper's tail and the 50 µs after it
        assert g.gap[add].tolist() == [TAIL[rank] + AFTER] * 3, rank


def test_an_op_running_when_an_asynchronous_collective_ends_keeps_its_own_time_as_compute(tmp_path):
    """An all_reduce issued at the step's start (a DDP bucket's kind) ends inside a later matmul's own time
    (the matmul has a child): the matmul did not issue it nor wait for it, so its own time after that end
    is its work (before the end it is waiting, as for any op's own time while a collective is outstanding)."""
    from tracekit.assess.whatif import run_whatif
    from tracekit.parse.run import parse_run
    from tracekit.whatif.graph import Category

    store = parse_run(_write_run(tmp_path, async_all_reduce=True), tmp_path / "s", progress=False).store
    out = run_whatif(store, [])
    assert [(s["measured_ns"], s["replayed_ns"]) for s in out["steps"]] == [(STEP, STEP)] * 3
    g = out["results"][0].graph
    for rank in (0, 1):
        mine = np.flatnonzero((g.rank == rank) & (g.category == Category.COMPUTE))
        mm = mine[[g.name[i] == "aten::mm" for i in mine.tolist()]]
        # the mm's own time from the all_reduce's end to its own end, each step
        assert sorted(g.dur[mm].tolist()) == [WORK[rank] - AR_END] * 3, rank
        # per step: the copy_, the mm after the all_reduce's end, the wrapper before its call, the add
        assert int(g.dur[mine].sum()) == 3 * (100 * US + WORK[rank] - AR_END + 10 * US + ADD), rank


def _root_and_symptom(root_sev: Severity, symptom_sev: Severity) -> list[Finding]:
    root = Finding(kind=FindingKind.STRAGGLER, severity=root_sev, ranks=(1,), dim="world", summary="rank 1 late",
                   evidence=StragglerEvidence(cause="host_idle", delay_ns_per_step=14 * MS), recommendation="",
                   est_saving_ns=14 * MS)
    symptom = Finding(kind=FindingKind.IDLE_HOST_BOUND, severity=symptom_sev, ranks=(1,), dim=None,
                      summary="rank 1 stalls", recommendation="", est_saving_ns=30 * MS,
                      evidence=HostStallEvidence(cause="host_gap", stall_ns=30 * MS))
    return [root, symptom]


def test_the_root_of_an_absorbed_warning_is_at_least_a_warning():
    """A straggler (info: a host-side cause late by 12% of the step, under the 25% timing-noise guard) whose
    fix holds its idle_host_bound's (warning: host gaps of 12% of every step, measured on the rank) and
    saves as much absorbs it: the root on top is a warning, the symptom keeps its own and saves 0."""
    from tracekit.assess.critical_path import _absorbed
    from tracekit.whatif.fixes import Fix

    fixes = [[Fix("rank_compute", rank=1), Fix("host_stalls", rank=1)], [Fix("host_stalls", rank=1)]]
    rows = [{"finding": i, "saving_ns": 16 * MS, "counted": True} for i in (0, 1)]
    for symptom_sev in (Severity.WARNING, Severity.CRITICAL):
        root, symptom = _absorbed(_root_and_symptom(Severity.INFO, symptom_sev), rows, fixes)
        assert (root.severity, root.est_saving_ns) == (Severity.WARNING, 14 * MS)
        assert root.evidence.details["severity_from_absorbed"] == {"from": "info", "to": "warning",
                                                                   "symptom": "idle_host_bound"}
        assert (symptom.severity, symptom.est_saving_ns) == (symptom_sev, 0)
        assert symptom.evidence.absorbed_by == {"kind": "straggler", "ranks": [1]}
    # a root at warning stays as it is (each kind judges warning and critical on its own scale); so does an
    # info root whose symptom is info
    root, _ = _absorbed(_root_and_symptom(Severity.WARNING, Severity.CRITICAL), rows, fixes)
    assert root.severity == Severity.WARNING and "severity_from_absorbed" not in root.evidence.details
    root, _ = _absorbed(_root_and_symptom(Severity.INFO, Severity.INFO), rows, fixes)
    assert root.severity == Severity.INFO
    # a symptom that saves more than the root is not absorbed: nothing moves
    rows[1]["saving_ns"] = 20 * MS
    root, symptom = _absorbed(_root_and_symptom(Severity.INFO, Severity.WARNING), rows, fixes)
    assert root.severity == Severity.INFO and symptom.est_saving_ns == 30 * MS
