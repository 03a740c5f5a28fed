"""Shared test fixtures: where the real traces live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_traces_dir() -> Path:
    env = os.environ.get("TRACEKIT_SHARED_TRACES")
    return Path(env) if env else REPO.parent / "shared" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    path = shared_traces_dir()
    if not path.is_dir():
        pytest.fail(f"real traces not found at {path}: put shared/ beside the repo or set TRACEKIT_SHARED_TRACES")
    return path
