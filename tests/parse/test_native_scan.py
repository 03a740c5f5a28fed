"""The native column builder (parse/kscan.c, parse/native.py) gives exactly the columns of msgspec's typed
decode and `kineto._add_rows`, or hands the piece to them: on every real trace of the shared corpus, on
hand-made events at each edge the scanner refuses or handles, and on random events. Its times are also checked
against plain `json` and `Decimal` (integer ns, half away from zero)."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracekit.parse import decode as D
from tracekit.parse import kineto as K
from tracekit.parse import native as N
from tracekit.parse.gz import iter_trace_blocks

SHARED = Path(os.environ.get("TRACEKIT_SHARED_TRACES") or Path(__file__).resolve().parents[3] / "shared" / "traces")
_FIELDS = ("n", "names", "cats", "keep_name", "name_codes", "cat_codes", "ts", "ts_ok", "dur", "dur_ok", "pid", "tid",
           "ext", "corr", "stream", "device", "flops", "coll_name", "launch_kernel", "shape_books", "shape_codes",
           "args_keep", "ms", "memory", "phase_counts", "warnings", "event_ranks")


def _plain(v):
    """A comparable form of an EventColumns field."""
    if isinstance(v, dict) and not isinstance(v, K.CodeBook):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, K.CodeBook):
        return list(v.items())
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, list):
        if v and isinstance(v[0], np.ndarray):
            return [x.dtype.str for x in v[:1]] + np.concatenate(v).tolist()
        if v and isinstance(v[0], pa.Array):
            return [str(v[0].type)] + pa.concat_arrays(v).to_pylist()
        return [_plain(x) for x in v]
    if hasattr(v, "__struct_fields__"):
        return type(v).__name__, msgspec.json.encode(v)
    return v


def _columns(blocks, native: bool, monkeypatch, event_ranks: bool = False) -> "K.EventColumns | None":
    monkeypatch.setenv("TRACEKIT_NATIVE", "1" if native else "0")
    return K.decode_columns(blocks, event_ranks=event_ranks)


def _assert_same(a, b) -> None:
    assert (a is None) == (b is None)
    if a is None:
        return
    for f in _FIELDS:
        assert _plain(getattr(a, f)) == _plain(getattr(b, f)), f
    for ids in ("pid_ids", "tid_ids"):
        assert getattr(a, ids).text_of == getattr(b, ids).text_of
        assert getattr(a, ids).stream_ids == getattr(b, ids).stream_ids


class _Counting:
    """Counts the pieces the native scanner took and refused."""

    def __init__(self, monkeypatch) -> None:
        self.took = self.refused = 0
        scan = N.scan

        def counting(piece):
            out = scan(piece)
            if out is None:
                self.refused += 1
            else:
                self.took += 1
            return out

        monkeypatch.setattr(N, "scan", counting)


def test_the_native_builder_is_built() -> None:
    assert N.kscan is not None, "tracekit/parse/kscan.c was not compiled by pip install (setup.py)"
    assert N.available()


def _shared_traces() -> list[Path]:
    return sorted(p for p in SHARED.glob("*/*.json*") if p.name.endswith((".json", ".json.gz")))


def _plain_json_answer(path: Path) -> tuple[list, list, list, Counter]:
    """Computed without tracekit: the complete events' names, ts and dur (int ns, Decimal, half away from zero;
    None where absent) and each phase's count, from plain `json`."""
    doc = json.loads(b"".join(iter_trace_blocks(str(path), None, K.CHUNK_BYTES)), parse_float=Decimal)
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    return ([e.get("name", "") for e in xs], [_ns(str(e["ts"])) if "ts" in e else None for e in xs],
            [_ns(str(e["dur"])) if "dur" in e else None for e in xs], Counter(e.get("ph") for e in doc["traceEvents"]))


def _times(col: list, ok: list) -> list:
    return [v if o else None for v, o in zip(np.concatenate(col).tolist(), np.concatenate(ok).tolist())]


