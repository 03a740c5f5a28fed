"""`tracekit analyze --max-memory`: the whole command's budget, planned (workers, each parse's share, the
prefetch cap) and watched (the process tree's summed PSS; said when the peak went over it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.scale.conftest import REPO
from tracekit.engines import budget as B
from tracekit.engines.options import engine_from_options

MiB = 1 << 20


def test_plan_runs_the_workers_that_fit_beside_this_process(monkeypatch):
    own = 300 * MiB
    monkeypatch.setattr(B, "tree_pss_bytes", lambda pid=None: (own, 0))
    largest, factor = 10 * MiB, 1.5
    one_worker = B.WORKER_BASE_BYTES + int(largest * factor) + largest  # its base, its parse, its result
    b = B.MemoryBudget(own + 2 * one_worker + MiB)  # room for two workers, not three
    w, each = b.parse_plan(4, largest, factor)
    assert w == 2
    assert each == (2 * one_worker + MiB) // 2 - B.WORKER_BASE_BYTES
    assert each >= largest * factor  # each file parses one-shot within its share
    w, each = B.MemoryBudget(own + MiB).parse_plan(4, largest, factor)  # no room for a worker beside it
    assert (w, each) == (1, B.MIN_PARSE_BYTES)  # parsed here, in chunks of the smallest share
    assert B.MemoryBudget(1 << 30).prefetch_bytes == (1 << 30) // 8


def test_the_budget_is_the_whole_command_only_for_analyze():
    e, budget = engine_from_options("local", workers=2, address=None, max_memory="1GB", whole_command=True)
    assert budget == 10**9 and e.budget.total == 10**9
    e, budget = engine_from_options("local", workers=2, address=None, max_memory="1GB")  # tracekit parse
    assert budget == 10**9 and e.budget is None


def test_a_budget_below_what_the_analysis_holds_is_said(tmp_path):
    """`python -m tracekit analyze` in its own process (in this test process, children that earlier tests left
    behind, such as a multiprocessing forkserver, would be counted among the tree's processes)."""
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "tracekit", "analyze", str(REPO / "fixtures" / "dp_ddp"), "--out",
                          str(out), "-j", "2", "-q", "--max-memory", "1MB"], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    said = re.search(r"--max-memory 1 MB could not be kept: peak memory ([\d,]+) MB \(this process ([\d,]+) MB, "
                     r"workers ([\d,]+) MB", " ".join((res.stdout + res.stderr).split()))
    assert said, res.stdout + res.stderr
    peak, own, workers = (int(x.replace(",", "")) for x in said.groups())
    assert workers == 0  # no room for a worker: parsed in this process
    assert own >= 50  # the process itself (Python, pyarrow, tracekit imported) holds far more than 1 MB
    assert peak >= own
    assert json.loads((out / "analysis.json").read_text())["ranks"]  # the analysis is still made
