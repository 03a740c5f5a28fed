"""64 generated ranks end to end through `tracekit analyze` with 2 workers and a memory budget."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tracekit.cli.main import app
from tracekit.tables.store import RunStore


@pytest.mark.slow  # worker processes
def test_analyze_64_ranks_end_to_end(synth_run_64, tmp_path):
    run, truth = synth_run_64
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["analyze", str(run), "--out", str(out), "-j", "2", "-q",
                                   "--max-memory", "200KB"])  # every file over budget: chunked path
    assert res.exit_code == 0, res.output
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["inputs"]["ranks"] == list(range(64))
    assert [r["rank"] for r in analysis["ranks"]] == list(range(64))
    assert all(r["steps"] == truth["config"]["num_steps"] for r in analysis["ranks"])
    stragglers = [f for f in analysis["findings"] if f["kind"] == "straggler"]
    assert stragglers and stragglers[0]["ranks"] == [truth["straggler_rank"]]

    store = RunStore(out / "tables")
    per_rank = {r["rank"]: r["n"] for r in store.sql("SELECT rank, count(*) AS n FROM events GROUP BY rank").to_pylist()}
    assert [per_rank[r] for r in range(64)] == truth["complete_events_per_rank"]
    calls = store.sql("SELECT rank, count(*) AS n FROM collectives WHERE source = 'kineto' GROUP BY rank").to_pylist()
    expected = truth["config"]["num_steps"] * truth["config"]["collectives_per_step"]
    assert sorted(c["n"] for c in calls) == [expected] * 64


def test_bad_scale_options_are_usage_errors(synth_run_64, tmp_path):
    run, _ = synth_run_64
    for args in (["--max-memory", "lots"], ["--engine", "spark"], ["--address", "x:1"]):
        res = CliRunner().invoke(app, ["parse", str(run), "--out", str(tmp_path / "s"), *args])
        assert res.exit_code == 2, (args, res.output)
