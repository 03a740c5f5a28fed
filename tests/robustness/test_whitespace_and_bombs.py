"""Cost per byte independent of content (behaviour at small sizes; benchmarks/bad_input_bench.py has the
full sizes and the timings): megabytes of whitespace anywhere in the events array parse to the same
tables as the compact file without being held, and a gzip bomb is refused once the inflated bytes pass
the budget, without inflating it a second time."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from tracekit.errors import InputTooLargeError
from tracekit.parse import gz
from tracekit.parse.chunked import parse_kineto_chunked
from tracekit.parse.kineto import parse_kineto

_WS = b" \n\t \r" * (1 << 20)  # 5 MiB of mixed whitespace


def _events() -> list[dict]:
    return [
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1700000000000000.5, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1700000000000010.25, "dur": 10,
         "args": {"External id": 3}},
        {"ph": "X", "cat": "user_annotation", "name": "a   b", "pid": 1, "tid": 1, "ts": 1700000000000030, "dur": 5},
    ]


def _compact() -> bytes:
    return json.dumps({"traceEvents": _events(), "distributedInfo": {"rank": 0}}).encode()


def _padded() -> bytes:
    """The same trace with 5 MiB of whitespace before the first event, between events, inside an event
    and after the last one."""
    e = [json.dumps(x).encode() for x in _events()]
    inside = e[1].replace(b'"args":', b'"args":' + _WS)
    return (b'{"traceEvents": [' + _WS + e[0] + _WS + b"," + _WS + inside + b"," + e[2] + _WS + b"]," + _WS
            + b'"distributedInfo": {"rank": 0}}')


def _rows(parsed) -> dict:
    return {k: parsed.tables[k].to_pylist() for k in ("events", "kernels", "steps", "collectives")}


@pytest.mark.parametrize("gzipped", [False, True])
def test_whitespace_parses_like_the_compact_file(tmp_path, gzipped):
    want = _rows(parse_kineto(_write(tmp_path / "compact.json", _compact(), gzipped)))
    padded = _write(tmp_path / "padded.json", _padded(), gzipped)
    got = parse_kineto(padded)
    assert _rows(got) == want
    assert got.tables["events"].column("name").to_pylist()[2] == "a   b"  # short runs inside strings are kept
    chunked = parse_kineto_chunked(padded, max_memory_bytes=1 << 30, chunk_bytes=1 << 16)
    assert _rows(chunked) == want


def _write(path, data: bytes, gzipped: bool):
    if gzipped:
        path = path.with_suffix(".json.gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def test_gzip_bomb_refused_once_the_budget_is_crossed(tmp_path, monkeypatch):
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    data = [comp.compress(b'{"traceEvents": [' + json.dumps(_events()[0]).encode() + b",")]
    data += [comp.compress(_WS) for _ in range(8)]  # 40 MiB of whitespace
    data.append(comp.compress(json.dumps(_events()[1]).encode() + b"]}") + comp.flush())
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(b"".join(data))
    inflated = []
    real = gz.gzip_pieces

    def counting(*args, **kwargs):
        for piece in real(*args, **kwargs):
            inflated.append(len(piece))
            yield piece

    monkeypatch.setattr(gz, "gzip_pieces", counting)
    budget = 4 << 20
    with pytest.raises(InputTooLargeError, match="budget"):
        parse_kineto(bomb, max_decompressed_bytes=budget)
    # stopped at the piece that crossed the budget (not handed on), and not inflated a second time
    assert budget - max(inflated) < sum(inflated) <= budget
