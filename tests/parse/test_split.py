"""One trace decoded by several processes (parse/split.py): the same tables as one process, checked
against the whole-document decode; the cut plan checked against plain `json`; every failure falls
back to one process."""

from __future__ import annotations

import gzip
import json
import os
import time

import msgspec
import pytest

import tracekit.parse.kineto as K
from tracekit.engines.local import LocalEngine
from tracekit.parse import decode as D
from tracekit.parse import pool as P
from tracekit.parse import split as S
from tests.parse.test_kineto_chunks import _DIR, _ENC, _assert_same, _doc, _whole

PROCESSES = 3


@pytest.fixture
def small_parts(monkeypatch):
    """Parts of a few KB, so small documents split (and chunks of 4 KB inside each part)."""
    monkeypatch.setattr(S, "MIN_PART_BYTES", 2048)
    monkeypatch.setattr(K, "CHUNK_BYTES", 4096)


def _write(tmp_path, doc: dict, indent: int | None = None):
    text = _ENC.encode(doc)
    if indent:
        text = msgspec.json.format(text, indent=indent)
    path = tmp_path / "t.json"
    path.write_bytes(text)
    return path, text


def _split_parse(path) -> tuple[K.Columns | None, K.KinetoParse]:
    cols = S.decode_columns_split(str(path), PROCESSES)
    return cols, K.parse_kineto(path, columns=cols)


@pytest.mark.parametrize("indent", [None, 2])
def test_split_equals_whole_document(tmp_path, small_parts, indent):
    path, _ = _write(tmp_path, _doc(300, events_last=True), indent)
    cols, parsed = _split_parse(path)
    assert cols is not None  # it really split
    _assert_same(parsed, _whole(path))


