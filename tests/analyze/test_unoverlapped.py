"""Unoverlapped collectives on a hand-built two-rank GPU store; every expected number is recounted
here nanosecond by nanosecond with Python sets (no interval code of tracekit's)."""

from __future__ import annotations

from tracekit.analyze.breakdown import analyze_breakdown
from tracekit.analyze.unoverlapped import analyze_unoverlapped
from tracekit.config import AnalysisConfig
from tracekit.derive.activity import rank_activities
from tracekit.derive.matching import analyze_matching
from tracekit.derive.topology import analyze_layout
from tracekit.findings.finding import FindingKind, Severity

from tests.analyze.analyze_builders import build_store

STEP = (0, 10_000)
COMPUTE = {0: [(0, 4_000), (7_000, 8_000)], 1: [(0, 2_000), (9_000, 9_200)]}
# rank 1's second all_reduce runs concurrently with its first: instance sums exceed the union
COMM = {0: [(3_000, 6_000), (7_500, 9_500)], 1: [(3_000, 6_000), (3_500, 5_000), (7_500, 9_500)]}


def _ns(spans):
    return {t for a, b in spans for t in range(a, b)}


def _store(tmp_path):
    kernels = [{"rank": r, "ts": a, "dur": b - a, "kind": "compute", "stream": 7}
               for r, spans in COMPUTE.items() for a, b in spans]
    kernels += [{"rank": r, "ts": a, "dur": b - a, "kind": "comm", "pg_name": "0", "collective_op": "all_reduce",
                 "stream": 13} for r, spans in COMM.items() for a, b in spans]
    return build_store(tmp_path, {
        "ranks": [{"rank": r, "world_size": 2, "trace_kind": "gpu"} for r in (0, 1)],
        "process_groups": [{"pg_name": "0", "pg_desc": "mesh_dp", "ranks": [0, 1]}],
        "steps": [{"rank": r, "step": 1, "ts": STEP[0], "dur": STEP[1] - STEP[0]} for r in (0, 1)],
        "kernels": kernels,
    })


def _run(store):
    layout = analyze_layout(store)
    activity = rank_activities(store, layout)
    matching = analyze_matching(store, layout)
    breakdown = analyze_breakdown(store, activity, matching, AnalysisConfig())
    return analyze_unoverlapped(store, layout, breakdown, matching, activity)


def test_exposed_time_is_communication_covered_by_no_compute(tmp_path):
    res = _run(_store(tmp_path))
    sec = res.section
    window = set(range(*STEP))
    exposed = {r: len((_ns(COMM[r]) - _ns(COMPUTE[r])) & window) for r in (0, 1)}
    comm = {r: len(_ns(COMM[r]) & window) for r in (0, 1)}
    assert exposed == {0: 3_500, 1: 4_800}  # the hand count the sets confirm
    (row,) = sec["by_dim_op"]
    assert (row["dim"], row["op"], row["instances"]) == ("dp", "all_reduce", 5)
    assert row["comm_ns"] == sum(comm.values()) and row["exposed_ns"] == sum(exposed.values())
    assert row["overlap_ratio"] == round(1 - sum(exposed.values()) / sum(comm.values()), 6)
    # no matched instances (no collectives rows): nothing is waiting, all exposed time is transfer
    assert row["transfer_exposed_ns_per_step"] == max(exposed.values()) and row["worst_rank"] == 1
    assert row["share_of_step"] == max(exposed.values()) / (STEP[1] - STEP[0])
    # per instance, concurrent calls each count their own exposure: the sum exceeds the union
    per_instance = sum(len((_ns([span]) - _ns(COMPUTE[r])) & window) for r in (0, 1) for span in COMM[r])
    assert sec["exposed_ns"] == per_instance and per_instance > sum(exposed.values())
    assert sum(res.instances["exposed_ns"].to_pylist()) == per_instance and res.instances.num_rows == 5


def test_findings_name_the_worst_rank_and_the_communication_bound_one(tmp_path):
    res = _run(_store(tmp_path))
    by_kind = {f.kind: f for f in res.findings}
    worst = 4_800 / 10_000  # rank 1's exposed transfer per step, share of its step
    f = by_kind[FindingKind.UNOVERLAPPED_COLLECTIVE]
    assert f.dim == "dp" and f.ranks == (1,) and f.est_saving_ns == 4_800
    assert f.severity is (Severity.CRITICAL if worst >= 0.40 else Severity.WARNING)
    # rank 1: compute 2,200 < exposed 4,800 (rank 0: compute 5,000 > exposed 3,500): only rank 1 is bound
    b = by_kind[FindingKind.COMMUNICATION_BOUND]
    assert b.ranks == (1,) and b.est_saving_ns == 4_800 and b.dim == "dp"
    assert len(_ns(COMPUTE[1])) == 2_200 and len(_ns(COMPUTE[0])) == 5_000


def test_a_rank_finishing_after_its_peer_is_not_transfer(tmp_path):
    """A 2-rank CPU (gloo) all-reduce: rank 0 arrives at 2 ms, rank 1 at 5 ms, rank 0's record ends at
    6 ms and rank 1's at 9 ms (its gloo thread not running once the data was there: a clean recording beside
    a busy process had it 16.7 ms after its peer's). Transfer = first member's end − last arrival (DESIGN §3):
    1 ms on each rank; rank 0's 3 ms before the last arrival is waiting, rank 1's 3 ms after its peer's end is
    finishing late. Neither is what overlap could hide."""
    ms = 1_000_000
    arrive, end = {0: 2 * ms, 1: 5 * ms}, {0: 6 * ms, 1: 9 * ms}
    step = 10 * ms
    events, coll = [], []
    for r in (0, 1):
        events.append({"rank": r, "tid": 1, "thread_name": "thread 1 (python)", "step": 0, "name": "aten::mm",
                       "cat": "cpu_op", "ts": 0, "dur": arrive[r]})
        events.append({"rank": r, "tid": 2, "thread_name": "thread 2 (pt_gloo_runloop)", "step": 0,
                       "name": "gloo:all_reduce", "cat": "user_annotation", "ts": arrive[r], "dur": end[r] - arrive[r]})
        common = {"rank": r, "pg_name": "0", "pg_desc": "default_pg", "op": "all_reduce", "group_ranks": [0, 1],
                  "group_size": 2, "bytes": 1 << 20, "step": 0, "ts": arrive[r], "dur": end[r] - arrive[r],
                  "enqueue_ts": arrive[r]}
        coll += [{**common, "source": "comms-log", "seq": 1, "seq_source": "log"}, {**common, "source": "kineto", "seq": None}]
    store = build_store(tmp_path, {
        "ranks": [{"rank": r, "world_size": 2, "hostname": "vm", "trace_kind": "cpu", "first_ts": 0, "last_ts": step}
                  for r in (0, 1)],
        "process_groups": [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]}],
        "steps": [{"rank": r, "step": 0, "ts": 0, "dur": step} for r in (0, 1)],
        "events": events, "collectives": coll})
    res = _run(store)
    rows = {(r["rank"], r["op"]): r for r in res.section["by_rank_dim_op"]}
    first_end, last_arrival = min(end.values()), max(arrive.values())
    for r in (0, 1):
        assert rows[(r, "all_reduce")]["exposed_ns"] == end[r] - arrive[r]  # no compute under it
        assert rows[(r, "all_reduce")]["transfer_exposed_ns"] == first_end - last_arrival == ms
