"""Critical path and what-if replay: a hand-built two-rank step checked against plain integer arithmetic,
and unchanged replay of real and reference-runtime traces against their step times read from the raw JSON."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from tracekit.whatif.fixes import Fix, RunFacts, apply_fixes
from tracekit.whatif.graph import (
    SMALL_GRAPH_NODES, Category, StepGraph, add_start_nodes, critical_path, rank_step_ns, replay, topo_levels,
)
from tracekit.whatif.replay import composition, path_of, predict_ns, replay_step

REPO = Path(__file__).resolve().parents[2]


def two_rank_allreduce(c0: int, c1: int, xfer: int, after: int, lead1: int = 0) -> StepGraph:
    """rank r: compute c_r, then an all_reduce (arrive, sync, transfer xfer), then compute `after`.
    Both ranks' step windows start at 0; rank 1's first op `lead1` later (a sleep before its first op).
    Nothing else. Times in ns."""
    last = max(c0, lead1 + c1)
    nodes = [  # rank, lane, category, start, dur, inst
        (0, 0, Category.COMPUTE, 0, c0, -1), (0, 0, Category.MARK, c0, 0, 0),
        (0, 1, Category.TRANSFER, last, xfer, 0), (0, 0, Category.COMPUTE, last + xfer, after, -1),
        (1, 2, Category.COMPUTE, lead1, c1, -1), (1, 2, Category.MARK, lead1 + c1, 0, 0),
        (1, 3, Category.TRANSFER, last, xfer, 0), (1, 2, Category.COMPUTE, last + xfer, after, -1),
        (-1, -1, Category.MARK, last, 0, 0),
    ]
    a = np.array([n[:5] for n in nodes], dtype=np.int64)
    edges = [(0, 1), (1, 8), (5, 8), (8, 2), (8, 6), (1, 2), (5, 6), (2, 3), (1, 3), (4, 5), (6, 7), (5, 7)]
    e = np.array(edges, dtype=np.int64)
    g = StepGraph(rank=a[:, 0].astype(np.int32), lane=a[:, 1], category=a[:, 2].astype(np.int8), start=a[:, 3],
                  dur=a[:, 4], src=e[:, 0], dst=e[:, 1], inst=np.array([n[5] for n in nodes], np.int32),
                  lane_names=["rank 0 training thread", "rank 0 comm", "rank 1 training thread", "rank 1 comm"],
                  terminal=np.array([n[1] >= 0 for n in nodes]))
    g.ranks = np.array([0, 1])
    g.win_step = np.array([0, 0])
    g.win_start = np.array([0, 0])
    g.win_end = np.array([last + xfer + after] * 2)
    add_start_nodes(g)
    return g


def test_unchanged_replay_and_path_through_the_slow_rank():
    g = two_rank_allreduce(c0=10_000, c1=25_000, xfer=3_000, after=4_000)
    res = replay_step(0, g)
    assert res.replayed_ns == res.measured_ns == 25_000 + 3_000 + 4_000
    path, rank = path_of(res)
    assert 4 in path.tolist() and 0 not in path.tolist()  # rank 1's compute, not rank 0's
    comp = composition(res, path, rank)
    assert sum(comp["by_category"].values()) == comp["step_ns"] == 32_000
    assert comp["by_category"]["compute"] == 25_000 + 4_000
    assert comp["by_category"]["exposed_transfer"] == 3_000


def test_rank_compute_at_peers_median_matches_arithmetic():
    c0, c1, xfer, after = 10_000, 25_000, 3_000, 4_000
    g = two_rank_allreduce(c0, c1, xfer, after)
    res = replay_step(0, g)
    # rank 1 at its peer's pace: both ranks run the same ops, so each of rank 1's takes rank 0's time
    assert predict_ns(res, [Fix("rank_compute", rank=1)], RunFacts()) == c0 + xfer + after
    # by a factor: every compute node of rank 1 scaled
    f = Decimal(c0 + after) / Decimal(c1 + after)
    new_c1 = int((Decimal(c1) * f).to_integral_value())
    new_after1 = int((Decimal(after) * f).to_integral_value())
    expect = max(max(c0, new_c1) + xfer + after, max(c0, new_c1) + xfer + new_after1)
    assert predict_ns(res, [Fix("rank_compute", rank=1, value=float(f))], RunFacts()) == expect
    # overlapping the collective removes the transfer and nothing else
    assert predict_ns(res, [Fix("dim_overlap", dim=None)], RunFacts()) == c1 + after


def test_a_stall_before_the_steps_first_op_is_removed_by_the_host_stall_and_straggler_fixes():
    ms = 1_000_000
    c0, c1, xfer, after, sleep = 10 * ms, 12 * ms, 3 * ms, 4 * ms, 50 * ms
    g = two_rank_allreduce(c0, c1, xfer, after, lead1=sleep)
    res = replay_step(0, g)
    assert res.replayed_ns == res.measured_ns == sleep + c1 + xfer + after
    without = max(c0, c1) + xfer + after  # the same step with rank 1 not sleeping
    assert predict_ns(res, [Fix("host_stalls", rank=1)], RunFacts()) == without
    assert predict_ns(res, [Fix("host_stalls", rank=0)], RunFacts()) == res.measured_ns  # not rank 0's stall


@pytest.fixture(params=["native", "numpy"])
def graph_path(request, monkeypatch):
    """Each graph test twice: with the levels and integer replays in C (`kgraph`, built by the install) and
    with the numpy passes (TRACEKIT_NATIVE=0)."""
    from tracekit.whatif import graph as G

    monkeypatch.setenv("TRACEKIT_NATIVE", "1" if request.param == "native" else "0")
    assert G.native_graph() == (request.param == "native")
    return request.param


def test_topological_levels_and_cycles(graph_path):
    src, dst = np.array([0, 1, 0, 2]), np.array([1, 2, 2, 3])
    assert topo_levels(4, src, dst).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="cycle"):
        topo_levels(3, np.array([0, 1, 2]), np.array([1, 2, 1]))


@pytest.mark.parametrize("n", [300, SMALL_GRAPH_NODES + 300])  # node by node, and a vectorised pass per level
def test_topological_levels_equal_the_longest_chain_on_a_random_dag(n, graph_path):
    rng = np.random.default_rng(n)
    a, b = rng.integers(0, n, 3 * n), rng.integers(0, n, 3 * n)
    keep = a != b
    src, dst = np.minimum(a, b)[keep], np.maximum(a, b)[keep]  # lower id -> higher id: acyclic
    perm = rng.permutation(n)  # node ids shuffled, so id order is not a topological order
    longest = [0] * n  # plain DP in id order over the unshuffled edges
    for s, d in sorted(zip(dst.tolist(), src.tolist())):
        longest[s] = max(longest[s], longest[d] + 1)
    got = topo_levels(n, perm[src], perm[dst])
    assert got[perm].tolist() == longest
    with pytest.raises(ValueError, match="cycle"):
        topo_levels(n, np.r_[perm[src], perm[dst[0]]], np.r_[perm[dst], perm[src[0]]])


def test_topological_levels_of_a_long_narrow_dag(graph_path):
    """A graph over SMALL_GRAPH_NODES with ~2 nodes per level (a 2-rank CPU trace's shape): the vectorised
    pass gives up after its probe levels and the node-by-node pass gives the longest chains; a wide graph
    of the same size keeps the vectorised pass."""
    from tracekit.whatif.graph import _levels_by_level

    n = SMALL_GRAPH_NODES + 300
    rng = np.random.default_rng(3)
    chains = np.arange(n - 2)  # two chains (even and odd ids) and random edges between them
    cross = rng.integers(0, n - 3, n // 4)
    a = np.r_[chains, cross]
    b = np.r_[chains + 2, cross + rng.choice([1, 3], n // 4)]
    perm = rng.permutation(n)
    longest = [0] * n
    for d, s in sorted(zip(b.tolist(), a.tolist())):
        longest[d] = max(longest[d], longest[s] + 1)
    assert max(longest) >= n // 2 - 1
    assert _levels_by_level(n, perm[a], perm[b]) is None
    got = topo_levels(n, perm[a], perm[b])
    assert got[perm].tolist() == longest
    assert _levels_by_level(n, perm[a], perm[b], probe=False)[perm].tolist() == longest
    wide_src, wide_dst = rng.integers(0, 2000, 3 * n), rng.integers(2000, n, 3 * n)  # 2 levels
    assert _levels_by_level(n, wide_src, wide_dst).max() == 1


def test_replay_equals_a_per_node_longest_path_on_a_random_dag(graph_path):
    rng = np.random.default_rng(7)
    n = 400
    src = rng.integers(0, n - 1, 1500)
    dst = src + 1 + rng.integers(0, 20, 1500)
    ok = dst < n
    src, dst = src[ok], dst[ok]
    dur = rng.integers(0, 1000, n)
    start = np.zeros(n, np.int64)
    for v in range(n):  # independent: a plain loop in index order (edges go forward)
        preds = src[dst == v]
        if preds.size:
            start[v] = max(int(start[u] + dur[u]) for u in preds) + 5
    g = StepGraph(rank=np.zeros(n, np.int32), lane=np.full(n, -1), category=np.zeros(n, np.int8), start=start,
                  dur=dur, src=src, dst=dst)
    assert (replay(g) == start).all()
    dur2 = dur // 2
    exp = np.zeros(n, np.int64)
    for v in range(n):
        preds = src[dst == v]
        if preds.size:
            exp[v] = max(int(exp[u] + dur2[u]) for u in preds) + 5
    assert (replay(g, dur2) == exp).all()
    last = int(np.argmax(start + dur))
    path = critical_path(g, start, dur, last)
    assert path[-1] == last and all(((src == a) & (dst == b)).any() for a, b in zip(path[:-1], path[1:]))


def test_replay_of_a_wide_random_dag_equals_a_per_node_loop(graph_path):
    """A graph over SMALL_GRAPH_NODES with many nodes per level: the plan (levels one vectorised pass each,
    in-edges grouped by level, each node's gap from its predecessors' latest end) and the level-by-level
    replay against a plain loop in id order, measured starts with gaps of their own kept, shuffled ids."""
    rng = np.random.default_rng(5)
    n = SMALL_GRAPH_NODES + 700
    a, b = rng.integers(0, n, 4 * n), rng.integers(0, n, 4 * n)
    keep = a != b
    src, dst = np.minimum(a, b)[keep], np.maximum(a, b)[keep]
    dur, gap = rng.integers(0, 1000, n), rng.integers(0, 50, n)
    dur2 = rng.integers(0, 1000, n)

    def loop(d: np.ndarray) -> np.ndarray:  # independent: in id order (edges go to higher ids)
        preds: list[list[int]] = [[] for _ in range(n)]
        for s, t in zip(src.tolist(), dst.tolist()):
            preds[t].append(s)
        out = [0] * n
        for v in range(n):
            if preds[v]:
                out[v] = max(out[u] + int(d[u]) for u in preds[v]) + int(gap[v])
        return np.array(out, np.int64)

    start = loop(dur)
    perm = rng.permutation(n)  # node v is perm[v] in the graph
    inv = np.argsort(perm)
    g = StepGraph(rank=np.zeros(n, np.int32), lane=np.full(n, -1), category=np.zeros(n, np.int8),
                  start=start[inv], dur=dur[inv], src=perm[src], dst=perm[dst])
    assert not g.plan.narrow
    assert (replay(g)[perm] == start).all()
    assert (replay(g, dur2[inv])[perm] == loop(dur2)).all()


def _profiler_steps_ns(path: Path) -> dict[int, int]:
    """ProfilerStep#N durations from the raw trace, µs text → exact ns."""
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh, parse_float=Decimal)
    out = {}
    for ev in doc.get("traceEvents", []):
        name = str(ev.get("name", ""))
        if ev.get("ph") == "X" and name.startswith("ProfilerStep#"):
            out[int(name.split("#")[1])] = int(Decimal(ev["dur"]) * 1000)
    return out


