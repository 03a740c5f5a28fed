"""A rank with no collective log: `join_collectives` numbers its rows without seq by order as columns
(`join.numbered_without_log`), exactly as the row path (`_number_by_order`) does."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tracekit.parse import join as J
from tracekit.tables.schema import conform


def _table(pg, op, p2p, seq, enq, ts) -> pa.Table:
    n = len(pg)
    return conform("collectives", pa.table({
        "rank": pa.array([0] * n, pa.int32()), "pg_name": pa.array(pg, pa.string()), "op": pa.array(op),
        "is_p2p": pa.array(p2p, pa.bool_()), "seq": pa.array(seq, pa.int64()),
        "seq_source": pa.array(["args" if s is not None else None for s in seq], pa.string()),
        "enqueue_ts": pa.array(enq, pa.int64()), "ts": pa.array(ts, pa.int64()), "dur": pa.array([5] * n, pa.int64())}))


def _row_path(k: pa.Table) -> tuple[pa.Table, int]:
    rows = J.table_rows(k)
    J.resolve_groups(rows, [])
    n = J._number_by_order(rows)
    return conform("collectives", pa.Table.from_pylist(rows, schema=k.schema)), n


def test_rows_without_seq_numbered_by_start_within_group_and_p2p():
    # group "a": an all_reduce with seq 7 kept; the others numbered by start (enqueue time first), a row
    # without any start last, a tie in table order; "a" p2p (a send, and is_p2p set) counted apart; "b" apart
    k = _table(pg=["a", "a", "a", "a", "a", "b", "a", "a"],
               op=["all_reduce", "all_reduce", "all_reduce", "send", "all_gather", "all_reduce", "recv", "all_reduce"],
               p2p=[False, False, False, False, None, False, True, False],
               seq=[7, None, None, None, None, None, None, None],
               enq=[None, None, 30, None, None, None, None, None],
               ts=[1, 50, 99, 10, 20, 5, 3, 20])
    joined, stats = J.join_collectives(k, None)
    # non-p2p "a" rows without seq: idx1 start 50, idx2 start 30 (enqueue), idx4 start 20, idx7 start 20
    # -> order idx4 (20), idx7 (20, after in table order), idx2 (30), idx1 (50); p2p "a": idx6 (3), idx3 (10)
    assert joined.column("seq").to_pylist() == [7, 4, 3, 2, 1, 1, 1, 2]
    assert joined.column("seq_source").to_pylist() == ["args"] + ["order"] * 7
    assert stats.numbered_by_order == 7
    k2 = _table(pg=["a", "a"], op=["all_reduce"] * 2, p2p=[False] * 2, seq=[None, None], enq=[None, None],
                ts=[None, 4])
    assert J.join_collectives(k2, None)[0].column("seq").to_pylist() == [2, 1]  # no start: last


def test_equal_to_the_row_path_on_random_tables():
    rng = np.random.default_rng(3)
    for _ in range(40):
        n = int(rng.integers(1, 60))
        k = _table(pg=rng.choice(["pg0", "pg1", "pg2"], n).tolist(),
                   op=rng.choice(["all_reduce", "send", "recv", "all_to_all"], n).tolist(),
                   p2p=[None if x == 2 else bool(x) for x in rng.integers(0, 3, n)],
                   seq=[None if rng.random() < 0.6 else int(rng.integers(0, 9)) for _ in range(n)],
                   enq=[None if rng.random() < 0.7 else int(rng.integers(0, 20)) for _ in range(n)],
                   ts=[None if rng.random() < 0.1 else int(rng.integers(0, 20)) for _ in range(n)])
        want, n_want = _row_path(k)
        got, stats = J.join_collectives(k, None)
        assert got.equals(want) and stats.numbered_by_order == n_want


def test_a_row_without_group_takes_the_row_path():
    k = _table(pg=[None, "a"], op=["all_reduce"] * 2, p2p=[False] * 2, seq=[None, None], enq=[None, None], ts=[1, 2])
    got, stats = J.join_collectives(k, None, groups=[])
    assert stats.no_group == 1 and got.column("seq").to_pylist() == [None, 1]
