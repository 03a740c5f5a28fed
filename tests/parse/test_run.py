"""parse_run: discovery, rank identity rules, log/trace join, pipeline labels, shared real traces."""

from __future__ import annotations

import gzip
import math
import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from tests.parse.gloo_run import WORLD, gloo_run_dir
from tracekit.parse.discover import rank_from_filename
from tracekit.parse.run import parse_run
from tracekit.tables.store import RunStore


def _x_events(path: Path) -> int:
    with gzip.open(path, "rt") as fh:
        return sum(1 for e in json.load(fh)["traceEvents"] if e.get("ph") == "X")


def _link(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.symlink_to(src)
    return dst


@pytest.fixture(scope="module")
def gloo_store(tmp_path_factory) -> tuple[Path, RunStore]:
    run = gloo_run_dir()
    result = parse_run(run / "trace", tmp_path_factory.mktemp("gloo") / "store", progress=False)
    return run, result.store


# ---- the real gloo job: trace + comms log ------------------------------------------------------

def test_gloo_run_ranks_and_sources(gloo_store) -> None:
    run, store = gloo_store
    assert store.ranks() == list(range(WORLD))
    assert store.skipped == []
    ranks = {r["rank"]: r for r in store.table("ranks").to_pylist()}
    for rank in range(WORLD):
        assert ranks[rank]["rank_source"] == "distributedInfo"
        assert ranks[rank]["world_size"] == WORLD
        assert ranks[rank]["num_events"] == _x_events(run / "trace" / f"rank{rank}.pt.trace.json.gz")
        assert ranks[rank]["hostname"] == ranks[0]["hostname"] is not None
        # one host, one clock: offsets are the difference of the traces' base times only
        assert ranks[rank]["clock_offset_ns"] == ranks[0]["base_time_ns"] - ranks[rank]["base_time_ns"]
    assert store.meta["manifest"]["world_size"] == WORLD
    assert store.meta["inputs"]["partial_logs"] == []  # both ranks closed their logs
    assert store.meta["inputs"]["files"]["0"]["comms_log"].endswith("comms.rank0.jsonl")
    groups = {g["pg_name"]: g for g in store.table("process_groups").to_pylist()}
    assert groups["0"]["pg_desc"] == "default_pg" and groups["1"]["pg_desc"] == "pair"
    assert groups["0"]["ranks"] == [0, 1] and groups["0"]["seen_by"] == [0, 1]


@pytest.mark.parametrize("rank", range(WORLD))
def test_gloo_kineto_collectives_get_log_sequence(gloo_store, rank: int) -> None:
    """Every profiled collective is matched to the op the job issued: group, seq, step, caller."""
    run, store = gloo_store
    issued = json.loads((run / "expected" / f"ops.rank{rank}.json").read_text())
    # Independent sequence numbers: count per (group, p2p) in issue order, from 1.
    counter: dict[tuple[str, bool], int] = defaultdict(int)
    for op in issued:
        counter[(op["pg_name"], op["is_p2p"])] += 1
        op["seq"] = counter[(op["pg_name"], op["is_p2p"])]
    profiled = [o for o in issued if o["step"] is not None]
    kin = store.sql(f"SELECT * FROM collectives WHERE source = 'kineto' AND rank = {rank} "
                    "ORDER BY enqueue_ts").to_pylist()
    assert len(kin) == len(profiled)
    assert [(k["op"], k["pg_name"], k["seq"], k["is_p2p"], k["step"], k["caller"]) for k in kin] == \
        [(o["op"], o["pg_name"], o["seq"], o["is_p2p"], o["step"], f"pp:stage{rank}:mb{o['step']}:fwd")
         for o in profiled]
    assert {k["seq_source"] for k in kin} == {"log"}
    join = store.meta["join"][str(rank)]
    assert join["matched_by_order"] == len(profiled) and join["numbered_by_order"] == 0

    # Log rows are all kept, on the trace's clock (base time subtracted).
    base = store.table("ranks").to_pylist()[rank]["base_time_ns"]
    log = store.sql(f"SELECT * FROM collectives WHERE source = 'comms-log' AND rank = {rank} "
                    "ORDER BY enqueue_ts").to_pylist()
    assert [(r["op"], r["pg_name"], r["seq"]) for r in log] == [(o["op"], o["pg_name"], o["seq"]) for o in issued]
    assert [r["enqueue_ts"] + base for r in log] == [o["created"] for o in issued]
    # Each matched Kineto op lies inside its log entry's [created, done] window, on one clock.
    by_key = {(r["pg_name"], r["is_p2p"], r["seq"]): r for r in log}
    for k in kin:
        lr = by_key[(k["pg_name"], k["is_p2p"], k["seq"])]
        assert lr["enqueue_ts"] <= k["enqueue_ts"] <= lr["ts"] + lr["dur"]


@pytest.mark.parametrize("late_us", [60, 200, 1000])
def test_gloo_join_holds_when_the_profiler_clock_is_off(tmp_path: Path, monkeypatch, late_us: int) -> None:
    """The profiler stamps ops on its own clock, converted to wall time by a fit made when it starts; on a
    loaded host that fit is off by tens to hundreds of µs (a CI run matched one all_gather to nothing). With
    the log's times moved `late_us` later against the trace, every profiled collective still gets the
    sequence number the job issued it with (counted here in issue order)."""
    import tracekit.parse.run as run_mod

    run = gloo_run_dir()
    join = run_mod.join_collectives
    monkeypatch.setattr(run_mod, "join_collectives", lambda kin, log, *, log_shift_ns=0, groups=None: join(
        kin, log, log_shift_ns=log_shift_ns - late_us * 1000, groups=groups))
    store = parse_run(run / "trace", tmp_path / "store", progress=False).store
    for rank in range(WORLD):
        issued = json.loads((run / "expected" / f"ops.rank{rank}.json").read_text())
        counter: dict[tuple[str, bool], int] = defaultdict(int)
        profiled = []
        for op in issued:
            counter[(op["pg_name"], op["is_p2p"])] += 1
            if op["step"] is not None:
                profiled.append((op["op"], op["pg_name"], counter[(op["pg_name"], op["is_p2p"])]))
        kin = store.sql(f"SELECT op, pg_name, seq, seq_source FROM collectives WHERE source = 'kineto' "
                        f"AND rank = {rank} ORDER BY enqueue_ts").to_pylist()
        assert [(k["op"], k["pg_name"], k["seq"]) for k in kin] == profiled
        assert {k["seq_source"] for k in kin} == {"log"}


def test_gloo_pipeline_rows_from_labels(gloo_store) -> None:
    run, store = gloo_store
    rows = store.sql("SELECT rank, step, stage, microbatch, CAST(phase AS VARCHAR) AS phase, ts, dur "
                     "FROM pipeline ORDER BY rank, ts").to_pylist()
    labels = store.sql("SELECT rank, CAST(name AS VARCHAR) AS name, ts, dur FROM events "
                       "WHERE CAST(name AS VARCHAR) LIKE 'pp:stage%' ORDER BY rank, ts").to_pylist()
    assert len(rows) == len(labels) == WORLD * 2
    for row, ev in zip(rows, labels):
        assert ev["name"] == f"pp:stage{row['stage']}:mb{row['microbatch']}:{row['phase']}"
        assert (row["rank"], row["ts"], row["dur"]) == (ev["rank"], ev["ts"], ev["dur"])
        assert row["stage"] == row["rank"] and row["microbatch"] == row["step"] and row["phase"] == "fwd"


def test_comms_log_only_and_flight_recorder_only(tmp_path: Path) -> None:
    run = gloo_run_dir()
    for rank in range(WORLD):
        _link(run / "trace" / f"comms.rank{rank}.jsonl", tmp_path / "logs" / f"comms.rank{rank}.jsonl")
        _link(run / "fr_pickle" / f"fr_trace_rank_{rank}", tmp_path / "fr" / f"fr_trace_rank_{rank}")
    (tmp_path / "logs" / "manifest.json").write_text(json.dumps({"world_size": WORLD, "hosts": {"0": "hA", "1": "hB"}}))
    logs = parse_run(tmp_path / "logs", tmp_path / "s1", progress=False).store
    assert [r["hostname"] for r in logs.table("ranks").to_pylist()] == ["hA", "hB"]  # from the manifest
    fr = parse_run(tmp_path / "fr", tmp_path / "s2", progress=False).store
    assert logs.ranks() == fr.ranks() == list(range(WORLD))
    assert {r["rank_source"] for r in logs.table("ranks").to_pylist()} == {"comms-log"}
    assert {r["rank_source"] for r in fr.table("ranks").to_pylist()} == {"filename"}
    for rank in range(WORLD):
        issued = json.loads((run / "expected" / f"ops.rank{rank}.json").read_text())
        assert logs.rank_table("collectives", rank).num_rows == len(issued)
        assert fr.rank_table("collectives", rank).num_rows == sum(not o["is_p2p"] for o in issued)
    # Flight Recorder rows learn group ranks from nothing here (gloo's pg_config is empty): null, not invented.
    assert set(fr.table("collectives").column("group_ranks").to_pylist()) == {None}


def test_truncated_comms_log_in_a_run(tmp_path: Path) -> None:
    run = gloo_run_dir()
    text = (run / "trace" / "comms.rank1.jsonl").read_text()
    lines = text.splitlines(keepends=True)
    cut = "".join(lines[:-2]) + lines[-2][:30]  # drop footer, cut the last entry
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "comms.rank1.jsonl").write_text(cut)
    store = parse_run(tmp_path / "in", tmp_path / "s", progress=False).store
    assert store.ranks() == [1]
    assert store.table("collectives").num_rows == len(lines) - 3  # minus header, footer, cut entry
    warnings = store.table("ranks").to_pylist()[0]["parse_warnings"]
    assert any("cut off" in w for w in warnings) and any("partial" in w for w in warnings)
    assert store.meta["inputs"]["partial_logs"] == [str(tmp_path / "in" / "comms.rank1.jsonl")]


