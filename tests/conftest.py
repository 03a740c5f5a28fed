"""Shared test fixtures: where the real traces live; the lock that keeps timing tests alone on the box."""

from __future__ import annotations

import fcntl
import gc
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


_held: list = []
"""The open lock file of the test running in this worker (while it runs): `quiet_section` converts its lock."""


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
        _held.append((fh, exclusive))
        try:
            yield
        finally:
            _held.pop()
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextmanager
def quiet_section() -> Iterator[None]:
    """Inside a test (its fixtures included), the box alone for the `with` block only: for a test whose
    timing-sensitive part is a recording (a job whose measured steps it compares) and whose parse and
    analysis after it are not. The worker's shared lock becomes exclusive (the other worker finishes its
    current test, then waits), and shared again after the block, so the other worker runs beside the
    analysis. A test marked `quiet_box` holds the box alone throughout already; one process: nothing runs
    beside it anyway."""
    if not _held or _held[-1][1]:
        yield
        return
    fh = _held[-1][0]
    fcntl.flock(fh, fcntl.LOCK_EX)  # a conversion: Linux drops the shared lock, then waits for the box alone
    try:
        yield
    finally:
        fcntl.flock(fh, fcntl.LOCK_SH)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Each test's setup (module fixtures' recordings included), call and teardown under `_box_lock`: a
    test that compares a replayed saving with a delay it measured on the box runs with no other test's
    multi-process job beside it (a clean-clone CI run read -18.6% against its 15% bound with the other
    worker's recordings running; alone or beside a busy loop it holds). A test whose analysis need not be
    alone takes the box only while it records (`quiet_section`)."""
    with _box_lock(item.get_closest_marker("quiet_box") is not None):
        yield




LONG_FILES_S: dict[str, int] = {
    "tests/simulate/test_detection_matrix_gpu_64.py": 191, "tests/advise/test_advise_cli_runtime.py": 154,
    "tests/analyze/test_detection_matrix.py": 146, "tests/record/test_hang_record.py": 108,
    "tests/record/test_user_scripts.py": 101, "tests/cli/test_diff_attribution.py": 75,
    "tests/simulate/test_detection_matrix_gpu.py": 67, "tests/record/test_record_pipelining.py": 67,
    "tests/analyze/test_runtime_e2e.py": 52, "tests/record/test_record_unlabelled_pipeline.py": 49,
    "tests/advise/test_advisor.py": 47, "tests/record/test_record_moe.py": 44,
    "tests/record/test_user_scripts_dataloader.py": 40, "tests/robustness/test_analyze_bad_inputs.py": 35,
    "tests/runtime/test_numerics.py": 30, "tests/analyze/test_whatif_sim.py": 30, "tests/runtime/test_faults.py": 29,
    "tests/cli/test_diff_check.py": 25, "tests/analyze/test_demo_report.py": 23, "tests/parse/test_run.py": 22,
    "tests/scale/test_ray_cluster.py": 22, "tests/advise/test_model_file.py": 21,
    "tests/parse/test_kineto_shared_traces.py": 20, "tests/simulate/test_partial_tracing.py": 19,
    "tests/robustness/test_parser_properties.py": 18, "tests/record/test_window_not_reached.py": 17,
    "tests/analyze/test_hta_crosscheck.py": 17, "tests/gpu_semantics/test_real_merged.py": 17,
    "tests/gpu_semantics/test_real_windows.py": 16, "tests/record/test_record_profile_ranks.py": 15,
}
"""Test files that take long, and about how long: CPU seconds of the whole file (its fixtures' recordings,
simulations and their child processes included), measured with the 2-core box shared (load average 7-13),
files of 15 s or more; `pytest_collection_modifyitems` runs them first, longest first. Only the order
depends on these numbers: a file missing here, or a stale figure, costs minutes of a worker's idle tail at
worst, never a result."""


def pytest_configure(config: pytest.Config) -> None:
    """The `long` marker, registered here rather than in pyproject.toml's markers (scripts/setup.sh reinstalls
    the package whenever pyproject.toml changes)."""
    config.addinivalue_line("markers", "long: a file of multi-process runs that takes minutes: scripts/test.sh runs "
                            "these in its second pass (-m long), after the suite (-m 'not long')")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`scripts/test.sh`: `--dist loadfile --no-loadscope-reorder`: whole files to a
    worker, in collection order), the longest files first (`LONG_FILES_S`), the others after them in their
    own order: a long file scheduled last leaves the other worker idle until it ends (longest first: the
    classic bound for two machines). Within a file the order is unchanged. One process: nothing reordered."""
    if not hasattr(config, "workerinput"):
        return
    rank = {path: i for i, path in enumerate(sorted(LONG_FILES_S, key=lambda p: -LONG_FILES_S[p]))}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: files stay whole


GC_THRESHOLDS = (10_000, 10, 100)
"""The collector's thresholds in test processes (CPython's default: 700, 10, 10). The tests' independent
computations load real traces with plain `json` (millions of dicts that survive into the oldest generation),
and at the default every tenth young collection may traverse the whole heap again: in a run of
test_real_multirank_replay, test_hta_crosscheck and test_real_windows, 57 full collections cost 9.3 of
38.7 CPU-s; at these thresholds, with the imported modules frozen (`pytest_collection_finish`), one full
collection and 30.4 CPU-s in all. Only when the collector runs changes: reference counting frees what
it did, and cyclic garbage is still collected."""
gc.set_threshold(*GC_THRESHOLDS)


def pytest_collection_finish(session: pytest.Session) -> None:
    """After collection every test module and what it imports (torch, pyarrow, tracekit) is loaded and
    lives as long as the process: frozen, the collector never traverses it again."""
    gc.collect()
    gc.freeze()
