"""The numpy column helpers the what-if builder and fixes group and join with (tracekit/whatif/columns.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tracekit.whatif.columns import arrow_columns, codes, first_of_group, group_median, lookup


def test_codes_number_key_tuples_in_sorted_order():
    rank = np.array([1, 0, 1, 0, 1])
    pg = np.array(["b", "a", "a", "a", "b"], dtype=object)
    code, n = codes(rank, pg)
    assert n == 3
    assert code.tolist() == [2, 0, 1, 0, 2]  # (0, a) < (1, a) < (1, b)
    assert first_of_group(code, n).tolist() == [1, 2, 0]
    assert codes(np.zeros(0, np.int64))[1] == 0


def test_group_median_leaves_groups_without_rows_nan():
    out = group_median(np.array([0, 0, 2, 0]), 3, np.array([1.0, 5.0, 7.0, 2.0]))
    assert out[0] == 2.0 and np.isnan(out[1]) and out[2] == 7.0


def test_lookup_is_a_left_join_on_the_first_match():
    left = [np.array([0, 1, 2]), np.array(["x", "y", "x"], dtype=object)]
    right = [np.array([2, 1, 1]), np.array(["x", "y", "y"], dtype=object)]
    assert lookup(left, right).tolist() == [-1, 1, 0]
    assert lookup(left, [np.zeros(0, np.int64), np.zeros(0, object)]).tolist() == [-1, -1, -1]


def test_arrow_columns_keep_epoch_nanoseconds_exact_beside_a_null_mask():
    ts = 1_661_203_462_602_605_001  # not representable in float64
    t = pa.table({"ts": pa.array([ts, None], pa.int64()), "pg": pa.array(["a", None]),
                  "op": pa.array(["send", "recv"]).dictionary_encode()})
    cols = arrow_columns(t)
    assert cols["ts"].dtype == np.int64 and int(cols["ts"][0]) == ts
    assert cols["ts_ok"].tolist() == [True, False]
    assert cols["pg"].tolist() == ["a", None] and cols["op"].tolist() == ["send", "recv"]
