"""The numpy column helpers matching, clocks and the what-if builder group and join with (tracekit/tables/columns.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tracekit.tables.columns import (argsort_desc, arrow_columns, first_of_group, group_ids, group_median, match_rows,
                                     merged_codes, recode, sorted_codes, sorted_unique, table_rows, unique_inverse,
                                     unique_pairs)


def test_group_ids_number_key_tuples_in_sorted_order():
    rank = np.array([1, 0, 1, 0, 1])
    pg = np.array(["b", "a", "a", "a", "b"], dtype=object)
    code, n = group_ids(rank, pg)
    assert n == 3
    assert code.tolist() == [2, 0, 1, 0, 2]  # (0, a) < (1, a) < (1, b)
    assert first_of_group(code, n).tolist() == [1, 2, 0]
    assert group_ids(np.zeros(0, np.int64))[1] == 0


def test_group_median_leaves_groups_without_rows_nan():
    out = group_median(np.array([0, 0, 2, 0]), 3, np.array([1.0, 5.0, 7.0, 2.0]))
    assert out[0] == 2.0 and np.isnan(out[1]) and out[2] == 7.0


def test_group_median_is_numpys_median_group_by_group():
    """One sort for every group gives np.median's value of each: the middle, or the mean of the two middle
    values (even counts), int64 beyond float64's exact range included, NaN for a group holding NaN."""
    rng = np.random.default_rng(7)
    for trial in range(60):
        n = int(rng.integers(1, 9))
        code = rng.integers(0, n, int(rng.integers(0, 40)))
        values = (rng.integers(2**60, 2**62, code.size) if trial % 3 == 0 else rng.integers(0, 4, code.size)
                  if trial % 3 == 1 else rng.normal(size=code.size) * 1e9)
        if trial % 5 == 4 and code.size:
            values = values.astype(np.float64)
            values[0] = np.nan
        got = group_median(code, n, values)
        want = [np.median(values[code == k]) if (code == k).any() else np.nan for k in range(n)]
        assert np.array_equal(got, np.array(want, np.float64), equal_nan=True)


def test_match_rows_is_a_left_join_on_the_first_match():
    left = [np.array([0, 1, 2]), np.array(["x", "y", "x"], dtype=object)]
    right = [np.array([2, 1, 1]), np.array(["x", "y", "y"], dtype=object)]
    assert match_rows(left, right).tolist() == [-1, 1, 0]
    assert match_rows(left, [np.zeros(0, np.int64), np.zeros(0, object)]).tolist() == [-1, -1, -1]


def test_arrow_columns_keep_epoch_nanoseconds_exact_beside_a_null_mask():
    ts = 1_661_203_462_602_605_001  # not representable in float64
    t = pa.table({"ts": pa.array([ts, None], pa.int64()), "pg": pa.array(["a", None]),
                  "op": pa.array(["send", "recv"]).dictionary_encode()})
    cols = arrow_columns(t)
    assert cols["ts"].dtype == np.int64 and int(cols["ts"][0]) == ts
    assert cols["ts_ok"].tolist() == [True, False]
    assert cols["pg"].tolist() == ["a", None] and cols["op"].tolist() == ["send", "recv"]


def test_argsort_desc_orders_ties_as_pandas_sort_values_does():
    import pandas as pd

    values = np.array([3, 1, 3, 2, 1, 3, 0, 2, 2, 1, 3, 1, 0, 2, 3, 1, 2, 0, 3, 1], np.int64)
    want = pd.Series(values).sort_values(ascending=False).index.to_numpy()
    assert argsort_desc(values).tolist() == want.tolist()


def test_table_rows_are_pyarrows_rows_value_for_value_and_type_for_type():
    """Every column type the store holds (int32/int64 with epoch-scale ns, float64, bool, dictionary and plain
    text, a list column by pyarrow's own path), with and without nulls, in several chunks: the rows equal
    `Table.to_pylist()`'s and each value has its Python type (an int stays an int, not a float)."""
    rng = np.random.default_rng(3)
    n = 257
    null = rng.random(n) < 0.2

    def masked(values):
        return [None if m else v for v, m in zip(values, null.tolist())]

    ns = (1_700_000_000_000_000_000 + rng.integers(0, 10**12, n)).tolist()
    cols = {
        "rank": pa.array(rng.integers(0, 4, n).tolist(), pa.int32()),
        "ts": pa.array(ns, pa.int64()),
        "dur": pa.array(masked(ns), pa.int64()),
        "flops": pa.array(masked(rng.random(n).tolist()), pa.float64()),
        "ok": pa.array(masked((rng.random(n) < 0.5).tolist()), pa.bool_()),
        "flag": pa.array((rng.random(n) < 0.5).tolist(), pa.bool_()),
        "name": pa.array(masked([f"op{i % 7}" for i in range(n)]), pa.string()).dictionary_encode(),
        "pg": pa.array(masked([f"g{i % 3}" for i in range(n)]), pa.string()),
        "dims": pa.array([[i, i + 1] if i % 5 else None for i in range(n)], pa.list_(pa.int64())),
    }
    t = pa.table(cols)
    chunked = pa.concat_tables([t.slice(0, 100), t.slice(100)])
    for table in (t, chunked, t.slice(0, 0)):
        want = table.to_pylist()
        got = table_rows(table)
        assert got == want
        assert all(type(a[k]) is type(b[k]) for a, b in zip(got, want) for k in a)
    assert table_rows(t)[0]["ts"] == ns[0]  # exact: no float64 on the way


