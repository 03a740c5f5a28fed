"""`tracekit analyze`: exit codes, outputs, re-analysing a run store, option errors."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tracekit.cli.main import app


def test_analyze_writes_outputs_and_reanalyzes_its_store(shared_traces, tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["analyze", str(shared_traces / "hta_gloo_cpu_rank34of300"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    a = json.loads((out / "analysis.json").read_text())
    assert a["inputs"]["ranks"] == [34] and [r["rank"] for r in a["ranks"]] == [34]
    assert (out / "tables" / "meta.json").is_file()
    assert (out / "report.html").is_file() and (out / "summary.md").is_file()
    assert "34" in res.output and "report.html" in res.output
    # a run store (has meta.json) is analyzed directly, with the same numbers
    res2 = CliRunner().invoke(app, ["analyze", str(out / "tables"), "--out", str(tmp_path / "again"), "--quiet"])
    assert res2.exit_code == 0, res2.output
    assert json.loads((tmp_path / "again" / "analysis.json").read_text())["ranks"] == a["ranks"]


def test_nothing_analyzable_exits_non_zero(shared_traces, tmp_path):
    res = CliRunner().invoke(app, ["analyze", str(shared_traces / "hta_rank_not_found"), "--out", str(tmp_path)])
    assert res.exit_code == 1
    assert "nothing" in res.output and "rank" in res.output


def test_peak_gbps_must_be_group_equals_number(shared_traces, tmp_path):
    res = CliRunner().invoke(app, ["analyze", str(shared_traces / "hta_gloo_cpu_rank34of300"), "--out", str(tmp_path),
                                   "--peak-gbps", "tp150"])
    assert res.exit_code == 2 and "GROUP=GBPS" in res.output
