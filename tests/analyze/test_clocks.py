"""Clock offsets between hosts estimated from collective ends; large inconsistent ones warn."""

from __future__ import annotations

from tracekit.flow import analyze_store

from tests.analyze.analyze_builders import build_store

MS = 1_000_000


def two_hosts(tmp_path, rank1_clock_ns):
    """Rank 1's clock reads `rank1_clock_ns[i]` ahead during instance i; true arrivals: rank 0 at
    10 ms, rank 1 at 12 ms into each 100 ms period; ends are simultaneous at 15 ms."""
    coll, ranks = [], []
    for r in (0, 1):
        ranks.append({"rank": r, "world_size": 2, "hostname": f"host{r}", "first_ts": 0, "last_ts": 2000 * MS})
        for i, off in enumerate(rank1_clock_ns):
            shift = off if r == 1 else 0
            arrival = i * 100 * MS + (12 if r == 1 else 10) * MS + shift
            end = i * 100 * MS + 15 * MS + shift
            coll.append({"rank": r, "source": "comms-log", "pg_name": "w", "pg_desc": "default_pg", "seq": i + 1,
                         "op": "all_reduce", "ts": arrival, "dur": end - arrival, "enqueue_ts": arrival,
                         "group_ranks": [0, 1], "group_size": 2})
    return build_store(tmp_path, {"ranks": ranks, "collectives": coll})


def test_consistent_offset_is_estimated_and_corrected(tmp_path):
    a = analyze_store(two_hosts(tmp_path, [50 * MS] * 6))
    clk = a["sections"]["clocks"]
    assert clk["method"] == "estimated" and clk["hosts"] == 2 and clk["reference_rank"] == 0
    r1 = next(r for r in clk["ranks"] if r["rank"] == 1)
    assert r1["offset_ns"] == 50 * MS and r1["mad_ns"] == 0 and r1["status"] == "corrected" and r1["applied"]
    # after correction the skew is the true 2 ms, not 52 ms
    (g,) = a["sections"]["matching"]["by_group"]
    assert g["skew_ns"]["max"] == 2 * MS and g["transfer_ns"]["max"] == 3 * MS
    assert not [f for f in a["findings"] if f["kind"] == "clock_skew"]


def test_large_inconsistent_offsets_warn(tmp_path):
    a = analyze_store(two_hosts(tmp_path, [50 * MS, -40 * MS, 10 * MS, 60 * MS, -30 * MS, 80 * MS]))
    r1 = next(r for r in a["sections"]["clocks"]["ranks"] if r["rank"] == 1)
    assert r1["status"] == "uncorrectable" and not r1["applied"]
    (f,) = [f for f in a["findings"] if f["kind"] == "clock_skew"]
    assert f["severity"] == "warning" and f["ranks"] == [1]


def test_small_offsets_are_not_applied(tmp_path):
    a = analyze_store(two_hosts(tmp_path, [200_000] * 6))  # 0.2 ms: below end jitter
    r1 = next(r for r in a["sections"]["clocks"]["ranks"] if r["rank"] == 1)
    assert r1["offset_ns"] == 200_000 and r1["status"] == "negligible" and not r1["applied"]
