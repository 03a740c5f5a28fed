"""Interval-set arithmetic vs a brute-force boolean timeline."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.derive import intervals as iv

SPAN = 60
ivl = st.lists(st.tuples(st.integers(0, SPAN), st.integers(0, 20)), max_size=12)


def mask(pairs) -> np.ndarray:
    m = np.zeros(SPAN + 21, dtype=bool)
    for s, d in pairs:
        m[s:s + d] = True
    return m


def to_set(pairs):
    return iv.union([s for s, _ in pairs], [s + d for s, d in pairs])


def set_mask(a) -> np.ndarray:
    m = np.zeros(SPAN + 21, dtype=bool)
    for s, e in zip(a[0].tolist(), a[1].tolist()):
        m[s:e] = True
    return m


@settings(max_examples=400, deadline=None)
@given(ivl, ivl, st.integers(0, SPAN), st.integers(0, SPAN))
def test_set_operations_match_boolean_timeline(a, b, lo, hi):
    A, B = to_set(a), to_set(b)
    ma, mb = mask(a), mask(b)
    # union is disjoint and sorted, and covers exactly the same points
    assert np.all(A[0][1:] > A[1][:-1]) and np.all(A[1] > A[0])
    assert np.array_equal(set_mask(A), ma)
    assert iv.total(A) == ma.sum()
    assert np.array_equal(set_mask(iv.intersect(A, B)), ma & mb)
    assert iv.overlap(A, B) == (ma & mb).sum()
    assert np.array_equal(set_mask(iv.subtract(A, B)), ma & ~mb)
    # both are disjoint sets as `union` writes them (sorted, apart, non-empty), in either argument order
    for got in (iv.intersect(A, B), iv.intersect(B, A), iv.subtract(A, B), iv.subtract(B, A)):
        assert got[0].dtype == got[1].dtype == np.int64
        assert np.all(got[0][1:] > got[1][:-1]) and np.all(got[1] > got[0])
        assert np.array_equal(got[0], iv.union(*got)[0]) and np.array_equal(got[1], iv.union(*got)[1])
    assert np.array_equal(set_mask(iv.subtract(B, A)), mb & ~ma)
    assert np.array_equal(set_mask(iv.merge(A, B)), ma | mb)
    lo, hi = min(lo, hi), max(lo, hi)
    win = np.zeros_like(ma)
    win[lo:hi] = True
    assert np.array_equal(set_mask(iv.clip(A, lo, hi)), ma & win)
    assert np.array_equal(set_mask(iv.complement(A, lo, hi)), win & ~ma)
    # covered(): per query interval
    qs = [s for s, _ in b]
    qe = [s + d for s, d in b]
    got = iv.covered(A, qs, qe)
    want = [int(ma[s:e].sum()) for s, e in zip(qs, qe)]
    assert got.tolist() == want
