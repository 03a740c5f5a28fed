"""Interval-set arithmetic on int64 nanosecond arrays, vectorised with numpy.

An interval set is a pair of sorted int64 arrays `(starts, ends)` of disjoint half-open intervals
`[start, end)` with `start < end` (what `union` returns). All the breakdown/exposure definitions of
DESIGN §3 are unions, intersections and differences of such sets.
"""

from __future__ import annotations

import numpy as np

from tracekit.tables.columns import sorted_unique

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


def _covered_before(a: IntervalSet, t: np.ndarray) -> np.ndarray:
    """For each time t, the length of the disjoint set `a` lying before t."""
    s, e = a
    t = np.asarray(t, dtype=np.int64)
    if s.size == 0:
        return np.zeros(t.shape, dtype=np.int64)
    cum = np.concatenate(([0], np.cumsum(e - s)))
    i = np.searchsorted(s, t, side="right") - 1  # last interval starting at or before t
    inside = np.where(i >= 0, np.minimum(t, e[np.maximum(i, 0)]) - s[np.maximum(i, 0)], 0)
    return np.where(i >= 0, cum[np.maximum(i, 0)] + inside, 0)


def covered(a: IntervalSet, starts, ends) -> np.ndarray:
    """Per query interval [starts[i], ends[i]), how much of it the disjoint set `a` covers."""
    qs = np.asarray(starts, dtype=np.int64)
    qe = np.maximum(np.asarray(ends, dtype=np.int64), qs)
    return _covered_before(a, qe) - _covered_before(a, qs)


def overlap(a: IntervalSet, b: IntervalSet) -> int:
    """Summed length of the intersection of two disjoint sets (`total(intersect(a, b))` without building it)."""
    if a[0].size == 0 or b[0].size == 0:
        return 0
    return int(covered(b, a[0], a[1]).sum())


def _near(a: IntervalSet, lo: int, hi: int) -> IntervalSet:
    """The intervals of disjoint set `a` that overlap [lo, hi), a slice of it: the others change nothing
    in an intersection or difference with a set inside [lo, hi), and a set of a whole rank's busy time
    against one label's few intervals (stragglers, host stalls) made every such operation sort all of it."""
    i = int(np.searchsorted(a[1], lo, side="right"))
    j = int(np.searchsorted(a[0], hi, side="left"))
    return a[0][i:max(i, j)], a[1][i:max(i, j)]


def intersect(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """Intersection of two disjoint sets."""
    if a[0].size == 0 or b[0].size == 0:
        return empty()
    a, b = _near(a, b[0][0], b[1][-1]), _near(b, a[0][0], a[1][-1])
    # every boundary of either set; a piece between consecutive boundaries is in both or not
    pts = sorted_unique(np.concatenate((a[0], a[1], b[0], b[1])))
    lo, hi = pts[:-1], pts[1:]
    in_a = covered(a, lo, hi) == (hi - lo)
    in_b = covered(b, lo, hi) == (hi - lo)
    keep = in_a & in_b
    return union(lo[keep], hi[keep])


def subtract(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """The part of disjoint set `a` not covered by disjoint set `b`."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    b = _near(b, a[0][0], a[1][-1])
    pts = sorted_unique(np.concatenate((a[0], a[1], b[0], b[1])))
    lo, hi = pts[:-1], pts[1:]
    in_a = covered(a, lo, hi) == (hi - lo)
    in_b = covered(b, lo, hi) > 0
    keep = in_a & ~in_b
    return union(lo[keep], hi[keep])


def merge(*sets: IntervalSet) -> IntervalSet:
    """Union of several disjoint sets."""
    if not sets:
        return empty()
    return union(np.concatenate([s[0] for s in sets]), np.concatenate([s[1] for s in sets]))


def complement(a: IntervalSet, lo: int, hi: int) -> IntervalSet:
    """The part of the window [lo, hi) not covered by `a`."""
    return subtract((np.array([lo], dtype=np.int64), np.array([hi], dtype=np.int64)), clip(a, lo, hi))
