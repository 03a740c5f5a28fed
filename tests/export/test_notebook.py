"""`tracekit.open(DIR)` (issue 33): DataFrames for notebooks, and the example notebook run top to bottom.

Expected values come from the raw files (plain json/gzip, integer ns) or, for what only the analysis
defines (findings, the critical path), from analysis.json read as JSON."""

from __future__ import annotations

import ast
import gzip
import json
import os
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

import tracekit
from tests.conftest import REPO, shared_traces_dir
from tracekit.errors import TracekitError

DDP = REPO / "fixtures" / "dp_ddp"
NOTEBOOK = REPO / "examples" / "notebook_quickstart.ipynb"


def _raw(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh, parse_float=Decimal)


@pytest.fixture(scope="module")
def ddp_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp") / "out"
    tracekit.analyze_run(DDP, out)
    return out


def test_open_any_kind_of_folder(ddp_out):
    """An analysis folder (nothing recomputed), its run store and the traces give the same tables."""
    runs = [tracekit.open(ddp_out), tracekit.open(ddp_out / "tables"), tracekit.open(DDP)]
    doc = json.loads((ddp_out / "analysis.json").read_text())
    assert runs[0].analysis == doc
    first = runs[0].breakdown()
    assert first["rank"].tolist() == [r["rank"] for r in doc["ranks"]]
    assert (first["compute_share"] == first["compute_ns"] / first["step_ns"]).all()
    for run in runs[1:]:
        assert run.breakdown()[["rank", "step_ns", "compute_ns", "exposed_comm_ns", "idle_ns"]].equals(
            first[["rank", "step_ns", "compute_ns", "exposed_comm_ns", "idle_ns"]])
    with pytest.raises(TracekitError):
        tracekit.open(ddp_out / "no-such-folder")


def test_tables_against_the_raw_files(ddp_out):
    run = tracekit.open(ddp_out)
    # events per rank = the trace's complete events
    raw_counts = {}
    for f in sorted(DDP.glob("rank*.pt.trace.json.gz")):
        doc = _raw(f)
        raw_counts[doc["distributedInfo"]["rank"]] = sum(e.get("ph") == "X" for e in doc["traceEvents"])
    got = run.sql("SELECT rank, count(*) AS n FROM events GROUP BY rank ORDER BY rank")
    assert dict(zip(got["rank"], got["n"])) == raw_counts
    # collective instances = the comms logs' collectives seen by more than one rank, keyed group#seq
    members: dict[str, set[int]] = {}
    for f in sorted(DDP.glob("comms.rank*.jsonl")):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e.get("type") != "header" and not e.get("is_p2p") and e.get("collective_seq_id"):
                members.setdefault(f"{e['process_group'][0]}#{e['collective_seq_id']}", set()).add(e["rank"])
    inst = run.collectives()
    assert sorted(inst["key"]) == sorted(k for k, m in members.items() if len(m) > 1)
    assert dict(zip(inst["key"], inst["n"])) == {k: len(m) for k, m in members.items() if len(m) > 1}
    rows = run.collectives(members=True)
    assert Counter(rows["key"]) == Counter({k: len(m) for k, m in members.items() if len(m) > 1})
    assert len(run.stragglers()) == len(raw_counts)


def test_analysis_views(ddp_out):
    run = tracekit.open(ddp_out)
    doc = json.loads((ddp_out / "analysis.json").read_text())
    f = run.findings()
    assert f["kind"].tolist() == [x["kind"] for x in doc["findings"]]
    assert f["est_saving_ns"].tolist() == [x["est_saving_ns"] for x in doc["findings"]]
    steps = doc["sections"]["critical_path"]["steps"]
    for s in steps:
        cp = run.critical_path(s["step"])
        assert cp[["rank", "category", "start_ns", "end_ns"]].to_dict("records") == [
            {k: r[k] for k in ("rank", "category", "start_ns", "end_ns")} for r in s["path"]]
    slowest = max(steps, key=lambda s: s["measured_ns"])["step"]
    assert (run.critical_path()["step"] == slowest).all()
    with pytest.raises(TracekitError, match="not replayed"):
        run.critical_path(10_000)
    if run.store.has("ops"):  # a tracekit whose parser writes the ops table
        assert len(run.ops()) == int(run.sql("SELECT count(*) AS n FROM ops")["n"][0])
    else:
        with pytest.raises(TracekitError, match="'ops'"):
            run.ops()  # no ops table in this store: a clear error, not a KeyError
    with pytest.raises(TracekitError, match="'no_such_table'"):
        run.table("no_such_table")
    w = run.whatif(no_host_stalls=True)
    assert w["measured_ns"].tolist() == [s["measured_ns"] for s in steps]
    assert run.memory().empty and doc["sections"]["memory"]["available"] is False


def test_kernels_and_memory_on_gpu_traces():
    """kernels() on a real 2-rank NCCL trace; memory() peaks on the H100 fixture, from the raw events."""
    s2 = shared_traces_dir() / "hta_sampled_2rank"
    run = tracekit.open(s2)
    want = {}
    for f in sorted(s2.glob("*.json.gz")):
        doc = _raw(f)
        want[doc["distributedInfo"]["rank"]] = sum(e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                                                   for e in doc["traceEvents"])
    assert run.kernels().groupby("rank").size().to_dict() == want
    gpu = REPO / "fixtures" / "gpu_h100"
    doc = _raw(gpu / "rank0.pt.trace.json.gz")
    peaks: dict[tuple[int, int], int] = {}
    for e in doc["traceEvents"]:
        if e.get("name") == "[memory]":
            a = e["args"]
            key = (a["Device Type"], a["Device Id"])
            peaks[key] = max(peaks.get(key, 0), a["Total Allocated"])
    mem = tracekit.open(gpu).memory()
    cuda = mem[mem["device_type"] == 1]
    assert dict(zip(cuda["device"], cuda["peak_allocated"])) == {d: p for (t, d), p in peaks.items() if t == 1}


def _run_cells_plainly(nb: dict, cwd: Path) -> dict:
    """Each code cell in order in one namespace (the last expression evaluated, as a kernel would)."""
    ns: dict = {}
    old = Path.cwd()
    os.chdir(cwd)
    try:
        for cell in nb["cells"]:
            if cell["cell_type"] != "code":
                continue
            tree = ast.parse("".join(cell["source"]))
            exec(compile(tree, "<cell>", "exec"), ns)
    finally:
        os.chdir(old)
    return ns


def test_example_notebook_runs_top_to_bottom(monkeypatch):
    """examples/notebook_quickstart.ipynb against the dp_ddp fixture run: through a Jupyter kernel when
    nbclient and ipykernel are installed, else its code cells in order in one namespace."""
    monkeypatch.setenv("TRACEKIT_RUN", str(DDP))
    nb = json.loads(NOTEBOOK.read_text())
    assert any(c["cell_type"] == "code" for c in nb["cells"])
    try:
        import ipykernel  # noqa: F401
        import nbclient
        import nbformat
    except ImportError:
        ns = _run_cells_plainly(nb, NOTEBOOK.parent)
        assert len(ns["run"].breakdown()) == 2 and ns["out"].flows > 0
        return
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    book = nbformat.reads(NOTEBOOK.read_text(), as_version=4)
    nbclient.NotebookClient(book, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()  # raises on a cell error
    outputs = ["".join(o.get("text", "") or o.get("data", {}).get("text/plain", "")) for c in book.cells
               if c.cell_type == "code" for o in c.outputs]
    assert any("collective flows" in o for o in outputs)
    assert any("tracekit.Run" in o and "ranks=[0, 1]" in o for o in outputs)
