"""`tracekit analyze` on folders with one bad input beside good ones.

For each bad input: the exit status, the message naming the file and the reason, analysis.json listing
the skipped input (and a finding saying so), and the good ranks' numbers equal to those of a clean
run without the bad file. Missing ranks, mixed runs, time-unit mix-ups and clock skew appear as
warnings in analysis.json, report.html and summary.md.
"""

from __future__ import annotations

import gzip
import html
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import jsonschema
import pytest

from . import corpus as C
from .conftest import run_analyze

SCHEMA = json.loads((C.REPO / "tracekit" / "schemas" / "analysis.schema.json").read_text())
INPUT_KINDS = {"input_skipped", "missing_ranks", "mixed_runs", "time_unit_mismatch", "clock_skew"}


def _rank_row(analysis, rank):
    rows = [r for r in analysis["ranks"] if r["rank"] == rank]
    assert len(rows) == 1, analysis["ranks"]
    return rows[0]


def _analysis_findings(analysis):
    """Findings about the training (not about the inputs), comparable across runs."""
    return sorted((f["kind"], f["summary"]) for f in analysis["findings"] if f["kind"] not in INPUT_KINDS)


def skipped_reason(analysis) -> str:
    return analysis["inputs"]["skipped"][0]["reason"] if analysis["inputs"]["skipped"] else "<none>"


def _squash(text: str) -> str:
    return "".join(text.split())


def _kinds(analysis):
    return [f["kind"] for f in analysis["findings"]]


