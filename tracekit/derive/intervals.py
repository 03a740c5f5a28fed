"""Interval-set arithmetic on int64 nanosecond arrays, vectorised with numpy.

An interval set is a pair of sorted int64 arrays `(starts, ends)` of disjoint half-open intervals
`[start, end)` with `start < end` (what `union` returns). All the breakdown/exposure definitions of
DESIGN §3 are unions, intersections and differences of such sets.
"""

from __future__ import annotations

import numpy as np


IntervalSet = tuple[np.ndarray, np.ndarray]

_EMPTY = np.zeros(0, dtype=np.int64)


def empty() -> IntervalSet:
    return _EMPTY.copy(), _EMPTY.copy()


def union(starts, ends) -> IntervalSet:
    """Merge possibly overlapping intervals into a sorted disjoint set (empty/negative ones dropped)."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return empty()
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_max = np.maximum.accumulate(e)
    # a new merged interval begins where the start lies past every earlier end
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_max[:-1]
    idx = np.flatnonzero(new)
    out_s = s[idx]
    out_e = np.maximum.reduceat(e, idx)
    return out_s, out_e


def total(a: IntervalSet) -> int:
    """Summed length of a disjoint set."""
    return int((a[1] - a[0]).sum())


def clip(a: IntervalSet, lo: int, hi: int) -> IntervalSet:
    """Restrict a disjoint set to the window [lo, hi)."""
    s = np.clip(a[0], lo, hi)
    e = np.clip(a[1], lo, hi)
    keep = e > s
    return s[keep], e[keep]


def _covered_before(a: IntervalSet, t: np.ndarray, cum: np.ndarray | None = None) -> np.ndarray:
    """For each time t, the length of the disjoint set `a` lying before t (`cum`: its lengths' running sum
    from 0, `_running`, when the caller has it)."""
    s, e = a
    t = np.asarray(t, dtype=np.int64)
    if s.size == 0:
        return np.zeros(t.shape, dtype=np.int64)
    cum = _running(a) if cum is None else cum
    i = np.searchsorted(s, t, side="right") - 1  # last interval starting at or before t
    j = np.maximum(i, 0)
    return np.where(i >= 0, cum[j] + np.minimum(t, e[j]) - s[j], 0)


def _running(a: IntervalSet) -> np.ndarray:
    """0, then the running sum of the set's lengths."""
    out = np.zeros(a[0].size + 1, dtype=np.int64)
    np.cumsum(a[1] - a[0], out=out[1:])
    return out


def covered(a: IntervalSet, starts, ends) -> np.ndarray:
    """Per query interval [starts[i], ends[i]), how much of it the disjoint set `a` covers."""
    qs = np.asarray(starts, dtype=np.int64)
    qe = np.maximum(np.asarray(ends, dtype=np.int64), qs)
    if a[0].size == 0:
        return np.zeros(qs.shape, dtype=np.int64)
    cum = _running(a)
    return _covered_before(a, qe, cum) - _covered_before(a, qs, cum)


def overlap(a: IntervalSet, b: IntervalSet) -> int:
    """Summed length of the intersection of two disjoint sets (`total(intersect(a, b))` without building it)."""
    if a[0].size == 0 or b[0].size == 0:
        return 0
    return int(covered(b, a[0], a[1]).sum())


def intersect(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """Intersection of two disjoint sets: each interval of `a` against the run of `b`'s that overlap it (two
    binary searches), one piece per overlapping pair. The pieces come out sorted, disjoint and apart (two
    pieces of one interval of `a` are apart as `b`'s intervals are; of two, as `a`'s are): a disjoint set."""
    if a[0].size == 0 or b[0].size == 0:
        return empty()
    (a_s, a_e), (b_s, b_e) = (a, b) if a[0].size <= b[0].size else (b, a)  # the searches from the smaller
    lo = np.searchsorted(b_e, a_s, side="right")  # first of b's ending after the interval starts
    cnt = np.maximum(np.searchsorted(b_s, a_e, side="left") - lo, 0)  # ... up to the first starting at its end
    n = int(cnt.sum())
    if n == 0:
        return empty()
    ai = np.repeat(np.arange(a_s.size), cnt)
    bi = np.arange(n) - np.repeat(np.cumsum(cnt) - cnt - lo, cnt)
    return (np.maximum(a_s[ai], b_s[bi]).astype(np.int64, copy=False),
            np.minimum(a_e[ai], b_e[bi]).astype(np.int64, copy=False))


def subtract(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """The part of disjoint set `a` not covered by disjoint set `b`: `a` cut at the pieces of its intersection
    with `b`. Within each interval of `a` its starts (the interval's, then each piece's end) and its ends (each
    piece's start, then the interval's end) alternate, so sorting each list pairs them; empty gaps dropped."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    i_s, i_e = intersect(a, b)
    if i_s.size == 0:
        return union(*a)
    s = np.sort(np.concatenate((a[0], i_e)))
    e = np.sort(np.concatenate((i_s, a[1])))
    keep = e > s
    return s[keep].astype(np.int64, copy=False), e[keep].astype(np.int64, copy=False)


def merge(*sets: IntervalSet) -> IntervalSet:
    """Union of several disjoint sets."""
    if not sets:
        return empty()
    return union(np.concatenate([s[0] for s in sets]), np.concatenate([s[1] for s in sets]))


def complement(a: IntervalSet, lo: int, hi: int) -> IntervalSet:
    """The part of the window [lo, hi) not covered by `a`."""
    return subtract((np.array([lo], dtype=np.int64), np.array([hi], dtype=np.int64)), clip(a, lo, hi))
