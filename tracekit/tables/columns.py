"""Tables held as numpy columns: group keys, per-group reductions, joins, and pandas frames built on demand.

A table is a dict of equally long numpy arrays (`Columns`). A nullable integer column `x` is exact int64
values (0 where null) plus a boolean column `x_ok` (True where known): epoch-scale nanoseconds never go
through float64. Strings are object arrays with None for null. Groups are dense int ids whose order
is the sorted order of their key tuples (as pandas' groupby sorts them); orderings use stable sorts so
ties keep row order. `LazyFrame` turns such columns into a pandas DataFrame only when one is asked for
(pandas is imported then, never by this module). Arrow columns are read from their buffers
(`from_arrow`): pyarrow's own to_numpy, fill_null and array constructors may import pandas.
Used by matching, clocks and the what-if builder and fixes, which run without pandas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

try:
    from tracekit.tables import kcolumns
except ImportError:  # no compiler at install time: a dict lookup per row
    kcolumns = None

if TYPE_CHECKING:
    import pandas as pd

Columns = dict[str, np.ndarray]
"""Column name → numpy array; every array has one value per row."""


def _bits(buf: Any, offset: int, n: int) -> np.ndarray:
    """An Arrow bitmap (validity or boolean values) as n booleans."""
    return np.unpackbits(np.frombuffer(buf, np.uint8), bitorder="little")[offset:offset + n].astype(bool)


def _valid(a: pa.Array) -> np.ndarray:
    """Where an Arrow array holds a value."""
    return _bits(a.buffers()[0], a.offset, len(a)) if a.null_count else np.ones(len(a), bool)


def from_arrow(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values, known) of an Arrow (signed) integer, boolean or string column: integers as exact int64 (0 where
    null), booleans as bool (False where null), strings (plain or dictionary) as objects (None)."""
    a = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n = len(a)
    if n == 0:
        kind = np.int64 if pa.types.is_integer(a.type) else bool if pa.types.is_boolean(a.type) else object
        return np.zeros(0, kind), np.zeros(0, bool)
    ok = _valid(a)
    if pa.types.is_integer(a.type):
        values = np.frombuffer(a.buffers()[1], np.dtype(f"int{a.type.bit_width}"))[a.offset:a.offset + n]
        return np.where(ok, values, 0).astype(np.int64), ok
    if pa.types.is_boolean(a.type):
        return _bits(a.buffers()[1], a.offset, n) & ok, ok
    d = a if pa.types.is_dictionary(a.type) else pc.dictionary_encode(a)
    idx, _ = from_arrow(d.indices)
    words = np.array(d.dictionary.to_pylist() + [None], object)
    return words[np.where(ok, idx, len(words) - 1)], ok


def take(cols: Columns, idx: np.ndarray) -> Columns:
    """The rows `idx` (indices or a boolean mask) of every column."""
    return {k: v[idx] for k, v in cols.items()}


def kept(cols: Columns, mask: np.ndarray) -> Columns:
    """`take(cols, mask)` of a boolean mask, sharing the arrays (a new dict, no copy) when every row is kept:
    for callers that replace columns and never write into them (matching's `_agreeing` keeps every row of a
    run whose ranks agree on every collective's op: ~7 M rows at 10,000 ranks, copied for nothing)."""
    return dict(cols) if mask.all() else take(cols, mask)


def not_null(a: np.ndarray) -> np.ndarray:
    """Where an object column holds a value (not None)."""
    return np.not_equal(a, None)


def equals_any(a: np.ndarray, values: tuple[str, ...] | list[str]) -> np.ndarray:
    """Where an object column equals one of `values` (None equals nothing)."""
    out = np.zeros(a.shape, bool)
    for v in values:
        out |= np.equal(a, v)
    return out


def sorted_unique(a: Any) -> np.ndarray:
    """`np.unique(a)` (its sorted distinct values, flattened): integers and booleans by one sort. numpy 2.x finds
    them through a hash table, 5-40x slower than a sort where most values are distinct (7 M int64: 7.8 against
    0.18 CPU-s); other dtypes (floats: NaNs fold into one; objects) go to np.unique."""
    a = np.asarray(a).ravel()
    if a.dtype.kind not in "biu" or a.size < 2:
        return np.unique(a)
    s = np.sort(a)
    new = np.empty(s.size, bool)
    new[0] = True
    np.not_equal(s[1:], s[:-1], out=new[1:])
    return s[new]


