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
