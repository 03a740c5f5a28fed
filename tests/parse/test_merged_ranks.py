"""A merged multi-rank file (TraceFusion) decoded once and cut per rank (parse/merged_ranks.py) gives the store
the per-rank split documents give (parse/merged.py), and each rank holds its own events plus those of no rank.

Expected counts come from the JSON text as written here (plain `json`); the split path is the other oracle:
both stores must hold the same tables, rows, values and dictionaries.
"""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.parquet as pq
import pytest

from tracekit.parse.merged_ranks import decode_merged
from tracekit.parse.run import parse_run

STRIDE = 100_000_000


def _events(rank: int, names: list[str]) -> list[dict]:
    """One rank's events: a step, CPU ops (with shapes) that launch kernels, a collective kernel, thread names."""
    host, dev = rank * STRIDE + 4242, rank * STRIDE + 1
    out = [{"ph": "M", "name": "thread_name", "pid": host, "tid": 7, "args": {"name": f"main r{rank}", "rank": rank}},
           {"ph": "M", "name": "thread_name", "pid": dev, "tid": 9, "args": {"name": "stream 9"}},
           {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": host, "tid": 7,
            "ts": 1763000000000000.5 + rank, "dur": 900.25, "args": {"rank": rank, "External id": 1}}]
    for i, name in enumerate(names):
        ts = 1763000000000010.125 + 40 * i + rank
        out += [
            {"ph": "X", "cat": "cpu_op", "name": name, "pid": host, "tid": 7, "ts": ts, "dur": 20,
             "args": {"rank": rank, "External id": 10 + i, "Input Dims": [[4, 8 + i], [8 + i, 16]],
                      "Input type": ["float", "float"]}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": host, "tid": 7, "ts": ts + 1,
             "dur": 3, "args": {"rank": rank, "External id": 10 + i, "correlation": 100 + i}},
            {"ph": "X", "cat": "kernel", "name": f"gemm_{name}", "pid": dev, "tid": 9, "ts": ts + 5, "dur": 7.5,
             "args": {"rank": rank, "External id": 10 + i, "correlation": 100 + i, "stream": 9, "device": 0}},
            {"ph": "s", "id": 100 + i, "pid": host, "tid": 7, "ts": ts + 1, "cat": "ac2g", "name": "ac2g"},
        ]
    out.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_Generic", "pid": dev, "tid": 9,
                "ts": 1763000000000500.0 + rank, "dur": 50, "args": {"rank": rank, "stream": 9, "device": 0,
                                                                     "Collective name": "allreduce",
                                                                     "In msg nelems": 1024, "dtype": "Float"}})
    rpc = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": host, "tid": 7,
           "ts": 1763000000000499.0 + rank, "dur": 1, "args": {"rank": rank, "External id": 90, "In msg nelems": 1024,
                                                               "Process Group Name": "0", "Group size": 2}}
    out.insert(3 if rank else len(out), rpc)  # first seen at another place in each rank: codes differ per rank
    for e in out:  # TraceFusion keeps each event's own pid (the marker tracekit recognises a merged file by)
        if e["ph"] == "X":
            e["args"]["pid_raw"] = e["pid"] % STRIDE
    return out


def _merged_doc(extra: list[dict] | None = None) -> dict:
    r0 = _events(0, ["aten::mm", "aten::add", "aten::mul"])
    r1 = _events(1, ["aten::mul", "aten::mm", "aten::relu"])  # other names, other first-seen order
    events = []
    for a, b in zip(r0, r1):  # ranks interleaved, as a merge by time writes them
        events += [a, b]
    events += r0[len(r1):] + r1[len(r0):]
    # an event of no rank (text pid, no args.rank): every rank's document gets it
    events.insert(5, {"ph": "X", "cat": "user_annotation", "name": "spans", "pid": "Spans", "tid": "Spans",
                      "ts": 1763000000000001.0, "dur": 2})
    events += extra or []
    return {"schemaVersion": 1, "deviceProperties": [{"name": "MI300X", "totalGlobalMem": 1 << 30}],
            "distributedInfo": {"backend": "nccl"}, "traceEvents": events}


