"""Property tests: mutated traces into the parser. It returns tables that fit the declared schemas or
raises tracekit's own error, never another exception and never a hang (a deadline per example).

Example counts come from the `robustness` hypothesis profile (TRACEKIT_FUZZ_EXAMPLES, default 150),
so CI stays fast; raise it locally for a longer hunt.
"""

from __future__ import annotations

import atexit
import gzip
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from . import corpus as C
from .strategies import FUZZ, json_values
from tracekit.errors import TracekitError
from tracekit.parse.kineto import KinetoParse, parse_kineto
from tracekit.tables.schema import TABLES



def small_trace() -> dict:
    """A few hundred events of rank 0's clean trace: metadata, steps, collectives and some ops."""
    doc = C.load_clean_trace(0)
    keep, ops = [], 0
    for e in doc["traceEvents"]:
        name = str(e.get("name", ""))
        if e.get("ph") != "X":
            keep.append(e)
        elif name.startswith(("ProfilerStep", "c10d::", "gloo:", "nccl:")):
            keep.append(e)
        elif ops < 150:
            keep.append(e)
            ops += 1
    return dict(doc, traceEvents=keep[:400])


BASE = small_trace()
BASE_BYTES = json.dumps(BASE).encode()
_DIR = Path(tempfile.mkdtemp(prefix="tracekit-fuzz-"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)

EVENT_KEYS = ["ph", "name", "cat", "ts", "dur", "pid", "tid", "args", "id", "s"]
ARG_KEYS = ["External id", "external id", "correlation", "stream", "Collective name", "In msg nelems",
            "Out msg nelems", "Group size", "dtype", "In split size", "Out split size", "Process Group Name",
            "Process Group Ranks", "Input Dims", "Concrete Inputs", "Seq", "seq_num", "Rank", "flops"]
TOP_KEYS = ["traceEvents", "distributedInfo", "deviceProperties", "baseTimeNanoseconds", "schemaVersion",
            "host_name"]


def _check(path: Path) -> None:
    """The property: tables with the declared schemas, or a TracekitError naming this file."""
    try:
        kp = parse_kineto(path)
    except TracekitError as exc:
        assert str(path) in str(exc) or getattr(exc, "file", None) == str(path), str(exc)
        return
    assert isinstance(kp, KinetoParse)
    for name, table in kp.tables.items():
        assert table.schema.equals(TABLES[name], check_metadata=False), name
    ev = kp.tables["events"]
    if ev.num_rows:
        durs = [d for d in ev.column("dur").to_pylist() if d is not None]
        assert all(d >= 0 for d in durs)


@st.composite
def event_mutations(draw):
    """A copy of BASE with a few events or top-level fields replaced, deleted or added."""
    doc = dict(BASE)
    events = [dict(e) for e in BASE["traceEvents"]]
    for _ in range(draw(st.integers(1, 6))):
        what = draw(st.sampled_from(["event_field", "arg", "drop_field", "replace_event", "insert", "top"]))
        i = draw(st.integers(0, len(events) - 1))
        if what in ("event_field", "arg", "drop_field") and not isinstance(events[i], dict):
            what = "replace_event"
        if what == "event_field":
            events[i][draw(st.sampled_from(EVENT_KEYS))] = draw(json_values)
        elif what == "arg":
            args = events[i].get("args")
            args = dict(args) if isinstance(args, dict) else {}
            args[draw(st.sampled_from(ARG_KEYS))] = draw(json_values)
            events[i]["args"] = args
        elif what == "drop_field":
            events[i].pop(draw(st.sampled_from(EVENT_KEYS)), None)
        elif what == "replace_event":
            events[i] = draw(json_values)
        elif what == "insert":
            events.insert(i, draw(st.dictionaries(st.sampled_from(EVENT_KEYS), json_values, max_size=6)))
        else:
            doc[draw(st.sampled_from(TOP_KEYS))] = draw(json_values)
    if isinstance(doc.get("traceEvents"), list) and doc["traceEvents"] is BASE["traceEvents"]:
        doc["traceEvents"] = events
    return doc


@FUZZ
@given(doc=event_mutations(), gz=st.booleans())
def test_structurally_mutated_trace(doc, gz):
    path = _DIR / ("mut.pt.trace.json.gz" if gz else "mut.pt.trace.json")
    C.write(path, json.dumps(doc).encode(), gz=gz)
    _check(path)


@st.composite
def byte_mutations(draw):
    data = bytearray(BASE_BYTES)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "duplicate"]))
        i = draw(st.integers(0, len(data)))
        if op == "truncate":
            del data[i:]
        elif op == "flip" and i < len(data):
            data[i] = draw(st.integers(0, 255))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[i:i + draw(st.integers(1, 64))]
        elif op == "duplicate":
            data[i:i] = data[i:i + draw(st.integers(1, 256))]
    return bytes(data)


