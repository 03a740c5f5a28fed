"""Report papercuts (issue 33): bandwidth cells in the unit that fits, never "0.00 GB/s"; diff tables that say what they sum."""

from __future__ import annotations

import re

import pytest

import reports
from reports.format import bandwidth


@pytest.mark.parametrize("gbps, text", [(1.2, "1.2 GB/s"), (123.456, "123 GB/s"), (0.0121437, "12.1 MB/s"),
                                        (1.5476e-06, "1.55 kB/s"), (2.5e-10, "0.25 B/s"), (None, "–"),
                                        (1534.2, "1,534 GB/s")])
def test_bandwidth_text(gbps, text):
    assert bandwidth(gbps) == text


def test_cpu_run_bandwidth_table(analysis_builder):
    doc = analysis_builder()
    row = doc["sections"]["bandwidth"]["rows"][0]
    row.update(algbw_gbps_p50=0.006777062845562622, busbw_gbps_p50=0.006777062845562622, busbw_gbps_max=0.1056456)
    html = reports.render_html(doc)
    tab = html[html.index('id="bandwidth-table"'):]
    tab = tab[:tab.index("</table>")]
    cells = re.findall(r"<td class=n data-v=\"([^\"]+)\">([^<]*)</td>", tab)
    shown = {float(v): t for v, t in cells}
    assert shown[0.006777062845562622] == "6.78 MB/s" and shown[0.1056456] == "106 MB/s"
    assert not any(t.startswith("0.00") for _, t in cells)  # the text, not the sort value


def test_diff_markdown_says_collective_times_are_totals():
    """The diff's collectives table sums over ranks and steps (compare/diff.py collective_totals); its
    Markdown heading says so instead of sitting under the findings' per-step column."""
    diff = {"base": {"label": "a"}, "new": {"label": "b"}, "findings": [],
            "collectives": [{"group": "dp", "op": "all_reduce", "base_exposed_ns": 4_000_000,
                             "new_exposed_ns": 9_000_000, "delta_exposed_ns": 5_000_000}]}
    text = reports.render_diff_markdown(diff)
    assert "exposed time summed over ranks and steps" in text
