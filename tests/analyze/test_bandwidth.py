"""Bandwidth analyzer: NCCL-tests factors, run-relative and user-peak low-bandwidth findings."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tracekit.analyze.bandwidth import analyze_bandwidth
from tracekit.collectives import bus_factor
from tracekit.config import AnalysisConfig
from tracekit.findings.finding import FindingKind, Severity
from tracekit.tables.store import RunStoreWriter

MS = 1_000_000


def test_bus_factors_follow_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert bus_factor("reduce_scatter", 2) == pytest.approx(1 / 2)
    assert bus_factor("all_to_all", 16) == pytest.approx(15 / 16)
    assert bus_factor("broadcast", 8) == 1.0 and bus_factor("reduce", 8) == 1.0
    assert bus_factor("barrier", 8) is None


def _store(path, calls, steps=2, step_ns=100 * MS):
    """calls: (pg_name, dim, ranks, op, bytes, dur_ns, count_per_step) on every rank of the group."""
    w = RunStoreWriter(path)
    ranks = sorted({r for c in calls for r in c[2]})
    w.append("ranks", pa.table({"rank": pa.array(ranks, pa.int32())}))
    groups = {c[0]: (c[1], c[2]) for c in calls}
    w.append("process_groups", pa.table({"pg_name": list(groups), "dim": [g[0] for g in groups.values()],
                                         "ranks": pa.array([g[1] for g in groups.values()], pa.list_(pa.int32())),
                                         "size": pa.array([len(g[1]) for g in groups.values()], pa.int32())}))
    for r in ranks:
        cols = {k: [] for k in ("rank", "source", "pg_name", "seq", "op", "bytes", "group_size", "ts", "dur",
                                "step", "is_p2p")}
        for pg, dim, members, op, nbytes, dur, count in calls:
            if r not in members:
                continue
            for step in range(steps):
                for k in range(count):
                    for c, v in (("rank", r), ("source", "comms-log"), ("pg_name", pg), ("seq", step * count + k),
                                 ("op", op), ("bytes", nbytes), ("group_size", len(members)),
                                 ("ts", step * step_ns + k * dur), ("dur", dur), ("step", step), ("is_p2p", False)):
                        cols[c].append(v)
        w.append("collectives", pa.table(cols))
        w.append("steps", pa.table({"rank": pa.array([r] * steps, pa.int32()), "step": pa.array(range(steps), pa.int32()),
                                    "ts": [s * step_ns for s in range(steps)], "dur": [step_ns] * steps}))
    return w.close()


def run(store, **cfg):
    return analyze_bandwidth(store, None, None, None, AnalysisConfig(**cfg))


def test_slow_group_flagged_against_best_of_run(tmp_path):
    store = _store(tmp_path / "s", [
        ("tp0", "tp", [0, 1], "all_reduce", 32768, 5 * MS, 4),
        ("tp1", "tp", [2, 3], "all_reduce", 32768, 5 * MS, 4),
        ("dp0", "dp", [0, 2], "all_reduce", 1 << 20, 1 * MS, 1),
        ("dp1", "dp", [1, 3], "all_reduce", 1 << 20, 1 * MS, 1),
    ])
    res = run(store)
    rows = {(r["pg_name"], r["op"]): r for r in res.section["rows"]}
    tp = rows[("tp0", "all_reduce")]
    assert tp["bucket_bytes"] == 32768 and tp["count"] == 8
    # busbw = bytes/time × 2(n−1)/n with n = 2
    assert tp["busbw_gbps_p50"] == pytest.approx(32768 / (5 * MS) * 1.0)
    # reference: the dp all-reduce moves more bus bytes in 1 ms → 32768 B / 1 ms
    assert tp["reference_gbps"] == pytest.approx(32768 / MS)
    assert tp["low"] and not rows[("dp0", "all_reduce")]["low"]
    (f,) = res.findings
    assert f.kind is FindingKind.LOW_BUS_BANDWIDTH and f.dim == "tp" and f.ranks == (0, 1, 2, 3)
    # 4 calls per step, each 4 ms slower than the reference would take
    assert f.est_saving_ns == pytest.approx(4 * 4 * MS)
    assert f.severity is Severity.WARNING  # 16 ms of a 100 ms step


def test_clean_run_has_no_finding(tmp_path):
    store = _store(tmp_path / "s", [
        ("tp0", "tp", [0, 1], "all_reduce", 32768, MS // 5, 4),
        ("dp0", "dp", [0, 1], "all_reduce", 1 << 20, 1 * MS, 1),
        ("dp0", "dp", [0, 1], "barrier", 8, 10 * MS, 1),
    ])
    res = run(store)
    assert res.findings == []


def test_the_same_ranks_moving_more_bytes_faster_is_no_reference(tmp_path):
    # one pair of ranks: its 32 KiB all-reduces take 5 ms, its 1 MiB ones 1 ms. The same links moved more
    # bytes faster, so the slow calls met something other than a slow link (CPU starvation while they
    # overlap the backward pass): no low_bus_bandwidth finding
    store = _store(tmp_path / "s", [("dp0", "dp", [0, 1], "all_reduce", 32768, 5 * MS, 4),
                                    ("dp0", "dp", [0, 1], "all_reduce", 1 << 20, 1 * MS, 1),
                                    ("dp_cp", "dp", [0, 1], "all_reduce", 1 << 20, 1 * MS, 1)])
    res = run(store)
    assert res.findings == [] and not any(r["low"] for r in res.section["rows"])
    # another pair (other links) moving as much as fast is a reference
    store = _store(tmp_path / "t", [("dp0", "dp", [0, 1], "all_reduce", 32768, 5 * MS, 4),
                                    ("dp1", "dp", [2, 3], "all_reduce", 1 << 20, 1 * MS, 1)])
    (f,) = run(store).findings
    assert f.dim == "dp" and f.evidence.details["groups"] == ["dp0"]


def test_saving_is_bounded_by_the_exposed_transfer_time(tmp_path):
    import pyarrow as pa

    from tracekit.analyze.unoverlapped import UnoverlappedResult

    store = _store(tmp_path / "s", [("tp0", "tp", [0, 1], "all_reduce", 32768, 5 * MS, 4),
                                    ("dp0", "dp", [0, 2], "all_reduce", 1 << 20, 1 * MS, 1)])
    # the unoverlapped analyzer found 1.5 ms of each slow tp call exposed on rank 1 (0.5 ms on rank 0)
    rows = [{"rank": r, "pg_name": "tp0", "op": "all_reduce", "bytes": 32768, "steps": 2,
             "transfer_exposed_ns": (3 if r == 1 else 1) * MS // 2} for r in (0, 1) for _ in range(8)]
    unoverlapped = UnoverlappedResult(section={"by_dim_op": []}, instances=pa.Table.from_pylist(rows))
    (f,) = analyze_bandwidth(store, None, None, unoverlapped, AnalysisConfig()).findings
    # 16 ms per step lost against the reference, of which 4 calls × 1.5 ms were exposed on the worst rank
    assert f.evidence.details["lost_ns_per_step"] == {"tp0": 16 * MS}
    assert f.est_saving_ns == 6 * MS and f.evidence.exposed_bound_ns_per_step == 6 * MS
    assert "exposed transfer time" in f.evidence.saving_formula and f.severity is Severity.WARNING


def test_user_peak(tmp_path):
    nbytes = 4 << 20
    store = _store(tmp_path / "s", [("dp0", "dp", [0, 1, 2, 3], "all_gather", nbytes, 2 * MS, 1),
                                    ("tp0", "tp", [0, 1], "all_reduce", 4096, 1 * MS, 1)])
    res = run(store, peak_gbps={"dp": 10.0})
    row = [r for r in res.section["rows"] if r["pg_name"] == "dp0"][0]
    busbw = nbytes / (2 * MS) * 3 / 4
    assert row["busbw_gbps_p50"] == pytest.approx(busbw) and row["low"]
    (f,) = [f for f in res.findings if f.dim == "dp"]
    assert f.est_saving_ns == pytest.approx(2 * MS - nbytes * 0.75 / 10.0)
    # above half the peak: not low
    res = run(store, peak_gbps={"dp0": 2 * busbw * 0.9})
    assert not [r for r in res.section["rows"] if r["pg_name"] == "dp0"][0]["low"]


def test_real_nccl_trace_matches_independent_reading(shared_traces, tmp_path):
    """busbw per (op, size bucket) on a real A100 NCCL trace vs the kernels read with json + Decimal."""
    import gzip
    import json
    from decimal import Decimal
    from statistics import median

    from tracekit.flow import analyze_store
    from tracekit.parse.run import parse_run

    path = shared_traces / "hta_nccl_a100_rank0of2"
    doc = json.loads(gzip.open(path / "nccl_data.json.gz").read(), parse_float=Decimal)
    ops = {"allreduce": "all_reduce", "broadcast": "broadcast"}
    size = {"Float": 4, "Long": 8}
    expected: dict[tuple[str, int], list[float]] = {}
    for e in doc["traceEvents"]:
        a = e.get("args") or {}
        if e.get("ph") != "X" or str(e.get("cat", "")).lower() != "kernel" or "Collective name" not in a:
            continue
        op, n = ops[a["Collective name"]], int(a["Group size"])
        nbytes = max(int(a["In msg nelems"]), int(a["Out msg nelems"])) * size[a["dtype"]]
        dur_ns = Decimal(e["dur"]) * 1000
        factor = 2 * (n - 1) / n if op == "all_reduce" else 1.0
        bucket = 1 << (nbytes.bit_length() - 1)
        expected.setdefault((op, bucket), []).append(float(Decimal(nbytes) / dur_ns) * factor)
    assert expected
    store = parse_run(path, tmp_path / "store", progress=False).store
    rows = analyze_store(store)["sections"]["bandwidth"]["rows"]
    got = {(r["op"], r["bucket_bytes"]): r for r in rows}
    assert set(got) == set(expected)
    for key, vals in expected.items():
        assert got[key]["count"] == len(vals)
        assert got[key]["busbw_gbps_p50"] == pytest.approx(median(vals), rel=1e-6), key


def test_slow_host_is_the_one_in_every_low_inter_host_group_and_no_fine_one():
    from tracekit.analyze.bandwidth import slow_host

    hosts = {0: "h0", 1: "h0", 2: "h1", 3: "h1", 4: "h2", 5: "h2"}
    members = {"a": [0, 2], "b": [3, 4], "c": [1, 5], "d": [0, 1]}
    tiers = {"a": "inter_host", "b": "inter_host", "c": "inter_host", "d": "intra_host"}

    def row(pg, low):
        return {"pg_name": pg, "reference_gbps": 40.0, "low": low}

    # a (h0, h1) and b (h1, h2) are slow, c (h0, h2) is fine; d (intra-host) slow too but has no NIC traffic
    table = [row("a", True), row("b", True), row("c", False), row("d", True)]
    got = slow_host(table, members, tiers, hosts)
    assert got == {"host": "h1", "ranks": [2, 3], "groups": {"a", "b"}}
    # without a fine group through the other hosts nothing rules h0 or h2 out: no host is named
    assert slow_host([row("a", True), row("b", True)], members, tiers, hosts) is None
    # host names unknown: nothing to name
    assert slow_host(table, members, tiers, {}) is None


def test_best_of_tier_matches_a_scan_of_the_other_links() -> None:
    """`_TierBest` (sorted prefixes / suffixes) picks the row a plain scan of the tier's other links picks:
    fastest median time among rows moving at least as many bus bytes, best median busbw among those moving
    fewer, the first in order on ties (few distinct values, so ties and shared links are common)."""
    import random

    from tracekit.analyze.bandwidth import _TierBest

    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 30)
        rows = [(rng.randint(0, 5), {"bus_bytes_p50": rng.choice([1e3, 2e3, 4e3, 8e3]),
                                     "time_ns_p50": rng.choice([10, 20, 30]),
                                     "busbw_gbps_p50": rng.choice([1.0, 2.0, 3.0]), "n": i}) for i in range(n)]
        tb = _TierBest(rows)
        for mine, row in rows:
            others = [r for i, r in rows if i != mine]
            better = [r for r in others if r["bus_bytes_p50"] >= row["bus_bytes_p50"]]
            smaller = [r for r in others if r["bus_bytes_p50"] < row["bus_bytes_p50"]]
            want = (min(better, key=lambda r: r["time_ns_p50"]) if better else None,
                    max(smaller, key=lambda r: r["busbw_gbps_p50"]) if smaller else None)
            assert tb.best(row["bus_bytes_p50"], mine) == want


def test_grouped_medians_and_percentiles_are_numpys() -> None:
    """The table's per-row medians and 75th percentiles, computed for all rows at once, equal np.median and
    np.percentile of each row's values (bit for bit: integer and float values, odd and even counts, one value,
    ties)."""
    from tracekit.analyze.bandwidth import _medians, _percentiles

    rng = np.random.default_rng(4)
    ng = 300
    gid = rng.integers(0, ng, 5000)
    gid[:ng] = np.arange(ng)  # every group has a value
    ints = rng.integers(1, 50, gid.size) * 1_000_003  # ties within groups
    floats = rng.random(gid.size) * rng.choice([1e-3, 1.0, 1e6], gid.size)
    for values in (ints, floats, ints.astype(np.float64) / 7.0):
        med, p75 = _medians(values, gid, ng), _percentiles(values, gid, ng, 75)
        for g in range(ng):
            mine = values[gid == g]
            assert med[g] == np.median(mine) and p75[g] == np.percentile(mine, 75), (g, mine)
