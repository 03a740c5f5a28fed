"""Flight Recorder dumps from other people's jobs: the JSON form, plain-data pickles, and pickles that
try to run code (refused, nothing executed) or are cut off."""

from __future__ import annotations

import json
import pickle

import pytest

from . import corpus as C
from .conftest import run_analyze
from tracekit.errors import TraceFormatError, TracekitError, UnsafeInputError
from tracekit.parse.flight_recorder import parse_flight_recorder
from tracekit.parse.safe_pickle import load_plain_data, loads_plain_data


def test_json_and_plain_pickle_dumps_give_the_same_rows(tmp_path):
    doc = C.flight_recorder_doc(1)
    j = tmp_path / "fr_rank1.json"
    j.write_text(json.dumps(doc))
    p = tmp_path / "fr_rank1.pkl"
    p.write_bytes(pickle.dumps(doc, protocol=4))
    a = parse_flight_recorder(j).collectives
    b = parse_flight_recorder(p).collectives
    assert a.num_rows == len(doc["entries"]) > 0
    assert a.equals(b)
    assert a.column("seq").to_pylist() == [e["collective_seq_id"] for e in doc["entries"]]
    assert a.column("enqueue_ts").to_pylist() == [e["time_created_ns"] for e in doc["entries"]]


@pytest.mark.parametrize("name", list(C.hostile_pickles(C.REPO / "never").keys()))
def test_hostile_pickle_refused_and_nothing_runs(tmp_path, name):
    sentinel = tmp_path / "PWNED"
    payload = C.hostile_pickles(sentinel)[name]
    with pytest.raises(UnsafeInputError) as info:
        loads_plain_data(payload, "dump.pkl")
    assert info.value.file == "dump.pkl"
    path = tmp_path / "fr_rank0.pkl"
    path.write_bytes(payload)
    with pytest.raises(TracekitError) as info2:
        parse_flight_recorder(path)
    assert info2.value.file == str(path)
    assert not sentinel.exists()


def test_self_referencing_plain_pickle_does_not_hang(tmp_path):
    entries: list = []
    entries.append(entries)
    doc = {"version": "2.4", "pg_config": {}, "entries": entries}
    doc["pg_config"]["self"] = doc
    path = tmp_path / "fr_rank0.pkl"
    path.write_bytes(pickle.dumps(doc, protocol=4))
    assert load_plain_data(path)["entries"][0] is not None
    try:
        parsed = parse_flight_recorder(path, rank=0)
    except TracekitError as exc:
        assert exc.file == str(path)
    else:
        assert parsed.collectives.num_rows == 0


@pytest.mark.parametrize("form", ["json", "pickle"])
def test_cut_dump_is_skipped_and_traces_kept(tmp_path, clean_pair_analysis, form):
    d = C.write_clean_pair(tmp_path / "run")
    doc = C.flight_recorder_doc(1)
    data = json.dumps(doc).encode() if form == "json" else pickle.dumps(doc, protocol=4)
    dump = d / ("fr_rank1.json" if form == "json" else "fr_rank1.pkl")
    dump.write_bytes(data[: len(data) // 2])
    with pytest.raises((TraceFormatError, UnsafeInputError)):
        parse_flight_recorder(dump)

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    skipped = analysis["inputs"]["skipped"]
    assert [s["file"] for s in skipped] == [str(dump)]
    assert ("not valid JSON" if form == "json" else "not a readable pickle") in skipped[0]["reason"]
    assert analysis["ranks"] == clean_pair_analysis["ranks"]
