"""The suite's xdist scheduler (tests/conftest.py `CostOrderedFiles`, used by scripts/test.sh's
`--dist loadfile`): files handed out longest first by their measured seconds, unmeasured files last in
collection order, a file named in `split` dealt round-robin into parts, every test run exactly once, and a
file's tests (not split) all on one worker. Checked on fake workers that take the tests they are sent."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("xdist")

from tests import conftest  # noqa: E402


class FakeNode:
    """A worker: records the test indexes it is sent, in order."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def _config(tmp_path) -> SimpleNamespace:
    values = {"tx": ["popen"] * 2, "dist": "loadfile", "numprocesses": 2}
    return SimpleNamespace(getvalue=values.get, option=SimpleNamespace(loadscopereorder=True))


COLLECTION = (
    [f"tests/a/test_many.py::test_{i}" for i in range(6)]            # 6 tests, 10 s
    + [f"tests/b/test_long.py::test_{i}" for i in range(2)]          # 2 tests, 100 s
    + [f"tests/c/test_split.py::test_cell[{i}]" for i in range(7)]   # 7 tests, 90 s, split in 3
    + ["tests/d/test_new.py::test_x", "tests/d/test_new.py::test_y"]  # not measured
    + [f"tests/e/test_mid.py::test_{i}" for i in range(3)]           # 3 tests, 40 s
)
COSTS = {"seconds": {"tests/a/test_many.py": 10.0, "tests/b/test_long.py": 100.0,
                     "tests/c/test_split.py": 90.0, "tests/e/test_mid.py": 40.0},
         "split": {"tests/c/test_split.py": 3}}


def _run(tmp_path, monkeypatch) -> tuple[list[str], dict[str, list[str]]]:
    """Schedule COLLECTION on two fake workers and complete every test a worker was sent, one at a time
    (worker 0 first): the order units were handed out and each worker's tests."""
    costs = tmp_path / "test_costs.json"
    costs.write_text(__import__("json").dumps(COSTS))
    monkeypatch.setattr(conftest, "COSTS", costs)
    sched = conftest._cost_ordered_files()(_config(tmp_path))
    nodes = [FakeNode("gw0"), FakeNode("gw1")]
    for n in nodes:
        sched.add_node(n)
        sched.add_node_collection(n, COLLECTION)
    handed: list[str] = []
    real_assign = sched._assign_work_unit

    def assign(node):
        before = list(sched.workqueue)
        real_assign(node)
        (unit,) = set(before) - set(sched.workqueue)
        handed.append(unit)

    sched._assign_work_unit = assign
    sched.schedule()
    done = {n: 0 for n in nodes}
    while any(done[n] < len(n.sent) for n in nodes):
        for n in nodes:
            if done[n] < len(n.sent):
                sched.mark_test_complete(n, n.sent[done[n]])
                done[n] += 1
    return handed, {n.gateway.id: [COLLECTION[i] for i in n.sent] for n in nodes}


def test_longest_first_unmeasured_last_split_round_robin(tmp_path, monkeypatch):
    handed, ran = _run(tmp_path, monkeypatch)
    # 100 s file, then the split file's parts (90 s / 3 each: 30 s), the 40 s file before them, 10 s, unmeasured
    assert handed == ["tests/b/test_long.py", "tests/e/test_mid.py",
                      "tests/c/test_split.py::part0", "tests/c/test_split.py::part1", "tests/c/test_split.py::part2",
                      "tests/a/test_many.py", "tests/d/test_new.py"]
    every = [t for tests in ran.values() for t in tests]
    assert sorted(every) == sorted(COLLECTION)  # each test exactly once
    # a file not split runs on one worker; the split file's parts hold its tests dealt round-robin
    for f in ("tests/a/test_many.py", "tests/b/test_long.py", "tests/d/test_new.py", "tests/e/test_mid.py"):
        assert sum(any(t.startswith(f) for t in tests) for tests in ran.values()) == 1, f
    cells = [t for t in COLLECTION if t.startswith("tests/c/")]
    assert sched_parts(cells) == {0: cells[0::3], 1: cells[1::3], 2: cells[2::3]}


def sched_parts(cells: list[str]) -> dict[int, list[str]]:
    """The parts as the scheduler names them, read back through `_split_scope`."""
    sched = conftest._cost_ordered_files()(_config(None))
    sched.collection = COLLECTION
    out: dict[int, list[str]] = {}
    for c in cells:
        out.setdefault(int(sched._split_scope(c).rsplit("part", 1)[1]), []).append(c)
    return out


def test_other_dist_modes_keep_xdists_scheduler():
    cfg = SimpleNamespace(getvalue={"dist": "load"}.get)
    assert conftest.pytest_xdist_make_scheduler(cfg, None) is None
