"""Shared test fixtures: where the real traces live; the lock that keeps timing tests alone on the box."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("TRACEKIT_STRICT_DOCUMENT", "1")
"""Under test, an analysis that does not fit the typed document (tracekit/document) raises instead of
being written from the dict with a problem noted: a key or a null the structs lack fails the test that
produced it."""


def shared_traces_dir() -> Path:
    env = os.environ.get("TRACEKIT_SHARED_TRACES")
    return Path(env) if env else REPO.parent / "shared" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    path = shared_traces_dir()
    if not path.is_dir():
        pytest.fail(f"real traces not found at {path}: put shared/ beside the repo or set TRACEKIT_SHARED_TRACES")
    return path


@contextmanager
def _box_lock(exclusive: bool) -> Iterator[None]:
    """Under pytest-xdist, a lock all workers of this run share: every test holds it shared, a test marked
    `quiet_box` holds it alone (the other worker finishes its test, then waits)."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if uid is None:  # one process: nothing runs beside the test
        yield
        return
    with open(Path(tempfile.gettempdir()) / f"tracekit-tests-{uid}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Each test's setup (module fixtures' recordings included), call and teardown under `_box_lock`: a
    test that compares a replayed saving with a delay it measured on the box runs with no other test's
    multi-process job beside it (a clean-clone CI run read -18.6% against its 15% bound with the other
    worker's recordings running; alone or beside a busy loop it holds)."""
    with _box_lock(item.get_closest_marker("quiet_box") is not None):
        yield