@FUZZ
@given(data=byte_mutations(), gz=st.sampled_from(["plain", "gzip", "gzip-then-cut", "gzip-then-flip"]),
       where=st.floats(0, 1))
def test_byte_mutated_trace(data, gz, where):
    path = _DIR / ("bytes.pt.trace.json" if gz == "plain" else "bytes.pt.trace.json.gz")
    if gz != "plain":
        data = gzip.compress(data, compresslevel=1, mtime=0)
        k = min(int(where * len(data)), len(data) - 1)
        if gz == "gzip-then-cut":
            data = data[:k]
        elif gz == "gzip-then-flip":
            data = data[:k] + bytes([data[k] ^ 0xA5]) + data[k + 1:]
    path.write_bytes(data)
    _check(path)


def test_unmutated_base_parses():
    """The property tests start from a trace that parses, with steps and collectives to break."""
    path = C.write(_DIR / "base.pt.trace.json", BASE_BYTES)
    kp = parse_kineto(path)
    xs = [e for e in BASE["traceEvents"] if e.get("ph") == "X"]
    assert kp.tables["events"].num_rows == len(xs)
    assert kp.tables["steps"].num_rows == sum(str(e["name"]).startswith("ProfilerStep#") for e in xs) > 0
    assert kp.tables["collectives"].num_rows > 0


def _small_pair_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="tracekit-fuzz-run-", dir=_DIR))
    C.write(d / "rank0.pt.trace.json", BASE_BYTES)
    return d


RUN_EXAMPLES = max(10, FUZZ.max_examples // 10)
"""Whole-run examples cost a parse of two ranks plus every analyzer and both reports (~0.3 s each)."""


@settings(FUZZ, max_examples=RUN_EXAMPLES, deadline=20000)
@given(doc=event_mutations(), damage=st.sampled_from(["none", "none", "cut", "flip"]), where=st.floats(0, 1))
def test_mutated_rank_never_takes_the_run_down(doc, damage, where):
    """A mutated rank 1 beside a clean rank 0: the run parses, analyzes and renders; rank 1 is either
    analysed or listed as skipped, and rank 0's numbers do not depend on what rank 1 holds."""
    import jsonschema

    import reports
    from tracekit.flow import analyze_store
    from tracekit.parse.run import parse_run

    d = _small_pair_dir()
    data = json.dumps(dict(doc, distributedInfo=BASE["distributedInfo"] | {"rank": 1})
                      if isinstance(doc.get("distributedInfo"), dict) else doc).encode()
    k = min(int(where * len(data)), len(data) - 1)
    if damage == "cut":  # a rank killed mid-write
        data = data[:k]
    elif damage == "flip":
        data = data[:k] + bytes([data[k] ^ 0x80]) + data[k + 1:]
    C.write(d / "rank1.pt.trace.json", data)
    store = parse_run(d, d / "store", progress=False).store
    assert 0 in store.ranks()
    assert 1 in store.ranks() or [s["file"] for s in store.skipped] == [str(d / "rank1.pt.trace.json")]
    analysis = analyze_store(store)
    assert analysis["analyzer_errors"] == []
    jsonschema.validate(json.loads(json.dumps(analysis, default=str)), _SCHEMA)
    rank0 = [r for r in analysis["ranks"] if r["rank"] == 0]
    assert rank0 == [_BASE_RANK0]
    reports.render_html(analysis, store)
    reports.render_markdown(analysis)


def _base_rank0() -> dict:
    from tracekit.flow import analyze_store
    from tracekit.parse.run import parse_run

    d = _small_pair_dir()
    store = parse_run(d, d / "store", progress=False).store
    return [r for r in analyze_store(store)["ranks"] if r["rank"] == 0][0]


_SCHEMA = json.loads((C.REPO / "tracekit" / "schemas" / "analysis.schema.json").read_text())
_BASE_RANK0 = _base_rank0()
