"""summary.md and diff.md: verdict, findings with savings, links that land on report anchors, and escaping of
trace-derived names (no raw HTML, no broken table rows)."""

from __future__ import annotations

import re
from typing import Any

from tests.reports.conftest import HOSTILE, build_analysis
from reports import render_diff_markdown, render_html, render_markdown
from reports.escape import md
from tracekit.compare.diff import diff_analyses


def _table_rows(text: str) -> list[list[str]]:
    """Cells of every Markdown table row, split on unescaped pipes."""
    return [row for table in _tables(text) for row in table]


def _tables(text: str) -> list[list[list[str]]]:
    """Each Markdown table (consecutive table lines) as its rows' cells."""
    tables: list[list[list[str]]] = []
    previous = False
    for line in text.splitlines():
        row = line.startswith("|")
        if row:
            if not previous:
                tables.append([])
            tables[-1].append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
        previous = row
    return tables


def test_summary_lists_findings_with_savings_and_links() -> None:
    analysis = build_analysis()
    text = render_markdown(analysis, "report.html")
    assert text.startswith("## tracekit summary")
    assert "**Verdict:** This run is compute\\-bound on 4 of 4 ranks" not in text  # '-' is only escaped at line start
    assert "**Verdict:** This run is compute-bound on 4 of 4 ranks." in text
    for i, f in enumerate(analysis["findings"], 1):
        row = next(r for r in _table_rows(text) if r[0] == f"[{i}](report.html#finding-{i})")
        assert row[1].endswith(f["severity"])
        assert row[-1] == f"{f['est_saving_ns'] / 1e6:,.2f} ms"
    # the three fixes worth most, with the same savings
    fixes = re.findall(r"^\d\. .*saves up to \*\*(.*?)\*\*/step$", text, re.M)
    assert fixes == [f"{f['est_saving_ns'] / 1e6:,.2f} ms" for f in analysis["findings"][:3]]


def test_every_link_lands_on_an_anchor_of_the_report() -> None:
    analysis = build_analysis()
    html = render_html(analysis, None)
    ids = set(re.findall(r'id="([^"]+)"', html))
    links = re.findall(r"\(report\.html#([^)]+)\)", render_markdown(analysis))
    assert len(links) >= 10
    assert [a for a in links if a not in ids] == []


def test_links_only_to_sections_with_data() -> None:
    analysis = build_analysis()
    del analysis["sections"]["pipeline"]
    analysis["sections"]["experts"] = {"source": None, "layers": [], "heatmap": [], "ranks": []}
    text = render_markdown(analysis)
    assert "#pipeline" not in text and "#experts" not in text and "#stragglers" in text


def test_trace_names_cannot_inject_markup_or_break_tables() -> None:
    analysis = build_analysis()
    analysis["findings"][0]["summary"] = f"group a|b `x` [click](javascript:alert(1)) {HOSTILE}\n# heading"
    text = render_markdown(analysis)
    assert "<img" not in text and "](javascript" not in text
    assert "&lt;img src=x onerror=alert\\(1\\)&gt;" in text
    tables = _tables(text)
    assert len(tables) == 2  # the findings and the layout advice
    assert all(len(r) == len(t[0]) for t in tables for r in t)
    assert "\n# heading" not in text


def test_md_escape() -> None:
    assert md("a_b*c") == "a\\_b\\*c"
    assert md("- item") == "\\- item" and md("1. x") == "1\\. x" and md("v1.2-3") == "v1.2-3"
    assert md("<b>") == "&lt;b&gt;" and md("x\ny") == "x y"


def test_diff_markdown_tables_and_status() -> None:
    base: dict[str, Any] = build_analysis(slow_rank=None, seed=1, hostile=False)
    new = build_analysis(slow_rank=2, hostile=False)
    text = render_diff_markdown(diff_analyses(base, new, base_label="before", new_label="after"))
    assert "**before → after:**" in text
    rows = _table_rows(text)
    straggler = [r for r in rows if r[0].startswith("🆕 appeared: rank 2 arrives late")]
    assert len(straggler) == 1 and straggler[0][1] == "straggler" and straggler[0][2] == "2"
    assert straggler[0][3] == "– → 41.00 ms"
    reverse = render_diff_markdown(diff_analyses(new, base))
    assert "✅ resolved: rank 2 arrives late" in reverse