def test_shared_traces_give_the_same_columns(monkeypatch) -> None:
    """Every real trace: the natively read columns are msgspec's, and their names, times and phase counts are
    what plain `json` reads."""
    paths = _shared_traces()
    assert len(paths) >= 20, SHARED
    counting = _Counting(monkeypatch)
    for path in paths:
        blocks = lambda: D.squeeze_whitespace(iter_trace_blocks(str(path), None, K.CHUNK_BYTES))  # noqa: E731
        native = _columns(blocks(), True, monkeypatch)
        _assert_same(_columns(blocks(), False, monkeypatch), native)
        if native is None:  # not a Kineto trace (an execution trace): both paths say so
            continue
        names, ts, dur, phases = _plain_json_answer(path)
        book = list(native.names)
        assert [book[c] for c in np.concatenate(native.name_codes).tolist()] == names, path
        assert _times(native.ts, native.ts_ok) == ts, path
        assert _times(native.dur, native.dur_ok) == dur, path
        assert {k: v for k, v in native.phase_counts.items() if v} == dict(phases), path
        if "merged" in path.parent.name:  # each event's rank too, as a merged multi-rank file is read
            a, b = (_columns(blocks(), native, monkeypatch, event_ranks=True) for native in (False, True))
            _assert_same(a, b)
            assert len(set(np.concatenate(b.event_ranks).tolist())) >= 2
    # the native path is what ran on nearly all of them (a cut inside a string is refused and moved: a few)
    assert counting.took > 300 and counting.refused < counting.took / 20, (counting.took, counting.refused)


def _events_text(events: list, raw_tail: str = "") -> bytes:
    body = ",".join([json.dumps(e, ensure_ascii=False) for e in events] + ([raw_tail] if raw_tail else []))
    return ('{"schemaVersion": 1, "traceEvents": [' + body + '], "displayTimeUnit": "ms"}').encode()


def _ns(text: str) -> int:
    return int((Decimal(text) * 1000).to_integral_value(rounding=ROUND_HALF_UP))


_BASE = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 5.25, "dur": 1.5,
         "args": {"External id": 3, "device": 0, "stream": 7, "correlation": 11}}


def _with(**changes) -> dict:
    e = json.loads(json.dumps(_BASE))
    for k, v in changes.items():
        if k == "args_":
            e["args"].update(v)
        elif v is _DROP:
            e.pop(k, None)
        else:
            e[k] = v
    return e


