"""Collective logs (`comms.rank{R}.jsonl`) and Flight Recorder entries from crashed or foreign jobs:
cut lines, garbage lines, non-UTF-8 bytes and malformed entries cost those lines only."""

from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

from . import corpus as C
from .strategies import FUZZ, json_values
from tracekit.errors import TracekitError
from tracekit.parse.comms_log import parse_comms_log
from tracekit.parse.flight_recorder import parse_flight_recorder

LOG = C.CLEAN_RUN / "comms.rank1.jsonl"


def _entries() -> list[dict]:
    objs = [json.loads(x) for x in LOG.read_text().splitlines() if x.strip()]
    return [o for o in objs if o.get("type") not in ("header", "footer")]


def test_garbage_lines_and_malformed_entries_cost_only_themselves(tmp_path):
    lines = LOG.read_bytes().split(b"\n")
    bad_entry = json.dumps({"record_id": 99, "process_group": 5, "input_sizes": "abc"}).encode()
    mixed = b"\n".join(lines[:3] + [b"{not json", b"[1, 2]", b"42", bad_entry, b"\xff\xfe"] + lines[3:])
    path = tmp_path / "comms.rank1.jsonl"
    path.write_bytes(mixed)
    log = parse_comms_log(path)
    want = _entries()
    assert log.collectives.num_rows == len(want)
    assert log.collectives.column("seq").to_pylist() == [e["collective_seq_id"] for e in want]
    text = " ".join(log.warnings)
    assert "line 4 is not valid JSON" in text and "line 5 is not an object" in text
    assert "1 malformed entries skipped" in text and "line 8 is not valid JSON" in text


def test_log_cut_mid_line_keeps_entries_before_it(tmp_path):
    raw = LOG.read_bytes()
    cut = raw[: raw.index(b"\n", len(raw) // 2) + 20]  # 20 bytes into a line
    path = tmp_path / "comms.rank1.jsonl"
    path.write_bytes(cut)
    log = parse_comms_log(path)
    complete = cut.count(b"\n") - 1  # lines ended before the cut, minus the header
    assert log.collectives.num_rows == complete
    assert log.partial
    assert any("cut off" in w for w in log.warnings)


def test_flight_recorder_entry_of_another_shape_is_skipped(tmp_path):
    doc = C.flight_recorder_doc(1)
    n = len(doc["entries"])
    doc["entries"] = doc["entries"][:3] + [{"process_group": 5, "input_sizes": "abc"}, "text", None] + doc["entries"][3:]
    path = tmp_path / "fr_rank1.json"
    path.write_text(json.dumps(doc))
    fr = parse_flight_recorder(path)
    assert fr.collectives.num_rows == n
    text = " ".join(fr.warnings)
    assert "2 Flight Recorder entries are not objects" in text and "1 malformed entries skipped" in text


@settings(FUZZ, max_examples=max(20, FUZZ.max_examples // 3))
@given(changes=st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(
    ["process_group", "input_sizes", "output_sizes", "input_dtypes", "collective_seq_id", "time_created_ns",
     "time_discovered_completed_ns", "profiling_name", "group_ranks", "in_split_sizes", "is_p2p", "peer",
     "state", "duration_ms", "*"]), json_values), min_size=1, max_size=5))
def test_mutated_dump_entries(tmp_path_factory, changes):
    """Any field of any entry replaced by any JSON value: rows for the intact entries, or a TracekitError."""
    doc = C.flight_recorder_doc(1)
    entries = [dict(e) for e in doc["entries"]]
    touched = set()
    for i, key, value in changes:
        i %= len(entries)
        touched.add(i)
        if key == "*" or not isinstance(entries[i], dict):
            entries[i] = value
        else:
            entries[i][key] = value
    doc["entries"] = entries
    path = tmp_path_factory.mktemp("fr") / "fr_rank1.json"
    path.write_text(json.dumps(doc))
    try:
        fr = parse_flight_recorder(path)
    except TracekitError as exc:
        assert exc.file == str(path)
        return
    assert len(entries) - len(touched) <= fr.collectives.num_rows <= len(entries)