@pytest.mark.parametrize("fixture", ["pp_1f1b", "faults", "pp_interleaved"])
def test_unchanged_replay_reproduces_runtime_steps(fixture, tmp_path):
    from tracekit.flow import analyze_store
    from tracekit.parse.run import parse_run

    store = parse_run(REPO / "fixtures" / fixture, tmp_path / "store", progress=False).store
    doc = analyze_store(store)
    cp = doc["sections"]["critical_path"]
    raw = [_profiler_steps_ns(p) for p in sorted((REPO / "fixtures" / fixture).glob("rank*.pt.trace.json.gz"))]
    assert cp["steps"], cp
    for s in cp["steps"]:
        measured = max(r[s["step"]] for r in raw)
        assert abs(s["replayed_ns"] - measured) <= 0.02 * measured
        assert sum(s["composition"]["by_category"].values()) == s["composition"]["step_ns"]
    import jsonschema
    import reports

    doc = json.loads(json.dumps(doc, default=str))
    jsonschema.validate(doc, json.loads((REPO / "tracekit" / "schemas" / "analysis.schema.json").read_text()))
    html = reports.render_html(doc, None)
    assert 'id="critical-path"' in html and "critical path" in html
    if cp["whatif"]:
        assert "all of them together" in html


def test_whatif_cli_prints_prediction_and_exports_perfetto(tmp_path):
    from typer.testing import CliRunner

    from tracekit.cli.main import app
    from tracekit.assess.whatif import parse_bandwidth_gbps

    assert parse_bandwidth_gbps("150GB/s") == 150 and parse_bandwidth_gbps("800 Gbit/s") == 100
    with pytest.raises(ValueError):
        parse_bandwidth_gbps("fast")
    fixture = REPO / "fixtures" / "pp_imbalance"
    raw = [_profiler_steps_ns(p) for p in sorted(fixture.glob("rank*.pt.trace.json.gz"))]
    export = tmp_path / "step.json"
    res = CliRunner().invoke(app, ["whatif", str(fixture), "--stage-resplit", "--json", "--store",
                                   str(tmp_path / "store"), "--export", str(export)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    for s in out["steps"]:
        measured = max(r[s["step"]] for r in raw)
        assert s["measured_ns"] == measured == s["replayed_ns"]
        assert 0 < s["predicted_ns"] < measured  # the 5-layer stage's compute shrinks to the mean
    doc = json.loads(export.read_text())
    ev = doc["traceEvents"]
    crit = [e for e in ev if e["ph"] == "X" and e["args"]["critical_path"]]
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert crit and starts and starts.keys() == ends.keys()
    slices = {(e["pid"], e["tid"], e["ts"]) for e in crit}
    assert all((e["pid"], e["tid"], e["ts"]) in slices for e in list(starts.values()) + list(ends.values())
               if e["tid"] != 0)
    # the path's arrows cross ranks (stage 1 waits for stage 0's activations)
    assert {e["pid"] for e in crit} >= {0, 1}
    text = CliRunner().invoke(app, ["whatif", str(tmp_path / "store"), "--rank-compute", "0=0.5"]).output
    assert "predicted" in text and max(map(len, text.splitlines())) <= 80


def _gpu_steps_ns(path: Path) -> dict[int, int]:
    """Per ProfilerStep#N from the raw trace (Decimal µs → ns): device work launched inside the step's CPU
    interval (runtime calls by correlation), from its first start to the next step's first start (the
    last step: to its last end)."""
    with gzip.open(path, "rt") as fh:
        events = json.load(fh, parse_float=Decimal)["traceEvents"]
    ns = lambda v: int(Decimal(v) * 1000)  # noqa: E731
    steps = sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), int(e["name"].split("#")[1])) for e in events
                   if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))
    corr_step = {}
    for e in events:
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in ("cuda_runtime", "cuda_driver"):
            t = ns(e["ts"])
            for lo, hi, n in steps:
                if lo <= t < hi:
                    corr_step[(e.get("args") or {}).get("correlation")] = n
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for e in events:
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset"):
            n = corr_step.get((e.get("args") or {}).get("correlation"))
            if n is not None:
                first[n] = min(first.get(n, ns(e["ts"])), ns(e["ts"]))
                last[n] = max(last.get(n, 0), ns(e["ts"]) + ns(e["dur"]))
    order = sorted(first)
    return {n: (first[order[i + 1]] if i + 1 < len(order) else last[n]) - first[n] for i, n in enumerate(order)}