def test_sorted_unique_is_numpys_unique_for_every_dtype_and_shape():
    """The sort-based distinct values are np.unique's, value for value and dtype for dtype: integers of every
    width, booleans, 2-D input (flattened), empty and one-element arrays; floats with NaN and objects are
    np.unique's own (NaNs folded into one)."""
    for dtype, x in _arrays_of_every_dtype(11, (0, 1, 2, 7, 300)):
        want, got = np.unique(x), sorted_unique(x)
        assert got.dtype == want.dtype
        assert np.array_equal(got, want, equal_nan=dtype is np.float64)
    grid = np.random.default_rng(11).integers(0, 5, (4, 6))
    assert sorted_unique(grid).tolist() == sorted(set(grid.ravel().tolist()))
    assert sorted_unique([3, 1, 3, 2**62]).tolist() == [1, 3, 2**62]


def test_recode_numbers_a_subsets_groups_as_grouping_its_keys_again():
    """Group ids of all rows, restricted to some rows and renumbered, are the ids of grouping those rows' keys
    (dense, in key order), as np.unique's inverse of the ids."""
    rng = np.random.default_rng(5)
    for _ in range(30):
        keys = np.array([f"pg{int(k)}#{int(k) * 7}" for k in rng.integers(0, 40, int(rng.integers(0, 200)))], object)
        ids, _ = group_ids(keys)
        keep = rng.random(keys.size) < 0.4
        want = sorted(set(keys[keep].tolist()))
        got = recode(ids[keep])
        assert got.tolist() == [want.index(k) for k in keys[keep].tolist()]
        assert got.dtype == np.int64


def test_unique_pairs_are_the_distinct_pairs_in_lexicographic_order():
    """The distinct (a, b) pairs, sorted by a then b, as two rows: against a set of Python tuples, for small
    ranges (one int64 per pair), ranges too wide for one int64 (the lexsort) and negative values."""
    rng = np.random.default_rng(3)
    for lo, hi in ((0, 4), (-6, 6), (-2**61, 2**61), (0, 2**62)):
        for n in (0, 1, 9, 400):
            a, b = rng.integers(lo, hi, n), rng.integers(lo, hi, n)
            got = unique_pairs(a, b)
            want = sorted(set(zip(a.tolist(), b.tolist())))
            assert got.shape == (2, len(want)) and got.dtype == np.int64
            assert list(zip(got[0].tolist(), got[1].tolist())) == want


def test_merged_codes_number_concatenated_columns_by_their_sorted_keys():
    """Codes of several columns' rows one after the other, over the union of their values in sorted order:
    against the position of each row's value in `sorted(set(all values))`, parts sharing values, empty parts."""
    rng = np.random.default_rng(9)
    for _ in range(40):
        parts = [np.array([f"k{int(v)}#{int(v) % 7}" for v in rng.integers(0, 30, int(rng.integers(0, 50)))],
                          dtype=object) for _ in range(int(rng.integers(1, 4)))]
        every = [v for p in parts for v in p.tolist()]
        union = sorted(set(every))
        got = merged_codes([sorted_codes(p) for p in parts])
        assert got.dtype == np.int64
        assert got.tolist() == [union.index(v) for v in every]


def test_unique_inverse_is_numpys_unique_with_its_inverse():
    """Distinct values and each row's position among them, as np.unique(return_inverse=True) gives them
    (flattened), value for value and dtype for dtype: integers, booleans, floats with NaN, objects."""
    for dtype, x in _arrays_of_every_dtype(13, (0, 1, 2, 60, 2000)):
        want_u, want_i = np.unique(x, return_inverse=True)
        got_u, got_i = unique_inverse(x)
        assert got_u.dtype == want_u.dtype and got_i.dtype == want_i.dtype
        assert np.array_equal(got_u, want_u, equal_nan=dtype is np.float64)
        assert got_i.tolist() == want_i.reshape(-1).tolist()


def _arrays_of_every_dtype(seed: int, sizes: tuple[int, ...]):
    """(dtype, values) with repeats: integers of several widths, booleans, floats holding NaN, objects."""
    rng = np.random.default_rng(seed)
    for dtype in (np.int8, np.int32, np.int64, np.uint16, bool, np.float64, object):
        for n in sizes:
            x = rng.integers(-40, 40, n).astype(dtype)
            if dtype is np.float64 and n > 2:
                x[:3] = np.nan
            yield dtype, x


def test_strings_is_str_of_every_value():
    """`strings` gives str(x) of each value, whether the column holds only strings (returned as it is) or
    anything else (None, numbers, numpy strings)."""
    from tracekit.tables.columns import strings

    cases = [np.array(["a", "b#1", "", "é"], dtype=object), np.array(["a", None, 3, 2.5], dtype=object),
             np.array([None, None], dtype=object), np.array([1, 2, 3]), np.array(["x", "y"]), ["p", None],
             np.zeros(0, dtype=object)]
    for values in cases:
        got = strings(values)
        assert got.dtype == object and got.tolist() == [str(x) for x in values]
        assert all(isinstance(x, str) for x in got.tolist())
