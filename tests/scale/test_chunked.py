"""The chunked (bounded-memory) parse gives the one-shot parser's tables, on real and generated traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.scale.conftest import assert_stores_equal, plain_table
from tracekit.parse.chunked import EventChunks, parse_kineto_chunked
from tracekit.parse.kineto import parse_kineto
from tracekit.parse.run import parse_run

REAL = [  # (file, chunk bytes): chunks small enough to cut every file several times
    ("hta_nccl_a100_rank0of2/nccl_data.json.gz", 400_000),  # modern NCCL args, fractional µs
    ("hta_alltoall_a100_rank0of16/rank0.json.gz", 4_000_000),  # all_to_all, integer µs
    ("hta_gloo_cpu_rank34of300/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", 2_000),  # gloo CPU
    ("kineto_resnet50_2021_workers0/worker0.1623143089861.pt.trace.json.gz", 1_000_000),  # 2021 schema
    ("hta_triton/triton_example.json.gz", 2_000),
    # no ProfilerStep: the iterations the one-shot parser finds (repeated top-level ops) over the whole trace
    ("hta_cuda_event_sync_multi_stream/event_sync_trace.json.gz", 2_000),
]


def _assert_same(path, chunk_bytes: int) -> None:
    a = parse_kineto(path)
    b = parse_kineto_chunked(path, max_memory_bytes=chunk_bytes * 6, chunk_bytes=chunk_bytes)
    for name in a.tables:
        x, y = plain_table(a.tables[name]), plain_table(b.tables[name])
        assert x.num_rows == y.num_rows, name
        assert [c for c in x.column_names if not x.column(c).equals(y.column(c))] == [], name
    assert a.info == b.info
    assert a.phase_counts == b.phase_counts
    assert (a.rank, a.world_size, a.process_groups) == (b.rank, b.world_size, b.process_groups)


@pytest.mark.parametrize("rel,chunk_bytes", REAL, ids=[r.split("/")[0] for r, _ in REAL])
def test_chunked_equals_one_shot_on_real_traces(shared_traces, rel, chunk_bytes):
    path = shared_traces / rel
    assert sum(1 for _ in EventChunks(str(path), chunk_bytes)) > 2
    _assert_same(path, chunk_bytes)


def test_chunked_finds_the_iterations_of_a_trace_without_profiler_step(shared_traces):
    """Each chunk alone repeats too little (or differently): the iterations are found over the whole trace's
    host ops, and every chunk's events take their steps from them (issue 32: the chunked parse found none)."""
    path = shared_traces / "hta_cuda_event_sync_multi_stream/event_sync_trace.json.gz"
    raw = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    assert not [e for e in raw if str(e.get("name", "")).startswith("ProfilerStep#")]
    a = parse_kineto(path).tables["steps"].to_pylist()
    b = parse_kineto_chunked(path, max_memory_bytes=12_000, chunk_bytes=2_000).tables["steps"].to_pylist()
    assert len(a) >= 2 and {s["rule"] for s in a} == {"repeated_ops"}
    assert b == a
    ev = parse_kineto_chunked(path, max_memory_bytes=12_000, chunk_bytes=2_000).tables["events"]
    assert ev.column("step").null_count < ev.num_rows  # the events carry the steps too


def test_chunked_equals_one_shot_on_generated_trace(synth_run_16):
    run, truth = synth_run_16
    path = run / "rank5.pt.trace.json.gz"
    assert sum(1 for _ in EventChunks(str(path), 50_000)) > 5
    _assert_same(path, 50_000)


def test_cut_points_inside_strings_and_nested_objects(tmp_path):
    """Names holding '},{' and args with nested objects must not be cut there."""
    events = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}]
    for i in range(400):
        events.append({"ph": "X", "cat": "cpu_op", "name": 'odd "},{"x": 1} name' if i % 3 == 0 else "aten::mm",
                       "pid": 1, "tid": 1, "ts": 1000 + 10 * i, "dur": 5,
                       "args": {"nested": [{"a": i}, {"b": "},"}], "External id": i}})
    events.insert(0, {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
                      "ts": 999, "dur": 5000})
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}).encode()))
    chunks = list(EventChunks(str(path), 2_000))
    assert len(chunks) > 10
    assert sum(len(json.loads(b"[" + c + b"]")) for c in chunks) == len(events)
    _assert_same(path, 2_000)