_DROP = object()
# (events, raw JSON text of a last event or "", whether the scanner takes the piece)
_CASES = {
    "plain": ([_BASE], "", True),
    "unicode name": ([_with(name="ядро ✓ \U0001F680")], "", True),
    "escaped name": ([_with(name='say "hi"\n')], "", False),
    "text ids": ([_with(pid="Spans", tid="stream 9"), _with(pid=None, tid=_DROP)], "", True),
    "hex stream": ([_with(args_={"stream": "0x0", "device": "7", "correlation": "x"})], "", True),
    "float pid": ([_with(pid=1.5)], "", False),
    "bool tid": ([_with(tid=True)], "", False),
    "no times": ([_with(ts=_DROP, dur=_DROP)], "", True),
    "negative": ([_with(ts=-0.0005, dur=-12.3456)], "", True),
    "sub-ns digits": ([], '{"ph":"X","name":"a","ts":1.0005,"dur":2.99949,"args":{}}', True),
    "exponent": ([], '{"ph":"X","name":"a","ts":1e3,"dur":1,"args":{}}', False),
    "exponent beyond Decimal's": ([], '{"ph":"X","name":"a","ts":1e999999999,"dur":1}', False),  # was a crash
    "quoted time": ([_with(ts="12.5")], "", False),
    "huge time": ([], '{"ph":"X","name":"a","ts":99999999999999999999,"dur":1}', False),
    "null name": ([_with(name=None)], "", False),
    "no name, no cat, no args": ([_with(name=_DROP, cat=_DROP, args=_DROP)], "", True),
    "null cat": ([_with(cat=None)], "", True),
    "args null": ([_with(args=None)], "", False),
    "key twice": ([], '{"ph":"X","name":"a","name":"b","ts":1,"dur":1}', False),
    "args key twice": ([], '{"ph":"X","name":"a","ts":1,"dur":1,"args":{"device":1,"device":2}}', False),
    "flops": ([_with(args_={"flops": 4096}), _with(args_={"flops": 1.25}), _with(args_={"flops": None})], "", True),
    "huge flops": ([_with(args_={"flops": 2**60 + 1})], "", False),
    "shapes": ([_with(cat="cpu_op", args_={"Input Dims": [[2, 4], []], "Input type": ["float", ""],
                                           "Concrete Inputs": ["", "3"]}),
                _with(cat="cpu_op", args_={"Input Dims": [[2, 4], []], "Input Strides": [[4, 1], []]}),
                _with(cat="cpu_op", args_={"Input type": ["float"]})], "", True),
    "collective": ([_with(name="ncclDevKernel_AllReduce_Sum_f32_RING_LL", args_={
        "Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": "1024", "Group size": 8,
        "dtype": "Float", "Process Group Ranks": [0, 1], "In split size": "[]", "rank": 3}),
        _with(cat="cpu_op", name="record_param_comms", args_={"Collective name": "broadcast"})], "", True),
    "launch": ([_with(cat="cuda_runtime", name="cudaLaunchKernel", args_={"kernel": "void k<1>()"})], "", True),
    "merged ranks": ([_with(args_={"rank": 3}), _with(pid=300000007, args_={"rank": "3"}), _with(pid=-1),
                      _with(pid="Spans", args_={"rank": -2}), _with(pid=200000001, args_={"rank": True}),
                      _with(args_={"rank": [1]})], "", True),
    "bad arg type": ([_with(args_={"Group size": [8]})], "", False),
    "nested unknown args": ([_with(args_={"grid": [1, {"a": [None, True, False, "x\\u00e9"]}], "z": {}})], "", True),
    "metadata and memory": ([{"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
                             {"ph": "i", "name": "[memory]", "ts": 7.5, "pid": 0, "tid": 7, "s": "t",
                              "args": {"Device Type": 1, "Device Id": 0, "Addr": 1, "Bytes": 512,
                                       "Total Allocated": 512, "Total Reserved": 2048}},
                             {"ph": "f", "id": 1, "ts": 5.25, "bp": "e"}, _BASE], "", True),
    "bad metadata": ([{"ph": "M", "name": 5, "pid": 0}, _BASE], "", False),
    "unknown phase": ([{"ph": "Q", "name": "x"}, _BASE], "", False),
    "invalid utf-8": ([], '{"ph":"X","name":"a\xff","ts":1,"dur":1}', False),
    "control character": ([], '{"ph":"X","name":"a\tb","ts":1,"dur":1}', False),
    "leading zero": ([], '{"ph":"X","name":"a","ts":01,"dur":1}', False),
    "trailing comma": ([], '{"ph":"X","name":"a","ts":1,"dur":1,}', False),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_edge_cases_match_msgspec(case: str, monkeypatch) -> None:
    events, tail, taken = _CASES[case]
    text = _events_text(events, tail)
    if case == "invalid utf-8":
        text = text.replace("a\xff".encode(), b"a\xff")
    counting = _Counting(monkeypatch)
    native = _columns([text], True, monkeypatch)
    _assert_same(_columns([text], False, monkeypatch), native)
    _assert_same(_columns([text], False, monkeypatch, True), _columns([text], True, monkeypatch, True))
    assert (counting.took > 0) == taken, (counting.took, counting.refused)
    if taken:  # and the columns are the trace's, read with plain json and Decimal
        xs = [e for e in json.loads(text)["traceEvents"] if e["ph"] == "X"]
        raw = [t for t in json.loads(text, parse_float=str, parse_int=str)["traceEvents"] if t["ph"] == "X"]
        names = list(native.names)
        assert [names[c] for c in np.concatenate(native.name_codes).tolist()] == [e.get("name", "") for e in xs]
        for key, col, ok in (("ts", native.ts, native.ts_ok), ("dur", native.dur, native.dur_ok)):
            want = [_ns(r[key]) if key in r else None for r in raw]
            got = [int(v) if o else None for v, o in zip(np.concatenate(col).tolist(), np.concatenate(ok).tolist())]
            assert got == want, key


def test_sub_ns_rounding_is_half_away_from_zero(monkeypatch) -> None:
    texts = ["1.0005", "1.0004999", "-1.0005", "-0.0004", "0.0015", "123456789012345.6785", "7"]
    tail = ",".join(f'{{"ph":"X","name":"a","ts":{t},"dur":{t}}}' for t in texts)
    cols = _columns([_events_text([], tail)], True, monkeypatch)
    assert np.concatenate(cols.ts).tolist() == [_ns(t) for t in texts]


def test_a_cut_inside_a_string_is_refused(monkeypatch) -> None:
    """decode_event_stream cuts at `},{`, which may lie inside a string: the piece is not valid JSON, the scanner
    refuses it as msgspec does, and the cut moves on; the columns equal msgspec's."""
    names = [f'x"}},{{"y{i}' for i in range(3)]
    events = [_with(name=n) for n in names] + [_BASE] * 20000
    text = _events_text(events)
    a = _columns(D.squeeze_whitespace([text[i:i + 65536] for i in range(0, len(text), 65536)]), False, monkeypatch)
    b = _columns(D.squeeze_whitespace([text[i:i + 65536] for i in range(0, len(text), 65536)]), True, monkeypatch)
    _assert_same(a, b)
    assert b.n == len(events)


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6))
_value = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
_arg_keys = st.sampled_from(["External id", "external id", "device", "stream", "correlation", "kernel", "flops",
                             "Collective name", "In msg nelems", "Group size", "dtype", "Input Dims", "Input type",
                             "Concrete Inputs", "Input Strides", "rank", "grid", "Process Group Ranks"])