# ---- rank identity ------------------------------------------------------------------------------

@pytest.mark.parametrize("name,rank", [
    ("rank-3.json.gz", 3), ("rank3.pt.trace.json.gz", 3), ("trace_rank_12.json", 12), ("RANK7.json", 7),
    ("sampled_rank-0.json.gz", 0), ("rank.5.json", 5), ("comms.rank11.jsonl", 11),
    ("worker0.1623143089861.pt.trace.json.gz", None), ("franky3.json", None), ("trace.json", None),
])
def test_rank_from_filename(name: str, rank: int | None) -> None:
    assert rank_from_filename(name) == rank


def test_rank_identity_rules(tmp_path: Path, shared_traces: Path) -> None:
    no_info = shared_traces / "hta_no_distributed_info" / "distributed_info_not_found.json.gz"
    no_rank = shared_traces / "hta_rank_not_found" / "rank_not_found.json.gz"  # distributedInfo without rank
    r0 = shared_traces / "hta_sampled_2rank" / "sampled_rank-0.json.gz"
    src = tmp_path / "in"
    _link(no_info, src / "a" / "rank5.json.gz")           # rank from the file name
    _link(no_rank, src / "b" / "trace_rank_7.json.gz")    # distributedInfo lacks rank: name
    _link(no_info, src / "c" / "anonymous.json.gz")      # neither: skipped
    _link(r0, src / "d" / "first.json.gz")               # distributedInfo rank 0
    _link(r0, src / "e" / "rank9_copy.json.gz")          # also rank 0 (content wins over name): conflict
    store = parse_run(src, tmp_path / "store", progress=False).store
    ranks = {r["rank"]: r for r in store.table("ranks").to_pylist()}
    assert sorted(ranks) == [0, 5, 7]
    assert (ranks[5]["rank_source"], ranks[7]["rank_source"], ranks[0]["rank_source"]) == \
        ("filename", "filename", "distributedInfo")
    assert ranks[0]["source_file"].endswith("first.json.gz")
    skipped = {Path(s["file"]).name: s["reason"] for s in store.skipped}
    assert set(skipped) == {"anonymous.json.gz", "rank9_copy.json.gz"}
    assert "no rank" in skipped["anonymous.json.gz"]
    assert str(src / "d" / "first.json.gz") in skipped["rank9_copy.json.gz"]
    assert str(src / "e" / "rank9_copy.json.gz") in skipped["rank9_copy.json.gz"]
    # events of each rank carry that rank, never a placeholder
    assert sorted(set(store.table("events", ["rank"]).column("rank").to_pylist())) == [0, 5, 7]
    assert store.rank_table("events", 5).num_rows == _x_events(no_info)


