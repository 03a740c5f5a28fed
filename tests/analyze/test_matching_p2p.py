"""P2P pairing in matching: the k-th send src->dst on a group pairs with the k-th recv at dst from src,
and the side posted first waits until the other side is posted (a late peer, not transfer)."""

from __future__ import annotations

import pandas as pd

from tracekit.analyze.matching import _pair_p2p

MS = 1_000_000


def _row(rank, op, peer, t, pg="cp"):
    return {"rank": rank, "source": "comms-log", "pg_name": pg, "op": op, "peer": peer,
            "enqueue_ts": t, "ts": t, "dur": MS, "arrival": t}  # CPU backend: arrival = host start


def test_receiver_waits_for_a_late_sender_and_pairs_follow_order_per_direction():
    # rank 1 sends to 0 twice, 5 ms after rank 0 posted each recv; rank 0 sends to 1 once, 2 ms
    # before rank 1 posts its recv; an unrelated group's send has no matching recv
    df = pd.DataFrame([
        _row(0, "recv", 1, 10 * MS), _row(1, "send", 0, 15 * MS),
        _row(0, "recv", 1, 30 * MS), _row(1, "send", 0, 35 * MS),
        _row(0, "send", 1, 40 * MS), _row(1, "recv", 0, 42 * MS),
        _row(0, "send", 1, 50 * MS, pg="pp"),
    ])
    rows, counts = _pair_p2p(df, {0: 0, 1: 0})
    assert counts == {"pairs": 3, "unpaired": 1, "wait_ns": 5 * MS + 5 * MS + 2 * MS}
    got = sorted(zip(rows["rank"], rows["arrival_raw"], rows["wait"]))
    assert got == [(0, 10 * MS, 5 * MS), (0, 30 * MS, 5 * MS), (0, 40 * MS, 2 * MS),
                   (1, 15 * MS, 0), (1, 35 * MS, 0), (1, 42 * MS, 0)]


def test_clock_offsets_are_removed_before_the_wait_is_measured():
    # rank 1's clock runs 3 ms ahead: its send at 13 ms (raw) is at 10 ms, when rank 0 posted its recv
    df = pd.DataFrame([_row(0, "recv", 1, 10 * MS), _row(1, "send", 0, 13 * MS)])
    rows, counts = _pair_p2p(df, {0: 0, 1: 3 * MS})
    assert counts["pairs"] == 1 and counts["wait_ns"] == 0