def test_cuts_fall_between_whole_events(tmp_path):
    """Wherever the planned offset falls, the text before the cut (closed with `]}`) and the text after it
    (opened with `{"traceEvents":[`) are documents whose events, read by plain json, are the trace's."""
    path, text = _write(tmp_path, _doc(300, events_last=False), 1)
    events = json.loads(text)["traceEvents"]
    start = text.index(b"[", text.index(b'"traceEvents"'))
    for at in range(start, len(text) - 4096, len(text) // 23):
        cut = D.event_cut(text[at:at + D.CUT_WINDOW])
        assert cut is not None
        before = json.loads(text[:at + cut[0]] + b"]}")
        after = json.loads(b'{"traceEvents":[' + text[at + cut[1]:])
        assert before["traceEvents"] + after["traceEvents"] == events
        assert before["distributedInfo"] == {"rank": 1, "world_size": 2} and after["baseTimeNanoseconds"] == 1


def test_array_of_objects_after_the_events(tmp_path, small_parts):
    """`deviceProperties` (a list of objects) after the events: the last part reads the document's end
    as one process does."""
    path, _ = _write(tmp_path, _doc(300, events_last=False))
    cols, parsed = _split_parse(path)
    assert cols is not None
    _assert_same(parsed, _whole(path))


@pytest.mark.parametrize("where", ["string", "args"])
def test_a_cut_inside_an_event_fails_its_part(tmp_path, small_parts, monkeypatch, where):
    """A cut rule that got it wrong (inside a name, inside args' list of objects) fails the decode of the
    part before the cut, never yields other events."""
    path, text = _write(tmp_path, _doc(300, events_last=True))
    marker = _ENC.encode('aten::mm},{"x": [1]}, {')[1:-1] if where == "string" else b'{"a":1},{"b":[2]}'

    def wrong_cut(window):
        i = window.find(marker)
        return None if i < 0 else (i + marker.index(b"},{") + 1, i + marker.index(b"},{") + 2)

    monkeypatch.setattr(D, "event_cut", wrong_cut)
    assert S.decode_part(str(path), None, len(text) // 2, False, None) is None
    cols, parsed = _split_parse(path)
    assert cols is None
    _assert_same(parsed, _whole(path))


def _children_do(monkeypatch, action) -> None:
    """Forked children run `action` before their part (this process decodes its own as usual)."""
    parent = os.getpid()
    real = S.decode_part

    def decode_part(*args):
        if os.getpid() != parent:
            action()
        return real(*args)

    monkeypatch.setattr(S, "decode_part", decode_part)


def test_a_child_that_fails_falls_back(tmp_path, small_parts, monkeypatch):
    def fail():
        raise MemoryError("child out of memory")

    _children_do(monkeypatch, fail)
    path, _ = _write(tmp_path, _doc(300, events_last=True))
    cols, parsed = _split_parse(path)
    assert cols is None
    _assert_same(parsed, _whole(path))


def test_a_child_that_hangs_is_stopped(tmp_path, small_parts, monkeypatch):
    """A child stuck (say, on a lock another thread held at the fork) is killed and one process decodes."""
    _children_do(monkeypatch, lambda: time.sleep(600))
    monkeypatch.setattr(S, "CHILD_GRACE_S", 0.5)
    path, _ = _write(tmp_path, _doc(300, events_last=True))
    t0 = time.monotonic()
    cols, parsed = _split_parse(path)
    assert cols is None and time.monotonic() - t0 < 60
    _assert_same(parsed, _whole(path))


def test_lenient_events_in_a_later_part_fall_back(tmp_path, small_parts):
    doc = _doc(300, events_last=True)
    doc["traceEvents"][-5]["ph"] = "Z"  # unknown phase: only the lenient whole-document decoder reads it
    path, _ = _write(tmp_path, doc)
    cols, parsed = _split_parse(path)
    assert cols is None
    _assert_same(parsed, _whole(path))
    assert parsed.phase_counts.get("Z") == 1


def test_gzip_splits_too(tmp_path, small_parts):
    path, text = _write(tmp_path, _doc(300, events_last=False))
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(text))
    cols, parsed = _split_parse(gz)
    assert cols is not None
    _assert_same(parsed, _whole(gz))
    assert len(S.plan_parts(str(gz), 64, None)) == S.MAX_GZIP_PROCESSES  # each inflates from the start
    assert len(S.plan_parts(str(path), 64, None)) == 64


def test_what_is_not_split(tmp_path, small_parts, monkeypatch):
    path, text = _write(tmp_path, _doc(300, events_last=True))
    assert S.decode_columns_split(str(path), 1) is None
    assert S.decode_columns_split(str(path), PROCESSES, max_decompressed_bytes=len(text) - 1) is None
    assert S.split_processes(2 * S.MIN_PART_BYTES - 1, 8) == 1 and S.split_processes(9 * S.MIN_PART_BYTES, 8) == 8
    two = tmp_path / "two.json.gz"  # two gzip members: the trailer holds the last one's size only
    two.write_bytes(gzip.compress(text[:-10]) + gzip.compress(text[-10:]))
    assert S.decode_columns_split(str(two), PROCESSES) is None  # 10 bytes < the compressed size: not trusted
    two.write_bytes(gzip.compress(text[:1000]) + gzip.compress(text[1000:]))  # plausible, too small: uneven parts
    _assert_same(K.parse_kineto(two, columns=S.decode_columns_split(str(two), PROCESSES)), _whole(two))
    monkeypatch.setattr(S, "decompressed_budget", lambda size, limit: (size, "the budget"))  # a likely bomb
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(text))
    assert S.decode_columns_split(str(gz), PROCESSES) is None


@pytest.mark.parametrize("sub", ["hta_nccl_a100_rank0of2", "kineto_resnet50_2021_workers0", "hta_alltoall_a100_rank0of16"])
def test_real_traces_split_equal_one_process(tmp_path, monkeypatch, sub):
    files = sorted((_DIR / sub).glob("*.json*"))
    if not files:
        pytest.fail(f"shared trace {sub} missing under {_DIR}")
    plain = tmp_path / "trace.json"
    plain.write_bytes(gzip.decompress(files[0].read_bytes()))
    monkeypatch.setattr(S, "MIN_PART_BYTES", 64 << 10)
    for path in (files[0], plain):
        cols, parsed = _split_parse(path)
        assert cols is not None
        _assert_same(parsed, _whole(path))


def test_a_lone_file_gets_the_spare_processes(tmp_path, monkeypatch):
    """With fewer files than processes, the local engine lets each file use the rest."""
    seen: list[int] = []
    monkeypatch.setattr(S, "decode_columns_split", lambda path, n, limit=None: seen.append(n))
    path, _ = _write(tmp_path, _doc(20, events_last=True))
    results = list(LocalEngine(workers=4).parse_kineto_files([str(path)]))
    assert results[0][2] is None and seen == [4]
    seen.clear()
    assert list(P.parse_kineto_files([str(path)], workers=1))[0][2] is None and seen == [1]
