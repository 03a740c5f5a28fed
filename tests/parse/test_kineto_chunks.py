"""Chunked decoding of traceEvents and the vectorised µs-text → ns conversion, checked against the
whole-document decode and against Decimal arithmetic."""

from __future__ import annotations

import gzip
import json
import os
from decimal import Decimal
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracekit.parse.kineto as K
from tracekit.parse import decode as D
from tracekit.parse.gz import iter_trace_blocks, read_trace_bytes

_ENC = msgspec.json.Encoder(decimal_format="number")
_DIR = Path(os.environ.get("TRACEKIT_SHARED_TRACES") or Path(__file__).resolve().parents[2].parent / "shared" / "traces")


def _exact_ns(text: str) -> int | None:
    """Independent reading: Decimal µs × 1000, half away from zero; None outside int64 or not a number."""
    try:
        d = Decimal(text.strip('"'))
    except ArithmeticError:
        return None
    if not d.is_finite():
        return None
    v = int((d * 1000).quantize(Decimal(1), rounding="ROUND_HALF_UP"))
    return v if -(2**63) <= v < 2**63 else None


_plain = st.builds(
    lambda sign, whole, frac: f"{sign}{whole}" + (f".{frac}" if frac is not None else ""),
    st.sampled_from(["", "", "-"]),
    st.integers(0, 10**16),
    st.one_of(st.none(), st.from_regex(r"[0-9]{1,3}", fullmatch=True)),
)
_odd = st.one_of(
    st.from_regex(r"-?[0-9]{1,17}\.[0-9]{4,7}", fullmatch=True),  # sub-ns digits
    st.from_regex(r"[0-9]{17,21}", fullmatch=True),  # overflows int64 ns
    st.sampled_from(["1e3", "1.5E2", '"12.5"', "", "null", "9223372036854775.807", "9223372036854775.808",
                     "-9223372036854775.808", "[1,2]", "true"]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_plain, min_size=1, max_size=40))
def test_plain_decimals_exact(texts):
    vals, ok = D.raws_to_ns([msgspec.Raw(t.encode()) for t in texts])
    assert [int(v) if o else None for v, o in zip(vals, ok)] == [_exact_ns(t) for t in texts]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_plain, _odd), min_size=1, max_size=40))
def test_mixed_texts_exact_or_invalid(texts):
    vals, ok = D.raws_to_ns([msgspec.Raw(t.encode()) for t in texts])
    got = [int(v) if o else None for v, o in zip(vals, ok)]
    assert got == [_exact_ns(t) if t else None for t in texts]


def _streamed(path: Path):
    """Columns from the streamed, chunked path (None when it declines), blocks as small as the chunks."""
    return K.decode_columns(iter_trace_blocks(path, None, K.CHUNK_BYTES))


def _whole(path: Path) -> K.KinetoParse:
    """The reference: decode the whole document at once."""
    buf = read_trace_bytes(path)
    trace, lenient = K.decode_document(str(path), buf)
    return K.tables_from_document(str(path), trace, lenient, None)


def _assert_same(a: K.KinetoParse, b: K.KinetoParse) -> None:
    assert a.info == b.info
    assert a.phase_counts == b.phase_counts and list(a.phase_counts) == list(b.phase_counts)
    assert a.process_groups == b.process_groups
    assert a.tables.keys() == b.tables.keys()
    for name, t in a.tables.items():
        assert t.schema == b.tables[name].schema, name
        assert t.equals(b.tables[name]), name


def _event(i: int) -> list[dict]:
    k = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "pid": 0, "tid": 7,
         "ts": f"{1700000000000000 + 10 * i}.25", "dur": 2,
         "args": {"correlation": i, "stream": 7, "device": 0, "Collective name": "allreduce"}}
    k["ts"] = Decimal(k["ts"])
    return [
        # names with JSON delimiters, args holding lists of objects: cut candidates inside an event
        {"ph": "X", "cat": "cpu_op", "name": 'aten::mm},{"x": [1]}, {', "pid": 1, "tid": 2,
         "ts": Decimal(f"{1700000000000000 + 10 * i}.123"), "dur": Decimal("5.5"),
         "args": {"External id": i, "list": [{"a": 1}, {"b": [2]}]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2,
         "ts": 1700000000000001 + 10 * i, "dur": 1, "args": {"correlation": i, "External id": i}},
        k,
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 2,
         "ts": 1700000000000000 + 10 * i, "dur": 3,
         "args": {"External id": i, "Collective name": "allreduce", "In msg nelems": 4, "Out msg nelems": 4,
                  "Group size": 2, "dtype": "Float", "Process Group Name": "0", "Process Group Ranks": "[0, 1]"}},
        {"ph": "f", "id": i, "pid": 1, "tid": 2, "ts": 1700000000000000 + 10 * i, "cat": "ac2g", "name": "x"},
        {"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 1, "tid": 2, "dur": 1},
    ]


def _doc(n: int, *, events_last: bool) -> dict:
    events = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}}]
    for i in range(n):
        events += _event(i)
    events.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 2,
                   "ts": 1700000000000000, "dur": 10 * n + 10})
    head = {"schemaVersion": 1, "distributedInfo": {"rank": 1, "world_size": 2}}
    tail = {"INFO": ["Profiler.cpp:976] Enabling", "x]"], "deviceProperties": [{"id": 0, "name": "A"}, {"id": 1}],
            "traceName": "t]", "baseTimeNanoseconds": 1}
    return {**head, "traceEvents": events, **tail} if not events_last else {**head, **tail, "traceEvents": events}


