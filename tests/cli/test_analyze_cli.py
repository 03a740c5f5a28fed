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
    # the console wraps long paths (xdist's tmp dirs are long): compare with whitespace removed
    flat = "".join(res.output.split())
    assert "34" in res.output and "".join(str(out / "report.html").split()) in flat
    # a run store (has meta.json) is analyzed directly, with the same numbers
    res2 = CliRunner().invoke(app, ["analyze", str(out / "tables"), "--out", str(tmp_path / "again"), "--quiet"])
    assert res2.exit_code == 0, res2.output
    assert json.loads((tmp_path / "again" / "analysis.json").read_text())["ranks"] == a["ranks"]


def test_nothing_analyzable_exits_non_zero(shared_traces, tmp_path):
    import shutil

    run = tmp_path / "run"  # two traces that state no rank: neither can be assumed to be rank 0
    run.mkdir()
    for name in ("a.json.gz", "b.json.gz"):
        shutil.copy(shared_traces / "hta_rank_not_found" / "rank_not_found.json.gz", run / name)
    res = CliRunner().invoke(app, ["analyze", str(run), "--out", str(tmp_path / "out")])
    assert res.exit_code == 1
    assert "nothing" in res.output and "rank" in res.output


def test_peak_gbps_must_be_group_equals_number(shared_traces, tmp_path):
    res = CliRunner().invoke(app, ["analyze", str(shared_traces / "hta_gloo_cpu_rank34of300"), "--out", str(tmp_path),
                                   "--peak-gbps", "tp150"])
    assert res.exit_code == 2 and "GROUP=GBPS" in res.output


def test_a_lone_trace_without_a_rank_is_rank_0_with_a_warning_or_the_given_rank(shared_traces, tmp_path):
    import gzip

    trace = shared_traces / "hta_no_distributed_info" / "distributed_info_not_found.json.gz"
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    assert "distributedInfo" not in doc  # the premise: neither content nor name states a rank
    complete = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")
    # a file, not a folder, is accepted; without --rank it is rank 0, with a warning on the console,
    # in analysis.json's inputs and in the ranks table
    res = CliRunner().invoke(app, ["analyze", str(trace), "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "analysed as rank 0" in res.output
    a = json.loads((tmp_path / "a" / "analysis.json").read_text())
    assert [r["rank"] for r in a["ranks"]] == [0]
    assert any("analysed as rank 0" in w for w in a["inputs"]["warnings"])
    res = CliRunner().invoke(app, ["analyze", str(trace), "--rank", "5", "--out", str(tmp_path / "b"), "-q"])
    assert res.exit_code == 0, res.output
    a = json.loads((tmp_path / "b" / "analysis.json").read_text())
    assert [r["rank"] for r in a["ranks"]] == [5]
    from tracekit.tables.store import RunStore

    store = RunStore(tmp_path / "b" / "tables")
    (row,) = store.table("ranks", ["rank", "rank_source", "parse_warnings"]).to_pylist()
    assert row["rank_source"] == "user (--rank)" and any("--rank" in w for w in row["parse_warnings"])
    assert store.table("events", ["rank"]).num_rows == complete


def test_rank_does_not_apply_to_several_rankless_traces(shared_traces, tmp_path):
    import shutil

    src = shared_traces / "hta_no_distributed_info" / "distributed_info_not_found.json.gz"
    run = tmp_path / "run"
    run.mkdir()
    for name in ("a.json.gz", "b.json.gz"):
        shutil.copy(src, run / name)
    res = CliRunner().invoke(app, ["parse", str(run), "--rank", "0", "--out", str(tmp_path / "s")])
    assert res.exit_code == 1
    assert res.output.count("applies to a lone trace") == 2
    res = CliRunner().invoke(app, ["parse", str(run), "--out", str(tmp_path / "t")])  # without --rank: the same
    assert res.exit_code == 1 and "a.json.gz" in res.output and "b.json.gz" in res.output
    assert res.output.count("no rank is assumed") == 2