def sorted_codes(a: np.ndarray) -> tuple[np.ndarray, list[Any]]:
    """Dense codes of an object column's values in their sorted order (`codes`), and those values in order.
    Where the C helper is built (`kcolumns.first_seen`) the rows are told apart by object identity first, then
    the distinct objects by value: a column read from Arrow holds one object per distinct string, so the dict
    lookup (a string hash and compare) runs once per distinct object, not per row (~7 M rows: 0.75 -> 0.2 s)."""
    items = a.tolist()
    if kcolumns is not None and os.environ.get("TRACEKIT_NATIVE", "1") != "0":
        ids, objs = kcolumns.first_seen(items)
        values = sorted(set(objs))
        index = {v: i for i, v in enumerate(values)}
        remap = np.fromiter(map(index.__getitem__, objs), np.int64, len(objs))
        return remap[np.frombuffer(ids, np.int64)], values
    values = sorted(set(items))
    index = {v: i for i, v in enumerate(values)}
    return np.fromiter(map(index.__getitem__, items), np.int64, a.size), values


def merged_codes(parts: list[tuple[np.ndarray, list[Any]]]) -> np.ndarray:
    """`codes` of the columns whose `sorted_codes` are `parts`, one after the other: each part's codes
    renumbered over the union of their sorted values, merged in one pass (the values sorted once, not the
    rows' values grouped again)."""
    import heapq

    union: list[Any] = []
    for v in heapq.merge(*(values for _, values in parts)):
        if not union or union[-1] != v:
            union.append(v)
    index = {v: i for i, v in enumerate(union)}
    out = [np.array([index[v] for v in values], np.int64)[code] if len(values) else code.astype(np.int64)
           for code, values in parts]
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def codes(a: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense codes of a column's values, in the values' sorted order, and how many there are."""
    if a.size == 0:
        return np.zeros(0, np.int64), 0
    if a.dtype == object:  # strings: a dict lookup (np.unique compares objects one by one: ~10x slower)
        code, values = sorted_codes(a)
        return code, len(values)
    uniq, inv = unique_inverse(a)
    return inv.astype(np.int64), len(uniq)


def unique_inverse(a: Any) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(a, return_inverse=True)` (flattened): integers and booleans by `sorted_unique` and a binary
    search of each value among the distinct ones, not an argsort of every value (19 M ranks: 5.6 -> 1.3 CPU-s);
    other dtypes by np.unique."""
    a = np.asarray(a).ravel()
    if a.dtype.kind not in "biu":
        uniq, inv = np.unique(a, return_inverse=True)
        return uniq, inv.reshape(-1)
    uniq = sorted_unique(a)
    return uniq, np.searchsorted(uniq, a)


def unique_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`np.unique(np.stack([a, b]), axis=1)` of two integer columns: the distinct (a, b) pairs in (a, b) order as
    two rows, by one sort of one integer per pair (`sorted_unique`) where a's and b's ranges fit one int64, else by
    a lexsort; numpy sorts the pairs as a structured dtype (6 M pairs: ~6 s)."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if a.size == 0:
        return np.zeros((2, 0), np.int64)
    a0, b0 = int(a.min()), int(b.min())
    span = int(b.max()) - b0 + 1
    if (int(a.max()) - a0 + 1) * span < 2**62:
        code = sorted_unique((a - a0) * span + (b - b0))
        return np.stack([code // span + a0, code % span + b0])
    o = np.lexsort((b, a))
    a, b = a[o], b[o]
    new = np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])]
    return np.stack([a[new], b[new]])


def recode(ids: np.ndarray) -> np.ndarray:
    """Non-negative integer ids renumbered densely in their order (`codes`' codes, `np.unique`'s inverse) by a
    pass over the ids, not a sort: group ids of a subset of rows, numbered as `group_ids` of the subset's keys
    would number them."""
    if ids.size == 0:
        return np.zeros(0, np.int64)
    present = np.zeros(int(ids.max()) + 1, bool)
    present[ids] = True
    return (np.cumsum(present) - 1)[ids]


