"""Collective sizes: unknown stays unknown (null bytes with a reason, never 1 element), every dtype torch
records is sized as torch sizes it, and the comms log supplies what the trace lacks.

Oracles: torch itself (element_size, the `Input type` strings its profiler writes, the ScalarType names
of `Tensor.type()`), and the trace JSON's own numbers multiplied out here."""

from __future__ import annotations

import gzip
import json
import os
import re
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from tracekit.parse.collective_names import dtype_bytes
from tracekit.parse.join import join_collectives
from tracekit.parse.kineto import parse_kineto
from tracekit.tables.schema import COLLECTIVES

_DIR = Path(os.environ.get("TRACEKIT_SHARED_TRACES") or Path(__file__).resolve().parents[2].parent / "shared" / "traces")


def test_every_torch_dtype_is_sized_like_torch(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import profile

    dtypes = sorted({d for d in vars(torch).values() if isinstance(d, torch.dtype)}, key=str)
    tensors = {d: torch.empty(2, dtype=d) for d in dtypes}
    with profile(record_shapes=True) as prof:
        for t in tensors.values():
            t.view(-1)
    path = tmp_path / "dtypes.json"
    prof.export_chrome_trace(str(path))
    recorded = [e["args"]["Input type"][0] for e in json.loads(path.read_text())["traceEvents"]
                if e.get("name") == "aten::view"]
    assert len(recorded) == len(tensors)
    for (d, t), input_type in zip(tensors.items(), recorded):
        scalar_type = re.match(r"^torch\.(?:quantized\.)?(\w+)Tensor$", t.type()).group(1)  # FloatTensor → Float
        for spelling in (input_type, scalar_type, str(d), str(d).removeprefix("torch.")):
            assert dtype_bytes(spelling) == t.element_size(), (d, spelling)
    for not_a_dtype in ("TensorList", "Scalar", "ScalarList", "GenericList", "", "Device", "string"):
        assert dtype_bytes(not_a_dtype) is None


def _x(name, ts, dur, cat="cpu_op", tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _ddp_trace(with_annotation_sizes: bool) -> dict:
    """A DDP bucket all-reduce as recorded in 2023 NCCL traces: c10d::allreduce_ over a TensorList
    (dims `[]`, not recorded), old record_param_comms without args, nccl:all_reduce inside."""
    ann = {"Input Dims": [[4096, 3]], "Input type": ["float"]} if with_annotation_sizes else {}
    return {"traceEvents": [
        _x("ProfilerStep#1", 0, 1000),
        _x("c10d::allreduce_", 100, 50, **{"Input Dims": [[], [], [], []],
                                           "Input type": ["TensorList", "", "", "Scalar"]}),
        _x("record_param_comms", 101, 40, **{"Input Dims": [[], [], [], [], [], [], []],
                                             "Input type": ["TensorList", "Scalar", "Scalar", "Scalar", "", "", ""]}),
        _x("nccl:all_reduce", 102, 30, cat="user_annotation", **ann),
        # an int32 all_to_all (`int` is a dtype: int32)
        _x("nccl:all_to_all", 300, 30, cat="user_annotation", **{"Input Dims": [[1002496]], "Input type": ["int"]}),
    ], "distributedInfo": {"rank": 0, "world_size": 2}}


@pytest.mark.parametrize("with_annotation_sizes", [False, True])
def test_ddp_bucket_of_unrecorded_dims(tmp_path, with_annotation_sizes):
    doc = _ddp_trace(with_annotation_sizes)
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    rows = {r["op"]: r for r in parse_kineto(p).tables["collectives"].to_pylist()}
    ar, a2a = rows["all_reduce"], rows["all_to_all"]
    if with_annotation_sizes:  # the NCCL annotation's own tensor gives the size
        assert (ar["bytes"], ar["dtype"], ar["size_note"]) == (4096 * 3 * 4, "float", None)
    else:
        assert ar["bytes"] is None and ar["in_nelems"] is None
        assert "TensorList" in ar["size_note"]
    assert (a2a["bytes"], a2a["size_note"]) == (1002496 * 4, None)


def test_log_fills_an_unknown_size():
    kin = {f.name: None for f in COLLECTIVES} | {
        "rank": 0, "source": "kineto", "op": "all_reduce", "enqueue_ts": 1_000_000, "enqueue_dur": 50_000,
        "size_note": "c10d::allreduce_: input 0 is a TensorList whose sizes were not recorded"}
    log = {f.name: None for f in COLLECTIVES} | {
        "rank": 0, "source": "comms-log", "op": "all_reduce", "enqueue_ts": 990_000, "seq": 4, "pg_name": "0",
        "in_nelems": 1000, "out_nelems": 1000, "dtype": "BFloat16", "bytes": 2000, "is_p2p": False}
    table, _ = join_collectives(pa.Table.from_pylist([kin], schema=COLLECTIVES),
                                pa.Table.from_pylist([log], schema=COLLECTIVES))
    row = table.to_pylist()[0]
    assert (row["bytes"], row["dtype"], row["size_note"], row["seq"]) == (2000, "BFloat16", None, 4)


def _ns(us) -> int:
    return int(Decimal(str(us)) * 1000)


def _c10d_tensorlist_starts(doc: dict) -> set[int]:
    """Start (ns) of every c10d op whose first argument is a TensorList (sizes not recorded)."""
    out = set()
    for e in doc["traceEvents"]:
        a = e.get("args") or {}
        if str(e.get("name", "")).startswith("c10d::") and (a.get("Input type") or [None])[0] == "TensorList":
            out.add(_ns(e["ts"]))
    return out


def _near(t: int | None, starts: set[int]) -> bool:
    return t is not None and any(abs(t - s) < 1000 for s in starts)


@pytest.mark.parametrize("name", ["hta_sampled_2rank", "hta_alltoall_a100_rank0of16", "hta_no_distributed_info"])
def test_real_traces_size_what_they_record(name):
    for path in sorted((_DIR / name).glob("*.json.gz")):
        with gzip.open(path, "rt") as f:
            doc = json.load(f, parse_float=Decimal)
        buckets = _c10d_tensorlist_starts(doc)
        int_a2a = {}  # start (ns) of each int32 nccl:all_to_all → its input elements, multiplied out here
        for e in doc["traceEvents"]:
            a = e.get("args") or {}
            if str(e.get("name", "")).startswith("nccl:all_to_all") and a.get("Input type") == ["int"]:
                n = 1
                for d in a["Input Dims"][0]:
                    n *= d
                int_a2a[_ns(e["ts"])] = n
        rows = parse_kineto(path).tables["collectives"].to_pylist()
        in_buckets = [r for r in rows if _near(r["enqueue_ts"], buckets)]
        assert len(in_buckets) >= len(buckets)
        for r in in_buckets:  # a bucket: its nccl annotation's size, or unknown with a reason
            assert r["bytes"] != 4 and (r["bytes"] is not None or "TensorList" in r["size_note"])
        a2a = [r for r in rows if r["op"] == "all_to_all" and r["enqueue_ts"] is not None]
        for t, n in int_a2a.items():  # the call enclosing each int32 annotation (the c10d op, or itself)
            (r,) = [r for r in a2a if r["enqueue_ts"] <= t <= r["enqueue_ts"] + (r["enqueue_dur"] or 0)]
            assert r["in_nelems"] == n and r["dtype"] == "int"
            assert r["bytes"] == 4 * max(n, r["out_nelems"] or 0)
