"""One bad Kineto file at a time, straight into the parser and the input discovery.

Each case is derived from a clean trace; the parser must raise tracekit's own error naming the file
and the reason, or return tables whose numbers are checked against the clean trace's.
"""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from . import corpus as C
from tracekit.errors import InputTooLargeError, TraceFormatError
from tracekit.parse import discover
from tracekit.parse.chunked import parse_kineto_chunked
from tracekit.parse.gz import MAX_COMPRESSION_RATIO, MIN_RATIO_CHECKED_BYTES, read_trace_bytes
from tracekit.parse.kineto import MAX_NAME_CHARS, parse_kineto


def _x_events(doc):
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def _ns(us) -> int:
    """Exact ns of a µs JSON number, from its text (independent of the parser's conversion)."""
    from decimal import Decimal

    return int((Decimal(json.dumps(us)) * 1000).to_integral_value())


def _whitespace_bomb(path, decompressed_bytes: int) -> int:
    """A valid gzip'd Kineto document padded with `decompressed_bytes` of spaces; returns its compressed size."""
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    parts = [c.compress(b'{"traceEvents": [')]
    block = b" " * (1 << 20)
    for _ in range(decompressed_bytes >> 20):
        parts.append(c.compress(block))
    parts += [c.compress(b"]}"), c.flush()]
    path.write_bytes(b"".join(parts))
    return path.stat().st_size