def _store_tables(path) -> dict:
    return {p.name: pq.read_table(p) for p in sorted(path.glob("*.parquet"))}


def _meta(path, root) -> dict:
    meta = json.loads((path / "meta.json").read_text())
    text = json.dumps({k: meta[k] for k in ("inputs", "warnings", "world_size", "join")}, sort_keys=True)
    return json.loads(text.replace(str(path), "STORE").replace(str(root), "ROOT"))


def _both(tmp_path, doc) -> tuple:
    src = tmp_path / "in" / "merged.json"
    src.parent.mkdir()
    src.write_text(json.dumps(doc, indent=2))
    once = parse_run(src.parent, tmp_path / "once", progress=False)
    # a memory budget splits merged files into per-rank documents for the engine (the path before issue 28)
    split = parse_run(src.parent, tmp_path / "split", progress=False, max_memory_bytes=1 << 40)
    return src, once, split


def test_one_decode_gives_the_split_documents_store(tmp_path):
    doc = _merged_doc()
    src, once, split = _both(tmp_path, doc)
    assert decode_merged(str(src)).ranks == [0, 1]  # the one-decode path applies to this file
    a, b = _store_tables(tmp_path / "once"), _store_tables(tmp_path / "split")
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].schema == b[name].schema, name
        assert a[name].equals(b[name]), name  # values, row order and dictionaries
    assert _meta(tmp_path / "once", src.parent) == _meta(tmp_path / "split", src.parent)
    # independent: each rank holds its own complete events and the one of no rank
    x = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    own = Counter(e["args"]["rank"] for e in x if "rank" in e.get("args", {}))
    events = once.store.table("events", ["rank", "name", "thread_name"]).to_pylist()
    assert Counter(e["rank"] for e in events) == {r: n + 1 for r, n in own.items()}
    assert all(sum(e["name"] == "spans" for e in events if e["rank"] == r) == 1 for r in (0, 1))
    assert {e["thread_name"] for e in events if e["rank"] == 1 and e["name"] == "aten::relu"} == {"main r1"}
    names = {r: [e["name"] for e in events if e["rank"] == r] for r in (0, 1)}
    assert names[1][:4] == ["ProfilerStep#3", "record_param_comms", "aten::mul", "cudaLaunchKernel"]
    assert names[0][-1] == names[1][-1] == "spans"  # the event of no rank, after the rank's own
    ranks = once.store.table("ranks", ["rank", "world_size"]).to_pylist()
    assert ranks == [{"rank": 0, "world_size": 2}, {"rank": 1, "world_size": 2}]


def test_memory_events_take_the_split_path(tmp_path):
    """`[memory]` instant events carry no pid in the fast decoder: such a file is split as before."""
    mem = [{"ph": "i", "name": "[memory]", "pid": r * STRIDE + 4242, "tid": 7, "ts": 1763000000000020.0 + r, "s": "t",
            "args": {"rank": r, "Device Type": 1, "Device Id": 0, "Addr": 1000 + r, "Bytes": 512 * (r + 1),
                     "Total Allocated": 4096, "Total Reserved": 8192}} for r in (0, 1)]
    doc = _merged_doc(mem)
    src = tmp_path / "m.json"
    src.write_text(json.dumps(doc))
    assert decode_merged(str(src)) is None
    _, once, split = _both(tmp_path, doc)
    got = once.store.table("memory", ["rank", "bytes"]).to_pylist()
    assert sorted((m["rank"], m["bytes"]) for m in got) == [(0, 512), (1, 1024)]
    assert once.store.table("events").equals(split.store.table("events"))


def test_one_rank_is_not_merged(tmp_path):
    doc = _merged_doc()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("args", {}).get("rank", 0) == 0
                          and not str(e.get("pid")).startswith("1")]
    src = tmp_path / "one.json"
    src.write_text(json.dumps(doc))
    assert decode_merged(str(src)) is None
