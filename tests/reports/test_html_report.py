"""report.html without a browser: escaping, no external references, plotly embedded once, numbers laid out
as the analysis states them, missing/odd sections, and size for many ranks."""

from __future__ import annotations

import base64
import gzip
import re
import time
from html.parser import HTMLParser
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reports.conftest import BREAKOUT, HOSTILE, build_analysis
from reports import render_html, render_markdown


class _Tags(HTMLParser):
    """Every start tag with its attributes, and the text of each <script> by type."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.ids: set[str] = set()
        self._in_script: dict[str, str | None] | None = None
        self._buf: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if a.get("id"):
            self.ids.add(a["id"] or "")
        if tag == "script":
            self._in_script, self._buf = a, []

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._in_script is not None:
            self.scripts.append((self._in_script, "".join(self._buf)))
            self._in_script = None

    def handle_data(self, data: str) -> None:
        if self._in_script is not None:
            self._buf.append(data)


def _parse(html: str) -> _Tags:
    p = _Tags()
    p.feed(html)
    p.close()
    return p


@pytest.fixture(scope="module")
def page() -> tuple[dict[str, Any], str, _Tags]:
    analysis = build_analysis()
    html = render_html(analysis, None)
    return analysis, html, _parse(html)


def test_trace_strings_never_become_markup(page: tuple[dict[str, Any], str, _Tags]) -> None:
    _, html, tags = page
    assert "<img" not in html.lower()
    assert BREAKOUT not in html and "window.__xss=true</script>" not in html
    assert [t for t, _ in tags.tags if t == "img"] == []
    assert html.count("&lt;img src=x onerror=alert(1)&gt;") >= 5  # shown as text in many places
    # JSON blocks: no raw '<' at all, so no '</script>' or '<!--' can end them early
    json_blocks = [body for a, body in tags.scripts if a.get("type") == "application/json"]
    assert len(json_blocks) == 7  # one per chart (test_report_browser: seven)
    assert all("<" not in b and ">" not in b for b in json_blocks)
    import json

    labels = json.dumps([json.loads(b) for b in json_blocks])
    assert "&lt;img src=x onerror=alert(1)&gt;" in labels  # plotly receives entity-escaped labels
    # the only executable scripts are our two inline ones
    assert [a.get("type") for a, _ in tags.scripts if a.get("type") not in ("application/json", "text/plain")] == [None, None]


def test_nothing_refers_outside_the_file(page: tuple[dict[str, Any], str, _Tags]) -> None:
    _, html, tags = page
    for tag, attrs in tags.tags:
        for name in ("src", "href", "action", "srcset", "poster", "data"):
            value = attrs.get(name)
            if value is not None:
                assert tag == "a" and name == "href" and value.startswith("#"), (tag, attrs)
    assert "default-src 'none'" in html  # the CSP blocks any request the page might still try
    assert not re.search(r"(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", re.sub(r"<script[^>]*>.*?</script>", "", html, flags=re.S))


def test_plotly_js_is_embedded_once_and_intact(page: tuple[dict[str, Any], str, _Tags]) -> None:
    from plotly.offline import get_plotlyjs

    _, _, tags = page
    blobs = [body for a, body in tags.scripts if a.get("id") == "tk-plotlyjs"]
    assert len(blobs) == 1
    assert gzip.decompress(base64.b64decode(blobs[0])).decode("utf-8") == get_plotlyjs()


def test_cached_plotly_js_is_keyed_by_the_installed_file(tmp_path, monkeypatch) -> None:
    """The cache is written once, read back while plotly.js is unchanged, and rebuilt when its key (path,
    size, mtime) no longer matches: each time the embedded text inflates to plotly's own plotly.js."""
    from plotly.offline import get_plotlyjs

    from reports.assets import plotly_js_gz_b64

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    plotly_js_gz_b64.cache_clear()
    try:
        first = plotly_js_gz_b64()
        (cache,) = (tmp_path / "tracekit").iterdir()
        key, _, body = cache.read_text(encoding="ascii").partition("\n")
        assert body == first.decode("ascii") and key.rsplit(":", 2)[1] == str(len(get_plotlyjs().encode("utf-8")))
        cache.write_text(f"{key}\nstale", encoding="ascii")  # same key: the cached text is what is used
        plotly_js_gz_b64.cache_clear()
        assert plotly_js_gz_b64() == b"stale"
        cache.write_text("another plotly.js\nstale", encoding="ascii")  # key differs: rebuilt
        plotly_js_gz_b64.cache_clear()
        assert gzip.decompress(base64.b64decode(plotly_js_gz_b64())).decode("utf-8") == get_plotlyjs()
        assert cache.read_text(encoding="ascii").partition("\n")[0] == key
    finally:
        plotly_js_gz_b64.cache_clear()


