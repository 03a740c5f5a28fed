"""The row-capturing decoder leaves the args only collectives read (D.FULL_ONLY_ARGS) out of each event; the
events that keep their full args get them from their own text, found where their `ts` text lies in the piece
(D.full_args), or from a second decode of the piece. Either way each value equals what the plain `json`
module reads from the same text, whatever the layout, key order and strings around the event."""

from __future__ import annotations

import json

import pytest

from tracekit.parse import decode as D
from tracekit.parse import kineto as K

_KEY = {attr: key or attr for attr, key, _ in D.ARG_FIELDS}  # attribute -> args key in the trace


def _coll_args(i: int) -> dict:
    return {"External id": 100 + i, "Collective name": "allreduce", "In msg nelems": 1024 + i, "Out msg nelems": 1024,
            "Group size": 2, "dtype": "Float", "In split size": [], "Out split size": [], "Process Group Name": str(i),
            "Process Group Description": "default_pg", "Process Group Ranks": [0, 1], "Seq": i, "Rank": 0}


def _events() -> list[dict]:
    tricky = 'x}, {"ph": "X", "name": "y", "ts": 1, "args": {"Seq": 99}}, {'  # boundaries inside a string
    return [
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 2, "ts": 1700000000001.5,
         "dur": 4, "args": _coll_args(0)},  # the piece's first event
        {"ph": "X", "cat": "cpu_op", "name": "void f<{lambda()#1}>", "pid": 1, "tid": 2, "ts": 1700000000002,
         "dur": 1, "args": {"External id": 5}},
        {"ph": "f", "id": 7, "pid": 1, "tid": 2, "ts": 1700000000003, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph": "X", "cat": "kernel", "name": tricky, "pid": 0, "tid": 7, "ts": 1700000000004.25, "dur": 3,
         "args": dict(_coll_args(1), **{"Process Group Ranks": [{"a": 1}, {"b": 2}]})},  # objects in a list
        # args before ts, keys in reverse order, a list of objects among them
        {"args": dict(reversed(list(_coll_args(2).items()))), "dur": 2, "ts": 1700000000005, "tid": 7, "pid": 0,
         "name": "ncclDevKernel_AllReduce", "cat": "kernel", "ph": "X"},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "pid": 0, "tid": 7, "ts": 1700000000006,
         "dur": 2, "args": _coll_args(3)},  # the piece's last event
    ]


def _capture(text: bytes):
    capture = D.row_capture()
    capture.rows.clear()
    events = capture.decoder.decode(text)
    columns = D.row_columns(capture.rows)
    capture.rows.clear()
    return events, columns


def _want(event: dict) -> dict:
    args = event.get("args", {})
    return {attr: args.get(_KEY[attr]) for attr in D.FULL_ONLY_ARGS}


def _got(args) -> dict:
    return {attr: getattr(args, attr) for attr in D.FULL_ONLY_ARGS}


@pytest.mark.parametrize("indent", [None, 2])
def test_full_args_of_each_event_equal_plain_json(indent):
    events = _events()
    text = json.dumps(events, indent=indent).encode()
    decoded, columns = _capture(text)
    assert len(decoded) == len(events)
    assert not hasattr(decoded[0].args, "pg_name")  # the captured args leave them out
    xs = [e for e in events if e["ph"] == "X"]
    rows = list(range(len(xs)))
    found = D.full_args(text, columns[2], columns[0], rows)
    assert found is not None
    assert [_got(a) for a in found] == [_want(e) for e in xs]
    assert [a.coll_name for a in found] == [e["args"].get("Collective name") for e in xs]


def test_an_event_without_ts_is_read_from_a_second_decode():
    events = _events()
    del events[3]["ts"]
    text = json.dumps(events).encode()
    _, columns = _capture(text)
    xs = [e for e in events if e["ph"] == "X"]
    assert D.full_args(text, columns[2], columns[0], [2]) is None
    got = K._full_args(text, columns[2], columns[0], [0, 2, 4])
    assert [_got(a) for a in got] == [_want(xs[i]) for i in (0, 2, 4)]


def test_parse_keeps_full_args_of_collectives(tmp_path):
    """Through the streamed parse (pieces of about CHUNK_BYTES): every event with a Collective name keeps
    the args that only collectives read, as json reads them."""
    filler = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 2, "ts": 1000 + i,
               "dur": 1, "args": {"External id": i, "Record function id": 0}} for i in range(20000)]
    events = []
    for i, f in enumerate(filler):
        events.append(f)
        if i % 997 == 0:
            e = _events()[3 + i % 3]
            events.append(dict(e, ts=1000 + i, args=dict(e["args"], Seq=i)))
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}, indent=1))
    assert path.stat().st_size > 3 * K.CHUNK_BYTES
    cols = K.decode_columns(D.squeeze_whitespace(K.iter_trace_blocks(str(path), None, K.CHUNK_BYTES)))
    xs = [e for e in events if e["ph"] == "X"]
    colls = [r for r, e in enumerate(xs) if "Collective name" in e["args"]]
    assert len(colls) == 21 and set(colls) <= set(cols.args_keep)
    for r in colls:
        assert _got(cols.args_keep[r]) == _want(xs[r]), r
