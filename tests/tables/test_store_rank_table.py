"""RunStore.rank_table reads a rank's row groups by index: same rows as a filtered scan."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as ds

from tracekit.tables.store import RunStoreWriter


def _kernels(ranks, n):
    return pa.table({"rank": pa.array([r for r in ranks for _ in range(n)], pa.int32()),
                     "ts": list(range(len(ranks) * n)), "dur": [5] * (len(ranks) * n),
                     "kind": ["compute"] * (len(ranks) * n)})


def test_rank_table_matches_a_filtered_scan(tmp_path):
    w = RunStoreWriter(tmp_path / "a")
    for r in (3, 0, 7, 3):  # rank 3 twice: two row groups
        w.append("kernels", _kernels([r], 4))
    store = w.close()
    assert store._rank_row_groups("kernels") is not None
    for r in (0, 3, 7, 5):
        got = store.rank_table("kernels", r, ["rank", "ts", "kind"])
        want = store.dataset("kernels").to_table(columns=["rank", "ts", "kind"], filter=ds.field("rank") == r)
        assert got.equals(want)
    assert store.rank_table("kernels", 5).schema == store.dataset("kernels").schema
    assert store.rank_table("kernels", 3).num_rows == 8


def test_mixed_row_groups_fall_back_to_the_scan(tmp_path):
    w = RunStoreWriter(tmp_path / "b")
    w.append("kernels", _kernels([1, 2], 3))  # one row group holding two ranks
    store = w.close()
    assert store._rank_row_groups("kernels") is None
    assert store.rank_table("kernels", 2).column("rank").to_pylist() == [2, 2, 2]


def test_row_groups_are_bounded_and_stay_one_rank_each(tmp_path, monkeypatch):
    from tracekit.tables import store as store_mod

    monkeypatch.setattr(store_mod, "ROW_GROUP_ROWS", 5)
    w = RunStoreWriter(tmp_path / "c")
    w.append("kernels", _kernels([4], 12))  # 12 rows: groups of 5, 5, 2
    w.append("kernels", _kernels([9], 3))
    store = w.close()
    _, groups = store._rank_row_groups("kernels")
    assert groups == {4: [0, 1, 2], 9: [3]}
    assert store.rank_table("kernels", 4).column("ts").to_pylist() == list(range(12))


def test_grouped_sum_matches_a_plain_reading(tmp_path):
    import random

    rng = random.Random(7)
    rows = [{"rank": rng.randrange(4), "step": rng.choice([None, 1, 2, 3]), "ts": i,
             "dur": rng.choice([None, rng.randrange(1000)]), "name": rng.choice(["a", "b", "c"])}
            for i in range(3000)]
    w = RunStoreWriter(tmp_path / "d")
    for r in range(4):
        w.append("events", pa.Table.from_pylist([x for x in rows if x["rank"] == r]))
    store = w.close()
    want: dict = {}
    for x in rows:
        if x["name"] == "b" and x["step"] is not None and x["dur"] is not None:
            want[(x["rank"], x["step"])] = want.get((x["rank"], x["step"]), 0) + x["dur"]
    import pyarrow.compute as pc

    # batches of 100 rows: a rank's sums must add up across several batches
    got = store.grouped_sum("events", ["rank", "step"], "dur", pc.field("name") == "b", batch_size=100)
    assert got == want and len(want) >= 10
    assert store.grouped_sum("events", ["rank", "step"], "dur", pc.field("name") == "zz") == {}


def test_a_column_added_after_the_store_was_written_reads_as_unknown(tmp_path):
    """A store from an earlier tracekit lacks columns added since (ranks.host_cpus): they read as nulls,
    and the columns it has read as written."""
    import pyarrow.parquet as pq

    from tracekit.tables.store import RunStore

    w = RunStoreWriter(tmp_path / "old")
    w.append("ranks", pa.table({"rank": pa.array([0, 1], pa.int32()), "hostname": ["a", "b"]}))
    store = w.close()
    old = pq.read_table(store.file("ranks"))
    pq.write_table(old.drop_columns(["host_cpus"]), store.file("ranks"))
    again = RunStore(store.path)
    t = again.table("ranks", ["rank", "host_cpus", "hostname"])
    assert t.column_names == ["rank", "host_cpus", "hostname"]
    assert t.column("host_cpus").to_pylist() == [None, None] and t.column("hostname").to_pylist() == ["a", "b"]
    assert again.table("ranks", ["host_cpus"], filter=pa.compute.field("rank") == 1).to_pylist() == [{"host_cpus": None}]


def test_rank_rows_counts_a_ranks_rows_from_the_footer(tmp_path):
    """rank_rows: a rank's row count as plain pyarrow counts the file's rank column (0 for a rank or a table
    without rows), None where row groups mix ranks."""
    import pyarrow.parquet as pq

    w = RunStoreWriter(tmp_path / "c")
    for r, n in ((3, 4), (0, 2), (7, 5), (3, 1)):
        w.append("kernels", _kernels([r], n))
    store = w.close()
    ranks = pq.read_table(tmp_path / "c" / "kernels.parquet", columns=["rank"]).column("rank").to_pylist()
    assert {r: store.rank_rows("kernels", r) for r in (0, 3, 5, 7)} == {r: ranks.count(r) for r in (0, 3, 5, 7)}
    assert store.rank_rows("events", 3) == 0  # written empty
    w = RunStoreWriter(tmp_path / "d")
    w.append("kernels", _kernels([1, 2], 3))
    assert w.close().rank_rows("kernels", 2) is None
