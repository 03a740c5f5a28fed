"""tracekit.analyze_run: the library path the CLI, diff, check and advise share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracekit
from tracekit.errors import NothingToAnalyzeError

REPO = Path(__file__).resolve().parents[1]


def test_traces_to_outputs_and_the_store_gives_the_same_analysis(tmp_path):
    run = tracekit.analyze_run(REPO / "fixtures" / "dp_ddp", tmp_path / "out")
    written = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert written["ranks"] == run.analysis["ranks"] and written["findings"] == json.loads(
        json.dumps(run.analysis["findings"], default=str))
    # the two ranks of the fixture's file names, parsed into OUT/tables
    assert [r["rank"] for r in run.analysis["ranks"]] == [0, 1]
    assert (tmp_path / "out" / "tables" / "meta.json").is_file() and run.report == tmp_path / "out" / "report.html"
    again = tracekit.analyze_run(tmp_path / "out" / "tables")  # a run store: analysed as it is, no outputs
    assert again.out is None and again.analysis["ranks"] == run.analysis["ranks"]


def test_nothing_readable_raises_with_what_was_skipped(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "rank0.pt.trace.json").write_bytes(b"{not json")
    with pytest.raises(NothingToAnalyzeError) as info:
        tracekit.analyze_run(d)
    assert [Path(s["file"]).name for s in info.value.skipped] == ["rank0.pt.trace.json"]
    assert not (tmp_path / "out").exists()
