"""Lays out any JSON-ready section as tables, so data an analyzer adds is visible even without a chart.

Units follow analysis.json's naming: `_ns` / `_ns_per_step` keys (and the numbers of a dict under such a key)
are durations, shown in ms, µs or ns; `_bytes` sizes; ratios and shares as %. Clock readings (`ts`, `*_ts`,
`t0_ns`: ns on a rank's trace clock) are left out of these tables; analysis.json keeps them."""

from __future__ import annotations

from typing import Any

from reports.escape import h
from reports.format import duration, is_clock_key, is_ns_key, is_num
from reports.html_parts import Col, auto_col, kv_table, table, cell_text


MAX_ROWS = 1000
"""Rows shown per generic table (the charts hold the rest)."""


def _is_rows(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(r, dict) for r in value)


def _row_columns(rows: list[dict[str, Any]], max_cols: int = 24) -> list[Col]:
    keys: list[str] = []
    for row in rows[:200]:
        for k, v in row.items():
            if k not in keys and not _is_rows(v) and not is_clock_key(k):
                keys.append(k)
    cols = []
    for k in keys[:max_cols]:
        col = auto_col(k)
        if col.fmt is cell_text and all(is_num(r.get(k)) or r.get(k) is None for r in rows[:200]):
            col = Col(k, col.title)
        cols.append(col)
    return cols


def render_generic(data: Any, *, depth: int = 0, skip: frozenset[str] = frozenset(), ns: bool = False) -> str:
    """Scalars → key/value table; lists of records → sortable tables; nested dicts → sub-headings.
    Large numeric arrays (chart data) are summarised by their length. `ns`: the numbers of this dict are
    durations in ns (its key said so, e.g. `worst_rank_by_dim_ns_per_step`)."""
    if _is_rows(data):
        return table(data, _row_columns(data), max_rows=MAX_ROWS)
    if not isinstance(data, dict):
        return kv_table([("value", cell_text(data))])
    scalars: list[tuple[str, Any]] = []
    blocks: list[str] = []
    for key, value in data.items():
        if key in skip or is_clock_key(key):
            continue
        if _is_rows(value):
            blocks.append(f"<h3>{h(key.replace('_', ' '))}</h3>" + table(value, _row_columns(value), max_rows=MAX_ROWS))
        elif isinstance(value, dict) and depth < 2 and value and not _is_columnar(value):
            blocks.append(f"<h3>{h(auto_col(key).title)}</h3>"
                          + render_generic(value, depth=depth + 1, ns=ns or is_ns_key(key)))
        elif isinstance(value, (list, dict)) and (len(value) > 32 or _is_columnar(value)):
            scalars.append((key, f"({_size_text(value)}, shown in the chart)"))
        else:
            col = auto_col(key)
            if ns and is_num(value):
                scalars.append((col.title, duration(value)))
            else:
                scalars.append((col.title, col.fmt(value) if is_num(value) or value is None
                                else cell_text(value, ns=ns or is_ns_key(key))))
    out = kv_table(scalars) if scalars else ""
    return out + "".join(blocks)


def _is_columnar(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(isinstance(v, list) for v in value.values()) \
        and len({len(v) for v in value.values()}) == 1 and len(next(iter(value.values()))) > 32


def _size_text(value: Any) -> str:
    if isinstance(value, dict):
        n = len(next(iter(value.values()))) if _is_columnar(value) else len(value)
        return f"{n:,} entries"
    return f"{len(value):,} values"
