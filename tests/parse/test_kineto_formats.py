"""Kineto format variants and bad input, on small hand-written traces and the shared real ones."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from tracekit.errors import InputTooLargeError, TraceFormatError
from tracekit.parse.collective_names import dtype_bytes, is_comm_kernel_name, kernel_op, normalize_op
from tracekit.parse.kineto import is_kineto_trace, parse_kineto

_DIR = Path(os.environ.get("TRACEKIT_SHARED_TRACES") or Path(__file__).resolve().parents[2].parent / "shared" / "traces")


def _shared(sub: str) -> Path:
    files = sorted((_DIR / sub).glob("*"))
    if not files:
        pytest.fail(f"shared trace {sub} missing under {_DIR}")
    return files[0]


def _write(tmp_path: Path, doc, name="t.json", gz=False) -> Path:
    data = doc if isinstance(doc, (bytes, str)) else json.dumps(doc)
    data = data.encode() if isinstance(data, str) else data
    p = tmp_path / (name + (".gz" if gz else ""))
    p.write_bytes(gzip.compress(data) if gz else data)
    return p


def _x(name, ts, dur, cat="cpu_op", pid=1, tid=1, **args):
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "args": args}
    if dur is not None:
        e["dur"] = dur
    return e


# ---------------------------------------------------------------------------------------------
# names


@pytest.mark.parametrize("raw, op", [
    ("allreduce", "all_reduce"), ("AllReduce", "all_reduce"), ("all_reduce", "all_reduce"),
    ("_allgather_base", "all_gather"), ("all_gather_into_tensor", "all_gather"),
    ("reduce_scatter_tensor", "reduce_scatter"), ("alltoall", "all_to_all"), ("all_to_allv", "all_to_all"),
    ("all_to_all_single", "all_to_all"), ("c10d::alltoall_base_", "all_to_all"), ("nccl:_all_gather_base", "all_gather"),
    ("send", "send"), ("recv", "recv"), ("c10d::recv_", "recv"), ("broadcast", "broadcast"), ("barrier", "barrier"),
    ("gloo:all_to_all", "all_to_all"), ("wait", None), ("coalesced", None), ("SendRecv", None), ("frobnicate", "unknown"),
])
def test_collective_op_spellings(raw, op):
    assert normalize_op(raw) == op


def test_comm_kernel_names():
    assert is_comm_kernel_name("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)")
    assert is_comm_kernel_name("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)")
    assert is_comm_kernel_name("ncclDevKernel_Generic")
    assert not is_comm_kernel_name("volta_sgemm_128x64_nn")
    assert kernel_op("ncclKernel_ReduceScatter_RING_SIMPLE_Sum_bfloat16") == "reduce_scatter"
    assert kernel_op("ncclDevKernel_Generic") is None  # RCCL's one kernel serves every op
    assert kernel_op("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t") is None
    assert (dtype_bytes("Float"), dtype_bytes("BFloat16"), dtype_bytes("c10::Half"), dtype_bytes("Long")) == (4, 2, 2, 8)


# ---------------------------------------------------------------------------------------------
# bad input: a clear TraceFormatError naming the file, never another exception


def test_execution_trace_is_rejected():
    et = _DIR / "hta_mixed_et_and_kineto" / "benchmark_simple_add_et.json.gz"
    assert et.is_file()
    assert not is_kineto_trace(et)
    with pytest.raises(TraceFormatError, match="no traceEvents") as ei:
        parse_kineto(et)
    assert ei.value.file == str(et)


@pytest.mark.parametrize("content, reason", [
    (b"", "empty"),
    (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1', "invalid JSON"),
    (b"[1, 2]", "top level is a JSON array"),
    (b'"hello"', "non-object"),
    (b'{"traceEvents": 5}', "not a Kineto trace"),
    (b'{"schemaVersion": 1}', "no traceEvents"),
])
def test_malformed_json(tmp_path, content, reason):
    p = _write(tmp_path, content)
    with pytest.raises(TraceFormatError, match=reason):
        parse_kineto(p)


def test_truncated_gzip(tmp_path):
    src = _shared("hta_nccl_a100_rank0of2").read_bytes()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(src[: len(src) // 2])
    with pytest.raises(TraceFormatError, match="truncated gzip"):
        parse_kineto(p)
    q = tmp_path / "garbage.json.gz"
    q.write_bytes(src[:10] + b"\x00" * 200)
    with pytest.raises(TraceFormatError):
        parse_kineto(q)


def test_missing_file(tmp_path):
    with pytest.raises(TraceFormatError, match="cannot open"):
        parse_kineto(tmp_path / "nope.json")


def test_decompressed_size_budget(tmp_path):
    doc = {"traceEvents": [_x("a", 1, 1)] * 1000}
    plain = _write(tmp_path, doc)
    gz = _write(tmp_path, doc, name="g.json", gz=True)
    size = plain.stat().st_size
    for p in (plain, gz):
        with pytest.raises(InputTooLargeError):
            parse_kineto(p, max_decompressed_bytes=size - 1)
        assert parse_kineto(p, max_decompressed_bytes=size).tables["events"].num_rows == 1000


def test_concatenated_gzip_members(tmp_path):
    text = json.dumps({"traceEvents": [_x("a", 1, 2), _x("b", 3, 4)]}).encode()
    p = tmp_path / "multi.json.gz"
    p.write_bytes(gzip.compress(text[:20]) + gzip.compress(text[20:]))
    assert parse_kineto(p).tables["events"].column("name").to_pylist() == ["a", "b"]


# ---------------------------------------------------------------------------------------------
# format variants


def test_unknown_phase_and_odd_types_fall_back_without_dropping(tmp_path):
    events = [
        _x("a", 10, 5),
        {"ph": "Z", "name": "weird", "ts": 11},
        _x("b", 12, 3, stream="0x7", correlation="42"),
        {"ph": "X", "name": 17, "ts": 13, "dur": 1, "pid": 1, "tid": 1},
    ]
    p = parse_kineto(_write(tmp_path, {"traceEvents": events}))
    ev = p.tables["events"].to_pylist()
    assert [e["name"] for e in ev] == ["a", "b", "17"]
    assert ev[1]["correlation"] == 42 and ev[1]["stream"] == 7
    assert p.phase_counts["Z"] == 1
    assert any("lenient" in w for w in p.info["parse_warnings"])


def test_durations_and_fractional_times(tmp_path):
    # written as text: json.dumps would round 1700000000123456.789 through float64
    text = """{"traceEvents": [
        {"ph": "X", "name": "neg", "ts": 1, "dur": -1},
        {"ph": "X", "name": "missing", "ts": 2},
        {"ph": "X", "name": "zero", "ts": 3, "dur": 0},
        {"ph": "X", "name": "frac", "ts": 1700000000123456.789, "dur": 0.5},
        {"ph": "X", "name": "subns", "ts": 1.0004, "dur": 1.0005},
        {"ph": "X", "name": "exp", "ts": 1e3, "dur": 2.5E0}]}"""
    p = parse_kineto(_write(tmp_path, text))
    ev = p.tables["events"].to_pylist()
    assert [(e["ts"], e["dur"]) for e in ev] == [
        (1000, None), (2000, None), (3000, 0), (1700000000123456789, 500), (1000, 1001), (1000000, 2500)]
    warnings = " ".join(p.info["parse_warnings"])
    assert "1 complete events without dur" in warnings and "1 complete events with negative dur" in warnings


def test_string_pids_and_tids(tmp_path):
    events = [
        _x("k", 5, 1, cat="Kernel", pid=0, tid="stream 7", correlation=9, **{"external id": 3}),
        _x("op", 4, 3, cat="Operator", pid=100, tid="200", **{"external id": 3}),
        _x("PyTorch Profiler (0)", 1, 10, cat="Trace", pid="Spans", tid="PyTorch Profiler"),
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": "200", "args": {"name": "thread 200 (python)"}},
    ]
    p = parse_kineto(_write(tmp_path, {"traceEvents": events}))
    ev = {e["name"]: e for e in p.tables["events"].to_pylist()}
    assert ev["k"]["cat"] == "kernel" and ev["k"]["tid"] == 7 and ev["k"]["stream"] == 7
    assert ev["k"]["external_id"] == 3 and ev["op"]["cat"] == "cpu_op" and ev["op"]["tid"] == 200
    assert ev["op"]["thread_name"] == "thread 200 (python)" and ev["op"]["stream"] is None
    span = ev["PyTorch Profiler (0)"]
    assert span["thread_name"] == "PyTorch Profiler" and span["pid"] < 0 and span["tid"] < 0
    k = p.tables["kernels"].to_pylist()
    assert len(k) == 1 and k[0]["kind"] == "compute" and k[0]["stream"] == 7 and k[0]["device"] == 0


def test_missing_distributed_info_never_defaults_rank(tmp_path):
    path = _shared("hta_no_distributed_info")
    p = parse_kineto(path)
    assert p.rank is None and p.world_size is None and p.table_rank == -1
    assert set(p.tables["events"].column("rank").to_pylist()) == {-1}
    q = parse_kineto(path, rank=5)
    assert q.rank is None and q.table_rank == 5
    assert set(q.tables["collectives"].column("rank").to_pylist()) == {5}
    r = parse_kineto(_shared("hta_rank_not_found"))
    assert r.rank is None and r.info["backend"] == "nccl"


def test_old_schema_2021(tmp_path):
    path = _shared("kineto_resnet50_2021_workers0")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    p = parse_kineto(path)
    cats = set(p.tables["events"].column("cat").to_pylist())
    assert {"cpu_op", "kernel", "cuda_runtime", "gpu_memcpy", "gpu_memset"} <= cats
    assert not {c for c in cats if c and c != c.lower()}
    k = p.tables["kernels"]
    kinds = k.column("kind").to_pylist()
    assert kinds.count("memcpy") == sum(e["cat"] == "Memcpy" for e in xs)
    assert kinds.count("memset") == sum(e["cat"] == "Memset" for e in xs)
    assert kinds.count("compute") == sum(e["cat"] == "Kernel" for e in xs)
    assert set(k.column("stream").to_pylist()) == {int(e["tid"].split()[1]) for e in xs if e["cat"] == "Kernel"}
    assert k.column("external_id").null_count == 0  # from lower-case "external id"
    # kernels take the step of their launching runtime call
    steps = p.tables["steps"].to_pylist()
    assert [s["step"] for s in steps] == sorted(int(e["name"].split("#")[1]) for e in xs if e["name"].startswith("ProfilerStep#"))
    assert k.column("step").null_count < k.num_rows
    assert p.info["trace_kind"] == "gpu" and p.info["device_names"][0] == "Tesla V100-DGXS-32GB"


def test_old_nccl_schema_ops_from_names():
    p = parse_kineto(_shared("hta_alltoall_a100_rank0of16"))
    rows = p.tables["collectives"].to_pylist()
    assert {r["op"] for r in rows} == {"all_to_all", "all_reduce", "all_gather", "reduce_scatter"}
    assert all(r["name"].startswith("nccl:") and r["pg_name"] is None and r["seq"] is None for r in rows)
    # the all_to_all calls moving data have a device interval from their SendRecv kernel
    moving = [r for r in rows if r["op"] == "all_to_all" and r["in_nelems"]]
    assert moving and all(r["ts"] is not None and r["ts"] >= r["enqueue_ts"] for r in moving)
    k = p.tables["kernels"].to_pylist()
    comm = [x for x in k if x["kind"] == "comm"]
    assert comm and all(x["name"].startswith("ncclKernel_") for x in comm)


def test_modern_nccl_kernels_join_their_call():
    path = _shared("hta_nccl_a100_rank0of2")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    kernels = {e["args"]["External id"]: e for e in doc["traceEvents"]
               if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})}
    p = parse_kineto(path)
    rows = p.tables["collectives"].to_pylist()
    assert len(rows) == len(kernels) == 21
    for r in rows:
        k = kernels[r["external_id"]]
        assert r["ts"] == round(float(k["ts"]) * 1000) or abs(r["ts"] - float(k["ts"]) * 1000) < 1
        assert r["op"] == normalize_op(k["args"]["Collective name"])
        assert r["group_ranks"] == [0, 1] and r["pg_desc"] == "default_pg"
    comm = [k for k in p.tables["kernels"].to_pylist() if k["kind"] == "comm"]
    assert len(comm) == 21 and {k["collective_op"] for k in comm} == {"all_reduce", "broadcast"}
    assert {k["pg_name"] for k in comm} == {"0"}
    assert p.info["base_time_ns"] == 1711964646000000000
    pg = p.process_groups
    assert pg == [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1], "size": 2,
                   "backend": "cuda:nccl", "dim": "world", "seen_by": [0]}]


def test_gloo_rank34_of_300():
    path = _shared("hta_gloo_cpu_rank34of300")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    gloo = [e for e in doc["traceEvents"] if e.get("name", "").startswith("gloo:")]
    p = parse_kineto(path)
    assert (p.rank, p.world_size, p.info["backend"], p.info["trace_kind"]) == (34, 300, "gloo", "cpu")
    cfg = doc["distributedInfo"]["pg_config"]
    assert len(p.process_groups) == len(cfg) and all(len(g["ranks"]) == 300 for g in p.process_groups)
    if doc["distributedInfo"]["pg_count"] != len(cfg):  # this real file says 10 but lists 11
        assert any("pg_count" in w for w in p.info["parse_warnings"])
    rows = p.tables["collectives"].to_pylist()
    assert len(rows) == len(gloo) == 10
    sizes = sorted(r["in_nelems"] for r in rows)
    assert sizes == sorted(e["args"]["Input Dims"][0][0] for e in gloo)
    assert all(r["bytes"] == r["in_nelems"] * 4 and r["op"] == "all_reduce" for r in rows)
    assert p.info["base_time_ns"] == 1719853884000000000


def test_modern_p2p_and_seq_from_args(tmp_path):
    def rpc(ts, name, **extra):
        args = {"Collective name": name, "In msg nelems": 8, "Out msg nelems": 8, "Group size": 2, "dtype": "BFloat16",
                "In split size": "[]", "Out split size": "[]", "Process Group Name": "3",
                "Process Group Description": "mesh_pp", "Process Group Ranks": "[0, 4]", "External id": ts}
        args.update(extra)
        return _x("record_param_comms", ts, 5, **args)

    events = [
        _x("ProfilerStep#7", 0, 1000, cat="user_annotation"),
        _x("pp:send_fwd", 5, 20, cat="user_annotation"),
        rpc(10, "send", Seq=3, **{"Dst Rank": 4}),
        rpc(20, "recv", Seq=4, **{"Src Rank": 4}),
        rpc(30, "wait"),
        rpc(40, "all_to_allv", **{"In split size": "[3, 5]", "Out split size": [4, 4]}),
    ]
    rows = parse_kineto(_write(tmp_path, {"traceEvents": events}), rank=0).tables["collectives"].to_pylist()
    assert [r["op"] for r in rows] == ["send", "recv", "all_to_all"]
    send, recv, a2a = rows
    assert (send["seq"], send["seq_source"], send["peer"], send["is_p2p"]) == (3, "args", 4, True)
    assert (recv["seq"], recv["peer"]) == (4, 4)
    assert send["caller"] == "pp:send_fwd" and a2a["caller"] is None and send["step"] == 7
    assert send["bytes"] == 16 and send["group_ranks"] == [0, 4] and send["pg_desc"] == "mesh_pp"
    assert a2a["in_split_sizes"] == [3, 5] and a2a["out_split_sizes"] == [4, 4] and a2a["seq"] is None
    assert all(r["ts"] is None and r["state"] == "unknown" for r in rows)  # no kernels in this trace


def test_kernel_step_is_the_step_of_its_launch(tmp_path):
    events = [
        _x("ProfilerStep#3", 0, 100, cat="user_annotation"),
        _x("ProfilerStep#4", 100, 100, cat="user_annotation"),
        _x("cudaLaunchKernel", 90, 5, cat="cuda_runtime", correlation=11),
        _x("gemm", 150, 30, cat="kernel", pid=0, tid=7, correlation=11, stream=7, device=0),  # runs in step 4
        # no launch in the trace, starts before the first linked kernel (gemm at 150): carry-over
        _x("orphan", 120, 10, cat="kernel", pid=0, tid=7, correlation=99, stream=7, device=0),
        # no launch, after the first linked kernel: in no step, not carry-over
        _x("late_orphan", 185, 10, cat="kernel", pid=0, tid=7, correlation=98, stream=7, device=0),
    ]
    p = parse_kineto(_write(tmp_path, {"traceEvents": events}))
    k = {r["name"]: (r["step"], r["carry_over"]) for r in p.tables["kernels"].to_pylist()}
    assert k == {"gemm": (3, False), "orphan": (None, True), "late_orphan": (None, False)}
    ev = {r["name"]: r["step"] for r in p.tables["events"].to_pylist()}
    assert ev["gemm"] == 3 and ev["orphan"] is None and ev["cudaLaunchKernel"] == 3
    steps = {r["step"]: (r["device_ts"], r["device_dur"]) for r in p.tables["steps"].to_pylist()}
    assert steps == {3: (150_000, 30_000), 4: (None, None)}
