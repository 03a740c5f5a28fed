"""The late rank's delay in matching: counted from the group's previous collective's end and no more
than its extra gap since its own previous collective (gloo: the last arriver's collective also ends
last, so it stays last at the next one without being slow again); and comms-log rows, which carry no
end on CPU, take the end of the profiler's record of the same call."""

from __future__ import annotations

import numpy as np

from tracekit.derive.matching import COLUMNS, _aggregate_instances, _instances_frame, fill_log_ends
from tracekit.tables.columns import arrow_columns

from tests.analyze.analyze_builders import table

MS = 1_000_000


def _instances(rows: list[tuple[int, int, int, int]]):
    """rows: (rank, seq, arrival, end) on one group."""
    n = len(rows)
    rank, seq, arrival, end = (np.array(c, np.int64) for c in zip(*rows))
    cols = {"pg_name": np.array(["world"] * n, object), "seq": seq, "op": np.array(["all_gather"] * n, object),
            "rank": rank, "arrival": arrival, "end": end, "end_ok": np.ones(n, bool),
            "step": np.ones(n, np.int64), "step_ok": np.ones(n, bool), "group_size": np.full(n, 2, np.int64),
            "group_size_ok": np.ones(n, bool), "seq_basis": np.array(["log"] * n, object)}
    return _instances_frame(_aggregate_instances(cols, {"world": "dp"})).frame().set_index("seq")


def test_a_rank_whose_collectives_end_later_is_late_only_by_its_extra_gap():
    # Both ranks compute 1 ms between collectives; rank 1 ends each collective 1 ms after rank 0 (so it
    # arrives 1 ms after rank 0 at the next) and before seq 3 it sleeps 50 ms more.
    rows, t0, t1 = [], 0, 1 * MS
    for seq in range(1, 6):
        extra = 50 * MS if seq == 3 else 0
        a0, a1 = t0, t1 + extra
        transfer_end = max(a0, a1) + 2 * MS
        rows += [(0, seq, a0, transfer_end), (1, seq, a1, transfer_end + 1 * MS)]
        t0, t1 = transfer_end + 1 * MS, transfer_end + 2 * MS
    inst = _instances(rows)
    # by hand: seq 1 has no previous end (the old rule: 1 ms); seq 3 rank 1's gap 51 ms vs rank 0's 1 ms
    assert inst["last_rank"].tolist() == [1] * 5
    assert inst["delay"].to_dict() == {1: 1 * MS, 2: 0, 3: 50 * MS, 4: 0, 5: 0}


def test_the_old_rule_bounds_the_delay_when_the_gap_says_more():
    # rank 0 arrives after rank 1's previous collective ended: delay = last - second-to-last (3 ms), even
    # though rank 1's own gap is 8 ms longer than rank 0's
    inst = _instances([(0, 1, 0, 10 * MS), (1, 1, 1 * MS, 2 * MS),
                       (0, 2, 12 * MS, 20 * MS), (1, 2, 15 * MS, 20 * MS)])
    assert inst.loc[2, "delay"] == 3 * MS


def _row(rank, source, seq, ts, dur, seq_source="log", enqueue=None):
    return {"rank": rank, "source": source, "pg_name": "0", "seq": seq, "seq_source": seq_source,
            "is_p2p": False, "op": "all_gather", "ts": ts, "dur": dur, "enqueue_ts": enqueue}


def test_log_rows_take_the_end_of_the_profiler_record_of_the_same_call():
    cols = arrow_columns(table("collectives", [
        _row(0, "comms-log", 1, None, None, enqueue=100), _row(0, "kineto", 1, 105, 40),  # end 145
        _row(1, "comms-log", 1, None, None, enqueue=200), _row(1, "kineto", 1, 210, 30),  # shift unknown
        _row(0, "comms-log", 2, None, None, enqueue=300), _row(0, "kineto", 2, 305, 9, seq_source="order"),
        _row(0, "comms-log", 3, 400, 5, enqueue=390), _row(0, "kineto", 3, 401, 50),  # the log's own end stays
    ]).select(COLUMNS))
    out = fill_log_ends(cols, {0: 10, 1: None})
    end = [int(e) if ok else None for e, ok in zip(out["end"], out["end_ok"])]
    log = {(int(r), int(s)): e for r, s, e, src in zip(out["rank"], out["seq"], end, out["source"])
           if src == "comms-log"}
    assert log[(0, 1)] == 145 - 10 and log[(1, 1)] is None and log[(0, 2)] is None and log[(0, 3)] == 405
    assert [e for e, src in zip(end, out["source"]) if src == "kineto"] == [145, 240, 314, 451]