@pytest.mark.parametrize("trace", ["fixtures/gpu_h100/rank0.pt.trace.json.gz",
                                   "shared:hta_nccl_a100_rank0of2/nccl_data.json.gz"])
def test_unchanged_replay_reproduces_real_gpu_steps(trace, shared_traces, tmp_path):
    from tracekit.parse.run import parse_run
    from tracekit.assess.whatif import run_whatif

    path = shared_traces / trace.removeprefix("shared:") if trace.startswith("shared:") else REPO / trace
    store = parse_run(path, tmp_path / "store", progress=False, assume_rank=0).store
    out = run_whatif(store, [])
    raw = _gpu_steps_ns(path)
    assert out["steps"] and {s["step"] for s in out["steps"]} <= set(raw)
    for s in out["steps"]:
        assert abs(s["replayed_ns"] - raw[s["step"]]) <= 0.02 * raw[s["step"]], (s, raw)


def test_diff_marks_findings_absorbed_by_a_bigger_one_not_resolved():
    from tracekit.compare.diff import diff_analyses

    def run(exposed_ns: int, findings: list[dict]) -> dict:
        return {"schema": "tracekit.analysis/1", "inputs": {"ranks": [0, 1]},
                "ranks": [{"rank": r, "steps": 1, "step_ns": 100_000_000, "compute_ns": 1, "comm_ns": 1,
                           "exposed_comm_ns": 1, "other_ns": 0, "idle_ns": 0} for r in (0, 1)],
                "findings": findings,
                "sections": {"unoverlapped": {"by_rank_dim_op": [{"rank": 0, "dim": "dp", "op": "all_reduce",
                                                                   "instances": 3, "comm_ns": exposed_ns,
                                                                   "exposed_ns": exposed_ns}]},
                             "critical_path": {"measured_step_ns": 100_000_000,
                                               "all_fixes": {"saving_ns": 5_000_000, "step_ns": 95_000_000}}}}

    unoverlapped = {"kind": "unoverlapped_collective", "severity": "warning", "dim": "dp", "ranks": [0],
                    "summary": "all_reduce on dp is exposed", "evidence": {"op": "all_reduce"},
                    "est_saving_ns": 7_700_000}
    straggler = {"kind": "straggler", "severity": "critical", "dim": "dp", "ranks": [1], "summary": "rank 1 sleeps",
                 "evidence": {}, "est_saving_ns": 50_000_000}
    # the exposed time grew (7.7 -> 103 ms) while the finding left the list: absorbed, not resolved
    doc = diff_analyses(run(7_700_000, [unoverlapped]), run(103_000_000, [straggler]))
    (f,) = [f for f in doc["findings"] if f["kind"] == "unoverlapped_collective"]
    assert f["status"] == "absorbed" and doc["finding_counts"]["absorbed"] == 1
    # exposed time really fell: resolved
    doc = diff_analyses(run(7_700_000, [unoverlapped]), run(100_000, []))
    assert [f["status"] for f in doc["findings"]] == ["resolved"]
    # still listed but explained by another finding: absorbed
    explained = {**unoverlapped, "est_saving_ns": 0, "evidence": {"op": "all_reduce", "explained_by": "straggler"}}
    doc = diff_analyses(run(7_700_000, [unoverlapped]), run(9_000_000, [explained, straggler]))
    (f,) = [f for f in doc["findings"] if f["kind"] == "unoverlapped_collective"]
    assert f["status"] == "absorbed" and f["absorbed_by"] == "straggler"
    assert doc["replay"]["new"]["all_fixes_saving_ns"] == 5_000_000


