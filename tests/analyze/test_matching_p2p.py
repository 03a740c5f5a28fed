"""P2P pairing in matching: the k-th send src->dst on a group pairs with the k-th recv at dst from src,
and the side posted first waits until the other side is posted (a late peer, not transfer)."""

from __future__ import annotations

from tracekit.derive.matching import COLUMNS, _pair_p2p
from tracekit.tables.columns import arrow_columns

from tests.analyze.analyze_builders import table

MS = 1_000_000


def _row(rank, op, peer, t, pg="cp"):
    return {"rank": rank, "source": "comms-log", "pg_name": pg, "op": op, "peer": peer,
            "enqueue_ts": t, "ts": t, "dur": MS, "bytes": 4096, "step": 1}


def _p2p(rows):
    """The rows as matching's numpy columns, each arriving at its start (`ts`: host and device alike)."""
    cols = arrow_columns(table("collectives", rows).select(COLUMNS))
    cols["arrival"], cols["arrival_ok"] = cols["ts"], cols["ts_ok"]
    return cols


def test_receiver_waits_for_a_late_sender_and_pairs_follow_order_per_direction():
    # rank 1 sends to 0 twice, 5 ms after rank 0 posted each recv; rank 0 sends to 1 once, 2 ms
    # before rank 1 posts its recv; an unrelated group's send has no matching recv
    df = _p2p([
        _row(0, "recv", 1, 10 * MS), _row(1, "send", 0, 15 * MS),
        _row(0, "recv", 1, 30 * MS), _row(1, "send", 0, 35 * MS),
        _row(0, "send", 1, 40 * MS), _row(1, "recv", 0, 42 * MS),
        _row(0, "send", 1, 50 * MS, pg="pp"),
    ])
    rows, counts, _ = _pair_p2p(df, {0: 0, 1: 0}, set())
    assert counts == {"pairs": 3, "unpaired": 1, "wait_ns": 5 * MS + 5 * MS + 2 * MS}
    got = sorted(zip(rows["rank"], rows["arrival_raw"], rows["wait"]))
    assert got == [(0, 10 * MS, 5 * MS), (0, 30 * MS, 5 * MS), (0, 40 * MS, 2 * MS),
                   (1, 15 * MS, 0), (1, 35 * MS, 0), (1, 42 * MS, 0)]


def test_clock_offsets_are_removed_before_the_wait_is_measured():
    # rank 1's clock runs 3 ms ahead: its send at 13 ms (raw) is at 10 ms, when rank 0 posted its recv
    df = _p2p([_row(0, "recv", 1, 10 * MS), _row(1, "send", 0, 13 * MS)])
    rows, counts, _ = _pair_p2p(df, {0: 0, 1: 3 * MS}, set())
    assert counts["pairs"] == 1 and counts["wait_ns"] == 0


def test_pair_transfer_is_first_end_minus_last_arrival_on_device():
    # GPU ranks: rank 0's send kernel runs 10..14 ms, rank 1's recv kernel 12..15 ms: the data moves from
    # the later start (12) to the first end (14); rank 1 -> 0 has a host-timed side (rank 2 is no GPU rank)
    df = _p2p([
        {**_row(0, "send", 1, 10 * MS), "dur": 4 * MS, "bytes": 1 << 20},
        {**_row(1, "recv", 0, 12 * MS), "dur": 3 * MS, "bytes": 1 << 20},
        {**_row(2, "send", 0, 20 * MS), "step": 2}, {**_row(0, "recv", 2, 21 * MS), "step": 2},
    ])
    _, counts, pairs = _pair_p2p(df, {0: 0, 1: 0, 2: 0}, {0, 1})
    assert counts["pairs"] == 2
    got = {(int(r.src), int(r.dst)): (int(r.transfer), bool(r.device_timed), int(r.bytes), int(r.step))
           for r in pairs.frame().itertuples()}
    assert got == {(0, 1): (14 * MS - 12 * MS, True, 1 << 20, 1), (2, 0): (21 * MS - 21 * MS, False, 4096, 2)}


def test_epoch_scale_arrivals_keep_every_nanosecond():
    # a recv posted 101 ns after its send, at epoch-scale ns (beyond float64's 2**53): the wait is 101 ns
    base = 1_761_000_000_123_456_789
    rows, counts, _ = _pair_p2p(_p2p([_row(1, "send", 0, base), _row(0, "recv", 1, base + 101)]), {}, set())
    assert counts["wait_ns"] == 101
    assert sorted(zip(rows["rank"], rows["arrival_raw"])) == [(0, base + 101), (1, base)]
