"""The what-if graph's levels and replay in C (`tracekit.whatif.kgraph`) against the numpy passes they stand in
for: the same levels, the same starts, the same critical-path section of a whole analysis."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tracekit.whatif import graph as G
from tracekit.whatif.graph import StepGraph, replay, topo_levels

REPO = Path(__file__).resolve().parents[2]


def _loop_replay(n: int, src: np.ndarray, dst: np.ndarray, start: np.ndarray, dur: np.ndarray,
                 gap: np.ndarray) -> np.ndarray:
    """Independent: Kahn's queue in plain Python, each node at its latest predecessor's end plus its gap; a
    node without predecessors keeps its start."""
    preds: list[list[int]] = [[] for _ in range(n)]
    succ: list[list[int]] = [[] for _ in range(n)]
    for s, t in zip(src.tolist(), dst.tolist()):
        preds[t].append(s)
        succ[s].append(t)
    indeg = [len(p) for p in preds]
    out = start.tolist()
    ready = [v for v in range(n) if indeg[v] == 0]
    while ready:
        v = ready.pop()
        if preds[v]:
            out[v] = max(out[u] + int(dur[u]) for u in preds[v]) + int(gap[v])
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return np.array(out, np.int64)


def test_the_extension_is_built():
    """The install (scripts/setup.sh: pip install -e) compiles it; CI's machine has a compiler."""
    assert G.kgraph is not None


@pytest.mark.parametrize("ids", [np.int32, np.int64])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_native_replay_equals_numpy_and_a_plain_loop(seed, ids, monkeypatch):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 20_000))
    a, b = rng.integers(0, n, 3 * n), rng.integers(0, n, 3 * n)
    keep = a != b
    perm = rng.permutation(n)
    src, dst = perm[np.minimum(a, b)[keep]].astype(ids), perm[np.maximum(a, b)[keep]].astype(ids)
    start = rng.integers(0, 10**6, n)
    dur = rng.integers(0, 1000, n)
    gap = rng.integers(-50, 50, n)
    g = StepGraph(rank=np.zeros(n, np.int32), lane=np.full(n, -1), category=np.zeros(n, np.int8), start=start,
                  dur=dur, src=src, dst=dst)
    got = {}
    for path in ("1", "0"):
        monkeypatch.setenv("TRACEKIT_NATIVE", path)
        g._plan = None
        got[path] = (topo_levels(n, src, dst), replay(g), replay(g, dur[::-1].copy(), gap))
    for x, y in zip(got["1"], got["0"]):
        assert x.dtype == y.dtype and (x == y).all()
    assert (got["1"][1] == start).all()  # the measured graph gives back its starts
    assert (got["1"][2] == _loop_replay(n, src, dst, start, dur[::-1], gap)).all()


def test_float_durations_keep_the_numpy_replay(monkeypatch):
    """A what-if that scales durations by a fraction replays in float: numpy's (kgraph takes int64 only)."""
    monkeypatch.setenv("TRACEKIT_NATIVE", "1")
    src, dst = np.array([0, 1]), np.array([1, 2])
    g = StepGraph(rank=np.zeros(3, np.int32), lane=np.full(3, -1), category=np.zeros(3, np.int8),
                  start=np.array([0, 10, 20]), dur=np.array([10, 10, 10]), src=src, dst=dst)
    assert replay(g, np.array([5.5, 5.5, 5.5])).tolist() == [0, 5, 11]  # start truncated, end untruncated


def test_native_cycle_is_reported(monkeypatch):
    monkeypatch.setenv("TRACEKIT_NATIVE", "1")
    with pytest.raises(ValueError, match="cycle through 2"):
        topo_levels(4, np.array([0, 1, 2]), np.array([1, 2, 1]))


@pytest.mark.parametrize("fixture", ["faults", "pp_interleaved"])
def test_the_critical_path_section_is_the_same_either_way(fixture, tmp_path, monkeypatch):
    """A whole analysis (steps, every what-if, all fixes together, the verdict) with the C passes and with
    numpy's."""
    from tracekit.flow import analyze_store
    from tracekit.parse.run import parse_run

    store = parse_run(REPO / "fixtures" / fixture, tmp_path / "store", progress=False).store
    out = {}
    for path in ("1", "0"):
        monkeypatch.setenv("TRACEKIT_NATIVE", path)
        out[path] = analyze_store(store)["sections"]["critical_path"]
    assert out["1"]["whatif"], out["1"]
    assert out["1"] == out["0"]