def test_no_plotly_without_charts() -> None:
    bare = {"schema": "tracekit.analysis/1", "inputs": {"ranks": [], "skipped": []}, "ranks": [], "findings": []}
    html = render_html(bare, None)
    assert "tk-plotlyjs" not in html.replace('getElementById(\'tk-plotlyjs\')', "")
    assert len(html) < 60_000
    assert "No per-rank breakdown is available" in html


def test_numbers_are_the_analysis_numbers(page: tuple[dict[str, Any], str, _Tags]) -> None:
    analysis, html, _ = page
    for r in analysis["ranks"]:
        row = re.search(r'<tr><td class=n data-v="%d">%d</td>(.*?)</tr>' % (r["rank"], r["rank"]), html).group(1)
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        assert cells[1] == f"{r['step_ns'] / r['steps'] / 1e6:,.2f}"
        assert cells[2] == f"{r['compute_ns'] / r['steps'] / 1e6:,.2f}"
        assert cells[5] == f"{r['other_ns'] / r['steps'] / 1e6:,.2f}"
        assert cells[6] == f"{r['idle_ns'] / r['steps'] / 1e6:,.2f}"
        assert cells[8] == r["bound"]
    for i, f in enumerate(analysis["findings"], 1):
        m = re.search(rf'<tr id="finding-{i}">.*?<td>([^<]*)</td>.*?'
                      rf'<td class=n data-v="{f["est_saving_ns"]}">([^<]*)</td></tr>', html, re.S)
        assert m.group(1) == f["kind"]
        assert m.group(2) == f'{f["est_saving_ns"] / 1e6:,.2f} ms'


def test_verdict_and_top_fixes(page: tuple[dict[str, Any], str, _Tags]) -> None:
    analysis, html, _ = page
    verdict = re.search(r'<section id="verdict">(.*?)</section>', html, re.S).group(1)
    bounds = [r["bound"] for r in analysis["ranks"]]
    top = max(set(bounds), key=bounds.count)
    assert f"on {bounds.count(top)} of {len(bounds)} ranks" in verdict
    fixes = re.findall(r"<li>(.*?)</li>", verdict, re.S)
    assert len(fixes) == 3
    for li, f in zip(fixes, analysis["findings"][:3]):
        assert f"saves up to {f['est_saving_ns'] / 1e6:,.2f} ms per step" in li


def test_mesh_places_each_rank_at_its_coordinates(page: tuple[dict[str, Any], str, _Tags]) -> None:
    analysis, html, _ = page
    mesh = re.search(r"<table class=mesh>(.*?)</table>", html, re.S).group(1)
    rows = re.findall(r"<tr><th>dp=(\d+)</th>(.*?)</tr>", mesh)
    for dp, cells in rows:
        for tp, cell in enumerate(re.findall(r"<td>(.*?)</td>", cells)):
            expected = [r["rank"] for r in analysis["sections"]["layout"]["ranks"]
                        if r["coords"] == {"dp": int(dp), "tp": tp}]
            assert cell == ", ".join(map(str, expected))


def test_missing_sections_say_not_available() -> None:
    analysis = build_analysis()
    analysis["sections"] = {}
    html = render_html(analysis, None)
    for what in ("Step timeline", "Collective exposure", "Pipeline schedule", "Expert load", "Straggler view",
                 "Bandwidth table", "Throughput and placement"):
        assert f"{what}: " in html
    assert html.count('class="tk-plot"') + html.count("class=tk-plot ") == 1  # only the breakdown chart


@st.composite
def _json(draw: st.DrawFn) -> Any:
    leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**18), st.floats(allow_nan=False, allow_infinity=False),
                     st.text(max_size=12), st.just(HOSTILE))
    return draw(st.recursive(leaf, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                          st.dictionaries(st.sampled_from(_KEYS), kids, max_size=5)),
                             max_leaves=25))


_KEYS = ["rank", "step", "lane", "intervals", "lanes", "stage", "phase", "start_ns", "dur_ns", "end_ns", "layer",
         "tokens", "heatmap", "ranks", "rows", "by_rank_dim_op", "by_dim_op", "exposed_ns", "steps", "dim", "op",
         "diagram", "window_ns", "coords", "mesh_shape", "groups", "delay_ns_per_step", "source", "timeline",
         "microbatch", "stragglers", "top_offenders", "layers", "schedule", "x"]