@pytest.mark.parametrize("events_last", [False, True])
@pytest.mark.parametrize("indent", [None, 2])
def test_chunked_equals_whole_document(tmp_path, monkeypatch, events_last, indent):
    text = _ENC.encode(_doc(300, events_last=events_last))
    if indent:
        text = msgspec.json.format(text, indent=indent)  # re-indents without touching number texts
    path = tmp_path / "t.json"
    path.write_bytes(text)
    monkeypatch.setattr(K, "CHUNK_BYTES", 4096)
    assert _streamed(path) is not None  # the chunked path really ran
    chunks: list[int] = []
    D.decode_event_chunks(read_trace_bytes(path), 4096, lambda ev, text: chunks.append(len(ev)))
    assert len(chunks) > 10 and sum(chunks) == len(json.loads(text)["traceEvents"])
    _assert_same(K.parse_kineto(path), _whole(path))


def test_nested_trace_events_key_uses_whole_document(tmp_path):
    doc = {"meta": {"traceEvents": _event(0)}, "traceEvents": _event(1)}
    path = tmp_path / "t.json"
    path.write_bytes(_ENC.encode(doc))
    assert _streamed(path) is None
    p = K.parse_kineto(path)
    assert p.tables["events"].num_rows == 4  # the top-level events only (one lacks ts)
    _assert_same(p, _whole(path))


@pytest.mark.parametrize("sub", ["hta_nccl_a100_rank0of2", "hta_gloo_cpu_rank34of300", "kineto_resnet50_2021_workers0"])
def test_real_traces_small_chunks(monkeypatch, sub):
    files = sorted((_DIR / sub).glob("*.json*"))
    if not files:
        pytest.fail(f"shared trace {sub} missing under {_DIR}")
    monkeypatch.setattr(K, "CHUNK_BYTES", 64 << 10)
    assert _streamed(files[0]) is not None
    _assert_same(K.parse_kineto(files[0]), _whole(files[0]))


def test_escaped_arg_keys_are_read(tmp_path, monkeypatch):
    """Args keys spelled with \\u escapes are read like plain ones, in chunks and whole."""
    events = _event(0)[:3]
    text = _ENC.encode({"traceEvents": events}).replace(b'"device":0', b'"\\u0064evice":3')
    text = text.replace(b'"External id":0', b'"Ext\\u0065rnal id":11', 1)
    assert b"\\u0064evice" in text and b"Ext\\u0065rnal" in text
    path = tmp_path / "t.json"
    path.write_bytes(text)
    monkeypatch.setattr(K, "CHUNK_BYTES", 64)
    assert _streamed(path) is not None
    p = K.parse_kineto(path)
    assert p.tables["kernels"].column("device").to_pylist() == [3]
    assert p.tables["events"].column("external_id").to_pylist()[0] == 11
    _assert_same(p, _whole(path))


@pytest.mark.parametrize("pad", [4096 - 30, 4096 - 20, 4096 - 12, 4096 - 5, 3 * 4096])
def test_events_key_across_read_blocks(tmp_path, monkeypatch, pad):
    """The `"traceEvents": [` key split between two read blocks is still found (gzip too)."""
    doc = {"schemaVersion": 1, "pad": "x" * pad, "traceEvents": [e for i in range(40) for e in _event(i)]}
    text = _ENC.encode(doc)
    at = text.index(b'"traceEvents"')
    assert pad < 4096 * 2 or at > 4096
    plain, gz = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(text)
    gz.write_bytes(gzip.compress(text))
    monkeypatch.setattr(K, "CHUNK_BYTES", 4096)
    for path in (plain, gz):
        assert _streamed(path) is not None
        _assert_same(K.parse_kineto(path), _whole(path))
