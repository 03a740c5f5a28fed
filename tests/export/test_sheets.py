"""`tracekit analyze --csv DIR` (issue 33): one CSV per table users read, checked against the raw files
(plain json/gzip, integer ns) and against analysis.json."""

from __future__ import annotations

import csv
import gzip
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

from typer.testing import CliRunner

from tests.conftest import REPO, shared_traces_dir
from tracekit.cli.main import app


def _analyze(run: Path, tmp: Path) -> tuple[dict, Path]:
    out, sheets = tmp / "out", tmp / "sheets"
    res = CliRunner().invoke(app, ["analyze", str(run), "--out", str(out), "--csv", str(sheets), "-q", "--workers", "1"])
    assert res.exit_code == 0, res.output
    return json.loads((out / "analysis.json").read_text()), sheets


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_gpu_run_sheets(tmp_path):
    traces = shared_traces_dir() / "hta_sampled_2rank"
    doc, sheets = _analyze(traces, tmp_path)
    assert {p.name for p in sheets.iterdir()} == {"breakdown.csv", "findings.csv", "collectives.csv",
                                                   "stragglers.csv", "kernels.csv"}  # no memory events here
    bd = _rows(sheets / "breakdown.csv")
    assert [(int(r["rank"]), int(r["step_ns"]), int(r["compute_ns"])) for r in bd] == [
        (r["rank"], r["step_ns"], r["compute_ns"]) for r in doc["ranks"]]
    fd = _rows(sheets / "findings.csv")
    assert [(r["kind"], int(r["est_saving_ns"]), json.loads(r["ranks"])) for r in fd] == [
        (f["kind"], f["est_saving_ns"], f["ranks"]) for f in doc["findings"]]
    assert len(_rows(sheets / "collectives.csv")) == doc["sections"]["matching"]["instances"]
    # kernels: count and total time per (rank, name), from the raw device events
    want: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    for f in sorted(traces.glob("*.json.gz")):
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            raw = json.load(fh, parse_float=Decimal)
        rank = raw["distributedInfo"]["rank"]
        for e in raw["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["dur"] >= 0:
                w = want[(rank, e["name"])]
                w[0] += 1
                w[1] += int(Decimal(e["dur"]) * 1000)
    got: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in _rows(sheets / "kernels.csv"):
        g = got[(int(r["rank"]), r["name"])]
        g[0] += int(r["count"])
        g[1] += int(r["total_ns"])
    assert got == want


def test_cpu_run_and_memory_sheets(tmp_path):
    doc, sheets = _analyze(REPO / "fixtures" / "dp_ddp", tmp_path / "ddp")
    names = {p.name for p in sheets.iterdir()}
    assert "kernels.csv" not in names and "memory.csv" not in names  # a CPU run without memory events
    assert len(_rows(sheets / "findings.csv")) == len(doc["findings"])
    gpu = REPO / "fixtures" / "gpu_h100"
    doc, sheets = _analyze(gpu, tmp_path / "gpu")
    with gzip.open(gpu / "rank0.pt.trace.json.gz", "rt", encoding="utf-8") as fh:
        raw = json.load(fh, parse_float=Decimal)
    peak = max(e["args"]["Total Allocated"] for e in raw["traceEvents"]
               if e.get("name") == "[memory]" and e["args"]["Device Type"] == 1)
    mem = [r for r in _rows(sheets / "memory.csv") if r["device_type"] == "1"]
    assert [int(r["peak_allocated"]) for r in mem] == [peak]
