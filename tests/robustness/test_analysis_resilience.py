"""The analysis survives its own parts failing: an analyzer that raises on odd input is listed in
`analyzer_errors` while every other section is produced; names that look like rich markup are printed
as text."""

from __future__ import annotations

import jsonschema

from . import corpus as C
from .conftest import run_analyze
from .test_analyze_bad_inputs import SCHEMA


def test_failing_analyzer_is_listed_and_the_rest_runs(tmp_path, monkeypatch, clean_pair_analysis):
    def boom(store):
        raise KeyError("a column this trace does not have")

    monkeypatch.setattr("tracekit.analyze.pipeline.analyze_pipeline", boom)
    d = C.write_clean_pair(tmp_path / "run")

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    jsonschema.validate(analysis, SCHEMA)
    assert analysis["analyzer_errors"] == [{"analyzer": "pipeline", "error": "KeyError: 'a column this trace does not have'"}]
    assert "analyzer pipeline failed" in " ".join(err.split())
    assert "pipeline" not in analysis["sections"]
    assert set(analysis["sections"]) == set(clean_pair_analysis["sections"]) - {"pipeline"}
    assert analysis["ranks"] == clean_pair_analysis["ranks"]
    assert clean_pair_analysis["analyzer_errors"] == []
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<li>pipeline: KeyError: &#x27;a column this trace does not have&#x27;</li>" in page
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "- pipeline: KeyError: 'a column this trace does not have'" in summary


def test_isolation_can_be_turned_off_for_debugging(tmp_path, monkeypatch):
    import pytest

    from tracekit.flow import analyze_store
    from tracekit.config import AnalysisConfig
    from tracekit.parse.run import parse_run

    def boom(store):
        raise KeyError("x")

    monkeypatch.setattr("tracekit.analyze.pipeline.analyze_pipeline", boom)
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0.pt.trace.json.gz").write_bytes(C.clean_gz_bytes(0))
    store = parse_run(d, tmp_path / "store", progress=False).store
    with pytest.raises(KeyError):
        analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False))


def test_markup_like_path_is_printed_as_text(tmp_path, clean_rank0_analysis):
    """A folder named `a[/b]` (a rich closing tag) with a bad file: messages print, nothing raises."""
    d = tmp_path / "a[" / "b]"
    d.mkdir(parents=True)
    (d / "rank0.pt.trace.json.gz").write_bytes(C.clean_gz_bytes(0))
    (d / "rank1.pt.trace.json").write_bytes(b'{"traceEvents": [')
    from typer.testing import CliRunner

    from tracekit.cli.main import app

    res = CliRunner().invoke(app, ["analyze", str(d), "--out", str(tmp_path / "out")])  # not quiet: summary too
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 0
    assert "".join(f"{d / 'rank1.pt.trace.json'}: invalid JSON".split()) in "".join(res.stderr.split())


def test_damaged_run_store(tmp_path, clean_pair_analysis):
    """Re-analysing a store: cut meta.json exits 1 naming it; a cut Parquet table is an analyzer error, not a crash."""
    import shutil

    d = C.write_clean_pair(tmp_path / "run")
    code, err, _ = run_analyze(d, tmp_path / "first")
    assert code == 0, err
    store = tmp_path / "first" / "tables"

    cut_meta = tmp_path / "cut_meta"
    shutil.copytree(store, cut_meta)
    text = (cut_meta / "meta.json").read_text()
    (cut_meta / "meta.json").write_text(text[: len(text) // 2])
    code, err, analysis = run_analyze(cut_meta, tmp_path / "out1")
    assert code == 1 and analysis is None
    assert "".join(f"{cut_meta / 'meta.json'}: unreadable run store metadata".split()) in "".join(err.split())

    cut_table = tmp_path / "cut_table"
    shutil.copytree(store, cut_table)
    raw = (cut_table / "steps.parquet").read_bytes()
    (cut_table / "steps.parquet").write_bytes(raw[: len(raw) // 2])
    code, err, analysis = run_analyze(cut_table, tmp_path / "out2")
    assert analysis is not None and analysis["analyzer_errors"]
    assert all("steps.parquet" in e["error"] or "Parquet" in e["error"] for e in analysis["analyzer_errors"])
    assert "layout" in analysis["sections"]  # analyzers that do not read the cut table still ran


def test_check_and_diff_print_markup_like_paths_as_text(tmp_path):
    from typer.testing import CliRunner

    from tracekit.cli.main import app

    d = tmp_path / "c[" / "d]"
    d.mkdir(parents=True)
    (d / "rank0.pt.trace.json").write_bytes(b"")  # nothing analysable
    for args in (["check", str(d), "--max-idle", "0.5"], ["diff", str(d), str(d), "--out", str(tmp_path / "o"), "-q"]):
        res = CliRunner().invoke(app, args)
        assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
        assert res.exit_code == 2
        assert "".join(f"{d}: no trace could be analysed".split()) in "".join(res.stderr.split())
