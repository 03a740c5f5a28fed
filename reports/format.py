"""Unit formatting for reports (ns → ms, bytes → MB, ratios → %). Formatting only, no metrics."""

from __future__ import annotations

import math
from typing import Any


def is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def ms(ns: Any, digits: int = 2) -> str:
    """Nanoseconds as milliseconds text; '–' when unknown."""
    if not is_num(ns):
        return "–"
    return f"{ns / 1e6:,.{digits}f} ms"


def duration(ns: Any) -> str:
    """A duration in nanoseconds as text in the unit that fits: "12.35 ms", "3.20 µs", "850 ns"."""
    if not is_num(ns):
        return "–"
    a = abs(ns)
    if a >= 1e6:
        return f"{ns / 1e6:,.2f} ms"
    if a >= 1e3:
        return f"{ns / 1e3:,.2f} µs"
    return f"{ns:,.0f} ns"


def wall_time(ns: Any) -> str:
    """Nanoseconds since the Unix epoch (a wall-clock reading) as UTC date and time to the millisecond."""
    if not is_num(ns):
        return "–"
    import datetime as _dt

    t = _dt.datetime.fromtimestamp(int(ns) // 1_000_000 / 1e3, tz=_dt.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d} UTC"


CLOCK_KEYS = ("ts", "t0_ns")
"""Keys (and any key ending `_ts`) that hold a clock reading in ns (a rank's trace clock), not a duration:
generic tables leave them out (analysis.json has them); times are shown relative where the analysis
gives them (`*_since_*`, `span_ns`)."""


def is_clock_key(key: str) -> bool:
    return key in CLOCK_KEYS or key.endswith("_ts")


def is_ns_key(key: str) -> bool:
    """A key whose numbers are durations in ns by analysis.json's naming (`_ns`, `_ns_per_step`, `ns`)."""
    return (key == "ns" or key.endswith("_ns") or key.endswith("_ns_per_step")) and not is_clock_key(key)


def pct(ratio: Any, digits: int = 1) -> str:
    if not is_num(ratio):
        return "–"
    return f"{ratio * 100:.{digits}f}%"


def num(value: Any, digits: int = 2) -> str:
    if not is_num(value):
        return "–" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def bandwidth(gbps: Any) -> str:
    """A rate given in GB/s (10⁹ bytes/s) as text with three significant digits in the unit that fits
    (GB/s, MB/s, kB/s, B/s): a CPU run's 0.0121 GB/s reads "12.1 MB/s", never "0.00"."""
    if not is_num(gbps):
        return "–"
    rate = gbps * 1e9
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(rate) >= size:
            return f"{rate / size:,.3g} {unit}" if rate / size < 1000 else f"{rate / size:,.0f} {unit}"
    return f"{rate:.3g} B/s"


def nbytes(value: Any) -> str:
    if not is_num(value):
        return "–"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{int(value)} B"


def signed_ms(ns: Any, digits: int = 2) -> str:
    if not is_num(ns):
        return "–"
    return f"{ns / 1e6:+,.{digits}f} ms"


def ranks_text(ranks: Any, limit: int = 12) -> str:
    """A rank list as compact text: consecutive runs as ranges, long lists truncated."""
    if not isinstance(ranks, (list, tuple)) or not ranks:
        return "all" if isinstance(ranks, (list, tuple)) else "–"
    values = sorted({int(r) for r in ranks if is_num(r)})
    parts: list[str] = []
    start = prev = values[0]
    for r in values[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}–{prev}")
        if r is not None:
            start = prev = r
    if len(parts) > limit:
        return ", ".join(parts[:limit]) + f", … ({len(values)} ranks)"
    return ", ".join(parts)