def test_collective_advice_fits_the_evidence():
    from tracekit.findings.recommend import advise_collective

    # a single 84-byte DDP bucket that already overlaps: no "issue it asynchronously", fewer/larger messages
    ddp = advise_collective(dim="dp", op="all_reduce", overlap_ratio=0.55, bytes_p50=84, calls_per_step=1)
    assert "already" in ddp and "55%" in ddp and "larger buckets" in ddp and "asynchronously (" in ddp
    assert "lower-precision" not in ddp and "84 B" in ddp
    # large FSDP reduce-scatters that overlap: fewer bytes, not bigger buckets
    fsdp = advise_collective(dim="fsdp", op="reduce_scatter", overlap_ratio=0.3, bytes_p50=50 << 20)
    assert "already" in fsdp and "bf16" in fsdp and "bucket_cap_mb" not in fsdp
    # sequence-parallel activation collectives are not gradients
    sp = advise_collective(dim="tp", op="reduce_scatter", overlap_ratio=0.0, bytes_p50=8 << 20)
    assert "not gradients" in sp and "bucket" in sp and "do not apply" in sp
    # small messages anywhere: latency-bound
    small = advise_collective(dim="ep", op="all_to_all", overlap_ratio=0.0, bytes_p50=4096)
    assert "latency-bound" in small and "4 KiB" in small


