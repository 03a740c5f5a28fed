"""Modern NCCL traces (`record_param_comms` ops with `Collective name` args): one collectives row per op, its
sizes and group from its args, its device time from the comm kernels it launched, its caller from the
annotation around it, rows in enqueue order.

The trace is written here event by event and every expected value is worked out by hand from those events
(the rules in kineto_collectives.py's docstrings): a kernel belongs to the latest op on its launch's thread
whose interval contains the launch, or, launched by no recorded call, to the first op of its External id; an
op's device time runs from its first kernel's start to its last kernel's end."""

from __future__ import annotations

import json

from tracekit.parse.kineto import parse_kineto

HOST, GPU = 1, 0


def _op(name, ts, dur, tid=1, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": HOST, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _comms(ts, dur, coll, *, tid=1, ext=None, **args):
    a = {"Collective name": coll, **args}
    if ext is not None:
        a["External id"] = ext
    return _op("record_param_comms", ts, dur, tid=tid, **a)


def _launch(ts, corr, tid=1):
    return _op("cudaLaunchKernel", ts, 5, tid=tid, cat="cuda_runtime", correlation=corr)


def _kernel(ts, dur, corr, ext=None):
    args = {"device": 0, "stream": 7, "correlation": corr}
    if ext is not None:
        args["External id"] = ext
    return {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)",
            "pid": GPU, "tid": 7, "ts": ts, "dur": dur, "args": args}


def _trace() -> dict:
    group = {"Process Group Name": "0", "Process Group Ranks": "[0, 1]", "Group size": 2}
    return {"traceEvents": [
        _op("ProfilerStep#1", 0, 10_000),
        _op("fwd", 50, 2_950, cat="user_annotation"),
        # written before the others, enqueued last: a barrier that launched no kernel
        _comms(5_000, 50, "barrier", **group),
        # A: one kernel, launched inside it
        _comms(100, 200, "allreduce", ext=11, **group, **{"In msg nelems": 1024, "Out msg nelems": 1024,
                                                           "dtype": "Float", "Seq": 5}),
        _launch(150, 101),
        # B: two kernels (a coalesced op): its device time spans both, its correlation is the first kernel's
        _comms(1_000, 300, "allgather", **group, **{"In msg nelems": 10, "Out msg nelems": 20, "dtype": "BFloat16",
                                                    "Seq": 6}),
        _launch(1_050, 103),
        _launch(1_100, 102),
        # C contains D: a launch inside both belongs to D (the latest), one after D ended to C
        _comms(2_000, 1_000, "send", **group, **{"In msg nelems": 8, "Out msg nelems": 8, "dtype": "Long",
                                                 "Dst Rank": 1}),
        _comms(2_100, 200, "recv", **group, **{"In msg nelems": 4, "Out msg nelems": 4, "dtype": "Int",
                                               "Src Rank": 1}),
        _launch(2_150, 104),
        _launch(2_500, 105),
        # E on another thread, its kernel launched by no recorded call: linked by External id
        _comms(4_000, 100, "reduce_scatter", tid=2, ext=21, **group,
               **{"In msg nelems": 64, "Out msg nelems": 32, "dtype": "Float"}),
        _kernel(400, 300, 101),
        _kernel(1_400, 400, 103),
        _kernel(1_500, 100, 102),
        _kernel(3_100, 50, 104),
        _kernel(3_200, 60, 105),
        _kernel(4_500, 70, 106, ext=21),
    ], "distributedInfo": {"rank": 0, "world_size": 2}}


def test_modern_collectives_rows_are_worked_out_from_their_events(tmp_path):
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(_trace()))
    got = parse_kineto(p).tables["collectives"].to_pylist()
    us = 1_000  # the trace's microseconds in the table's ns
    keys = ("op", "enqueue_ts", "enqueue_dur", "ts", "dur", "state", "correlation", "external_id", "bytes",
            "size_note", "seq", "peer", "is_p2p", "caller", "step", "pg_name", "group_ranks", "group_size")
    want = [
        # op, enqueue, its dur, device ts, dur, state, correlation, External id, bytes, size note, seq, peer,
        # p2p, caller, step, group, ranks, size
        ("all_reduce", 100, 200, 400, 300, "completed", 101, 11, 1024 * 4, None, 5, None, False, "fwd"),
        ("all_gather", 1_000, 300, 1_400, 1_800 - 1_400, "completed", 103, None, 20 * 2, None, 6, None, False,
         "fwd"),
        ("send", 2_000, 1_000, 3_200, 60, "completed", 105, None, 8 * 8, None, None, 1, True, "fwd"),
        ("recv", 2_100, 200, 3_100, 50, "completed", 104, None, 4 * 4, None, None, 1, True, "fwd"),
        ("reduce_scatter", 4_000, 100, 4_500, 70, "completed", 106, 21, 64 * 4, None, None, None, False, None),
        ("barrier", 5_000, 50, None, None, "unknown", None, None, None, "no element count recorded", None, None,
         False, None),
    ]
    assert [tuple(r[k] for k in keys) for r in got] == [
        (op, enq * us, edur * us, None if ts is None else ts * us, None if dur is None else dur * us, *rest, 1,
         "0", [0, 1], 2)
        for op, enq, edur, ts, dur, *rest in want]
    assert {r["source"] for r in got} == {"kineto"} and {r["seq_source"] for r in got} == {"args", None}
    assert [r["seq_source"] for r in got][:2] == ["args", "args"]
