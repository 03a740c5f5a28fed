"""comms.rank{R}.jsonl: CommLog round trip, cut last line, missing footer, real gloo job logs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.parse.gloo_run import WORLD, gloo_run_dir
from tracekit.errors import TraceFormatError
from tracekit.parse.comms_log import parse_comms_log
from tracekit.record.commlog import CommLog, comms_log_path
from tracekit.tables.schema import COLLECTIVES

PG_CONFIG = {"0": {"name": "0", "desc": "default_pg", "ranks": [0, 1, 2, 3]},
             "5": {"name": "5", "desc": "mesh_tp", "ranks": [2, 3]}}


def _write_log(tmp_path: Path, close: bool = True) -> tuple[Path, list[dict]]:
    log = CommLog(comms_log_path(tmp_path, 2), rank=2, world_size=4, pg_config=PG_CONFIG)
    written = [
        log.record(pg_name="0", pg_desc="default_pg", profiling_name="nccl:all_reduce", time_created_ns=1_000,
                   time_started_ns=1_100, time_completed_ns=1_900, input_sizes=[[4, 8]], input_dtypes=["BFloat16"],
                   output_sizes=[[4, 8]], output_dtypes=["BFloat16"], caller="dp:grad_sync", step=7),
        log.record(pg_name="5", pg_desc="mesh_tp", profiling_name="nccl:all_to_all", time_created_ns=2_000,
                   time_started_ns=None, time_completed_ns=None, input_sizes=[[10, 2]], input_dtypes=["Float"],
                   output_sizes=[[6, 2]], output_dtypes=["Float"], in_split_sizes=[4, 6],
                   out_split_sizes=[3, 3], group_ranks=[2, 3], step=7),
        log.record(pg_name="5", pg_desc="mesh_tp", profiling_name="nccl:send 0->1", time_created_ns=3_000,
                   time_started_ns=3_010, time_completed_ns=None, input_sizes=[[3]], input_dtypes=["Double"],
                   output_sizes=[[3]], output_dtypes=["Double"], is_p2p=True, peer=3, group_ranks=[2, 3]),
        log.record(pg_name="0", pg_desc="default_pg", profiling_name="nccl:all_reduce", time_created_ns=4_000,
                   time_started_ns=4_000, time_completed_ns=4_500, input_sizes=[[1], [2, 2]],
                   input_dtypes=["Float", "Float"], output_sizes=[[1], [2, 2]], output_dtypes=["Float", "Float"]),
    ]
    if close:
        log.close()
    else:
        log.flush()
    return comms_log_path(tmp_path, 2), written


def test_round_trip_every_field(tmp_path: Path) -> None:
    path, written = _write_log(tmp_path)
    parsed = parse_comms_log(path)
    assert (parsed.rank, parsed.rank_source, parsed.world_size, parsed.partial) == (2, "comms-log", 4, False)
    assert parsed.warnings == []
    assert {g["pg_name"]: (g["pg_desc"], g["ranks"]) for g in parsed.process_groups} == \
        {k: (v["desc"], v["ranks"]) for k, v in PG_CONFIG.items()}
    assert parsed.collectives.schema == COLLECTIVES
    rows = parsed.collectives.to_pylist()
    # Independent reference: the file's own lines through plain json.
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    entries = [obj for obj in lines if obj.get("type") not in ("header", "footer")]
    assert entries == written
    elem = {"BFloat16": 2, "Float": 4, "Double": 8}
    for e, r in zip(entries, rows):
        assert r["rank"] == 2 and r["source"] == "comms-log"
        assert (r["pg_name"], r["pg_desc"]) == tuple(e["process_group"])
        assert r["seq"] == (e["p2p_seq_id"] if e["is_p2p"] else e["collective_seq_id"])
        assert r["is_p2p"] == e["is_p2p"] and r["peer"] == e["peer"]
        assert r["in_nelems"] == sum(math.prod(s) for s in e["input_sizes"])
        assert r["out_nelems"] == sum(math.prod(s) for s in e["output_sizes"])
        assert r["dtype"] == e["input_dtypes"][0]
        in_b = sum(math.prod(s) * elem[d] for s, d in zip(e["input_sizes"], e["input_dtypes"]))
        out_b = sum(math.prod(s) * elem[d] for s, d in zip(e["output_sizes"], e["output_dtypes"]))
        assert r["bytes"] == max(in_b, out_b)
        assert r["in_split_sizes"] == e["in_split_sizes"] and r["out_split_sizes"] == e["out_split_sizes"]
        assert r["enqueue_ts"] == e["time_created_ns"]
        assert r["ts"] == e["time_discovered_started_ns"]
        done, start = e["time_discovered_completed_ns"], e["time_discovered_started_ns"]
        assert r["dur"] == (done - start if done and start else None)
        assert r["state"] == e["state"] and r["name"] == e["profiling_name"]
        assert r["caller"] == e["caller"] and r["step"] == e["step"]
        ranks = e["group_ranks"] or PG_CONFIG[e["process_group"][0]]["ranks"]
        assert r["group_ranks"] == ranks and r["group_size"] == len(ranks)
    assert [r["seq"] for r in rows] == [1, 1, 1, 2]  # per group, p2p counted apart
    assert [r["op"] for r in rows] == ["all_reduce", "all_to_all", "send", "all_reduce"]


def test_cut_last_line_keeps_the_rest(tmp_path: Path) -> None:
    path, written = _write_log(tmp_path, close=False)
    text = path.read_text()
    path.write_text(text[: len(text) - 25])  # the rank died half-way through the last entry
    parsed = parse_comms_log(path)
    assert parsed.collectives.num_rows == len(written) - 1
    assert parsed.partial
    assert any("cut off" in w for w in parsed.warnings)
    assert any("partial" in w for w in parsed.warnings)
    assert parsed.collectives.column("enqueue_ts").to_pylist() == [e["time_created_ns"] for e in written[:-1]]


def test_missing_footer_is_partial(tmp_path: Path) -> None:
    path, written = _write_log(tmp_path, close=False)
    parsed = parse_comms_log(path)
    assert parsed.partial and parsed.collectives.num_rows == len(written)
    assert not any("cut off" in w for w in parsed.warnings)


def test_not_a_comms_log(tmp_path: Path) -> None:
    p = tmp_path / "comms.rank0.jsonl"
    p.write_text('{"record_id": 1}\n')
    with pytest.raises(TraceFormatError):
        parse_comms_log(p)


@pytest.mark.parametrize("rank", range(WORLD))
def test_real_job_logs_match_what_was_issued(rank: int) -> None:
    run = gloo_run_dir()
    parsed = parse_comms_log(run / "trace" / f"comms.rank{rank}.jsonl")
    issued = json.loads((run / "expected" / f"ops.rank{rank}.json").read_text())
    rows = parsed.collectives.to_pylist()
    assert not parsed.partial and parsed.rank == rank
    assert [(r["op"], r["pg_name"], r["is_p2p"], r["step"]) for r in rows] == \
        [(o["op"], o["pg_name"], o["is_p2p"], o["step"]) for o in issued]
    assert [(r["enqueue_ts"], r["ts"] + r["dur"]) for r in rows] == [(o["created"], o["done"]) for o in issued]


def _repeating_log(tmp_path: Path, steps: int = 3) -> Path:
    """The same collectives every step (as a training loop logs them): entries that differ only in times,
    sequence numbers and step, which the bulk reader turns into columns once per distinct entry."""
    log = CommLog(comms_log_path(tmp_path, 3), rank=3, world_size=4, pg_config=PG_CONFIG)
    t = 10_000
    for step in range(steps):
        log.record(pg_name="0", pg_desc="default_pg", profiling_name="nccl:all_reduce", time_created_ns=t,
                   time_started_ns=t + 50 + step, time_completed_ns=t + 900 + 7 * step, input_sizes=[[4, 8]],
                   input_dtypes=["BFloat16"], output_sizes=[[4, 8]], output_dtypes=["BFloat16"], step=step)
        log.record(pg_name="5", pg_desc="mesh_tp", profiling_name="nccl:recv 0<-1", time_created_ns=t + 1_000,
                   time_started_ns=t + 1_010, time_completed_ns=t + 1_500 + step, input_sizes=[[3]],
                   input_dtypes=["Float"], output_sizes=[[3]], output_dtypes=["Float"], is_p2p=True, peer=2,
                   group_ranks=[2, 3], step=step)
        t += 10_000
    log.close()
    return comms_log_path(tmp_path, 3)


def test_repeated_entries_keep_their_own_times_and_seq(tmp_path: Path) -> None:
    path = _repeating_log(tmp_path)
    # A Flight Recorder duration on one entry (as `prefer_flight_recorder` writes it): the measured time wins.
    lines = path.read_text().splitlines()
    fr = json.loads(lines[3])
    fr["duration_ms"] = 0.25
    lines[3] = json.dumps(fr)
    path.write_text("\n".join(lines) + "\n")
    parsed = parse_comms_log(path)
    assert parsed.warnings == [] and parsed.collectives.num_rows == 6
    entries = [json.loads(x) for x in lines[1:-1]]
    rows = parsed.collectives.to_pylist()
    for e, r in zip(entries, rows):
        assert r["seq"] == (e["p2p_seq_id"] if e["is_p2p"] else e["collective_seq_id"])
        assert (r["ts"], r["enqueue_ts"], r["step"]) == (e["time_discovered_started_ns"], e["time_created_ns"], e["step"])
        want = (250_000 if "duration_ms" in e else e["time_discovered_completed_ns"] - e["time_discovered_started_ns"])
        assert r["dur"] == want
        assert r["peer"] == e["peer"]
        assert r["bytes"] == (3 * 4 if e["is_p2p"] else 4 * 8 * 2)
    assert [r["seq"] for r in rows] == [1, 1, 2, 2, 3, 3]
    assert [r["dur"] for r in rows][:4] == [850, 490, 250_000, 491]


def test_a_malformed_entry_is_skipped_the_rest_kept(tmp_path: Path) -> None:
    path = _repeating_log(tmp_path)
    lines = path.read_text().splitlines()
    bad = json.loads(lines[2])
    bad["input_sizes"] = "not shapes"
    lines[2] = json.dumps(bad)
    path.write_text("\n".join(lines) + "\n")
    parsed = parse_comms_log(path)
    assert parsed.collectives.num_rows == 5
    assert any("1 malformed entries skipped" in w for w in parsed.warnings)
    kept = [json.loads(x) for i, x in enumerate(lines[1:-1], start=1) if i != 2]
    assert parsed.collectives.column("enqueue_ts").to_pylist() == [e["time_created_ns"] for e in kept]


def _log_only_run(tmp_path: Path, ranks: int = 40) -> Path:
    """`ranks` comms logs (no traces): rank r logs r % 5 + 1 all_reduces over the default group; rank 7's
    log is cut mid-line (partial), rank 11's is not JSON at all (skipped), rank 13's header is fine but every
    line after it is garbage (read line by line)."""
    world = {"0": {"name": "0", "desc": "default_pg", "ranks": list(range(ranks))}}
    for r in range(ranks):
        log = CommLog(comms_log_path(tmp_path, r), rank=r, world_size=ranks, pg_config=world)
        for i in range(r % 5 + 1):
            t = 1_000_000 * (i + 1) + 10 * r
            log.record(pg_name="0", pg_desc="default_pg", profiling_name="nccl:all_reduce", time_created_ns=t,
                       time_started_ns=t + 5, time_completed_ns=t + 500, input_sizes=[[8]], input_dtypes=["Float"],
                       output_sizes=[[8]], output_dtypes=["Float"], step=1)
        log.close()
    p = comms_log_path(tmp_path, 7)
    p.write_bytes(p.read_bytes()[:-30])
    comms_log_path(tmp_path, 11).write_bytes(b"\x00\x01 not a log\n")
    p = comms_log_path(tmp_path, 13)
    p.write_bytes(p.read_bytes().split(b"\n")[0] + b"\n{bad\n[1, 2]\n")
    return tmp_path


def test_log_only_ranks_parsed_on_the_pool_give_the_same_store(tmp_path: Path) -> None:
    """The comms logs of ranks without a trace are parsed on the engine's workers (`map_ranks`, a few logs a
    task) when it has more than one: the store (every table, meta.json's inputs, skipped files and warnings) is
    the one the serial parse writes, and each rank has the rows its log holds (counted with plain json)."""
    import pyarrow.parquet as pq

    from tracekit.engines.local import LocalEngine
    from tracekit.parse.run import parse_run

    run = _log_only_run(tmp_path / "run")
    stores = {}
    for workers in (1, 2):
        engine = LocalEngine(workers=workers)
        try:
            parse_run(run, tmp_path / f"store{workers}", workers=workers, progress=False, engine=engine)
        finally:
            engine.close()
        stores[workers] = tmp_path / f"store{workers}"
    names = sorted(p.name for p in stores[1].glob("*.parquet"))
    assert names == sorted(p.name for p in stores[2].glob("*.parquet")) and "collectives.parquet" in names
    for name in names:
        assert pq.read_table(stores[1] / name).equals(pq.read_table(stores[2] / name)), name
    meta = [json.loads((s / "meta.json").read_text()) for s in stores.values()]
    for m in meta:
        m.pop("trace_dir", None)
    assert meta[0] == meta[1]
    assert [s["file"] for s in meta[0]["inputs"]["skipped"]] == [str(comms_log_path(run, 11))]
    coll = pq.read_table(stores[2] / "collectives.parquet").to_pydict()
    for r in (0, 4, 7, 13, 39):
        lines = [json.loads(x) for x in comms_log_path(run, r).read_text().splitlines()
                 if x.startswith('{"record_id"') and x.endswith("}")]
        assert coll["rank"].count(r) == len(lines), r


HEADER_LINES = [  # what the header reader must read exactly as plain json.loads does, or reject
    b'{"type":"header","rank":3,"world_size":4,"pg_config":{"0":{"name":"0","desc":"default_pg","ranks":[0,1,2,3]}}}',
    b'{"type":"header","rank":3,"pg_config":{"7":{"ranks":[0,1]},"8":{"ranks":[0,1]}}}\n',  # same text, two keys
    b'{"type":"header","pg_config":[{"pg_name":"a","ranks":"[2, 3]","backend_config":"nccl"}, 3]}',
    b'{"type":"header","pg_config":{"0":{"name":"x","ranks":[0]},"0":{"ranks":[5, 6]}}}',  # key repeated
    b'{"type":"header","time_ns":NaN,"pg_config":{"0":{"ranks":[0]}}}',  # json.loads takes NaN
    b'\xef\xbb\xbf{"type":"header","pg_config":{"0":{"ranks":[1]}}}',  # BOM
    b'{"type":"header","rank":123456789012345678901234567890,"pg_config":{"0":{"desc":"\\ud800","ranks":[2]}}}',
    b'{"type":"header","pg_config":null}', b'{"type":"header","pg_config":5}', b'{"type":"header"}',
    b'{"type":"footer","type":"header","pg_config":{"":{"name":""}}}', b'{"type":"header","type":"footer"}',
    b'{"type":"header","pg_config":{"0":{"ranks":[0]}}} x', b'[1]', b'', b'{"type":"header",',
]


@pytest.mark.parametrize("line", HEADER_LINES)
def test_header_groups_are_plain_jsons(line: bytes) -> None:
    """Headers read field by field, each process group decoded once per process (the 10,000-rank world group
    that every rank's header repeats), give what plain json.loads of the line gives: the groups' names,
    descriptions and integer ranks, the other fields as they are; a line that is not a header object is None."""
    from tracekit.parse.comms_log import decode_header

    for _ in range(2):  # the second read comes from the decoded groups kept from the first
        got = decode_header(line)
        try:
            doc = json.loads(line)
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or doc.get("type") != "header":
            assert got is None
            continue
        header, groups = got
        assert header == {k: v for k, v in doc.items() if k != "pg_config"}
        cfg = doc.get("pg_config")
        items = list(cfg.items()) if isinstance(cfg, dict) else [(None, c) for c in cfg] if isinstance(cfg, list) else []
        want = []
        for key, c in items:
            if not isinstance(c, dict) or str(c.get("name", c.get("pg_name", key))) in ("", "None"):
                continue
            ranks = json.loads(c["ranks"]) if isinstance(c.get("ranks"), str) else c.get("ranks")
            want.append((str(c.get("name", c.get("pg_name", key))), c.get("desc"), [int(r) for r in ranks]))
        assert [(g["pg_name"], g["pg_desc"], g["ranks"]) for g in groups] == want


def test_world_group_repeated_by_every_header_is_one_row_seen_by_all(tmp_path: Path) -> None:
    """Six ranks' logs, each header naming the six-rank world group and the rank's own pair: the store's
    process_groups has the world group once, seen by all six, and each pair seen by its two members."""
    from tracekit.parse.run import parse_run
    from tracekit.tables.store import RunStore

    world = 6
    for rank in range(world):
        pair = [rank - rank % 2, rank - rank % 2 + 1]
        cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": list(range(world))},
               str(1 + rank // 2): {"name": str(1 + rank // 2), "desc": "mesh_tp", "ranks": pair}}
        log = CommLog(comms_log_path(tmp_path / "run", rank), rank=rank, world_size=world, pg_config=cfg)
        log.record(pg_name="0", pg_desc="default_pg", profiling_name="nccl:all_reduce", time_created_ns=1_000,
                   time_started_ns=1_100, time_completed_ns=1_900, input_sizes=[[4]], input_dtypes=["Float"],
                   output_sizes=[[4]], output_dtypes=["Float"], step=0)
        log.close()
    parse_run(tmp_path / "run", tmp_path / "store", progress=False)
    rows = RunStore(tmp_path / "store").table("process_groups", ["pg_name", "pg_desc", "ranks", "seen_by"]).to_pylist()
    want = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": list(range(world)), "seen_by": list(range(world))}]
    want += [{"pg_name": str(1 + p), "pg_desc": "mesh_tp", "ranks": [2 * p, 2 * p + 1], "seen_by": [2 * p, 2 * p + 1]}
             for p in range(world // 2)]
    assert sorted(rows, key=lambda r: r["pg_name"]) == want
