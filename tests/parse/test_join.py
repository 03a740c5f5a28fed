"""join_collectives on hand-made rows: the cases real gloo runs produce (see test_run for real ones)."""

from __future__ import annotations

import pyarrow as pa

from tracekit.parse.join import join_collectives
from tracekit.tables.schema import COLLECTIVES

US = 1_000


def _table(rows: list[dict]) -> pa.Table:
    full = [{f.name: r.get(f.name) for f in COLLECTIVES} for r in rows]
    return pa.Table.from_pylist(full, schema=COLLECTIVES)


def _k(op, start, dur=50 * US, nelems=None, pg=None):
    return {"rank": 0, "source": "kineto", "op": op, "enqueue_ts": start, "enqueue_dur": dur,
            "ts": start, "dur": dur, "in_nelems": nelems, "out_nelems": nelems, "pg_name": pg}


def _l(op, created, seq, pg, nelems=None, p2p=False):
    return {"rank": 0, "source": "comms-log", "op": op, "enqueue_ts": created, "seq": seq, "pg_name": pg,
            "pg_desc": f"desc{pg}", "seq_source": "log", "in_nelems": nelems, "out_nelems": nelems,
            "is_p2p": p2p, "group_ranks": [0, 1], "step": 7}


def _joined(kin, log, shift=0):
    table, stats = join_collectives(_table(kin), _table(log), log_shift_ns=shift)
    return [(r["op"], r["pg_name"], r["seq"], r["seq_source"]) for r in table.to_pylist()], stats


def test_back_to_back_async_ops_matched_by_size() -> None:
    # Two async all_reduces issued 260 µs apart; the first c10d op starts after the first entry.
    log = [_l("all_reduce", 1_000 * US, 2, "13", 66304), _l("all_reduce", 1_260 * US, 3, "13", 16384)]
    kin = [_k("all_reduce", 1_080 * US, 40 * US, 66304), _k("all_reduce", 1_330 * US, 40 * US, 16384)]
    rows, stats = _joined(kin, log)
    assert rows == [("all_reduce", "13", 2, "log"), ("all_reduce", "13", 3, "log")]
    assert stats.matched_by_order == 2


def test_entries_before_the_profiled_window_and_unlogged_ops() -> None:
    log = [_l("all_reduce", t * US, i + 1, "0", 12) for i, t in enumerate([100, 200, 300, 400])]
    kin = [_k("broadcast", 250 * US, nelems=22),          # DDP's own broadcast: not in the log
           _k("all_reduce", 320 * US, nelems=12), _k("all_reduce", 430 * US, nelems=12)]
    rows, stats = _joined(kin, log)
    # the broadcast names no group and the rank's groups are not given: no group, no seq, a note
    assert rows == [("broadcast", None, None, None), ("all_reduce", "0", 3, "log"), ("all_reduce", "0", 4, "log")]
    assert (stats.matched_by_order, stats.numbered_by_order, stats.no_group) == (2, 0, 1)
    # the rank belongs to one group only: that is the broadcast's group, numbered by order within it
    table, stats = join_collectives(_table(kin), _table(log), groups=[{"pg_name": "0", "ranks": [0, 1], "size": 2}])
    first = table.to_pylist()[0]
    assert (first["pg_name"], first["seq"], first["seq_source"]) == ("0", 1, "order")
    assert "inferred" in first["match_note"] and (stats.group_inferred, stats.no_group) == (1, 0)
    # two groups of the rank fit it: left without a group, with a note saying why
    two = [{"pg_name": "0", "ranks": [0, 1], "size": 2}, {"pg_name": "1", "ranks": [0, 1], "size": 2}]
    first = join_collectives(_table(kin), _table(log), groups=two)[0].to_pylist()[0]
    assert (first["pg_name"], first["seq"]) == (None, None) and "2 of this rank's groups" in first["match_note"]


def test_trace_clock_behind_the_log_clock() -> None:
    # Same-size ops 1 ms apart; the trace clock runs 150 µs behind, so each op "starts" before
    # its entry was created. The skew estimate must keep every op on its own entry.
    log = [_l("all_reduce", t * US, i + 1, "0", 8) for i, t in enumerate(range(1000, 9000, 1000))]
    kin = [_k("all_reduce", (t + 60 - 150) * US, nelems=8) for t in range(3000, 9000, 1000)]
    rows, _ = _joined(kin, log)
    assert [r[2] for r in rows] == [3, 4, 5, 6, 7, 8]


def test_log_shift_and_exact_seq_join() -> None:
    base = 1_790_000_000_000_000_000
    log = [_l("all_gather", base + 500 * US, 5, "2", 24), _l("all_gather", base + 900 * US, 6, "2", 24)]
    kin = [dict(_k("all_gather", 910 * US, nelems=24, pg="2"), seq=6, seq_source="args"),
           _k("all_gather", 520 * US, nelems=24)]
    table, stats = join_collectives(_table(kin), _table(log), log_shift_ns=base)
    got = table.to_pylist()
    assert [(r["seq"], r["seq_source"], r["pg_name"], r["pg_desc"], r["step"]) for r in got] == \
        [(6, "args", "2", "desc2", 7), (5, "log", "2", "desc2", 7)]
    assert (stats.matched_by_seq, stats.matched_by_order) == (1, 1)


def test_no_log_numbers_by_order_per_group() -> None:
    kin = [_k("all_reduce", 300, pg="a"), _k("all_reduce", 100, pg="b"), _k("all_reduce", 200, pg="a")]
    table, stats = join_collectives(_table(kin), None)
    assert [(r["pg_name"], r["seq"], r["seq_source"]) for r in table.to_pylist()] == \
        [("a", 2, "order"), ("b", 1, "order"), ("a", 1, "order")]
    assert stats.numbered_by_order == 3 and stats.warnings == []


def test_ops_closer_together_than_the_skew_margin() -> None:
    # Fast back-to-back launches 10 µs apart, each logged 1 µs before its op: spacing below the
    # 20 µs margin, so only the typical-lead rule keeps every op on its own entry.
    log = [_l("all_reduce", 3_000 * US + i * 10 * US - 1_000, i + 1, "0", 12) for i in range(20)]
    kin = [_k("all_reduce", 3_000 * US + i * 10 * US, 5 * US, 12) for i in range(20)]
    rows, stats = _joined(kin, log)
    assert [r[2] for r in rows] == list(range(1, 21)) and stats.numbered_by_order == 0


def test_long_tail_lead_of_batched_recv() -> None:
    # A recv posted in a batch: its entry is created 5 ms before the c10d op; the next recv entry
    # comes 2 ms after the op started. The earlier entry is the right one.
    log = [_l("send", 0, 1, "1", 8, True), _l("recv", 10 * US, 1, "1", 8, True),
           _l("send", 6_000 * US, 2, "1", 8, True), _l("recv", 6_010 * US, 2, "1", 8, True),
           _l("send", 7_000 * US, 3, "1", 8, True)]
    kin = [_k("send", 80 * US, nelems=8), _k("recv", 5_010 * US, nelems=8),
           _k("send", 6_090 * US, nelems=8), _k("recv", 6_100 * US, nelems=8), _k("send", 7_085 * US, nelems=8)]
    rows, _ = _joined(kin, log)
    assert [(r[0], r[2]) for r in rows] == [("send", 1), ("recv", 1), ("send", 2), ("recv", 2), ("send", 3)]