def test_content_rank_wins_over_name_with_warning(tmp_path: Path, shared_traces: Path) -> None:
    _link(shared_traces / "hta_sampled_2rank" / "sampled_rank-1.json.gz", tmp_path / "in" / "rank4.json.gz")
    store = parse_run(tmp_path / "in", tmp_path / "s", progress=False).store
    row = store.table("ranks").to_pylist()[0]
    assert row["rank"] == 1 and row["rank_source"] == "distributedInfo"
    assert any("file name says 4" in w for w in row["parse_warnings"])


def test_duplicate_comms_logs_name_both_files(tmp_path: Path) -> None:
    run = gloo_run_dir()
    a = _link(run / "trace" / "comms.rank0.jsonl", tmp_path / "in" / "a" / "comms.rank0.jsonl")
    b = _link(run / "trace" / "comms.rank0.jsonl", tmp_path / "in" / "b" / "comms.rank0.jsonl")
    result = parse_run(tmp_path / "in", tmp_path / "s", progress=False)
    assert result.store.ranks() == [0]
    assert len(result.skipped) == 1 and result.skipped[0]["file"] == str(b)
    assert str(a) in result.skipped[0]["reason"] and str(b) in result.skipped[0]["reason"]


def test_nothing_parseable(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.json").write_text('{"hello": 1}')
    result = parse_run(tmp_path / "in", tmp_path / "s", progress=False)
    assert result.store.ranks() == []
    assert [Path(s["file"]).name for s in result.skipped] == ["notes.json"]


# ---- shared real traces -------------------------------------------------------------------------

def test_sampled_2rank(tmp_path: Path, shared_traces: Path) -> None:
    d = shared_traces / "hta_sampled_2rank"
    store = parse_run(d, tmp_path / "s", progress=False).store
    assert store.ranks() == [0, 1] and store.skipped == []
    counts = {r["rank"]: r["n"] for r in store.sql("SELECT rank, count(*) AS n FROM events GROUP BY rank").to_pylist()}
    assert counts == {0: _x_events(d / "sampled_rank-0.json.gz"), 1: _x_events(d / "sampled_rank-1.json.gz")}
    # world size 128 with two files: a warning naming the missing ranks, none invented
    assert store.meta["world_size"] == 128
    assert any("missing ranks [2, 3, 4" in w and "126 missing" in w for w in store.meta["warnings"])
    # no log: Kineto collectives are numbered by order within their group
    kin = store.sql("SELECT rank, pg_name, seq, seq_source, enqueue_ts, ts FROM collectives "
                    "WHERE source = 'kineto'").to_pylist()
    for rank in (0, 1):
        rows = [r for r in kin if r["rank"] == rank]
        assert rows, "the sampled traces hold NCCL collectives"
        by_group: dict = defaultdict(list)
        for r in rows:
            if r["seq_source"] == "order":
                by_group[r["pg_name"]].append(r)
        for group_rows in by_group.values():
            group_rows.sort(key=lambda r: r["enqueue_ts"] if r["enqueue_ts"] is not None else r["ts"])
            assert [r["seq"] for r in group_rows] == list(range(1, len(group_rows) + 1))


def test_mixed_execution_trace_and_kineto(tmp_path: Path, shared_traces: Path) -> None:
    store = parse_run(shared_traces / "hta_mixed_et_and_kineto", tmp_path / "s", progress=False).store
    assert store.ranks() == [0]
    assert [Path(s["file"]).name for s in store.skipped] == ["benchmark_simple_add_et.json.gz"]
    assert "execution trace" in store.skipped[0]["reason"]


def test_gloo_rank34_groups_and_pg_count_warning(tmp_path: Path, shared_traces: Path) -> None:
    d = shared_traces / "hta_gloo_cpu_rank34of300"
    store = parse_run(d, tmp_path / "s", progress=False).store
    assert store.ranks() == [34]
    with gzip.open(next(d.glob("*.gz")), "rt") as fh:
        info = json.load(fh)["distributedInfo"]
    groups = store.table("process_groups").to_pylist()
    assert sorted((g["pg_name"], tuple(g["ranks"])) for g in groups) == \
        sorted((c["pg_name"], tuple(c["ranks"])) for c in info["pg_config"])
    assert all(g["seen_by"] == [34] and g["dim"] == ("world" if g["pg_desc"] == "default_pg" else "unknown") for g in groups)
    warnings = store.table("ranks").to_pylist()[0]["parse_warnings"]
    assert any("pg_count" in w for w in warnings)  # pg_count 10 vs 11 pg_config entries


def test_workers_give_the_same_store(tmp_path: Path, shared_traces: Path) -> None:
    d = shared_traces / "hta_sampled_2rank"
    one = parse_run(d, tmp_path / "one", progress=False).store
    two = parse_run(d, tmp_path / "two", workers=2, progress=False).store
    for name in ("ranks", "events", "kernels", "collectives", "steps", "process_groups"):
        assert one.table(name).equals(two.table(name)), name


def test_process_group_merge() -> None:
    from tracekit.parse.run import _GroupMerger

    m = _GroupMerger()
    m.add([{"pg_name": "3", "pg_desc": None, "ranks": None, "size": None, "backend": None}], rank=1)
    m.add([{"pg_name": "3", "pg_desc": "mesh_tp", "ranks": [0, 1], "size": 2, "backend": "gloo"}], rank=0)
    m.add([{"pg_name": "3", "pg_desc": "mesh_tp", "ranks": [2, 3], "size": 2, "backend": "gloo"}], rank=2)
    m.add([{"pg_name": "3", "pg_desc": "mesh_tp", "ranks": [0, 1], "size": 2, "backend": "gloo"}], rank=1)
    rows = m.table().to_pylist()
    assert [(r["pg_name"], r["ranks"], r["seen_by"], r["pg_desc"]) for r in rows] == \
        [("3", [0, 1], [0, 1], "mesh_tp"), ("3", [2, 3], [2], "mesh_tp")]
    assert m.ranks_of("3", 3) == [2, 3] and m.ranks_of("3", 0) == [0, 1] and m.ranks_of("9", 0) is None


def test_clock_offsets_from_hosts_and_manifest_anchors() -> None:
    from tracekit.parse.run import _clock_offsets

    def row(rank, host, epoch=0):
        return {"rank": rank, "hostname": host, "clock_offset_ns": None, "_epoch": epoch}

    base = 1_790_000_000_000_000_000
    # Same host: one clock; only the Kineto epochs differ (rank 2 is a log-only rank on wall clock).
    rows = [row(0, "a", base), row(1, "a", base + 5_000), row(2, "a", 0)]
    warnings: list[str] = []
    _clock_offsets(rows, None, warnings)
    assert [r["clock_offset_ns"] for r in rows] == [0, -5_000, base] and warnings == []

    # Other host, `tracekit record` anchors: median over barrier samples of (wall_r - wall_ref).
    samples = {"0": {"barrier_samples": [{"wall_ns": 100}, {"wall_ns": 200}, {"wall_ns": 300}]},
               "1": {"barrier_samples": [{"wall_ns": 1_100}, {"wall_ns": 1_150}, {"wall_ns": 1_400}]}}
    rows = [row(0, "a"), row(1, "b"), row(2, None)]
    warnings = []
    _clock_offsets(rows, {"clock_anchors": samples}, warnings)
    assert [r["clock_offset_ns"] for r in rows] == [0, 1_000, None]
    assert warnings and "unknown" in warnings[0]

    # Other host, runtime manifest offsets; the reference is the lowest rank when rank 0 is absent.
    rows = [row(1, "a"), row(3, "b", 7)]
    _clock_offsets(rows, {"clock_offset_ns": {"1": 50, "3": 2_050}}, [])
    assert [r["clock_offset_ns"] for r in rows] == [0, 2_000 - 7]


@pytest.mark.slow
def test_reference_runtime_run_joins_every_profiled_log_entry(tmp_path: Path) -> None:
    """The reference runtime (DDP x 1F1B pipeline, async all_reduce, batched P2P, MoE routing log):
    every logged op issued inside the profiled steps is matched by exactly one profiler collective."""
    import subprocess
    import sys

    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "instrumented_runtime", "--dp", "2", "--pp", "2", "--steps", "3",
                           "--microbatches", "4", "--schedule", "1f1b", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    profiled = set(manifest["profiled_steps"])
    store = parse_run(out, tmp_path / "store", progress=False).store
    world = manifest["world_size"]
    assert store.ranks() == list(range(world)) and store.skipped == [] and store.meta["warnings"] == []
    assert "ground_truth" not in store.meta and store.meta["manifest"]["world_size"] == world  # no answer key
    coll = store.table("collectives").to_pylist()
    for rank in range(world):
        lines = [json.loads(x) for x in (out / f"comms.rank{rank}.jsonl").read_text().splitlines()]
        entries = [e for e in lines if e.get("type") not in ("header", "footer")]
        key = lambda e: (e["process_group"][0], e["is_p2p"], e["p2p_seq_id"] if e["is_p2p"] else e["collective_seq_id"])  # noqa: E731
        by_key = {key(e): e for e in entries}
        in_window = {key(e) for e in entries if e["step"] in profiled}
        kin = [c for c in coll if c["rank"] == rank and c["source"] == "kineto"]
        matched = [c for c in kin if c["seq_source"] == "log"]
        assert sorted((c["pg_name"], c["is_p2p"], c["seq"]) for c in matched) == sorted(in_window)
        for c in matched:
            e = by_key[(c["pg_name"], c["is_p2p"], c["seq"])]
            assert c["op"] == e["profiling_name"].split(":")[1]
            logged = max(sum(math.prod(s) for s in e["input_sizes"]), sum(math.prod(s) for s in e["output_sizes"]))
            assert max(c["in_nelems"] or 0, c["out_nelems"] or 0) in (logged, 0) or logged == 0
        assert sum(c["source"] == "comms-log" and c["rank"] == rank for c in coll) == len(entries)
        routing_lines = (out / f"routing.rank{rank}.jsonl").read_text().splitlines()
        assert store.rank_table("routing", rank).num_rows == len(routing_lines)
    labels = store.sql("SELECT count(*) AS n FROM events WHERE regexp_matches(CAST(name AS VARCHAR), "
                       "'^pp:stage[0-9]+:mb[0-9]+:(fwd|bwd|bwd_input|bwd_weight)$')").to_pylist()[0]["n"]
    assert store.table("pipeline").num_rows == labels > 0
    assert {r["clock_offset_ns"] for r in store.table("ranks").to_pylist()} == {0}  # one host, equal bases


def test_the_answer_key_never_changes_the_analysis(tmp_path):
    """The answer key is a hidden file, and hidden files are never inputs: the same traces give the same
    analysis.json with the answer key as written, with every value changed, corrupt, or absent."""
    import shutil

    import tracekit

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[2] / "fixtures" / "faults", run)
    key = run / ".ground_truth.json"
    truth = json.loads(key.read_text())
    changed = {**truth, "faults": [{**f, "ranks": [9], "kind": "slow_link", "dim": "tp"} for f in truth["faults"]],
               "config": {**truth["config"], "dp": 7, "faults": {}}, "layout": {"pp": 3, "groups": {"pp": [[0, 1]]}}}
    variants = {"as written": key.read_bytes(), "values changed": json.dumps(changed).encode(),
                "corrupt": b"{\x00 not json", "absent": None}
    outputs = {}
    for name, content in variants.items():
        if content is None:
            key.unlink()
        else:
            key.write_bytes(content)
        out = tmp_path / "out"
        shutil.rmtree(out, ignore_errors=True)
        tracekit.analyze_run(run, out)
        outputs[name] = (out / "analysis.json").read_text()
    assert truth["faults"] and changed["faults"] != truth["faults"]
    assert len(set(outputs.values())) == 1, [n for n in outputs if outputs[n] != outputs["as written"]]