_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "M", "i", "f", "s"])},
    optional={"name": st.one_of(st.text(max_size=8), st.sampled_from(["aten::mm", "ncclKernel_AllReduce", ""])),
              "cat": st.one_of(st.none(), st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "Kernel"])),
              "pid": st.one_of(st.integers(-5, 2**40), st.sampled_from(["Spans", "7", "stream 3"]), st.none()),
              "tid": st.one_of(st.integers(-5, 2**40), st.sampled_from(["stream 7", "x"])),
              "ts": st.one_of(st.integers(-10**6, 10**16), st.decimals(-10**9, 10**9, places=4).map(float)),
              "dur": st.integers(0, 10**6),
              "args": st.dictionaries(_arg_keys, st.one_of(_value, st.integers(-2**63, 2**63 - 1)), max_size=5)})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(_event, min_size=1, max_size=12), st.booleans())
def test_random_events_match_msgspec(events: list, merged: bool) -> None:
    text = _events_text(events)
    old = os.environ.get("TRACEKIT_NATIVE")
    try:
        os.environ["TRACEKIT_NATIVE"] = "0"
        a = K.decode_columns([text], event_ranks=merged)
        os.environ["TRACEKIT_NATIVE"] = "1"
        b = K.decode_columns([text], event_ranks=merged)
    finally:
        if old is None:
            os.environ.pop("TRACEKIT_NATIVE", None)
        else:
            os.environ["TRACEKIT_NATIVE"] = old
    _assert_same(a, b)


def test_mutated_real_events_match_msgspec(monkeypatch) -> None:
    """Random byte edits (delete, duplicate, replace with a JSON-significant byte) of real events: where the
    scanner takes the mutated piece, msgspec decodes it to the same columns; where msgspec refuses it, the
    scanner refused it too (a piece it accepts is always one msgspec accepts)."""
    import random

    path = SHARED / "hta_nccl_a100_rank0of2" / "nccl_data.json.gz"
    text = b"".join(iter_trace_blocks(str(path), None, K.CHUNK_BYTES))
    start = text.index(b"[", text.index(b'"traceEvents"')) + 1
    stop = re.compile(rb"\}\s*,\s*\{").search(text, start + 20000).start() + 1
    events = text[start:stop]
    rng = random.Random(28)
    significant = b'{}[]",:0123456789.-eE \\\x00\xff'
    took = 0
    for _ in range(300):
        piece = bytearray(events)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(piece))
            op = rng.randrange(3)
            if op == 0:
                del piece[at]
            elif op == 1:
                piece[at:at] = piece[at:at + rng.randint(1, 40)]
            else:
                piece[at] = significant[rng.randrange(len(significant))]
        doc = b'{"traceEvents":[' + bytes(piece) + b"]}"
        monkeypatch.setenv("TRACEKIT_NATIVE", "1")
        native = N.scan(b"[" + bytes(piece) + b"]")
        took += native is not None
        _assert_same(_columns([doc], False, monkeypatch), _columns([doc], True, monkeypatch))
    assert took > 30  # the edits that keep valid JSON of accepted types (inside a name, a digit) are read natively


def test_the_scanner_knows_the_phases_the_typed_decoder_knows() -> None:
    """Each phase of decode.Event (X, M, i and OTHER_PHASES) is read natively; any other `ph` sends the piece to
    msgspec, whose typed decode refuses it."""
    def piece(ph: str) -> bytes:
        return json.dumps([{"ph": ph, "name": "n", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]).encode()

    known = ("X", "M", "i") + D.OTHER_PHASES
    for ph in known:
        chunk = N.scan(piece(ph))
        assert chunk is not None and chunk.counts == {ph: 1}, ph
    for ph in ("Q", "x", "XX", "", "m", "a"):
        assert N.scan(piece(ph)) is None, ph
        with pytest.raises(msgspec.ValidationError):
            D.EVENTS_DECODER.decode(piece(ph))
