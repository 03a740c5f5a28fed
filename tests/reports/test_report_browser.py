"""Opens report.html in real headless Chromium (DevTools protocol): no console errors, no request leaves
the file, every section and chart renders, a hostile trace name shows as text, a screenshot is produced."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from tests.reports.chromium_cdp import Chromium
from tests.reports.conftest import BREAKOUT, HOSTILE, build_analysis
from reports import render_diff_html, render_html
from reports.html_report import SECTIONS
from tracekit.compare.diff import diff_analyses

FIXTURES = Path(__file__).resolve().parent / "fixtures"

pytestmark = pytest.mark.chromium

READY = "document.body && document.body.getAttribute('data-plots-ready') !== null"


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def opened(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("browser")
    analysis = build_analysis()
    page = out / "report.html"
    page.write_text(render_html(analysis, None), encoding="utf-8")
    with Chromium(chromium) as browser:
        browser.open(page, READY)
        browser.drain(1.0)
        result = {
            "analysis": analysis,
            "page": page,
            "plots_ready": browser.eval("document.body.getAttribute('data-plots-ready')"),
            "plot_divs": browser.eval("document.querySelectorAll('div.tk-plot').length"),
            "drawn": browser.eval("Array.from(document.querySelectorAll('div.tk-plot'))"
                                  ".filter(d => d.querySelector('svg.main-svg')).length"),
            "section_ids": browser.eval("Array.from(document.querySelectorAll('section')).map(s => s.id)"),
            "img_count": browser.eval("document.querySelectorAll('img').length"),
            "text": browser.eval("document.body.innerText"),
            "svg_texts": browser.eval("Array.from(document.querySelectorAll('svg text')).map(t => t.textContent)"),
            "xss_fired": browser.eval("window.__xss === true"),
            "step_cells_before": browser.eval(
                "Array.from(document.querySelectorAll('#ranks-table tbody tr')).map(r => r.cells[0].textContent)"),
        }
        # sort the breakdown table by step time (3rd column): ascending on the first click
        browser.eval("document.querySelectorAll('#ranks-table thead th')[2].click()")
        result["ranks_sorted"] = browser.eval(
            "Array.from(document.querySelectorAll('#ranks-table tbody tr')).map(r => Number(r.cells[0].textContent))")
        result["screenshot"] = browser.screenshot(out / "report.png")
        browser.drain(0.5)
        result["run"] = browser.run
    return result


def test_no_console_errors_exceptions_or_dialogs(opened: dict[str, Any]) -> None:
    run = opened["run"]
    assert run.console_errors == []
    assert run.exceptions == []
    assert run.dialogs == []


def test_no_request_leaves_the_file(opened: dict[str, Any]) -> None:
    run = opened["run"]
    page_url = opened["page"].resolve().as_uri()
    assert page_url in run.requests
    outside = [u for u in run.requests if u != page_url and not u.startswith(("data:", "blob:"))]
    assert outside == []
    assert run.failed_requests == []


def test_sections_and_charts_render(opened: dict[str, Any]) -> None:
    expected = [a for a, _ in SECTIONS if a not in ("other-sections", "hang")]  # hang: only with dumps
    assert [s for s in opened["section_ids"] if s in expected] == expected
    # seven charts for the hand-made analysis: breakdown, timeline, heatmap, pipeline, experts, stragglers,
    # layout advice
    assert opened["plot_divs"] == 7
    assert opened["plots_ready"] == "7"
    assert opened["drawn"] == 7
    text = opened["text"]
    for _, title in SECTIONS:
        if title not in ("Other analyzer output", "Hang post-mortem"):
            assert title in text


def test_hostile_trace_name_is_text_not_markup(opened: dict[str, Any]) -> None:
    assert opened["img_count"] == 0  # the <img onerror> never became an element
    assert opened["xss_fired"] is False
    assert HOSTILE in opened["text"]  # ...but shows, literally, in tables and text
    assert any(HOSTILE in t for t in opened["svg_texts"])  # and in plotly's labels (timeline lane, heatmap)
    assert any(BREAKOUT in t for t in opened["svg_texts"])  # a lane name that tries to end the JSON block


def test_table_sorts_by_number(opened: dict[str, Any]) -> None:
    ranks = opened["analysis"]["ranks"]
    by_step = [r["rank"] for r in sorted(ranks, key=lambda r: r["step_ns"] / r["steps"])]
    assert opened["ranks_sorted"] == by_step
    assert opened["step_cells_before"] == [str(r["rank"]) for r in ranks]


def test_screenshot_is_produced(opened: dict[str, Any]) -> None:
    width, height = _png_size(opened["screenshot"])
    assert 1200 <= width <= 1280  # the viewport (less a scrollbar): nothing overflows sideways
    assert height > 3000  # the full page, not just the first screen
    assert opened["screenshot"].stat().st_size > 50_000


def test_diff_page_opens_cleanly(chromium: str, tmp_path: Path) -> None:
    diff = diff_analyses(build_analysis(slow_rank=None, seed=1), build_analysis(slow_rank=1), base_label=HOSTILE)
    page = tmp_path / "diff.html"
    page.write_text(render_diff_html(diff), encoding="utf-8")
    with Chromium(chromium) as browser:
        browser.open(page, READY)
        browser.drain(0.5)
        assert browser.eval("document.body.getAttribute('data-plots-ready')") == "1"
        assert browser.eval("document.querySelectorAll('svg.main-svg').length") >= 1
        assert browser.eval("document.querySelectorAll('img').length") == 0
        assert HOSTILE in browser.eval("document.body.innerText")
        browser.screenshot(tmp_path / "diff.png")
        run = browser.run
    assert run.console_errors == [] and run.exceptions == [] and run.dialogs == []
    assert all(u == page.resolve().as_uri() or u.startswith(("data:", "blob:")) for u in run.requests)


def test_real_run_report_opens_cleanly(chromium: str, tmp_path: Path) -> None:
    """The report `tracekit analyze` writes for a recorded runtime run (real analyzers, real sections)."""
    from typer.testing import CliRunner

    from tracekit.cli.main import app

    res = CliRunner().invoke(app, ["analyze", str(FIXTURES / "runtime_dp2_slow_rank0"), "--out", str(tmp_path), "-q"])
    assert res.exit_code == 0, res.output
    page = tmp_path / "report.html"
    assert page.stat().st_size < 3_000_000
    with Chromium(chromium) as browser:
        browser.open(page, READY)
        browser.drain(1.0)
        plots = browser.eval("document.querySelectorAll('div.tk-plot').length")
        assert plots >= 3  # breakdown, timeline, heatmap at least
        assert browser.eval("document.body.getAttribute('data-plots-ready')") == str(plots)
        assert browser.eval("document.querySelectorAll('div.tk-plot svg.main-svg').length") >= plots
        text = browser.eval("document.body.innerText")
        browser.screenshot(tmp_path / "report.png")
        run = browser.run
    assert run.console_errors == [] and run.exceptions == [] and run.dialogs == []
    assert all(u == page.resolve().as_uri() or u.startswith(("data:", "blob:")) for u in run.requests)
    assert "rank 0 arrives last" in text