def test_ranks_share_a_host_only_beyond_its_recorded_cpu_cores(tmp_path):
    """The manifest's host_cpus (keyed by the traces' host name) reaches the ranks table; CPU ranks count as
    sharing their host's cores (the shared-host replay rules) where the host holds more ranks than cores,
    or its cores are unknown, or (a busy process beside a core per rank) a rank's threads were recorded
    waiting for a core: `tracekit record`'s per-rank `cpu_window` (run-queue wait and CPU time over the
    profiled steps), its share wait / (wait + CPU) in `ranks.cpu_wait_share`."""
    import shutil

    from tracekit.derive.topology import CORE_WAIT_SHARE, cpu_hosts
    from tracekit.parse.run import parse_run

    def window(wait_ms: int, cpu_ms: int) -> dict:
        return {"wall_ns": 400_000_000, "cpu_ns": cpu_ms * 1_000_000, "wait_ns": wait_ms * 1_000_000, "threads": 5}

    src = REPO / "fixtures" / "faults"
    out, host = {}, None
    # (cores, each rank's (run-queue wait, CPU) ms over the window): 2 ranks on 2 cores waited 150 of 450
    # runnable ms (a third: one runnable thread too many) in "busy_beside", 4 of 404 ms in "quiet"
    cases = (("unknown", None, None), ("enough", 2, None), ("one_short", 1, None),
             ("quiet", 2, [(4, 400), (3, 380)]), ("busy_beside", 2, [(150, 300), (2, 300)]))
    for name, cores, waits in cases:
        run = tmp_path / name
        shutil.copytree(src, run)
        man = json.loads((run / "manifest.json").read_text())
        if cores is not None:
            man["host_cpus"] = {host: cores}
        if waits is not None:
            man["ranks"] = [{"rank": r, "host_cpus": cores, "cpu_window": window(*w), "profiled_steps": [3, 4]}
                            for r, w in enumerate(waits)]
        (run / "manifest.json").write_text(json.dumps(man))
        store = parse_run(run, tmp_path / f"{name}.store", progress=False).store
        rows = store.table("ranks", ["rank", "hostname", "host_cpus", "cpu_wait_share", "cpu_runnable_ns"]).to_pylist()
        host = rows[0]["hostname"]
        assert len(rows) == 2 and {r["hostname"] for r in rows} == {host}  # the fixture: 2 ranks, one machine
        assert [r["host_cpus"] for r in rows] == [cores, cores]
        assert [r["cpu_wait_share"] for r in rows] == ([None, None] if waits is None
                                                       else [pytest.approx(w / (w + c)) for w, c in waits])
        # runnable time (CPU + wait) per profiled step, ns: over the window's 2 steps
        assert [r["cpu_runnable_ns"] for r in rows] == ([None, None] if waits is None
                                                        else [(w + c) * 1_000_000 // 2 for w, c in waits])
        out[name] = cpu_hosts(store)
    assert 4 / 404 < CORE_WAIT_SHARE <= 150 / 450
    assert out == {"unknown": {0: host, 1: host}, "enough": {}, "one_short": {0: host, 1: host}, "quiet": {},
                   "busy_beside": {0: host, 1: host}}


def test_record_writes_host_cpus_and_the_run_queue_wait_of_the_profiled_steps(tmp_path):
    """`tracekit record`'s manifest: host name → the fewest cores any of its ranks may run on, and each
    rank's `cpu_window` as its record has it (record/cpu_share.py reads /proc/self/task/*/schedstat)."""
    from tracekit.record import cpu_share
    from tracekit.record.manifest import host_cpus

    recs = {0: {"host": "a", "host_cpus": 4}, 1: {"host": "a", "host_cpus": 2}, 2: {"host": "b", "host_cpus": 8},
            3: {"host": "c"}}
    assert host_cpus(recs) == {"a": 2, "b": 8}
    begin = {"wall_ns": 10, "cpu_ns": 100, "wait_ns": 5, "threads": 3}
    end = {"wall_ns": 1010, "cpu_ns": 700, "wait_ns": 305, "threads": 4}
    once = cpu_share.add_span(None, begin, end)
    assert once == {"wall_ns": 1000, "cpu_ns": 600, "wait_ns": 300, "threads": 4}
    assert cpu_share.add_span(once, begin, end) == {"wall_ns": 2000, "cpu_ns": 1200, "wait_ns": 600, "threads": 4}
    assert cpu_share.add_span(once, None, end) == once
    now = cpu_share.sample()
    if Path("/proc/self/task").is_dir():  # Linux: this process's threads, CPU time only grows
        assert now is not None and now["threads"] >= 1 and now["cpu_ns"] > 0
        sum(range(200_000))
        later = cpu_share.sample()
        assert later["cpu_ns"] >= now["cpu_ns"] and later["wait_ns"] >= now["wait_ns"]
    assert cpu_share.host_cpus() >= 1


def test_a_wait_in_a_collective_is_one_node_released_by_its_end(tmp_path):
    """On a CPU run with all_to_alls (fixtures/ep), a training thread's wait in a collective (the comm call,
    the op it waits in, their parents' own time) is one zero-length node, never a chain whose later nodes
    carry the earlier ones' waiting as a fixed gap no fix could release."""
    from tracekit.parse.run import parse_run
    from tracekit.assess.whatif import run_whatif

    store = parse_run(REPO / "fixtures" / "ep", tmp_path / "store", progress=False).store
    res = run_whatif(store, [])["results"]
    assert res and all(abs(r.replayed_ns - r.measured_ns) <= 0.02 * r.measured_ns for r in res)
    g = res[0].graph
    thread = np.flatnonzero(np.array(["training thread" in n for n in g.lane_names])[np.maximum(g.lane, 0)] & (g.lane >= 0))
    thread = thread[np.lexsort((g.start[thread], g.lane[thread]))]
    waits = g.category[thread] == Category.WAIT
    same_lane = g.lane[thread][1:] == g.lane[thread][:-1]
    assert waits.sum() > 0
    assert not (waits[1:] & waits[:-1] & same_lane).any()


def test_a_lone_rank_with_unknown_cores_shares_them_only_where_untraced_ranks_may_sit_beside_it(tmp_path):
    """Cores unknown: a host of several CPU ranks shares them; a complete run's lone rank on its host shares with no
    peer (a busy neighbour would show as its recorded wait for a core); a partial run's lone rank may have
    untraced peers on its host, so it still counts as sharing."""
    from tests.analyze.analyze_builders import build_store

    from tracekit.derive.topology import cpu_hosts

    def hosts_of(name: str, hostnames: tuple[str, ...], world: int) -> dict[int, str]:
        ranks = [{"rank": r, "world_size": world, "hostname": h, "trace_kind": "cpu", "first_ts": 0, "last_ts": 1}
                 for r, h in enumerate(hostnames)]
        return cpu_hosts(build_store(tmp_path / name, {"ranks": ranks}))

    assert hosts_of("apart", ("a", "b"), 2) == {}
    assert hosts_of("together", ("a", "a"), 2) == {0: "a", 1: "a"}
    assert hosts_of("mixed", ("a", "a", "b"), 3) == {0: "a", 1: "a"}
    assert hosts_of("partial", ("a", "b"), 8) == {0: "a", 1: "b"}


def test_edges_are_held_as_int32_node_ids_with_every_edge_kept():
    """A graph's edge ids are int32 below 2**31 nodes (half an int64 edge array: 63 MB per array of a 1,024-rank
    graph), the edges given plus one pinned start node per rank before each lane's first node."""
    g = two_rank_allreduce(c0=10_000, c1=25_000, xfer=3_000, after=4_000)
    given = {(0, 1), (1, 8), (5, 8), (8, 2), (8, 6), (1, 2), (5, 6), (2, 3), (1, 3), (4, 5), (6, 7), (5, 7)}
    assert g.src.dtype == g.dst.dtype == np.int32
    edges = set(zip(g.src.tolist(), g.dst.tolist()))
    assert given <= edges
    starts = set(range(9, g.num_nodes))  # the start nodes, appended after the 9 built ones
    first_on_lane = {0: [0, 2], 1: [4, 6]}  # per rank: the first node of each of its lanes (from the node list)
    added = edges - given
    assert {d for _, d in added} == {0, 2, 4, 6} and {s for s, _ in added} == starts
    for s, d in added:
        assert int(g.rank[s]) == next(r for r, firsts in first_on_lane.items() if d in firsts)


def test_zero_backed_holds_the_same_values():
    from tracekit.whatif.graph import zero_backed

    rng = np.random.default_rng(3)
    x = np.zeros(300_000, np.int64)
    x[rng.integers(0, x.size, 50)] = rng.integers(-10**12, 10**12, 50)
    out = zero_backed(x)
    assert out.dtype == np.int64 and out.tolist() == x.tolist()


def test_the_plans_in_edges_are_grouped_by_level_order_in_edge_order():
    """The plan's in-edges (what each level's replay pass reads): node by node in level order, each node's
    in-edges in the order the edges were given, as positions in that order; against a plain loop over the
    edges and the levels (topo_levels' longest chain, checked on its own above)."""
    rng = np.random.default_rng(11)
    n = SMALL_GRAPH_NODES + 500
    a, b = rng.integers(0, n, 3 * n), rng.integers(0, n, 3 * n)
    keep = a != b
    src, dst = np.minimum(a, b)[keep], np.maximum(a, b)[keep]
    perm = rng.permutation(n)
    src, dst = perm[src].astype(np.int32), perm[dst].astype(np.int32)
    g = StepGraph(rank=np.zeros(n, np.int32), lane=np.full(n, -1), category=np.zeros(n, np.int8),
                  start=np.zeros(n, np.int64), dur=np.ones(n, np.int64), src=src, dst=dst)
    plan = g.plan
    level = topo_levels(n, src, dst).tolist()
    order = sorted(range(n), key=lambda v: (level[v], v))  # independent: level, then id
    assert plan.order.tolist() == order
    pos = {v: p for p, v in enumerate(order)}
    preds: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(src.tolist(), dst.tolist()):
        preds[d].append(pos[s])
    from tracekit.whatif.graph import _level_edges

    edge_src_pos, edge_bounds, seg_starts = _level_edges(plan)  # made when numpy's replay first needs them
    assert plan.edge_src_pos is edge_src_pos
    assert edge_src_pos.tolist() == [p for v in order for p in preds[v]]
    nlev = max(level) + 1
    for i in range(1, nlev):  # per level: where each of its nodes' in-edges begin, from the level's first edge
        nodes = [v for v in order if level[v] == i]
        cut = np.cumsum([0] + [len(preds[v]) for v in nodes])[:-1]
        assert plan.seg_starts[i - 1].tolist() == cut.tolist()
        assert plan.edge_bounds[i + 1] - plan.edge_bounds[i] == sum(len(preds[v]) for v in nodes)


def test_the_steps_and_the_whatifs_share_one_unchanged_replay():
    """replay_steps_of's starts are the replay of the unchanged graph, and replay_changed starts from that same
    (read-only) array rather than a second full replay of the graph."""
    from tracekit.whatif.graph import _base_replay
    from tracekit.whatif.replay import replay_steps_of

    g = two_rank_allreduce(c0=10_000, c1=25_000, xfer=3_000, after=4_000)
    res = replay_steps_of(g)
    assert res[0].start.tolist() == replay(g).tolist()
    assert _base_replay(g)[0] is res[0].start and not res[0].start.flags.writeable
