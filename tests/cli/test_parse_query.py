"""`tracekit parse` and `tracekit query` through the CLI (typer's CliRunner)."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.cli.main import app
from tracekit.tables.schema import TABLES

runner = CliRunner()


def _x_events(path: Path) -> int:
    with gzip.open(path, "rt") as fh:
        return sum(1 for e in json.load(fh)["traceEvents"] if e.get("ph") == "X")


@pytest.fixture(scope="module")
def sampled_store(tmp_path_factory, shared_traces: Path) -> Path:
    store = tmp_path_factory.mktemp("cli") / "store"
    result = runner.invoke(app, ["parse", str(shared_traces / "hta_sampled_2rank"), "--out", str(store), "--quiet"])
    assert result.exit_code == 0, result.output
    return store


def test_parse_then_query_counts(sampled_store: Path, shared_traces: Path) -> None:
    d = shared_traces / "hta_sampled_2rank"
    expected = {0: _x_events(d / "sampled_rank-0.json.gz"), 1: _x_events(d / "sampled_rank-1.json.gz")}
    res = runner.invoke(app, ["query", str(sampled_store),
                              "SELECT rank, count(*) AS n FROM events GROUP BY rank ORDER BY rank", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert {r["rank"]: r["n"] for r in json.loads(res.stdout)} == expected

    res = runner.invoke(app, ["query", str(sampled_store), "SELECT count(*) AS n FROM events", "-f", "csv"])
    assert res.exit_code == 0
    rows = list(csv.reader(io.StringIO(res.stdout)))
    assert rows == [["n"], [str(sum(expected.values()))]]

    res = runner.invoke(app, ["query", str(sampled_store), "SELECT rank, rank_source FROM ranks ORDER BY rank"])
    assert res.exit_code == 0
    assert "distributedInfo" in res.stdout


def test_parse_summary_and_skipped(tmp_path: Path, shared_traces: Path) -> None:
    res = runner.invoke(app, ["parse", str(shared_traces / "hta_mixed_et_and_kineto"), "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "rank" in out and "events" in out and "collectives" in out
    assert "benchmark_simple_add_et.json.gz" in res.stderr and "execution trace" in res.stderr


def test_parse_nothing_parseable_exits_1(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x.json").write_text('{"nodes": []}')
    res = runner.invoke(app, ["parse", str(tmp_path / "in"), "--out", str(tmp_path / "s"), "--quiet"])
    assert res.exit_code == 1
    assert "x.json" in res.stderr and "nothing" in res.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert runner.invoke(app, ["parse", str(tmp_path / "missing"), "--out", str(tmp_path / "s")]).exit_code == 2
    assert runner.invoke(app, ["parse", str(tmp_path)]).exit_code == 2  # no --out
    assert runner.invoke(app, ["query", str(tmp_path / "missing"), "SELECT 1"]).exit_code == 2


def test_query_schema_and_errors(sampled_store: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["query", str(sampled_store), "--schema"])
    assert res.exit_code == 0
    for name, schema in TABLES.items():
        assert f"{name}:" in res.stdout
        assert all(field.name in res.stdout for field in schema)
    bad = runner.invoke(app, ["query", str(sampled_store), "SELECT nope FROM events"])
    assert bad.exit_code == 1 and "nope" in bad.stderr
    (tmp_path / "empty").mkdir()
    assert runner.invoke(app, ["query", str(tmp_path / "empty"), "SELECT 1"]).exit_code == 1  # not a store


def test_help_texts_have_examples() -> None:
    for cmd in ("parse", "query"):
        res = runner.invoke(app, [cmd, "--help"])
        assert res.exit_code == 0
        assert "Examples" in res.stdout and "tracekit " + cmd in res.stdout