_SECTIONS = ["layout", "breakdown", "unoverlapped", "matching", "stragglers", "clocks", "pipeline", "experts",
             "bandwidth", "throughput", "placement", "recommendations", "hang", "unknown_new_section"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sections=st.dictionaries(st.sampled_from(_SECTIONS), _json(), max_size=6))
def test_odd_section_shapes_never_crash(sections: dict[str, Any]) -> None:
    analysis = build_analysis(num_ranks=2, timeline_intervals_per_rank=2)
    analysis["sections"] = sections
    html = render_html(analysis, None)
    assert "<img" not in html
    render_markdown(analysis)


def test_report_size_for_many_ranks() -> None:
    """DESIGN §6: < 10 MB at 1,024 ranks (timeline at the analyzers' 20,000-interval budget); issue: 64 ranks."""
    for ranks, per_rank in ((64, 300), (1024, 19)):
        analysis = build_analysis(num_ranks=ranks, timeline_intervals_per_rank=per_rank, hostile=False)
        t0 = time.perf_counter()
        html = render_html(analysis, None)
        elapsed = time.perf_counter() - t0
        size = len(html.encode("utf-8"))
        assert size < 10_000_000, (ranks, size)
        assert elapsed < 30, (ranks, elapsed)
        assert html.count('id="finding-') == len(analysis["findings"])


def _decode(arr: Any) -> list[float]:
    import numpy as np

    if isinstance(arr, dict):
        return np.frombuffer(base64.b64decode(arr["bdata"]), dtype={"f4": np.float32, "f8": np.float64}[arr["dtype"]]).tolist()
    return list(arr)


def test_timeline_draws_every_interval_where_the_section_puts_it(page: tuple[dict[str, Any], str, _Tags]) -> None:
    import json

    analysis, _, tags = page
    tl = analysis["sections"]["breakdown"]["timeline"]
    figs = [json.loads(b) for a, b in tags.scripts if a.get("type") == "application/json"]
    gantt = next(f for f in figs if f["data"][0].get("orientation") == "h" and "lane" not in f["data"][0]["name"]
                 and len(f["data"]) == len(tl["lanes"]))
    t0 = min(iv[2] for iv in tl["intervals"])
    for lane, trace in zip(tl["lanes"], gantt["data"]):
        ivs = [iv for iv in tl["intervals"] if iv[1] == lane]
        base, width = _decode(trace["base"]), _decode(trace["x"])
        assert trace["y"] == [f"r{iv[0]} · {__import__('html').escape(lane)}" for iv in ivs]
        assert base == pytest.approx([(iv[2] - t0) / 1e6 for iv in ivs], rel=1e-6, abs=1e-4)
        assert width == pytest.approx([(iv[3] - iv[2]) / 1e6 for iv in ivs], rel=1e-6)


def test_inputs_table_from_the_store(tmp_path) -> None:
    import pyarrow as pa

    from tracekit.tables.store import RunStoreWriter

    w = RunStoreWriter(tmp_path / "store")
    w.append("ranks", pa.table({"rank": pa.array([0, 1], pa.int32()), "hostname": [HOSTILE, "h1"],
                                "source_file": ["rank0.json", "rank1.json"], "first_ts": [1_000, 2_000],
                                "last_ts": [5_001_000, 9_002_000], "num_events": [10, 20]}))
    w.skip("rank2.json", "truncated")
    store = w.close()
    analysis = build_analysis(num_ranks=2)
    # the spans come from the analysis (inputs.rank_spans: last - first event), the report only lays them out
    analysis.setdefault("sections", {})["inputs"] = {
        "rank_spans": [{"rank": 0, "span_ns": 5_000_000}, {"rank": 1, "span_ns": 9_000_000}],
        "runs": [{"ranks": [0, 1], "start_ns": 1_764_000_000_000_000_000, "end_ns": 1_764_000_000_009_002_000,
                  "span_ns": 9_002_000}]}
    html = render_html(analysis, store)
    inputs = re.search(r'<table class="tk sortable" id="inputs-table">(.*?)</table>', html, re.S).group(1)
    assert inputs.count("<tr>") == 3 and "&lt;img src=x" in inputs and "<img" not in inputs
    assert "traced span 5.00 ms on rank 0" in html
    assert ">9.00 ms<" in inputs and "5,001,000" not in html  # units, never the clock readings
    runs = re.search(r'id="runs-table">(.*?)</table>', html, re.S).group(1)
    assert "2025-11-24 16:00:00.000 UTC" in runs and "9.00 ms" in runs  # 1.764e18 ns after the epoch