def test_parse_run_takes_the_chunked_path_over_budget(synth_run_16, tmp_path):
    run, _ = synth_run_16
    one_shot = parse_run(run, tmp_path / "a", progress=False).store
    chunked = parse_run(run, tmp_path / "b", progress=False, max_memory_bytes=600_000).store
    assert_stores_equal(one_shot, chunked)


def test_chunked_events_reach_the_store_part_by_part_and_leave_no_files(tmp_path, monkeypatch):
    """Over budget, a file's events go to the store chunk by chunk (one row group or more per chunk, never
    the whole rank at once), through the pool too; the chunks spill into the caller's temp dir (also from a
    fork server started before it was set) and every spilled chunk folder is gone afterwards."""
    import pyarrow.parquet as pq

    import tempfile

    from tracekit.parse.pool import start_pool_server
    from tracekit.parse.spilled import SpilledTable

    # the fork server's socket lives in the temp dir of the process that starts it: start it before TMPDIR
    # points at this test's (long, under xdist) tmp path, or AF_UNIX refuses the path for this worker's life
    start_pool_server()
    spill = tmp_path / "tmp"
    spill.mkdir()
    monkeypatch.setenv("TMPDIR", str(spill))
    monkeypatch.setattr(tempfile, "tempdir", None)
    # every chunk folder this process receives (made here, or in a pool worker and handed over): where it was
    received: list[str] = []
    post_init = SpilledTable.__post_init__

    def seen(self):
        received.append(self.workdir)
        post_init(self)

    monkeypatch.setattr(SpilledTable, "__post_init__", seen)
    from benchmarks.synth import SynthConfig, generate_run

    run = tmp_path / "run"
    generate_run(SynthConfig(num_ranks=2, events_per_rank=20_000, tp=2), run)  # ~5 MB of JSON per rank
    one_shot = parse_run(run, tmp_path / "a", progress=False).store
    for workers in (1, 2):
        received.clear()
        # a 2 MB budget: chunked, in chunks of 1 MB (the smallest)
        store = parse_run(run, tmp_path / f"w{workers}", progress=False, workers=workers,
                          max_memory_bytes=2 << 20).store
        assert_stores_equal(one_shot, store)
        md = pq.ParquetFile(store.file("events")).metadata
        assert md.num_row_groups >= 3 * len(store.ranks())  # several chunks per rank
        assert len(received) == len(store.ranks()), received  # one chunk folder per rank's file
        assert all(Path(d).parent == spill for d in received), received
        assert not any(Path(d).exists() for d in received), received
        assert not list(spill.glob("tracekit-chunks-*")), list(spill.iterdir())


def test_spilled_table_hands_its_files_to_the_receiver(tmp_path):
    import pickle

    import pyarrow as pa

    from tracekit.parse.spilled import SpilledTable

    work = tmp_path / "w"
    work.mkdir()
    paths = []
    for k in range(3):
        p = work / f"part{k}.arrows"
        t = pa.table({"x": list(range(k * 10, k * 10 + 10))})
        with pa.OSFile(str(p), "wb") as sink, pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        paths.append(str(p))
    sent = SpilledTable(paths, t.schema, 30, str(work))
    got = pickle.loads(pickle.dumps(sent))
    del sent  # the sender's copy no longer owns the folder
    assert work.is_dir()
    assert got.read_all().column("x").to_pylist() == list(range(30))
    assert not work.exists()  # read once, then removed
    # a consumer that drops it unread leaves nothing behind either
    work.mkdir()
    (work / "part.arrows").write_bytes(b"")
    dropped = SpilledTable([str(work / "part.arrows")], t.schema, 0, str(work))
    del dropped
    assert not work.exists()
