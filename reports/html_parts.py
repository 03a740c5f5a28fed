"""HTML building blocks: sortable tables, key/value tables, sections, and plotly figures embedded as JSON."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import msgspec
import numpy as np

from reports.escape import h, json_for_script
from reports.format import duration, is_clock_key, is_ns_key, is_num, ms, nbytes, num, pct


@dataclass(frozen=True)
class Col:
    """One table column: `key` into the row dict, a header, and a text formatter (numbers sort by raw value)."""

    key: str
    title: str
    fmt: Callable[[Any], str] = num
    numeric: bool = True


def auto_col(key: str) -> Col:
    """A column formatted by the naming convention of analysis.json (`_ns` → ms, `_bytes` → MB, ratios → %)."""
    title = key.replace("_", " ")
    if key.endswith("_ns_per_step"):
        return Col(key, title[:-len(" ns per step")] + " per step", _ns_text)
    if is_ns_key(key):
        return Col(key, title[:-3] if key.endswith("_ns") else "time", _ns_text)
    if key.endswith("_bytes") or key == "bytes":
        return Col(key, title, nbytes)
    if key.endswith("ratio") or key.endswith("_frac") or key.endswith("_share") or key == "share" \
            or key.startswith("share_of_"):
        return Col(key, title, pct)
    return Col(key, title, cell_text, numeric=False)


def _entry_text(key: str, value: Any, ns: bool) -> str:
    """A dict entry's value, by its own key's naming convention (else as its parent said)."""
    if is_num(value) and not ns:
        fmt = auto_col(key).fmt
        if fmt is not cell_text:
            return fmt(value)
    return cell_text(value, ns or is_ns_key(key))


def _ns_text(value: Any) -> str:
    return cell_text(value, ns=True)


def cell_text(value: Any, ns: bool = False) -> str:
    """A value as text; `ns`: its numbers are durations in ns (a dict under a key such as `by_dim_ns`).
    A dict's entries are formatted by their own keys' naming convention (`x_ns=1.20 ms`)."""
    if isinstance(value, (list, tuple)):
        text = ", ".join(cell_text(v, ns) for v in value[:32])
        return text + (f", … ({len(value)})" if len(value) > 32 else "")
    if isinstance(value, dict):
        return ", ".join(f"{k}={_entry_text(str(k), v, ns)}" for k, v in list(value.items())[:16]
                         if not is_clock_key(str(k)))
    if is_num(value):
        return duration(value) if ns else num(value)
    return "–" if value is None else str(value)


def _cell(row: Any, key: str) -> Any:
    """A row's field: a dict's key, or a document struct's attribute (unset: None)."""
    if isinstance(row, dict):
        return row.get(key)
    value = getattr(row, key, None)
    return None if value is msgspec.UNSET else value


def table(rows: Iterable[Any], cols: list[Col], *, table_id: str | None = None,
          max_rows: int = 5000) -> str:
    """A sortable table of dicts or document structs (tracekit.document); every cell's text is escaped.
    Rows beyond `max_rows` are cut with a note."""
    rows = list(rows)
    head = "".join(f"<th scope=col>{h(c.title)}</th>" for c in cols)
    body = []
    for row in rows[:max_rows]:
        cells = []
        for c in cols:
            value = _cell(row, c.key)
            text = h(c.fmt(value))
            if c.numeric and is_num(value):
                cells.append(f'<td class=n data-v="{value!r}">{text}</td>')
            else:
                cells.append(f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    id_attr = f' id="{h(table_id)}"' if table_id else ""
    more = (f'<p class=note>Showing {max_rows:,} of {len(rows):,} rows.</p>' if len(rows) > max_rows else "")
    return (f'<div class=tbl-wrap><table class="tk sortable"{id_attr}><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>{more}")


def kv_table(pairs: Iterable[tuple[str, Any]]) -> str:
    """A two-column table of labels and (escaped) values."""
    rows = "".join(f"<tr><th scope=row>{h(k)}</th><td>{h(v)}</td></tr>" for k, v in pairs)
    return f'<table class="tk kv"><tbody>{rows}</tbody></table>'


def not_available(what: str, why: str = "not available for this run") -> str:
    return f'<p class=na>{h(what)}: {h(why)}.</p>'


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{h(anchor)}"><h2>{h(title)}</h2>{body}</section>'


def typed(values: Any, dtype: str = "f8") -> dict[str, str] | list:
    """A numeric array in plotly.js's typed-array form ({dtype, bdata}): ~3x smaller than JSON numbers."""
    arr = np.asarray(values, dtype={"f8": np.float64, "f4": np.float32, "i4": np.int32}[dtype])
    if arr.size < 16:
        return arr.tolist()
    return {"dtype": dtype, "bdata": base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii")}


class Figures:
    """Collects plotly figures for one page; each becomes a <div> plus a safely escaped JSON block."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, data: list[dict[str, Any]], layout: dict[str, Any], *, height: int = 360) -> str:
        self.count += 1
        fig_id = f"tk-fig-{self.count}"
        base_layout = {
            "height": height, "margin": {"l": 70, "r": 20, "t": 30, "b": 45},
            "paper_bgcolor": "#fff", "plot_bgcolor": "#fff", "font": {"size": 12},
            "legend": {"orientation": "h", "y": -0.18},
            "hoverlabel": {"namelength": -1},
        }
        base_layout.update(layout)
        spec = json_for_script({"data": data, "layout": base_layout})
        return (f'<div class=tk-plot id="{fig_id}-div" data-fig="{fig_id}" style="height:{height}px">'
                f'<p class=plot-fallback>Chart loading… (needs JavaScript; the tables below hold the same numbers)</p></div>'
                f'<script type="application/json" id="{fig_id}">{spec}</script>')


def plotly_text(value: Any) -> str:
    """Trace-derived text for a plotly label: plotly interprets a few HTML-like tags in labels, so escape
    them; plotly turns the entities back into literal characters."""
    return h(value)
