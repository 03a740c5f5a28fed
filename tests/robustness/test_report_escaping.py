"""Strings from a trace reach report.html and summary.md only escaped: a hostile host name, process-group
description and file name flow through parse → analyze → render (the report tests cover the renderers
on hand-made analysis.json; this covers the whole path)."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

from . import corpus as C
from .conftest import run_analyze

HOST = "</script><script>alert('host')</script>"
PG_DESC = "<img src=x onerror=alert('pg')>|**x**"
BAD_NAME = "rank9<img src=x onerror=alert(3)>|[x](javascript:alert(4)).pt.trace.json"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.imgs: list[dict] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.imgs.append(dict(attrs))


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


def test_hostile_trace_strings_are_escaped_in_html_and_markdown(tmp_path, clean_docs, clean_pair_analysis):
    d = tmp_path / "run"
    d.mkdir()
    for r in (0, 1):
        doc = C.with_host_and_group_desc(clean_docs[r], HOST, PG_DESC)
        C.write(d / f"rank{r}.pt.trace.json.gz", C.dump(doc))
    (d / BAD_NAME).write_bytes(b'{"traceEvents": [')  # cut off: skipped, its name shown

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    assert analysis["ranks"] == clean_pair_analysis["ranks"]
    page = (tmp_path / "out" / "report.html").read_text()
    summary = (tmp_path / "out" / "summary.md").read_text()

    # HTML: the strings are there, escaped; none of them became markup
    for s in (HOST, PG_DESC, BAD_NAME):
        assert html.escape(s, quote=True) in page or html.escape(s, quote=False) in page, s
    assert "<img src=x" not in page and "alert('host')</script>" not in page
    tags = _Tags()
    tags.feed(page)
    assert tags.imgs == []
    # the skipped file and its finding reach summary.md
    assert any(f["kind"] == "input_skipped" and BAD_NAME in f["summary"] for f in analysis["findings"])
    assert "<img" not in summary and "<script" not in summary and "](javascript:" not in summary
    assert "&lt;img src=x onerror=alert\\(3\\)&gt;\\|\\[x\\]\\(javascript:alert\\(4\\)\\)" in summary
    header = next(line for line in summary.splitlines() if line.startswith("| # |"))
    for line in summary.splitlines():
        if line.startswith("| ["):  # a findings row: no extra cell from a `|` in a name
            assert _unescaped_pipes(line) == _unescaped_pipes(header), line


def test_non_utf8_file_name_does_not_break_the_reports(tmp_path, clean_rank0_analysis):
    """A file name with bytes that are not UTF-8 (os.fsdecode gives lone surrogates) is shown as U+FFFD."""
    import os

    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0.pt.trace.json.gz").write_bytes(C.clean_gz_bytes(0))
    bad = os.fsdecode(os.fsencode(str(d)) + b"/rank1\xff.pt.trace.json")
    with open(os.fsencode(bad), "wb") as f:
        f.write(b'{"traceEvents": [')

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    assert [s["file"] for s in analysis["inputs"]["skipped"]] == [bad]
    assert "failed" not in err  # both renderers wrote their file
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    summary = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    assert html.escape(bad.replace("\udcff", "\ufffd")) in page
    assert "rank1\ufffd.pt.trace.json" in summary
    assert analysis["ranks"] == clean_rank0_analysis["ranks"]
