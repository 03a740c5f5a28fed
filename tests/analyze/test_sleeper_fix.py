"""The fix of a rank that sleeps each step: its sleep removed, its compute at its peer's pace only where
it computes more than its peer beyond the peer's own step-to-step spread (issue 32; docs/metrics.md §8
"Straggler / rank compute").

A hand-built 2-rank CPU run shaped like tests/user_scripts/ddp_loop.py's faulty recording with `--sleep-ms`
(one gloo all-reduce a step, both ranks on one host's cores): per step rank 0 runs `aten::mm` then
`aten::relu` and arrives at the all-reduce; rank 1 sleeps SLEEP (no op: a host gap before its step's first
op), then runs the same two ops, each at a pace of its own (a busy box: one op slower, the other faster than
its peer's). The all-reduce ends TRANSFER after rank 1 arrives and the next step begins RESUME later.

Rank 1 computing 1 ms a step more than its peer, whose own steps differ by 4 ms: removing the sleep leaves
rank 1 arriving at its own compute's end, the step at the later of the two ranks' compute + TRANSFER +
RESUME. Setting rank 1's compute op by op to its peer's as well (the straggler fix before: each op at the
peer's, never slower than it ran, wherever the peer's total is less) took the minimum of two noisy ranks,
below either's total: 41 ms replayed for a 40 ms sleep, 1.25 ms more than the sleep's removal saves. Rank 1
computing 7 ms a step more (beyond the spread) keeps the compute part: each op at its peer's.
"""

from __future__ import annotations

import json

import pytest

from tests.analyze.analyze_builders import two_rank_gloo_run
from tracekit.flow import analyze_store

MS = 1_000_000
STEPS = 4
SLEEP = 40 * MS
PEER = [(10 * MS, 11 * MS), (12 * MS, 13 * MS), (9 * MS, 13 * MS), (11 * MS, 13 * MS)]
"""rank 0's (mm, relu) per step: 21 to 25 ms a step, 23 on average (the box's noise)"""
NOISY = [(13 * MS, 11 * MS), (14 * MS, 10 * MS), (11 * MS, 13 * MS), (12 * MS, 12 * MS)]
"""rank 1 at 24 ms a step, one op slower and the other faster than its peer's: 1 ms a step more than its peer,
within the 4 ms its peer's own steps differ by"""
SLOWER = [(a + 3 * MS, b + 3 * MS) for a, b in NOISY]
"""rank 1 at 30 ms a step: 7 ms more than its peer, beyond that spread"""
TRANSFER = MS // 2
RESUME = MS // 2
"""from the all-reduce's end to the next step's first op"""


def _store(tmp_path, ops1):
    ops = {0: PEER, 1: ops1}
    step = SLEEP + sum(ops1[0]) + TRANSFER + RESUME  # rank 1 arrives last in each step, as late in each

    def per_step(r, s, base):
        lead = SLEEP if r == 1 else 0
        mm, relu = ops[r][s]
        end = base + SLEEP + sum(ops1[s]) + TRANSFER  # the last arrival (rank 1's) + the transfer
        return [{"name": "aten::mm", "cat": "cpu_op", "ts": base + lead, "dur": mm,
                 "input_dims": json.dumps([[256, 2048], [2048, 2048]]), "input_types": json.dumps(["float", "float"])},
                {"name": "aten::relu", "cat": "cpu_op", "ts": base + lead + mm, "dur": relu,
                 "input_dims": json.dumps([[256, 2048]]), "input_types": json.dumps(["float"])},
                ], base + lead + mm + relu, end
    return two_rank_gloo_run(tmp_path, per_step, step, STEPS, 262_164), step


def test_the_hand_built_ranks_compute_as_described():
    peer, noisy, slower = ([a + b for a, b in ops] for ops in (PEER, NOISY, SLOWER))
    spread = max(peer) - min(peer)
    assert (spread, sum(peer)) == (4 * MS, 4 * 23 * MS)
    assert noisy == [24 * MS] * STEPS and 24 * MS - 23 * MS < spread
    assert slower == [30 * MS] * STEPS and 30 * MS - 23 * MS > spread
    # op by op the minimum of the two is below rank 1's total in every step: what the old fix took off
    assert all(sum(map(min, zip(PEER[s], NOISY[s]))) < noisy[s] for s in range(STEPS))


@pytest.mark.parametrize("ops1", [NOISY, SLOWER], ids=["within_the_spread", "beyond_the_spread"])
def test_a_sleeper_straggler_saves_its_sleep_and_only_compute_beyond_its_peers_spread(tmp_path, ops1):
    store, step = _store(tmp_path, ops1)
    a = analyze_store(store)
    loud = [f for f in a["findings"] if f["severity"] in ("warning", "critical")]
    top = loud[0]
    assert top["kind"] == "straggler" and top["ranks"] == [1], \
        [(f["kind"], f["ranks"], f["evidence"].get("cause")) for f in loud]
    # rank 1 not sleeping: each rank arrives at its compute's end, the all-reduce ends TRANSFER after the later,
    # the next step begins RESUME after that; rank 1's compute as it ran within the spread, else each op at its
    # peer's (never slower than it ran); the run's step is the mean over the steps
    fixed = NOISY if ops1 is NOISY else [tuple(map(min, zip(PEER[s], ops1[s]))) for s in range(STEPS)]
    replayed = [max(sum(PEER[s]), sum(fixed[s])) + TRANSFER + RESUME for s in range(STEPS)]
    saving = step - sum(replayed) // STEPS
    assert top["evidence"]["replayed_saving_ns"] == top["est_saving_ns"] == saving