def _bad_file(case: str, d: Path, docs, rank: int = 1) -> Path:
    """Write a bad stand-in for `rank`'s trace; returns its path."""
    gz = C.clean_gz_bytes(1)
    raw = C.dump(docs[1])
    stem = f"rank{rank}.pt.trace"
    if case == "truncated_gz":
        return C.write(d / f"{stem}.json.gz", gz[: len(gz) * 2 // 3], gz=False)
    if case == "corrupt_gz":
        bad = gz[:5000] + bytes(b ^ 0x5A for b in gz[5000:6000]) + gz[6000:]
        return C.write(d / f"{stem}.json.gz", bad, gz=False)
    if case == "truncated_json":  # a rank killed mid-write
        return C.write(d / f"{stem}.json", raw[: len(raw) // 2])
    if case == "empty":
        return C.write(d / f"{stem}.json", b"")
    if case == "gzip_of_nothing":
        return C.write(d / f"{stem}.json.gz", b"")
    if case == "top_level_array":
        return C.write(d / f"{stem}.json", C.dump(docs[1]["traceEvents"]))
    if case == "trace_events_string":
        return C.write(d / f"{stem}.json", C.dump(dict(docs[1], traceEvents="oops")))
    if case == "event_not_an_object":
        ev = docs[1]["traceEvents"]
        return C.write(d / f"{stem}.json.gz", C.dump(dict(docs[1], traceEvents=ev[:50] + [7] + ev[50:])))
    if case == "execution_trace":
        return C.write(d / f"{stem}.json", C.dump(C.execution_trace()))
    if case == "bomb":
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        block = b" " * (1 << 20)
        data = c.compress(b'{"traceEvents": [') + b"".join(c.compress(block) for _ in range(24)) + c.compress(b"]}") + c.flush()
        return C.write(d / f"{stem}.json.gz", data, gz=False)
    raise AssertionError(case)


BAD_FILES = {
    "truncated_gz": "truncated gzip stream",
    "corrupt_gz": "corrupt gzip data",
    "truncated_json": "invalid JSON: Input data was truncated",
    "empty": "empty file",
    "gzip_of_nothing": "gzip data decompresses to nothing",
    "top_level_array": "JSON without 'traceEvents'",
    "trace_events_string": "not a Kineto trace",
    "event_not_an_object": "not a Kineto trace",
    "execution_trace": "execution trace",
    "bomb": "likely decompression bomb",
}


@pytest.fixture(scope="module")
def graveyard(tmp_path_factory, clean_docs):
    """Rank 0's clean trace beside one bad file per kind of damage, analysed once."""
    mp = pytest.MonkeyPatch()
    mp.setattr("tracekit.parse.gz.MIN_RATIO_CHECKED_BYTES", 8 << 20)  # a 24 MiB bomb is enough
    try:
        base = tmp_path_factory.mktemp("graveyard")
        d = base / "run"
        d.mkdir()
        (d / "rank0.pt.trace.json.gz").write_bytes(C.clean_gz_bytes(0))
        bad = {case: _bad_file(case, d, clean_docs, rank=i + 1) for i, case in enumerate(BAD_FILES)}
        # the files claim ranks 1..10 of a world of 2: only rank 1 is missing from the world
        # one process: the lowered ratio floor above is patched here and would not reach pool workers
        code, err, analysis = run_analyze(d, base / "out", "--workers", "1")
    finally:
        mp.undo()
    return bad, code, err, analysis


def test_bad_files_exit_zero_and_are_listed(graveyard):
    bad, code, err, analysis = graveyard
    assert code == 0, err
    jsonschema.validate(analysis, SCHEMA)
    assert analysis["inputs"]["ranks"] == [0]
    assert sorted(s["file"] for s in analysis["inputs"]["skipped"]) == sorted(map(str, bad.values()))


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_each_bad_file_named_with_its_reason(graveyard, case):
    bad, code, err, analysis = graveyard
    reason = {s["file"]: s["reason"] for s in analysis["inputs"]["skipped"]}[str(bad[case])]
    assert BAD_FILES[case] in reason
    assert _squash(f"skipped {bad[case]}: {reason}") in _squash(err)  # stderr wraps lines: compare sans whitespace


def test_good_rank_intact_beside_bad_files(graveyard, clean_rank0_analysis):
    """Rank 0 analysed exactly as in a run without the bad files; the skips are findings naming the files."""
    bad, code, err, analysis = graveyard
    assert _rank_row(analysis, 0) == _rank_row(clean_rank0_analysis, 0)
    assert _analysis_findings(analysis) == _analysis_findings(clean_rank0_analysis)
    skip = [f for f in analysis["findings"] if f["kind"] == "input_skipped"]
    assert len(skip) == 1 and skip[0]["severity"] == "warning"
    assert skip[0]["evidence"]["num_skipped"] == len(BAD_FILES)
    assert sorted(s["file"] for s in skip[0]["evidence"]["skipped"]) == sorted(map(str, bad.values()))
    missing = [f for f in analysis["findings"] if f["kind"] == "missing_ranks"]
    assert len(missing) == 1 and missing[0]["ranks"] == [1] and missing[0]["evidence"]["world_size"] == 2


@pytest.mark.parametrize("case", ["unknown_phases", "bad_durations", "non_utf8"])
def test_damaged_but_readable_rank_is_kept(tmp_path, clean_docs, clean_pair_analysis, case):
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0.pt.trace.json.gz").write_bytes(C.clean_gz_bytes(0))
    if case == "unknown_phases":
        data = C.dump(C.with_unknown_phases(clean_docs[1]))
    elif case == "bad_durations":
        data = C.dump(C.with_bad_durations(clean_docs[1])[0])
    else:
        data = C.dump(clean_docs[1]).replace(b'"aten::mul"', b'"aten::\xe9mul"', 2)
    C.write(d / "rank1.pt.trace.json.gz", data)

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    jsonschema.validate(analysis, SCHEMA)
    assert analysis["inputs"]["ranks"] == [0, 1] and analysis["inputs"]["skipped"] == []
    assert _rank_row(analysis, 0) == _rank_row(clean_pair_analysis, 0)
    if case != "bad_durations":  # the other two change no time at all
        assert _rank_row(analysis, 1) == _rank_row(clean_pair_analysis, 1)
    else:  # durations now null: the rank is analysed, within its step time
        r1 = _rank_row(analysis, 1)
        assert r1["steps"] == 2 and r1["step_ns"] == _rank_row(clean_pair_analysis, 1)["step_ns"]
    from tracekit.tables.store import RunStore

    warns = RunStore(tmp_path / "out" / "tables").table("ranks").to_pylist()[1]["parse_warnings"]
    expect = {"unknown_phases": "lenient decoder", "bad_durations": "negative dur",
              "non_utf8": "2 invalid UTF-8 byte sequence(s) replaced"}[case]
    assert any(expect in w for w in warns), warns


def test_duplicate_rank_keeps_one_and_names_both(tmp_path, clean_pair_analysis):
    d = C.write_clean_pair(tmp_path / "run")
    (d / "rank1_copy.pt.trace.json.gz").write_bytes(C.clean_gz_bytes(1))

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    skipped = analysis["inputs"]["skipped"]
    assert len(skipped) == 1
    reason = skipped[0]["reason"]
    assert "rank 1 is claimed by two Kineto trace files" in reason
    assert str(d / "rank1.pt.trace.json.gz") in reason and str(d / "rank1_copy.pt.trace.json.gz") in reason
    assert [(r["rank"], r["step_ns"], r["compute_ns"]) for r in analysis["ranks"]] == \
        [(r["rank"], r["step_ns"], r["compute_ns"]) for r in clean_pair_analysis["ranks"]]


def test_missing_ranks_warned_in_json_html_and_markdown(tmp_path, clean_docs, clean_pair_analysis):
    """World size 8, files for 6: a warning naming ranks 6 and 7; the 6 ranks analysed as in the clean run."""
    d = tmp_path / "run"
    d.mkdir()
    for r in range(6):
        C.write(d / f"rank{r}.pt.trace.json.gz", C.dump(C.renumbered(clean_docs[r % 2], r, 8)))

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    jsonschema.validate(analysis, SCHEMA)
    assert analysis["inputs"]["ranks"] == list(range(6))
    missing = [f for f in analysis["findings"] if f["kind"] == "missing_ranks"]
    assert len(missing) == 1 and missing[0]["ranks"] == [6, 7]
    assert missing[0]["evidence"] == {"world_size": 8, "missing_ranks": [6, 7], "num_present": 6}
    assert any("missing ranks [6, 7]" in w for w in analysis["inputs"]["warnings"])
    assert "mixed_runs" not in _kinds(analysis)
    clean = {r["rank"]: r for r in clean_pair_analysis["ranks"]}
    for row in analysis["ranks"]:
        # waited_for names the ranks waited for, which are this run's (its copies of the clean pair's ranks)
        mine = ("rank", "waited_for")
        assert {k: v for k, v in row.items() if k not in mine} == {k: v for k, v in clean[row["rank"] % 2].items() if k not in mine}
        assert sum(row["waited_for"].values()) == row["sync_wait_ns"]
    report = (tmp_path / "out" / "report.html").read_text()
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert html.escape(missing[0]["summary"]) in report
    assert "missing ranks \\[6, 7\\]" in summary  # Markdown-escaped brackets


@pytest.mark.parametrize("how", ["days_apart", "world_sizes"])
def test_ranks_of_two_runs_are_warned(tmp_path, clean_docs, how):
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0.pt.trace.json.gz").write_bytes(C.clean_gz_bytes(0))
    other = C.shifted(clean_docs[1], 3 * 86400 * C.US_PER_S) if how == "days_apart" else C.renumbered(clean_docs[1], 1, 4)
    C.write(d / "rank1.pt.trace.json.gz", C.dump(other))

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    jsonschema.validate(analysis, SCHEMA)
    mixed = [f for f in analysis["findings"] if f["kind"] == "mixed_runs"]
    assert len(mixed) == 1 and mixed[0]["severity"] == "warning"
    ev = mixed[0]["evidence"]
    if how == "days_apart":
        assert [r["ranks"] for r in ev["runs"]] == [[0], [1]]
        gap_ns = ev["runs"][1]["start_ns"] - ev["runs"][0]["start_ns"]
        # independent: the two traces' first X timestamps, µs → ns, plus the 3-day shift
        first = [min(e["ts"] for e in clean_docs[r]["traceEvents"] if e.get("ph") == "X") for r in (0, 1)]
        assert abs(gap_ns - ((first[1] - first[0]) * 1000 + 3 * 86400 * 10**9)) < 1000
        assert "+3.0 days" in mixed[0]["summary"]
    else:
        assert ev["world_sizes"] == {"2": [0], "4": [1]}
    assert mixed[0]["summary"] in analysis["inputs"]["warnings"]
    assert html.escape(mixed[0]["summary"]) in (tmp_path / "out" / "report.html").read_text()


def test_rank_in_nanoseconds_is_flagged(tmp_path, clean_docs):
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0.pt.trace.json.gz").write_bytes(C.clean_gz_bytes(0))
    C.write(d / "rank1.pt.trace.json.gz", C.dump(C.in_ns(clean_docs[1])))

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    units = [f for f in analysis["findings"] if f["kind"] == "time_unit_mismatch"]
    assert len(units) == 1 and units[0]["ranks"] == [1]
    import statistics

    med = [statistics.median(e["dur"] for e in clean_docs[r]["traceEvents"]
                             if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")) for r in (0, 1)]
    assert units[0]["evidence"]["measure"] == "step"
    assert units[0]["evidence"]["ratio"] == pytest.approx(1000 * med[1] / med[0], abs=0.1)
    assert "mixed_runs" not in _kinds(analysis)  # the unit mix-up is not mistaken for another run
    assert units[0]["summary"] in analysis["inputs"]["warnings"]


def _comms_log_shifted(rank: int, shift_ns) -> str:
    """The clean run's comms log of `rank` with every wall-clock time moved by `shift_ns` (ns, or a
    function of the time giving the shift)."""
    shift = shift_ns if callable(shift_ns) else (lambda t: shift_ns)
    out = []
    for line in (C.CLEAN_RUN / f"comms.rank{rank}.jsonl").read_text().splitlines():
        if line.strip():
            obj = json.loads(line)
            for k, v in obj.items():
                if (k == "time_ns" or k.startswith("time_")) and isinstance(v, int):
                    obj[k] = v + shift(v)
            out.append(json.dumps(obj))
    return "\n".join(out) + "\n"


def test_clock_skew_between_hosts_is_aligned(tmp_path, clean_docs):
    """Rank 1 on another host whose clock is 2 s ahead: the offset is estimated and removed. The clean
    traces' collectives name no process group and two of the ranks' groups span both ranks, so the
    comms logs (on each host's clock) say which group each belongs to (issue 12 item 10)."""
    runs = {}
    for name, shift_s in (("ref", 0), ("skewed", 2)):
        d = tmp_path / name
        d.mkdir()
        (d / "rank0.pt.trace.json.gz").write_bytes(C.clean_gz_bytes(0))
        (d / "comms.rank0.jsonl").write_text(_comms_log_shifted(0, 0))
        doc1 = dict(C.shifted(clean_docs[1], shift_s * C.US_PER_S), host_name="hostB") if shift_s else clean_docs[1]
        C.write(d / "rank1.pt.trace.json.gz", C.dump(doc1))
        (d / "comms.rank1.jsonl").write_text(_comms_log_shifted(1, shift_s * 1_000_000_000))
        code, err, runs[name] = run_analyze(d, tmp_path / f"out_{name}")
        assert code == 0, err
    analysis, ref = runs["skewed"], runs["ref"]

    clocks = {r["rank"]: r for r in analysis["sections"]["clocks"]["ranks"]}
    assert clocks[1]["status"] == "corrected" and clocks[1]["applied"], clocks
    assert abs(clocks[1]["offset_ns"] - 2_000_000_000) < 1_000_000
    assert "clock_skew" not in _kinds(analysis) and "mixed_runs" not in _kinds(analysis)
    # the estimate's residual error moves rank 1's arrivals by that much in each of a step's collectives
    residual = abs(clocks[1]["offset_ns"] - 2_000_000_000)
    events = clean_docs[0]["traceEvents"]
    per_step = (sum(str(e.get("name")).startswith("c10d::") for e in events)
                // sum(str(e.get("name")).startswith("ProfilerStep#") for e in events))
    clean_s = {r["rank"]: r for r in ref["sections"]["stragglers"]["ranks"]}
    assert sorted(clean_s) == [0, 1] and sum(r["last_count"] for r in clean_s.values()) > 0
    for r in analysis["sections"]["stragglers"]["ranks"]:
        assert r["last_count"] == clean_s[r["rank"]]["last_count"]
        assert abs(r["delay_ns_per_step"] - clean_s[r["rank"]]["delay_ns_per_step"]) <= 100_000 + per_step * residual
    # the waiting part of exposed comm rests on the matched arrivals too; everything else is unchanged
    waits = ("sync_wait_ns", "exposed_transfer_ns", "waited_for")
    for row, clean_row in zip(analysis["ranks"], ref["ranks"], strict=True):
        assert {k: v for k, v in row.items() if k not in waits} == {k: v for k, v in clean_row.items() if k not in waits}
        for k in waits[:2]:
            assert abs(row[k] - clean_row[k]) <= 100_000 + row["steps"] * per_step * residual
        assert set(row["waited_for"]) <= set(clean_row["waited_for"]) | {"0", "1"}
        for peer in set(row["waited_for"]) | set(clean_row["waited_for"]):
            got, want = row["waited_for"].get(peer, 0), clean_row["waited_for"].get(peer, 0)
            assert abs(got - want) <= 100_000 + row["steps"] * per_step * residual


def test_inconsistent_clock_skew_is_warned(tmp_path, clean_docs):
    """Rank 1's clock jumps from +5 ms to +60 ms mid-trace: no single offset fits, so `clock_skew` warns."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0.pt.trace.json.gz").write_bytes(C.clean_gz_bytes(0))
    xs = [e["ts"] for e in clean_docs[1]["traceEvents"] if e.get("ph") == "X"]
    mid = (min(xs) + max(xs)) / 2

    def jump(e):
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += 5_000 if e["ts"] < mid else 60_000
        return e

    C.write(d / "rank1.pt.trace.json.gz", C.dump(dict(C.map_events(clean_docs[1], jump), host_name="hostB")))
    # the comms logs say which group each collective belongs to (the traces name none; two groups span
    # both ranks); rank 1's log is on its host's clock too: µs trace time + baseTimeNanoseconds = log ns
    base = int(clean_docs[1]["baseTimeNanoseconds"])
    mid_ns = base + int(mid * 1000)
    (d / "comms.rank0.jsonl").write_text(_comms_log_shifted(0, 0))
    (d / "comms.rank1.jsonl").write_text(_comms_log_shifted(1, lambda t: 5_000_000 if t < mid_ns else 60_000_000))

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    skew = [f for f in analysis["findings"] if f["kind"] == "clock_skew"]
    assert len(skew) == 1 and skew[0]["ranks"] == [1]
    assert html.escape(skew[0]["summary"]) in (tmp_path / "out" / "report.html").read_text()


def test_malicious_pickle_beside_traces_is_refused_not_run(tmp_path, clean_pair_analysis):
    d = C.write_clean_pair(tmp_path / "run")
    sentinel = tmp_path / "PWNED"
    evil = d / "fr_rank1.pkl"
    evil.write_bytes(C.malicious_pickle(sentinel))

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    assert not sentinel.exists()
    assert [s["file"] for s in analysis["inputs"]["skipped"]] == [str(evil)]
    assert "would import or call code; refused" in analysis["inputs"]["skipped"][0]["reason"]
    assert analysis["ranks"] == clean_pair_analysis["ranks"]


def test_nothing_analyzable_exits_1_naming_each_file(tmp_path, clean_docs):
    """Real process: exit status 1, each bad file named with its reason on stderr."""
    d = tmp_path / "run"
    d.mkdir()
    a = _bad_file("truncated_json", d, clean_docs)
    b = C.write(d / "rank0.pt.trace.json.gz", C.clean_gz_bytes(0)[:1000], gz=False)
    env = dict(os.environ, COLUMNS="400")
    res = subprocess.run([sys.executable, "-m", "tracekit", "analyze", str(d), "--out", str(tmp_path / "out"), "-q"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=C.REPO)
    assert res.returncode == 1, res.stderr
    err = _squash(res.stderr)
    assert _squash(f"skipped {a}: invalid JSON: Input data was truncated") in err
    assert _squash(f"skipped {b}: truncated gzip stream") in err
    assert _squash(f"nothing under {d} could be analyzed") in err


def test_explicit_decompression_budget_on_the_command_line(tmp_path, clean_pair_analysis):
    """--max-decompressed-mb below the traces' size skips both (exit 1, each named); above it, both analysed."""
    d = C.write_clean_pair(tmp_path / "run")
    sizes = [len(gzip.decompress(C.clean_gz_bytes(r))) for r in (0, 1)]
    assert 1 << 20 < min(sizes) and max(sizes) < 8 << 20

    code, err, analysis = run_analyze(d, tmp_path / "small", "--max-decompressed-mb", "1")
    assert code == 1
    for r in (0, 1):
        assert _squash(f"skipped {d / f'rank{r}.pt.trace.json.gz'}: decompresses to more than the 1048576-byte budget") in _squash(err)

    code, err, analysis = run_analyze(d, tmp_path / "big", "--max-decompressed-mb", "8")
    assert code == 0, err
    assert analysis["ranks"] == clean_pair_analysis["ranks"]


def test_huge_strings_outside_event_names_are_cut(tmp_path, clean_docs, clean_pair_analysis):
    """4 MiB appended to thread names, the host name and a group description (every row of a thread carries its name):
    cut at parse time, so the analysis and the reports stay the clean run's size and numbers."""
    from tracekit.parse.kineto import MAX_NAME_CHARS
    from tracekit.tables.store import RunStore

    big = "<b>" + "B" * (4 << 20)
    d = tmp_path / "run"
    d.mkdir()
    for r in (0, 1):
        doc = C.with_host_and_group_desc(clean_docs[r], big, big)
        doc = C.map_events(doc, lambda e: dict(e, args={"name": e["args"]["name"] + big})
                           if e.get("ph") == "M" and e.get("name") == "thread_name" else e)
        C.write(d / f"rank{r}.pt.trace.json.gz", C.dump(doc))

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    assert analysis["ranks"] == clean_pair_analysis["ranks"]
    store = RunStore(tmp_path / "out" / "tables")
    hosts = store.table("ranks", ["hostname"]).column("hostname").to_pylist()
    assert all(h.startswith(big[:MAX_NAME_CHARS]) and len(h) < MAX_NAME_CHARS + 64 for h in hosts)
    threads = store.table("events", ["thread_name"]).column("thread_name").combine_chunks().dictionary.to_pylist()
    assert max(map(len, threads)) < MAX_NAME_CHARS + 64
    descs = [x for x in store.table("process_groups", ["pg_desc"]).column("pg_desc").to_pylist() if x]
    assert max(map(len, descs)) < MAX_NAME_CHARS + 64
    assert (tmp_path / "out" / "report.html").stat().st_size < 4 << 20


def test_bad_files_over_a_process_pool(tmp_path, clean_docs, graveyard):
    """--workers 2: failures inside pool workers come back as the same skipped entries; rank 0 is the same."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0.pt.trace.json.gz").write_bytes(C.clean_gz_bytes(0))
    cases = ["truncated_gz", "truncated_json", "event_not_an_object"]
    bad = {case: _bad_file(case, d, clean_docs, rank=list(BAD_FILES).index(case) + 1) for case in cases}

    code, err, analysis = run_analyze(d, tmp_path / "out", "--workers", "2")

    assert code == 0, err
    serial = {Path(s["file"]).name: s["reason"] for s in graveyard[3]["inputs"]["skipped"]}
    pooled = {Path(s["file"]).name: s["reason"] for s in analysis["inputs"]["skipped"]}
    assert pooled == {p.name: serial[p.name] for p in bad.values()}
    assert _rank_row(analysis, 0) == _rank_row(graveyard[3], 0)


def test_gap_in_ranks_without_world_size_is_warned(tmp_path, clean_docs):
    """No distributedInfo (a quarter of real traces): ranks from file names 0, 1, 3 - rank 2 is missing."""
    d = tmp_path / "run"
    d.mkdir()
    for r in (0, 1, 3):
        doc = {k: v for k, v in clean_docs[r % 2].items() if k != "distributedInfo"}
        C.write(d / f"rank{r}.pt.trace.json.gz", C.dump(doc))

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    assert analysis["inputs"]["ranks"] == [0, 1, 3]
    missing = [f for f in analysis["findings"] if f["kind"] == "missing_ranks"]
    assert len(missing) == 1 and missing[0]["ranks"] == [2]
    assert missing[0]["evidence"] == {"world_size": None, "missing_ranks": [2], "num_present": 3}
    assert "no world size stated, highest rank 3" in missing[0]["summary"]


def test_two_complete_runs_in_subfolders_keep_one(tmp_path, clean_docs, clean_pair_analysis):
    """runA/ and runB/ (a day later) under one folder: run A's ranks are analysed, run B's files are
    skipped as second claims of ranks 0 and 1, naming both files."""
    d = tmp_path / "run"
    for r in (0, 1):
        (d / "runA").mkdir(parents=True, exist_ok=True)
        (d / "runB").mkdir(parents=True, exist_ok=True)
        (d / "runA" / f"rank{r}.pt.trace.json.gz").write_bytes(C.clean_gz_bytes(r))
        C.write(d / "runB" / f"rank{r}.pt.trace.json.gz", C.dump(C.shifted(clean_docs[r], 86400 * C.US_PER_S)))

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    assert analysis["ranks"] == clean_pair_analysis["ranks"]
    skipped = {s["file"]: s["reason"] for s in analysis["inputs"]["skipped"]}
    assert sorted(skipped) == [str(d / "runB" / f"rank{r}.pt.trace.json.gz") for r in (0, 1)]
    for r in (0, 1):
        reason = skipped[str(d / "runB" / f"rank{r}.pt.trace.json.gz")]
        assert f"rank {r} is claimed by two Kineto trace files" in reason
        assert str(d / "runA" / f"rank{r}.pt.trace.json.gz") in reason
    assert "mixed_runs" not in _kinds(analysis)


def test_execution_trace_beside_a_real_kineto_trace(shared_traces, tmp_path):
    """HTA's mixed folder (read in place): the execution trace is skipped with its reason, the Kineto trace analysed."""
    d = shared_traces / "hta_mixed_et_and_kineto"
    code, err, analysis = run_analyze(d, tmp_path / "out")
    assert code == 0, err
    jsonschema.validate(analysis, SCHEMA)
    assert analysis["inputs"]["skipped"] == [{
        "file": str(d / "benchmark_simple_add_et.json.gz"),
        "reason": "execution trace (has 'nodes', no 'traceEvents'): not a Kineto trace"}]
    with gzip.open(d / "benchmark_simple_add_trace.json.gz") as f:
        rank = json.load(f)["distributedInfo"]["rank"]
    assert analysis["inputs"]["ranks"] == [rank] and [r["rank"] for r in analysis["ranks"]] == [rank]


def test_deeply_nested_side_files_do_not_take_the_run_down(tmp_path, clean_rank0_analysis):
    """100,000 levels of [ in a .jsonl beside the traces, a Flight Recorder dump, a comms-log line and
    a manifest: each is skipped or ignored with its reason; rank 0 is analysed as without them."""
    deep = "[" * 100_000 + "]" * 100_000
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0.pt.trace.json.gz").write_bytes(C.clean_gz_bytes(0))
    (d / "notes.jsonl").write_text(deep + "\n")
    (d / "fr_rank1.json").write_text('{"entries": [], "pg_config": {"0": {"name": "0", "ranks": "' + deep + '"}}, "version": ' + deep + "}")
    (d / "comms.rank1.jsonl").write_text('{"type": "header", "version": "tracekit.comms/1", "rank": 1, "world_size": 2}\n' + deep + "\n")
    (d / "manifest.json").write_text(deep)

    code, err, analysis = run_analyze(d, tmp_path / "out")

    assert code == 0, err
    skipped = {Path(s["file"]).name: s["reason"] for s in analysis["inputs"]["skipped"]}
    assert skipped["fr_rank1.json"] == "JSON nested too deeply to decode"
    assert skipped["manifest.json"].startswith("unreadable JSON")
    assert "notes.jsonl" not in skipped  # not an input of any kind
    assert _rank_row(analysis, 0) == _rank_row(clean_rank0_analysis, 0)
    from tracekit.tables.store import RunStore

    rows = {r["rank"]: r for r in RunStore(tmp_path / "out" / "tables").table("ranks").to_pylist()}
    assert any("line 2 is not valid JSON" in w for w in rows[1]["parse_warnings"])
