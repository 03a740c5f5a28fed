"""host_bound reads one rank's host ops at a time (a per-rank summary for the run-wide medians, `OpSummary`):
its section, finding and the slow ops it keeps for the what-if build equal what every rank's op columns held
at once give (`excess_ns` over all ranks, the analyzer's former path), on real traces with slow host ops
(kineto_resnet50_2021_workers0), with first launches (hta_amd_mi250) and on two ranks, where the median
is taken across ranks (hta_sampled_2rank)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tracekit.analyze import host_bound as hb
from tracekit.derive.host_ops import SLOW_COLUMNS, device_ops, excess_ns, host_ops
from tracekit.parse.run import parse_run

SHARED = Path(os.environ.get("TRACEKIT_SHARED_TRACES") or Path(__file__).resolve().parents[3] / "shared" / "traces")


@pytest.mark.parametrize("name", ["kineto_resnet50_2021_workers0", "hta_amd_mi250", "hta_sampled_2rank"])
def test_summary_path_equals_all_ranks_at_once(tmp_path, name):
    if not (SHARED / name).is_dir():
        pytest.skip("shared trace corpus not available")
    store = parse_run(SHARED / name, tmp_path / "s", progress=False).store
    new = hb.analyze_host_bound(store)
    kern = {r: k for r in store.ranks() if (k := device_ops(store, r)) is not None}
    ops = {r: o for r, k in kern.items() if (o := host_ops(store, r, k)) is not None}
    ex, first = excess_ns(ops), excess_ns(ops, first_launch=True)
    rows = [x for r in ops if (x := hb.rank_rows(store, r, kern[r], ops[r], ex[r], first[r])) is not None]
    assert new.section["ranks"] == rows
    assert new.section["slow_ops"] == hb.slow_op_table(ops, ex)
    old = hb._finding(rows, hb.slow_op_table(ops, ex))
    assert [f.summary for f in new.findings] == ([old.summary] if old else [])
    assert sum(r["slow_ops"] for r in rows) + sum(r["first_launch_ns"] for r in rows) > 0  # something to compare
    # the slow ops it hands the what-if build: each rank's ops with an excess, from every rank's ops at once
    assert new.slow_ops.keys() == ops.keys()
    for r, cols in new.slow_ops.items():
        keep = ex[r] > 0
        want = {**{c: ops[r][c][keep] for c in SLOW_COLUMNS}, "excess": ex[r][keep]}
        assert cols.keys() == want.keys()
        for c in cols:
            np.testing.assert_array_equal(cols[c], want[c])
