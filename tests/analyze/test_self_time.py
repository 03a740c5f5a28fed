"""An op's own time: its span less its direct children's overlap with it (`derive/host_ops.self_time`), each
row's parent the last earlier row of its thread still open at its start, as a call stack gives it.

The expected values come from a plain call-stack walk (pop what ended before the row starts, or belongs to
another thread; the top is the parent), on random intervals in (thread, start, longest first) order: nested,
disjoint, overlapping without nesting (a child running past its parent), zero-length, equal starts."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.derive.host_ops import parents, self_time


def _stack_walk(tid, ts, end) -> tuple[list[int], list[int]]:
    own, par, stack = [e - s for s, e in zip(ts, end)], [], []
    for i, (t, s) in enumerate(zip(tid, ts)):
        while stack and (tid[stack[-1]] != t or end[stack[-1]] <= s):
            stack.pop()
        par.append(stack[-1] if stack else -1)
        if stack:
            own[stack[-1]] -= min(end[i], end[stack[-1]]) - s
        stack.append(i)
    return [max(o, 0) for o in own], par


rows = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 80), st.integers(0, 40)), max_size=70)


@settings(max_examples=300, deadline=None)
@given(rows)
def test_own_time_and_parents_match_a_call_stack_walk(rs):
    rs = sorted(((t, s, s + d) for t, s, d in rs), key=lambda r: (r[0], r[1], -r[2]))
    tid = np.array([r[0] for r in rs], np.int64)
    ts = np.array([r[1] for r in rs], np.int64)
    end = np.array([r[2] for r in rs], np.int64)
    own, par = _stack_walk(tid.tolist(), ts.tolist(), end.tolist())
    assert self_time(tid, ts, end).tolist() == own
    assert parents(tid, ts, end).tolist() == par
