"""Collectives the trace files under no process group (DDP's buffer broadcast on gloo: its CPU event names
none, and the comms log never saw it) are paired across ranks only by what the times show: the same
position among the same op's calls of the same step, every rank with that op in that step having as many,
and every member ending within the quickest member's own time in it of the others. Otherwise they stay out
of matching (`no_group`), as before. Expected waits are worked out by hand from the rows below."""

from __future__ import annotations

from tracekit.derive.matching import UNNAMED_GROUP, match_collectives

from tests.analyze.analyze_builders import build_store

MS = 1_000_000


def _log(rank, seq, t, dur=MS, step=1):
    """A logged all_reduce on group "dp" (makes the comms log each rank's chosen source)."""
    return {"rank": rank, "source": "comms-log", "pg_name": "dp", "seq": seq, "seq_source": "log",
            "op": "all_reduce", "ts": t, "dur": dur, "enqueue_ts": t, "group_size": 2, "step": step}


def _unnamed(rank, t, dur, step=1, op="broadcast"):
    """A profiler collective with no group and no seq (the parser's `resolve_groups` left it so)."""
    return {"rank": rank, "source": "kineto", "op": op, "ts": t, "dur": dur, "step": step}


def _match(tmp_path, coll):
    ranks = [{"rank": r, "world_size": 2, "hostname": "h", "first_ts": 0, "last_ts": 10_000 * MS,
              "trace_kind": "cpu"} for r in (0, 1)]
    logged = [_log(r, s, 500 * MS + 10 * s * MS) for r in (0, 1) for s in (1, 2)]
    return match_collectives(build_store(tmp_path, {"ranks": ranks, "collectives": logged + coll}), {"dp": "dp"})


def _unnamed_rows(matched):
    rows = matched.rows
    return rows[rows["pg_name"] == UNNAMED_GROUP].sort_values(["seq", "rank"])


def test_a_broadcast_rank_0_waits_in_for_a_stalled_rank_1_is_paired_and_its_wait_counted(tmp_path):
    # rank 0 enters at 10 ms and waits; rank 1 stalls and enters at 60 ms; both end at 61 ms (+0.1 ms)
    # then a second broadcast both enter within 0.2 ms of each other
    matched, _, section = _match(tmp_path, [
        _unnamed(0, 10 * MS, 51 * MS), _unnamed(1, 60 * MS, 1 * MS + 100_000),
        _unnamed(0, 70 * MS, 1 * MS), _unnamed(1, 70 * MS + 200_000, 900_000)])
    assert section["no_group"] == 0 and section["no_group_paired"] == 4
    rows = _unnamed_rows(matched)
    assert rows[["seq", "rank", "wait", "is_last"]].values.tolist() == [
        [1, 0, 50 * MS, False], [1, 1, 0, True], [2, 0, 200_000, False], [2, 1, 0, True]]
    # the wait is on rank 0's trace clock as an interval: [10 ms, 60 ms) among its other waits
    assert any(s == 10 * MS and e == 60 * MS for s, e in zip(*matched.wait_intervals[0]))
    inst = matched.instances.set_index("key")
    assert inst.loc[f"{UNNAMED_GROUP}#1", "last_rank"] == 1 and inst.loc[f"{UNNAMED_GROUP}#1", "skew"] == 50 * MS


def test_ends_that_do_not_meet_are_not_one_collective(tmp_path):
    # same position, same op, same step, but rank 0's call ends 20 ms before rank 1's ends and rank 1
    # spent only 1 ms in its own: two unrelated calls (different groups), never paired
    _, _, section = _match(tmp_path, [_unnamed(0, 10 * MS, 5 * MS), _unnamed(1, 34 * MS, 1 * MS)])
    assert section["no_group"] == 2 and section["no_group_paired"] == 0
    assert any("without a process group" in w for w in section["warnings"])


def test_uneven_counts_in_a_step_and_calls_of_different_steps_stay_unpaired(tmp_path):
    # step 1: rank 0 has two broadcasts, rank 1 one (positions would shift); step 2 vs step 3: one
    # broadcast each, ends together, but in different steps. Only step 4's pair (ends together) is kept.
    _, _, section = _match(tmp_path, [
        _unnamed(0, 10 * MS, 2 * MS), _unnamed(0, 13 * MS, 1 * MS), _unnamed(1, 11 * MS, 1 * MS),
        _unnamed(0, 100 * MS, 2 * MS, step=2), _unnamed(1, 101 * MS, 1 * MS, step=3),
        _unnamed(0, 200 * MS, 2 * MS, step=4), _unnamed(1, 201 * MS, 1 * MS, step=4)])
    assert section["no_group"] == 5 and section["no_group_paired"] == 2
