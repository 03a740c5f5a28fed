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


def test_auto_workers_are_one_per_core_capped_by_files_and_free_memory(tmp_path, monkeypatch):
    import tracekit.engines.local as local
    import tracekit.parse.pool as pool
    from tracekit.engines.options import available_cores, engine_from_options

    engine, budget = engine_from_options("local", workers=0, address=None, max_memory=None)
    assert engine.auto and engine.workers == available_cores() and budget is None
    explicit, _ = engine_from_options("local", workers=3, address=None, max_memory=None)
    assert not explicit.auto and explicit.workers == 3
    # three plain 1 MB "traces": sizes are all memory_workers reads
    paths = []
    for k in range(3):
        p = tmp_path / f"rank{k}.json"
        p.write_bytes(b" " * 1_000_000)
        paths.append(str(p))
    GB = 1_000_000_000
    monkeypatch.setattr(pool, "available_memory_bytes", lambda: 10 * GB)
    assert pool.memory_workers(paths, None) == int(10 * GB * 0.6 // (1.5e6 + 1e6))
    monkeypatch.setattr(pool, "available_memory_bytes", lambda: 6_000_000)  # 6 MB free: 3.6 MB usable
    assert pool.memory_workers(paths, None) == 1                            # 2.5 MB per worker
    assert pool.memory_workers(paths, 200_000) == 3                         # a budget: 1.2 MB per worker
    seen = []
    monkeypatch.setattr(local, "parse_kineto_files", lambda p, workers, **kw: seen.append(workers) or iter(()))
    monkeypatch.setattr(pool, "available_memory_bytes", lambda: 10 * GB)
    local.LocalEngine(workers=8, auto=True).parse_kineto_files(paths)
    local.LocalEngine(workers=8, auto=False).parse_kineto_files(paths)     # the user's count stands
    assert seen == [3, 8]
    with __import__("pytest").raises(ValueError, match="--workers"):
        engine_from_options("local", workers=-1, address=None, max_memory=None)


@pytest.mark.parametrize("trace,ranks", [("hta_sampled_2rank", [0, 1]), ("tl_h100_qwen", [0])])
def test_ops_derived_in_the_worker_equal_the_writers_own(shared_traces, tmp_path, monkeypatch, trace, ranks):
    """`ops` and `kernel_summary`, computed where each trace is parsed (parse/ops.derived_tables), are the rows the
    store writer computes itself when the parse hands none over (as for a chunked parse), on real traces (HTA's
    2-rank NCCL run: kernel rows, no op with shapes; a vLLM Qwen step: 1,030 ops); the worker's tables carry
    rank 0 until the writer sets each rank's."""
    from tests.scale.conftest import plain_table
    from tracekit.parse import ops as parse_ops

    run = shared_traces / trace
    worker = parse_run(run, tmp_path / "worker", progress=False).store
    monkeypatch.setattr(pool, "derived_tables", lambda tables: {})
    writer = parse_run(run, tmp_path / "writer", progress=False).store
    assert worker.ranks() == writer.ranks() == ranks
    for name in parse_ops.DERIVED:
        a, b = plain_table(worker.table(name)), plain_table(writer.table(name))
        assert a.equals(b), name
        assert sorted(set(a.column("rank").to_pylist())) == (ranks if a.num_rows else [])
    assert worker.table("kernel_summary").num_rows > 0
    assert trace != "tl_h100_qwen" or worker.table("ops").num_rows > 1000
