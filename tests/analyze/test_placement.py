"""Placement analyzer: heavy groups spanning hosts, with and without light groups inside a host."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tracekit.analyze.placement import analyze_placement
from tracekit.analyze.unoverlapped import UnoverlappedResult
from tracekit.findings.finding import FindingKind, Severity
from tracekit.tables.store import RunStoreWriter

MS = 1_000_000


def _store(path, hosts, groups, tp_comm_ns=10 * MS):
    w = RunStoreWriter(path, meta={"manifest": {"hosts": {str(r): h for r, h in hosts.items()}}})
    w.append("ranks", pa.table({"rank": pa.array(sorted(hosts), pa.int32())}))
    w.append("process_groups", pa.table({"pg_name": [g[0] for g in groups], "dim": [g[1] for g in groups],
                                         "ranks": pa.array([g[2] for g in groups], pa.list_(pa.int32()))}))
    for r in sorted(hosts):
        w.append("steps", pa.table({"rank": pa.array([r], pa.int32()), "step": pa.array([1], pa.int32()),
                                    "ts": [0], "dur": [100 * MS]}))
        tp = [g for g in groups if g[1] == "tp" and r in g[2]]
        if tp:  # two overlapping collectives: union 10 ms
            w.append("collectives", pa.table({"rank": pa.array([r, r], pa.int32()), "pg_name": [tp[0][0]] * 2,
                                              "source": ["comms-log"] * 2, "ts": [0, tp_comm_ns // 2],
                                              "dur": [tp_comm_ns // 2, tp_comm_ns // 2],
                                              "step": pa.array([1, 1], pa.int32())}))
    return w.close()


def test_tp_across_hosts_with_dp_inside(tmp_path):
    # ranks 0,1 on host a, 2,3 on host b; TP pairs (0,2),(1,3) cross, DP pairs (0,1),(2,3) stay inside
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    groups = [("tp0", "tp", [0, 2]), ("tp1", "tp", [1, 3]), ("dp0", "dp", [0, 1]), ("dp1", "dp", [2, 3])]
    res = analyze_placement(_store(tmp_path / "s", hosts, groups), None, None)
    (f,) = res.findings
    assert f.kind is FindingKind.PLACEMENT_MISMATCH and f.dim == "tp" and f.ranks == (0, 1, 2, 3)
    assert f.severity is Severity.CRITICAL
    assert f.evidence.details["light_dims_inside_host"] == ["dp"]
    assert f.est_saving_ns == 10 * MS and f.evidence.details["exposed_basis"] == "comm_time"
    g = {x["pg_name"]: x for x in res.section["groups"]}
    assert g["tp0"]["hosts"] == ["a", "b"] and not g["dp0"]["crosses_hosts"]


def test_uses_unoverlapped_section_and_unavoidable_is_milder(tmp_path):
    hosts = {0: "a", 1: "b"}
    groups = [("tp0", "tp", [0, 1])]
    unoverlapped = UnoverlappedResult(section={"by_dim_op": [
        {"dim": "tp", "op": "all_reduce", "transfer_exposed_ns_per_step": 3 * MS},
        {"dim": "tp", "op": "all_gather", "transfer_exposed_ns_per_step": 1 * MS},
        {"dim": "dp", "op": "all_reduce", "transfer_exposed_ns_per_step": 7 * MS}]})
    (f,) = analyze_placement(_store(tmp_path / "s", hosts, groups), None, unoverlapped).findings
    assert f.est_saving_ns == 4 * MS and f.severity is Severity.INFO
    assert f.evidence.details["light_dims_inside_host"] == []


def test_single_host_no_finding(tmp_path):
    hosts = {0: "a", 1: "a"}
    res = analyze_placement(_store(tmp_path / "s", hosts, [("tp0", "tp", [0, 1])]),
                            None, None)
    assert res.findings == [] and res.section["num_hosts"] == 1