@pytest.mark.parametrize("case, reason", [
    ("truncated_gz", "truncated gzip stream"),
    ("corrupt_gz", "corrupt gzip data"),
    ("truncated_json", "invalid JSON"),
    ("top_level_array", "top level is a JSON array"),
    ("top_level_number", "top level is a JSON non-object value"),
    ("trace_events_object", "not a Kineto trace"),
    ("execution_trace", "no traceEvents"),
    ("empty_json", "empty file"),
])
def test_unreadable_trace_raises_trace_format_error_naming_file(tmp_path, clean_docs, case, reason):
    gz = C.clean_gz_bytes(1)
    raw = C.dump(clean_docs[1])
    path = tmp_path / ("rank1.pt.trace.json.gz" if case.endswith("_gz") else "rank1.pt.trace.json")
    data = {
        "truncated_gz": gz[: len(gz) // 2],
        "corrupt_gz": gz[:5000] + bytes(b ^ 0x5A for b in gz[5000:6000]) + gz[6000:],
        "truncated_json": raw[: len(raw) // 2],
        "top_level_array": C.dump(clean_docs[1]["traceEvents"][:100]),
        "top_level_number": b"42",
        "trace_events_object": C.dump({"traceEvents": {"0": {"ph": "X"}}}),
        "execution_trace": C.dump(C.execution_trace()),
        "empty_json": b"   \n",
    }[case]
    path.write_bytes(data)
    with pytest.raises(TraceFormatError) as info:
        parse_kineto(path)
    assert info.value.file == str(path)
    assert reason in info.value.reason
    assert str(path) in str(info.value)


def test_unknown_phases_keep_every_complete_event(tmp_path, clean_docs):
    """Phases no writer uses make the typed decoder fail; the lenient one keeps all X events exactly."""
    path = C.write(tmp_path / "rank1.pt.trace.json", C.dump(C.with_unknown_phases(clean_docs[1])))
    kp = parse_kineto(path)
    xs = _x_events(clean_docs[1])
    ev = kp.tables["events"]
    assert ev.num_rows == len(xs)
    assert sorted(ev.column("ts").to_pylist()) == sorted(_ns(e["ts"]) for e in xs)
    assert kp.phase_counts.get("Z") == 1
    assert any("lenient" in w for w in kp.info["parse_warnings"])


def test_bad_durations_become_null_and_are_counted(tmp_path, clean_docs):
    doc, counts = C.with_bad_durations(clean_docs[1])
    kp = parse_kineto(C.write(tmp_path / "rank1.pt.trace.json.gz", C.dump(doc)))
    ev = kp.tables["events"]
    bad = counts["minus_one"] + counts["negative"] + counts["missing"]
    assert counts["minus_one"] and counts["negative"] and counts["missing"]
    assert ev.column("dur").null_count == bad
    durs = [d for d in ev.column("dur").to_pylist() if d is not None]
    assert min(durs) >= 0
    # every surviving duration equals the clean trace's, event for event
    want = sorted(_ns(e["dur"]) for e in _x_events(doc) if isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0)
    assert sorted(durs) == want
    warns = " ".join(kp.info["parse_warnings"])
    assert f"{counts['missing']} complete events without dur" in warns
    assert f"{counts['minus_one'] + counts['negative']} complete events with negative dur" in warns


def test_non_utf8_bytes_are_replaced_and_the_rank_kept(tmp_path, clean_docs):
    raw = C.dump(clean_docs[1])
    assert raw.count(b'"aten::mul"') >= 3
    bad = raw.replace(b'"aten::mul"', b'"aten::\xff\xfemul"', 3)
    kp = parse_kineto(C.write(tmp_path / "rank1.pt.trace.json.gz", bad))
    names = kp.tables["events"].column("name").to_pylist()
    assert names.count("aten::\ufffd\ufffdmul") == 3
    assert len(names) == len(_x_events(clean_docs[1]))
    assert "6 invalid UTF-8 byte sequence(s) replaced" in " ".join(kp.info["parse_warnings"])
    # the bounded-memory path (large traces) keeps the rank the same way, the count summed over its chunks
    chunked = parse_kineto_chunked(tmp_path / "rank1.pt.trace.json.gz", max_memory_bytes=1 << 30, chunk_bytes=1 << 12)
    assert chunked.tables["events"].column("name").to_pylist() == names
    assert "6 invalid UTF-8 byte sequence(s) replaced" in " ".join(chunked.info["parse_warnings"])


def test_huge_names_are_cut_and_counted(tmp_path, clean_docs):
    huge = "<script>alert(1)</script>" + "A" * (4 << 20)
    k = 0

    def fn(e):
        nonlocal k
        if e.get("ph") == "X" and e.get("name") == "aten::add_" and k < 3:
            k += 1
            e["name"] = huge
        return e

    kp = parse_kineto(C.write(tmp_path / "rank1.pt.trace.json.gz", C.dump(C.map_events(clean_docs[1], fn))))
    assert k == 3
    names = kp.tables["events"].column("name").to_pylist()
    cut = [n for n in names if n.startswith("<script>")]
    assert len(cut) == 3
    assert all(n.startswith(huge[:MAX_NAME_CHARS]) and len(n) < MAX_NAME_CHARS + 64 for n in cut)
    assert f"{len(huge) - MAX_NAME_CHARS} more characters cut" in cut[0]
    assert "3 event names longer than 4096 characters were cut" in kp.info["parse_warnings"]


def test_decompression_bomb_refused_by_default_ratio(tmp_path, monkeypatch):
    """No budget given: a file expanding over max(floor, 200x) is refused (floor lowered to keep the test small)."""
    monkeypatch.setattr("tracekit.parse.gz.MIN_RATIO_CHECKED_BYTES", 8 << 20)
    path = tmp_path / "rank1.pt.trace.json.gz"
    compressed = _whitespace_bomb(path, 24 << 20)
    assert (24 << 20) > MAX_COMPRESSION_RATIO * compressed > 0  # a bomb by the ratio rule
    with pytest.raises(InputTooLargeError) as info:
        parse_kineto(path)
    assert info.value.file == str(path)
    assert "likely decompression bomb" in info.value.reason
    assert f"{8 << 20} bytes" in info.value.reason
    # the same content under the floor is read: the rule only refuses big expansions
    ok = tmp_path / "rank2.pt.trace.json.gz"
    _whitespace_bomb(ok, 4 << 20)
    assert parse_kineto(ok).tables["events"].num_rows == 0


def test_real_traces_expand_far_below_the_ratio(clean_docs):
    gz = C.clean_gz_bytes(0)
    assert len(gzip.decompress(gz)) < MAX_COMPRESSION_RATIO / 5 * len(gz)
    assert MIN_RATIO_CHECKED_BYTES >= 256 << 20


def test_explicit_budget_refuses_and_admits(tmp_path, clean_docs):
    path = tmp_path / "rank0.pt.trace.json.gz"
    path.write_bytes(C.clean_gz_bytes(0))
    size = len(gzip.decompress(path.read_bytes()))
    with pytest.raises(InputTooLargeError) as info:
        read_trace_bytes(path, max_decompressed_bytes=size - 1)
    assert f"the {size - 1}-byte budget" in info.value.reason
    assert len(read_trace_bytes(path, max_decompressed_bytes=size)) == size


def test_forged_gzip_trailer_does_not_allocate_it(tmp_path, clean_docs):
    """ISIZE claims 4 GiB: the output buffer is not sized by it, and the file is refused as corrupt."""
    import tracemalloc

    gz = bytearray(C.clean_gz_bytes(0))
    path = tmp_path / "rank0.pt.trace.json.gz"
    gz[-4:] = (2**32 - 1).to_bytes(4, "little")
    path.write_bytes(bytes(gz))
    tracemalloc.start()
    try:
        with pytest.raises(TraceFormatError, match="corrupt gzip data"):  # the trailer's length check fails
            read_trace_bytes(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(gzip.decompress(C.clean_gz_bytes(0)))


@pytest.mark.parametrize("content, reason", [  # ids named (gzip's header holds a time: xdist workers must agree)
    (b"", "empty file"),
    (b"   \n\t ", "file holds only whitespace"),
    (gzip.compress(b"", mtime=0), "gzip data decompresses to nothing"),
    (b"\x1f\x8b\x08\x00garbage", "gzip data decompresses to nothing"),
    (b"42", "not a JSON object"),
    (json.dumps(C.execution_trace()).encode(), "execution trace"),
], ids=["empty", "whitespace", "empty_gzip", "gzip_garbage", "number", "execution_trace"])
def test_discovery_skips_with_specific_reason(tmp_path, content, reason):
    (tmp_path / "rank3.pt.trace.json.gz").write_bytes(content)
    found = discover.discover_inputs(tmp_path)
    assert found.inputs == []
    assert len(found.skipped) == 1 and found.skipped[0]["file"] == str(tmp_path / "rank3.pt.trace.json.gz")
    assert reason in found.skipped[0]["reason"]


def test_discovery_scan_of_a_bomb_stops_at_the_budget(tmp_path, monkeypatch):
    """No traceEvents in the first 256 KiB: the full-file scan stops at the budget instead of reading it all."""
    monkeypatch.setattr("tracekit.parse.discover.decompressed_budget", lambda size, limit: (8 << 20, "test"))
    path = tmp_path / "rank0.pt.trace.json.gz"
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    block = b" " * (1 << 20)
    path.write_bytes(c.compress(b"{") + b"".join(c.compress(block) for _ in range(64))
                     + c.compress(b'"traceEvents": []}') + c.flush())
    decompressed = []
    real = discover.isal_zlib.decompressobj

    class Counting:
        def __init__(self, *a):
            self._d = real(*a)

        def decompress(self, data, max_length=0):
            out = self._d.decompress(data, max_length)
            decompressed.append(len(out))
            return out

        def __getattr__(self, name):
            return getattr(self._d, name)

    monkeypatch.setattr(discover.isal_zlib, "decompressobj", Counting)
    found = discover.discover_inputs(tmp_path)
    assert [f.kind for f in found.inputs] == ["kineto"]  # handed to the parser, which enforces the budget
    assert 8 << 20 < sum(decompressed) <= (8 << 20) + 2 * (4 << 20)
    assert max(decompressed) <= 4 << 20


def test_chunked_parser_refuses_a_bomb_too(tmp_path, monkeypatch):
    """The bounded-memory path (files over --max-memory) streams; the default ratio rule still stops it."""
    from tracekit.parse.chunked import parse_kineto_chunked

    monkeypatch.setattr("tracekit.parse.gz.MIN_RATIO_CHECKED_BYTES", 8 << 20)
    path = tmp_path / "rank1.pt.trace.json.gz"
    _whitespace_bomb(path, 24 << 20)
    with pytest.raises(InputTooLargeError) as info:
        parse_kineto_chunked(path, max_memory_bytes=64 << 20)
    assert info.value.file == str(path) and "likely decompression bomb" in info.value.reason


@pytest.mark.parametrize("where", ["args", "distributedInfo"])
def test_deeply_nested_json_is_a_trace_format_error(tmp_path, where):
    """200,000 levels of [ in a free-form field: a clear error, not a RecursionError."""
    deep = b"[" * 200_000 + b"]" * 200_000
    if where == "args":
        body = b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"Process Group Ranks": ' + deep + b"}}]}"
    else:
        body = b'{"traceEvents": [], "distributedInfo": {"pg_config": ' + deep + b"}}"
    path = tmp_path / "rank0.pt.trace.json"
    path.write_bytes(body)
    with pytest.raises(TraceFormatError) as info:
        parse_kineto(path)
    assert info.value.file == str(path) and "nested too deeply" in info.value.reason
