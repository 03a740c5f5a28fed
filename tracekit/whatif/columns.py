"""Tables as named numpy columns of equal length: what the what-if builder and fixes use in place of
pandas frames (grouping by sorted codes, joins by key lookup).

Nullable integer columns read from Arrow keep exact int64 values (0 where null) beside a `<name>_ok`
mask: epoch-scale nanoseconds never go through float64. String columns are object arrays (None where
null).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

Columns = dict[str, np.ndarray]
"""Column name → numpy array; every array has one value per row."""


def num_rows(cols: Columns) -> int:
    """Rows of `cols` (0 when it has no column)."""
    return len(next(iter(cols.values()))) if cols else 0


def take(cols: Columns, idx: Any) -> Columns:
    """The rows `idx` (indices or a mask) of every column."""
    return {k: v[idx] for k, v in cols.items()}


def concat(parts: list[Columns]) -> Columns:
    """Rows of `parts` one after the other (the columns of the first part)."""
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def strings(values: Any) -> np.ndarray:
    """Each value as `str` (None → 'None'), as an object array."""
    return np.array([str(x) for x in values], dtype=object)


def codes(*keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Per row: the index of its key tuple among the distinct tuples sorted by `keys` in order (as
    pandas' sorted groupby numbers groups), and how many there are."""
    code = np.zeros(len(keys[0]) if keys else 0, np.int64)
    n = 1
    for k in keys:
        u, inv = np.unique(k, return_inverse=True)
        u2, code = np.unique(code * len(u) + inv.reshape(-1), return_inverse=True)
        code, n = code.reshape(-1).astype(np.int64), len(u2)
    return code, (n if len(code) else 0)


def first_of_group(code: np.ndarray, n: int) -> np.ndarray:
    """Per group (0..n-1): the position of its first row."""
    first = np.full(n, -1, np.int64)
    u, pos = np.unique(code, return_index=True)
    first[u] = pos
    return first


def group_median(code: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Per group (0..n-1): the median of its rows' `values` (NaN for a group without rows)."""
    out = np.full(n, np.nan)
    order = np.argsort(code, kind="stable")
    bounds = np.flatnonzero(np.diff(code[order])) + 1
    for idx in np.split(order, bounds) if order.size else ():
        out[code[idx[0]]] = np.median(values[idx])
    return out


def lookup(left: list[np.ndarray], right: list[np.ndarray]) -> np.ndarray:
    """Per row of `left`: the first row of `right` with the same key tuple, -1 when none (a left join)."""
    nl = len(left[0])
    if nl == 0 or len(right[0]) == 0:
        return np.full(nl, -1, np.int64)
    code, _ = codes(*(np.concatenate([a, b]) for a, b in zip(left, right)))
    uc, first = np.unique(code[nl:], return_index=True)
    pos = np.clip(np.searchsorted(uc, code[:nl]), 0, uc.size - 1)
    return np.where(uc[pos] == code[:nl], first[pos], -1).astype(np.int64)


def arrow_columns(t: pa.Table) -> Columns:
    """An Arrow table as numpy columns: strings (dictionary-encoded too) as objects, integers and booleans
    with nulls as values (0 / False where null) plus `<name>_ok`, floats as float64 (NaN where null)."""
    out: Columns = {}
    for name in t.column_names:
        col = t.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(pa.string())
        if pa.types.is_integer(col.type) or pa.types.is_boolean(col.type):
            out[f"{name}_ok"] = col.is_valid().to_numpy(zero_copy_only=False)
            fill = False if pa.types.is_boolean(col.type) else 0
            dtype = bool if pa.types.is_boolean(col.type) else np.int64
            out[name] = col.fill_null(fill).to_numpy(zero_copy_only=False).astype(dtype)
        elif pa.types.is_floating(col.type):
            out[name] = col.to_numpy(zero_copy_only=False).astype(np.float64)
        else:
            out[name] = np.asarray(col.to_numpy(zero_copy_only=False), dtype=object)
    return out
