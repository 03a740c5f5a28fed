"""The `recording` analyzer: verdict stability from per-step breakdown rows, tracekit's own overhead."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from tracekit.analyze.breakdown import BreakdownResult
from tracekit.analyze.recording import CLEAR_MARGIN, Z, analyze_recording

MS = 1_000_000


class _NoEvents:
    manifest: dict = {}  # a run store's manifest (none recorded: no recorder overhead measured)

    def rank_table(self, name, rank, columns):
        import pyarrow as pa

        return pa.table({c: pa.array([], pa.int64() if c in ("ts", "dur") else pa.string()) for c in columns})


def _ctx(step_rows):
    return BreakdownResult(section={"steps": step_rows})


def _row(rank, step, compute, exposed, idle, sync=0):
    return {"rank": rank, "step": step, "ts": step * 100 * MS, "step_ns": compute + exposed + idle,
            "compute_ns": compute, "comm_ns": exposed, "exposed_comm_ns": exposed, "other_ns": 0,
            "idle_ns": idle, "sync_wait_ns": sync}


def _expected_needed(margins):
    """Independent: n* = ceil((Z * sample sd / mean)^2) with exact fractions for mean and variance."""
    n = len(margins)
    mean = Fraction(sum(margins), n)
    var = sum((Fraction(m) - mean) ** 2 for m in margins) / (n - 1)
    return max(n + 1, 3, math.ceil(Z ** 2 * float(var) / float(mean) ** 2))


def test_uneven_short_window_is_unstable_and_asks_for_enough_steps():
    # Rank 0: idle wins overall, but one step is compute-heavy: margins idle - compute per step.
    steps = [(2 * MS, 1 * MS, 9 * MS), (9 * MS, 1 * MS, 2 * MS), (2 * MS, 1 * MS, 8 * MS)]
    rows = [_row(0, i + 2, *s) for i, s in enumerate(steps)]
    res = analyze_recording(_NoEvents(), _ctx(rows))
    [st] = res.section["verdict_stability"]
    margins = [idle - comp for comp, _, idle in steps]
    assert st["bound"] == "idle" and st["runner_up"] == "compute" and st["stable"] is False
    assert st["steps_needed"] == _expected_needed(margins)
    [f] = res.findings
    assert f.kind.value == "unstable_verdict" and f.severity.value == "warning" and f.ranks == (0,)
    assert f"--active {st['steps_needed']}" in f.recommendation


def test_steady_window_is_stable():
    rows = [_row(1, s, 3 * MS, 1 * MS + s * 1000, 1 * MS) for s in range(2, 10)]
    res = analyze_recording(_NoEvents(), _ctx(rows))
    [st] = res.section["verdict_stability"]
    assert st["bound"] == "compute" and st["stable"] is True and st["steps_needed"] == 8
    assert res.findings == []


@pytest.mark.parametrize("margin_share, stable", [(CLEAR_MARGIN + 0.05, True), (CLEAR_MARGIN - 0.05, False)])
def test_two_steps_need_a_clear_margin_in_each(margin_share, stable):
    # compute c, idle i with c - i = margin_share * (c + i) and no comm
    total = 10 * MS
    c = int(total * (1 + margin_share) / 2)
    rows = [_row(0, s, c, 0, total - c) for s in (2, 3)]
    [st] = analyze_recording(_NoEvents(), _ctx(rows)).section["verdict_stability"]
    assert st["stable"] is stable


def test_sync_wait_is_its_own_part_of_the_verdict():
    # exposed 6 ms of which 5 ms is waiting for a late peer: sync_wait (5) wins over compute (4).
    rows = [_row(0, s, 4 * MS, 6 * MS, 0, sync=5 * MS) for s in range(2, 8)]
    [st] = analyze_recording(_NoEvents(), _ctx(rows)).section["verdict_stability"]
    assert st["bound"] == "sync_wait" and st["runner_up"] == "compute"


def test_a_small_steady_margin_is_a_near_tie_not_noise():
    # compute 5.15 / 4.9 ms in turn against idle 5.0 ms, eight steps: the mean margin (0.25% of the step) is
    # within noise, but its 2-standard-error band stays under TIE_SHARE: info, both parts named, no recording
    # advice
    from tracekit.analyze.recording import TIE_SHARE

    rows = [_row(0, s, 5_150_000 if s % 2 else 4_900_000, 0, 5_000_000) for s in range(2, 10)]
    margins = [r["compute_ns"] - r["idle_ns"] for r in rows]
    n, mean = len(margins), Fraction(sum(margins), len(margins))
    sd = math.sqrt(float(sum((Fraction(m) - mean) ** 2 for m in margins) / (n - 1)))
    step = Fraction(sum(r["step_ns"] for r in rows), n)
    assert float(mean) < Z * sd / math.sqrt(n)  # unstable by the margin rule ...
    assert float(abs(mean)) + Z * sd / math.sqrt(n) < TIE_SHARE * float(step)  # ... but known to be small
    res = analyze_recording(_NoEvents(), _ctx(rows))
    [st] = res.section["verdict_stability"]
    assert st["stable"] is False and st["tie"] is True and "near tie" in st["note"]
    [f] = res.findings
    assert f.severity.value == "info" and "near tie" in f.summary and "--active" not in f.recommendation


def test_a_margin_no_recording_can_settle_says_so():
    # a 1% mean margin against a ~30% spread over three steps: tens of thousands of steps to settle
    steps = [(8 * MS, 0, 2 * MS), (2 * MS, 0, 8 * MS), (5_200_000, 0, 4_900_000)]
    rows = [_row(0, i + 2, *s) for i, s in enumerate(steps)]
    res = analyze_recording(_NoEvents(), _ctx(rows))
    [st] = res.section["verdict_stability"]
    assert st["stable"] is False and not st["tie"] and st["steps_needed"] > 1000
    [f] = res.findings
    assert f.severity.value == "warning" and "near tie" in f.recommendation and "--active" not in f.recommendation
