"""Parallel parsing: the same store with 2 workers as with 1, and no spill files left behind."""

from __future__ import annotations

import pytest

import os

from tests.scale.conftest import assert_stores_equal
from tracekit.parse import pool
from tracekit.parse.run import parse_run


@pytest.mark.slow  # worker processes
def test_two_workers_write_the_same_store(synth_run_16, tmp_path, monkeypatch):
    run, truth = synth_run_16
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setattr(pool, "default_spill_dir", lambda: str(spill))
    serial = parse_run(run, tmp_path / "serial", progress=False).store
    parallel = parse_run(run, tmp_path / "parallel", workers=2, progress=False).store
    assert_stores_equal(serial, parallel)
    assert os.listdir(spill) == []
    rows = parallel.sql("SELECT rank, count(*) AS n FROM events GROUP BY rank").to_pylist()
    counts = {r["rank"]: r["n"] for r in rows}
    assert [counts[r] for r in range(16)] == truth["complete_events_per_rank"]


def test_spilled_tables_come_back_memory_mapped(tmp_path):
    import pyarrow as pa

    t = pa.table({"a": pa.array(["x", "y", "x"]).dictionary_encode(), "b": [1, 2, 3]})
    files = pool.spill_tables({"events": t}, str(tmp_path))
    back = pool.load_spilled(files)
    assert back["events"].equals(t)
    assert os.listdir(tmp_path) == []
