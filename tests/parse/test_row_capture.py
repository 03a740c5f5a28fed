"""The row-capturing decoder (parse/decode.py): each complete event's fields, read back as one column per
ROW_FIELDS entry, equal what the plain `json` module reads from the same text, whatever order the event's
keys and args keys come in."""

from __future__ import annotations

import json

from tracekit.parse import decode as D

# args key in the trace -> the ROW_FIELDS column holding it
_ARG_COLUMNS = {"External id": "external_id", "external id": "external_id_old", "correlation": "correlation",
                "stream": "stream", "device": "device", "flops": "flops", "Collective name": "coll_name",
                "kernel": "launch_kernel"}
_SHAPE_COLUMNS = {"Input Dims": "input_dims", "Input type": "input_type", "Input Strides": "input_strides",
                  "Concrete Inputs": "concrete_inputs"}


def _events() -> list[dict]:
    kernel_args = {"External id": 7, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": 91,
                   "grid": [1, 2, 1], "Collective name": "allreduce"}
    return [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 1623143089861.123, "dur": 4.5,
         "args": {"External id": 3, "Record function id": 0, "Concrete Inputs": ["", ""],
                  "Input type": ["float", "float"], "Input Strides": [[4, 1], [4, 1]], "Input Dims": [[2, 4], [4, 2]],
                  "Ev Idx": 5}},
        {"ph": "s", "id": 91, "pid": 1, "tid": 2, "ts": 1623143089862, "cat": "ac2g", "name": "ac2g"},
        # keys in another order than Kineto's, args in reverse order of the struct's fields
        {"args": dict(reversed(list(kernel_args.items()))), "dur": 12, "ts": 1623143089870.5, "tid": "stream 7",
         "pid": 0, "name": "ncclKernel_AllReduce", "cat": "kernel", "ph": "X"},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 1623143089866,
         "dur": 3, "args": {"cbid": 211, "correlation": 91, "external id": 3, "kernel": "ncclKernel_AllReduce"}},
        {"ph": "X", "name": "no_args_no_cat", "pid": 1, "tid": 2, "ts": 1623143089900, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 2, "ts": 1623143089901,
         "dur": 2, "args": {"flops": 4096, "External id": 4}},
    ]


def test_row_columns_match_plain_json() -> None:
    events = _events()
    text = json.dumps(events).encode()
    capture = D.row_capture()
    capture.rows.clear()
    decoded = capture.decoder.decode(text)
    columns = dict(zip(D.ROW_FIELDS, D.row_columns(capture.rows)))
    capture.rows.clear()
    xs = [e for e in events if e["ph"] == "X"]
    assert len(decoded) == len(events)
    for col in columns.values():
        assert len(col) == len(xs)
    assert columns["name"] == [e["name"] for e in xs]
    assert columns["cat"] == [e.get("cat") for e in xs]
    assert columns["pid"] == [e["pid"] for e in xs]
    assert columns["tid"] == [e["tid"] for e in xs]
    # times stay the number's text, exactly as json writes it
    assert [bytes(r).decode() for r in columns["ts"]] == [json.dumps(e["ts"]) for e in xs]
    assert [bytes(r).decode() for r in columns["dur"]] == [json.dumps(e["dur"]) for e in xs]
    for key, col in _ARG_COLUMNS.items():
        assert columns[col] == [e.get("args", {}).get(key) for e in xs], key
    for key, col in _SHAPE_COLUMNS.items():
        want = [json.dumps(e["args"][key]) if key in e.get("args", {}) else "" for e in xs]
        assert [json.dumps(json.loads(bytes(r))) if len(r) else "" for r in columns[col]] == want, key