def group_ids(*keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense group ids of rows by the key columns (no nulls), numbered in sorted key-tuple order."""
    cs = [codes(k)[0] for k in keys]
    n = cs[0].size
    if n == 0:
        return np.zeros(0, np.int64), 0
    if len(cs) == 1:
        return codes(keys[0])
    order = np.lexsort(cs[::-1])
    change = np.zeros(n, bool)
    for c in cs:
        s = c[order]
        change[1:] |= s[1:] != s[:-1]
    ids = np.empty(n, np.int64)
    ids[order] = np.cumsum(change)
    return ids, int(ids.max()) + 1


def group_order(ids: np.ndarray, n: int, *ties: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ordered by group, then by `ties` (first tie primary; stable), with each group's first
    position in that order and its size."""
    order = np.lexsort(tuple(ties[::-1]) + (ids,))
    counts = np.bincount(ids, minlength=n)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if n else np.zeros(0, np.int64)
    return order, starts, counts


def cumcount(ids: np.ndarray, n: int) -> np.ndarray:
    """Each row's position within its group, counted in row order (pandas' cumcount)."""
    order, starts, _ = group_order(ids, n)
    out = np.empty(ids.size, np.int64)
    out[order] = np.arange(ids.size) - starts[ids[order]]
    return out


def group_extreme(ids: np.ndarray, n: int, values: np.ndarray, ok: np.ndarray | None, largest: bool
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per group: the min (or max) of the known values and whether it has any (nulls skipped)."""
    sel = ok if ok is not None else np.ones(ids.size, bool)
    lim = np.iinfo(np.int64)
    out = np.full(n, lim.min if largest else lim.max, np.int64)
    (np.maximum if largest else np.minimum).at(out, ids[sel], values[sel].astype(np.int64))
    has = np.bincount(ids[sel], minlength=n) > 0
    return np.where(has, out, 0), has


def argsort_desc(values: np.ndarray) -> np.ndarray:
    """Positions that sort `values` descending, ties as pandas' sort_values(ascending=False) leaves them
    (its default quicksort over the reversed array, reversed back)."""
    idx = np.arange(values.size)[::-1]
    return idx[values[::-1].argsort(kind="quicksort")][::-1]


def lookup(keys: np.ndarray, mapping: dict[Any, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per row: mapping[key] as int64 (0 when unknown) and whether it is known (present, not None)."""
    if keys.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    uniq, inv = unique_inverse(keys)
    got = [mapping.get(k) for k in uniq.tolist()]
    known = np.array([g is not None for g in got], bool)
    vals = np.array([int(g) if g is not None else 0 for g in got], np.int64)
    return vals[inv.reshape(-1)], known[inv.reshape(-1)]


def num_rows(cols: Columns) -> int:
    """Rows of `cols` (0 when it has no column)."""
    return len(next(iter(cols.values()))) if cols else 0


def concat(parts: list[Columns]) -> Columns:
    """Rows of `parts` one after the other (the columns of the first part)."""
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def strings(values: Any) -> np.ndarray:
    """Each value as `str` (None → 'None'), as an object array. An object array holding only strings is
    returned as it is, not copied (a 10,000-rank run's member columns: ~6 M values, 0.6 -> 0.05 CPU-s each):
    never modify the result in place."""
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1 and values.size:
        from pandas.api.types import infer_dtype  # pandas is loaded wherever columns this long are built

        if infer_dtype(values, skipna=False) == "string":
            return values
    return np.array([str(x) for x in values], dtype=object)


def first_of_group(code: np.ndarray, n: int) -> np.ndarray:
    """Per group (0..n-1): the position of its first row."""
    first = np.full(n, -1, np.int64)
    u, pos = np.unique(code, return_index=True)
    first[u] = pos
    return first


def group_median(code: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Per group (0..n-1): the median of its rows' `values` (NaN for a group without rows): np.median's
    value, the middle of the sorted values or the mean of the two middle ones, for every group in one sort
    (a group holding NaN: NaN, as np.median gives, group by group)."""
    out = np.full(n, np.nan)
    v = np.asarray(values)
    if code.size and not (v.dtype.kind == "f" and np.isnan(v).any()):
        order = np.lexsort((v, code))
        c, x = code[order], v[order].astype(np.float64)
        first = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
        count = np.diff(np.r_[first, c.size])
        out[c[first]] = (x[first + (count - 1) // 2] + x[first + count // 2]) / 2
        return out
    order = np.argsort(code, kind="stable")
    bounds = np.flatnonzero(np.diff(code[order])) + 1
    for idx in np.split(order, bounds) if order.size else ():
        out[code[idx[0]]] = np.median(values[idx])
    return out


def match_rows(left: list[np.ndarray], right: list[np.ndarray]) -> np.ndarray:
    """Per row of `left`: the first row of `right` with the same key tuple, -1 when none (a left join)."""
    nl = len(left[0])
    if nl == 0 or len(right[0]) == 0:
        return np.full(nl, -1, np.int64)
    code, _ = group_ids(*(np.concatenate([a, b]) for a, b in zip(left, right)))
    uc, first = np.unique(code[nl:], return_index=True)
    pos = np.clip(np.searchsorted(uc, code[:nl]), 0, uc.size - 1)
    return np.where(uc[pos] == code[:nl], first[pos], -1).astype(np.int64)


def arrow_columns(t: pa.Table) -> Columns:
    """An Arrow table as numpy columns (`from_arrow`): integers and booleans with `<name>_ok` beside them,
    strings (dictionary-encoded too) as objects, floats as float64 (NaN where null)."""
    out: Columns = {}
    for name in t.column_names:
        col = t.column(name)
        if pa.types.is_floating(col.type):
            out[name] = col.to_numpy(zero_copy_only=False).astype(np.float64)
            continue
        out[name], ok = from_arrow(col)
        if pa.types.is_integer(col.type) or pa.types.is_boolean(col.type):
            out[f"{name}_ok"] = ok
    return out


def python_values(col: pa.ChunkedArray | pa.Array) -> list[Any]:
    """The column's values as Python objects, as `to_pylist()` gives them (None where null): integer, float
    and boolean columns through numpy, dictionary columns as their dictionary's values taken by the rows'
    codes (one Python object per distinct value); any other type by `to_pylist()`. pyarrow converts value
    by value through a scalar object, ~4x slower on an ops table's integer and text columns."""
    a = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = a.type
    if pa.types.is_dictionary(t):
        words = np.empty(len(a.dictionary) + 1, dtype=object)
        words[:] = a.dictionary.to_pylist() + [None]
        idx, ok = from_arrow(a.indices)
        return words[np.where(ok, idx, len(words) - 1)].tolist()
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        return a.to_pylist()
    if a.null_count == 0:
        return a.to_numpy(zero_copy_only=False).tolist()
    values = a.fill_null(False if pa.types.is_boolean(t) else 0).to_numpy(zero_copy_only=False).astype(object)
    values[~_valid(a)] = None
    return values.tolist()


def table_rows(t: pa.Table) -> list[dict[str, Any]]:
    """The table's rows as dicts, `Table.to_pylist()`'s values (`python_values`, column by column)."""
    names = t.column_names
    return [dict(zip(names, row)) for row in zip(*(python_values(t.column(c)) for c in names))]


@dataclass(frozen=True)
class Column:
    """One column of a LazyFrame: its pandas dtype, values (or a function giving them, called only when
    the frame is built) and, for nullable ones, where they are known."""

    dtype: str
    """int64 | bool | object as they are; Int64 / Int32 nullable; float64 with NaN where unknown."""
    values: np.ndarray | Callable[[], np.ndarray]
    ok: np.ndarray | None = None


@dataclass(frozen=True)
class LazyFrame:
    """Columns that become a pandas DataFrame (RangeIndex, columns in this order) only when asked."""

    n: int
    columns: dict[str, Column]

    def __len__(self) -> int:
        return self.n

    def frame(self) -> "pd.DataFrame":
        import pandas as pd

        data: dict[str, Any] = {}
        for name, col in self.columns.items():
            v = col.values() if callable(col.values) else col.values
            if col.dtype in ("Int64", "Int32"):
                ok = col.ok if col.ok is not None else np.ones(v.size, bool)
                data[name] = pd.arrays.IntegerArray(v.astype(col.dtype.lower()), ~ok)
            elif col.dtype == "float64":
                f = v.astype(np.float64)
                data[name] = np.where(col.ok, f, np.nan) if col.ok is not None else f
            else:
                data[name] = v.astype(col.dtype) if col.dtype != "object" else v
        return pd.DataFrame(data, index=pd.RangeIndex(self.n))
