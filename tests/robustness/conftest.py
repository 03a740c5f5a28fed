"""Robustness fixtures: the clean 2-rank runtime traces (decoded once) and the clean run's analysis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from . import corpus as C


@pytest.fixture(scope="session")
def clean_docs() -> dict[int, dict[str, Any]]:
    """rank → the clean Kineto trace of that rank as JSON (do not mutate: copy what you change)."""
    return {r: C.load_clean_trace(r) for r in (0, 1)}


def run_analyze(trace_dir: Path, out: Path, *extra: str) -> tuple[int, str, dict[str, Any] | None]:
    """`tracekit analyze TRACE_DIR --out OUT -q` in-process: (exit code, stderr, analysis.json or None)."""
    from tracekit.cli.main import app

    res = CliRunner().invoke(app, ["analyze", str(trace_dir), "--out", str(out), "-q", *extra])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    path = out / "analysis.json"
    analysis = json.loads(path.read_text()) if path.is_file() else None
    return res.exit_code, res.stderr, analysis


@pytest.fixture(scope="session")
def clean_rank0_analysis(tmp_path_factory) -> dict[str, Any]:
    """Analysis of rank 0's clean trace alone: what rank 0's numbers must be when rank 1's file is bad."""
    d = tmp_path_factory.mktemp("clean_rank0")
    (d / "rank0.pt.trace.json.gz").write_bytes(C.clean_gz_bytes(0))
    code, err, analysis = run_analyze(d, d / "out")
    assert code == 0, err
    return analysis


@pytest.fixture(scope="session")
def clean_pair_analysis(tmp_path_factory) -> dict[str, Any]:
    """Analysis of both clean ranks."""
    d = C.write_clean_pair(tmp_path_factory.mktemp("clean_pair"))
    code, err, analysis = run_analyze(d, d / "out")
    assert code == 0, err
    return analysis
