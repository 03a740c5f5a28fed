"""Raw (generic) sections of the report show units and no clock readings (issue 33's papercut).

Before: `_ns` numbers in ms with two decimals (3.2 µs read "0.00"), `*_ns_per_step` and dicts under `_ns`
keys as bare nanosecond counts, clock readings (`ts`, `peak_ts`, `t0_ns`) as 16-digit numbers."""

from __future__ import annotations

import re

from reports.format import duration, wall_time
from reports.generic import render_generic

CLOCK = 1_764_000_000_123_456_789  # a clock reading: must not appear in any form


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "|", html))


def test_durations_pick_their_unit():
    assert duration(12_345_678) == "12.35 ms"
    assert duration(3_200) == "3.20 µs"
    assert duration(850) == "850 ns"
    assert duration(None) == "–"
    assert wall_time(CLOCK) == "2025-11-24 16:00:00.123 UTC"


def test_generic_section_units_and_clock_readings():
    sec = {"wait_ns": 3_200, "t0_ns": CLOCK, "peak_ts": CLOCK, "exposed_ns_per_step": 2_500_000,
           "worst_rank_by_dim_ns_per_step": {"tp": 1_500, "dp": 7_000_000},
           "rows": [{"rank": 0, "ts": CLOCK, "dur_ns": 640, "share_of_step": 0.25,
                     "by_kind": {"kernels": 3, "ns": 1_500, "share": 0.5}}]}
    html = render_generic(sec)
    text = _text(html)
    for clock in (str(CLOCK), f"{CLOCK:,}", f"{CLOCK / 1e6:,.2f}"):
        assert clock not in text
    assert "3.20 µs" in text and "2.50 ms" in text           # wait_ns, exposed_ns_per_step
    assert "1.50 µs" in text and "7.00 ms" in text           # the dict under a `_ns_per_step` key
    assert "640 ns" in text and "25.0%" in text               # a row's dur_ns and share
    assert "kernels=3, ns=1.50 µs, share=50.0%" in text       # a dict cell: each entry by its key
    assert "| ts |" not in text and "peak ts" not in text and "t0" not in text
    assert "per step" in text and "ns per step" not in text
