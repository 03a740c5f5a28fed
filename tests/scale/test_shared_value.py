"""A value every per-rank task reads alike (the layout's dims map) travels to each worker process once
(tracekit/engines/shared.py): each task's arguments hold a small handle, not the value, and a worker loads the
value once however many tasks it runs (issue 28: at 10,000 ranks the map, 13,451 groups, was pickled with each
rank's task)."""

from __future__ import annotations

import os
import pickle

import pytest

from tracekit.engines.local import LocalEngine
from tracekit.engines.shared import engine_shared, shared_value


def _probe(handle, i: int) -> tuple[int, int, int]:
    """(this worker's pid, the identity of the value it reads, a checksum of it)."""
    v = shared_value(handle)
    return os.getpid(), id(v), sum(len(k) + len(x) for k, x in v.items()) + i


def _groups(n: int) -> dict[str, str]:
    return {f"pg{i}": ("tp", "dp", "pp")[i % 3] for i in range(n)}


@pytest.mark.slow  # worker processes
def test_local_workers_load_the_shared_value_once():
    value = _groups(20_000)
    want = sum(len(k) + len(x) for k, x in value.items())
    engine = LocalEngine(workers=2)
    try:
        with engine.shared(value) as handle:
            assert len(pickle.dumps(handle)) < 1000 < len(pickle.dumps(value)) // 100  # the tasks carry the handle only
            got = list(engine.map_ranks(_probe, [(handle, i) for i in range(40)]))
            path = handle.path
        assert not os.path.exists(path)  # the file goes with the block
    finally:
        engine.close()
    assert [c - i for i, (_, _, c) in enumerate(got)] == [want] * 40  # every task read the whole value
    ids: dict[int, set[int]] = {}
    for pid, ident, _ in got:
        ids.setdefault(pid, set()).add(ident)
    assert pid != os.getpid()
    assert all(len(s) == 1 for s in ids.values())  # one load per worker process, kept for its later tasks


def test_in_process_engines_pass_the_value_itself():
    value = _groups(10)
    with LocalEngine(workers=1).shared(value) as handle:
        assert handle is value
    with engine_shared(object(), value) as handle:  # an engine without `shared`
        assert handle is value and shared_value(handle) is value
