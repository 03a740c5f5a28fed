"""`sorted_codes` with the C helper (ids by object identity, then values) against the dict lookup per row."""

from __future__ import annotations

import numpy as np
import pytest

from tracekit.tables import columns as C


def test_the_extension_is_built():
    assert C.kcolumns is not None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_codes_by_identity_equal_codes_by_value(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    words = [f"pg{i}#{i % 7}" for i in range(int(rng.integers(1, 3000)))]
    # the same value as several distinct objects (equal strings built apart), shared objects, ints mixed in
    # a column of their own kind
    objs = [w if rng.random() < 0.5 else "".join(list(w)) for w in words for _ in range(2)]
    a = np.array(objs, object)[rng.integers(0, len(objs), int(rng.integers(0, 50_000)))]
    ints = np.array([int(x) for x in rng.integers(-5, 5, 1000)], object)
    for col in (a, ints, a[:0], a[:1]):
        monkeypatch.setenv("TRACEKIT_NATIVE", "1")
        got, got_values = C.sorted_codes(col)
        monkeypatch.setenv("TRACEKIT_NATIVE", "0")
        want, want_values = C.sorted_codes(col)
        assert got.dtype == want.dtype == np.int64
        assert got.tolist() == want.tolist() and got_values == want_values
        values = sorted(set(col.tolist()))  # independent: each row's value's place among the sorted values
        rank = {v: i for i, v in enumerate(values)}
        assert got_values == values and got.tolist() == [rank[v] for v in col.tolist()]


def test_first_seen_rejects_what_is_not_a_list():
    with pytest.raises(TypeError):
        C.kcolumns.first_seen(np.array(["a"], object))
