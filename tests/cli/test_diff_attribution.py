"""The explained diff (tracekit.compare.attribution) and `tracekit check --expect`.

- Hand-built graphs: Shapley parts checked against arithmetic done here on the longest path.
- A simulated pair (`tracekit simulate`, deterministic) with one slow GPU: the measured step change
  computed here from the raw traces (plain gzip/json: each rank's step windows from its kernels, launched
  inside ProfilerStep#N, to the next step's first kernel), the parts on the compute causes and the slow rank.
- Runtime pairs (python -m instrumented_runtime, 2 ranks, simulated device time so a 2-core box shows
  the fault rather than its own contention), recorded back to back once for the module: a slower rank, a
  slower tp link, more micro-batches (1 -> 4 at pp 2: bubble 1/2 -> 1/5); each puts >= 80% of the measured step change on its cause and the
  parts sum to the measured change (slowest rank's step, mean over the profiled steps, computed here from the
  raw traces) within 2%.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.conftest import quiet_section
from tracekit.cli.main import app
from tracekit.compare.attribution import attribute, attribute_stores, op_family, shapley
from tracekit.compare.expect import check_expectations, load_expectations
from tracekit.whatif.build import infer_stream_waits
from tracekit.whatif.graph import Category, StepGraph

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


# --- hand-built graphs --------------------------------------------------------------------------------

def _graph(c0: int, c1: int, t: int, opt: int) -> StepGraph:
    """Two ranks: compute (aten::mm) on each, a dp all-reduce (arrivals, sync, transfer of length t on
    each rank), then an optimizer op of length opt on each rank. Lanes: thread per rank, comm lane."""
    # nodes: 0 mm r0, 1 mm r1, 2 arrive r0, 3 arrive r1, 4 sync, 5 xfer r0, 6 xfer r1, 7 opt r0, 8 opt r1
    rank = np.array([0, 1, 0, 1, -1, 0, 1, 0, 1], np.int32)
    lane = np.array([0, 1, 0, 1, -1, 2, 3, 0, 1], np.int64)
    cat = np.array([Category.COMPUTE, Category.COMPUTE, Category.MARK, Category.MARK, Category.MARK,
                    Category.TRANSFER, Category.TRANSFER, Category.COMPUTE, Category.COMPUTE], np.int8)
    last = max(c0, c1)
    start = np.array([0, 0, c0, c1, last, last, last, last + t, last + t], np.int64)
    dur = np.array([c0, c1, 0, 0, 0, t, t, opt, opt], np.int64)
    src = np.array([0, 1, 2, 3, 4, 4, 2, 3, 5, 6])
    dst = np.array([2, 3, 4, 4, 5, 6, 5, 6, 7, 8])
    return StepGraph(rank=rank, lane=lane, category=cat, start=start, dur=dur, src=src, dst=dst,
                     dim=np.array([-1, -1, 0, 0, -1, 0, 0, -1, -1], np.int32),
                     inst=np.array([-1, -1, 0, 0, 0, 0, 0, -1, -1], np.int32),
                     name=["aten::mm", "aten::mm", "arrive", "arrive", "sync", "all_reduce dp", "all_reduce dp",
                           "Optimizer.step#AdamW.step", "Optimizer.step#AdamW.step"],
                     lane_names=["rank0 thread", "rank1 thread", "rank0 comm", "rank1 comm"], dims=["dp"],
                     terminal=np.array([1, 1, 0, 0, 0, 1, 1, 1, 1], bool))


def test_attribution_exact_on_a_hand_built_pair() -> None:
    base, new = _graph(10_000, 10_000, 5_000, 2_000), _graph(10_000, 30_000, 8_000, 3_000)
    # step = max(c0, c1) + t + opt (the longest path), for every mix of old and new durations
    v = lambda c1, t, o: max(10_000, c1) + t + o  # noqa: E731
    assert v(10_000, 5_000, 2_000) == 17_000 and v(30_000, 8_000, 3_000) == 41_000
    # players: compute:gemm (c1), comm:dp (t), compute:optimizer (opt): additive here, so each part is its own change
    a = attribute(base, new)
    parts = {p["cause"]: p["delta_ns"] for p in a["parts"]}
    assert parts["compute:gemm"] == 20_000
    assert parts["comm:dp"] == 3_000
    assert parts["compute:optimizer"] == 1_000
    assert parts["schedule"] == 0
    assert a["measured"]["delta_ns"] == 24_000 and a["explained_ns"] == 24_000 and a["residual_ns"] == 0
    assert {r["rank"]: r["delta_ns"] for r in a["by_rank"]}[1] > 0


def test_attribution_splits_an_interaction_evenly() -> None:
    """Both ranks slower, the step follows the slower one: max() makes an interaction, Shapley splits it."""
    base = _graph(10_000, 10_000, 5_000, 2_000)
    new = _graph(16_000, 14_000, 5_000, 2_000)
    a = attribute(base, new)
    by_rank = {r["rank"]: r["delta_ns"] for r in a["by_rank"]}
    # v({}) = 10, v({0}) = 16, v({1}) = 14, v({0,1}) = 16 (µs): φ0 = ((16-10) + (16-14)) / 2 = 4, φ1 = ((14-10) + 0) / 2 = 2
    assert by_rank == {0: 4_000, 1: 2_000}
    assert {p["cause"]: p["delta_ns"] for p in a["parts"]}["compute:gemm"] == 6_000


def _launch_bound(comm: int) -> StepGraph:
    """One rank: a SendRecv of length `comm` on the comm stream from 0; a launch on the host thread from 0
    to 5,010 ns, its kernel (1,000 ns) on the compute stream right after it: launch-bound."""
    return StepGraph(rank=np.zeros(3, np.int32), lane=np.array([2, 0, 1]),
                     category=np.array([Category.TRANSFER, Category.HOST, Category.COMPUTE], np.int8),
                     start=np.array([0, 0, 5_010], np.int64), dur=np.array([comm, 5_010, 1_000], np.int64),
                     src=np.array([1]), dst=np.array([2]), name=["ncclKernel_SendRecv", "cudaLaunchKernel", "aten::mm"],
                     lane_names=["rank0 host thread 1", "rank0 stream 7", "rank0 stream 21"])


def test_attribution_leaves_out_assumed_edges() -> None:
    """The builder keeps a launch-bound kernel after the other stream's op that ended just before it (an
    edge the trace does not show). In the new run that op is longer and the kernel ran beside it: the
    change is the SendRecv's own, none of it the graph's shape."""
    base, new = _launch_bound(5_000), _launch_bound(9_000)
    infer_stream_waits(base)
    infer_stream_waits(new)
    assert base.assumed_edges.tolist() == [[0, 2]] and new.assumed_edges.tolist() == []
    # step: from 0 to the last end; base max(5000, 6010) = 6010, new max(9000, 6010) = 9000
    a = attribute(base, new)
    assert a["measured"]["delta_ns"] == 2_990
    parts = {p["cause"]: p["delta_ns"] for p in a["parts"]}
    # with the assumed edge the base graph at the new durations would run the kernel after the SendRecv
    # (10,000 ns): a schedule part of -1,000 that neither run shows
    assert parts == {"comm:unknown": 2_990, "schedule": 0}


def test_shapley_sums_exactly_with_sampled_orders() -> None:
    players = [f"p{i}" for i in range(10)]
    w = {p: i + 1 for i, p in enumerate(players)}
    value = lambda s: float(sum(w[p] for p in s) + (5 if {"p0", "p9"} <= s else 0))  # noqa: E731
    parts, method = shapley(players, value)
    assert "orders" in method
    assert sum(parts.values()) == pytest.approx(value(frozenset(players)) - value(frozenset()), abs=1e-9)
    assert parts["p3"] == pytest.approx(4.0)  # no interaction: its own weight in every order


def test_op_family() -> None:
    assert op_family("aten::mm") == "gemm" and op_family("nvjet_tst_192x192_64x3_2x1_v_bz_coopB_TNT") == "gemm"
    assert op_family("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>") == "attention"
    assert op_family("aten::native_layer_norm") == "norm"
    assert op_family("Optimizer.step#AdamW.step") == "optimizer"
    assert op_family("void at::native::vectorized_elementwise_kernel<4>") == "other"


# --- raw-trace arithmetic (independent of tracekit) ---------------------------------------------------

def _events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


def _ns(us: float) -> int:
    return int(round(us * 1000))


def gpu_step_ns(path: Path) -> dict[int, int]:
    """Per profiled step of one GPU rank: its first kernel start to the next step's first kernel start (the
    last step: to its last kernel end); a kernel is in the step whose ProfilerStep#N holds its launch."""
    ev = _events(path)
    steps = sorted((_ns(e["ts"]), _ns(e["ts"] + e["dur"]), int(e["name"].split("#")[1])) for e in ev
                   if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))
    launch = {e["args"]["correlation"]: _ns(e["ts"]) for e in ev
              if e.get("cat") == "cuda_runtime" and "correlation" in (e.get("args") or {})}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for e in ev:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset") or e.get("ph") != "X":
            continue
        t = launch.get((e.get("args") or {}).get("correlation"))
        st = next((s for a, b, s in steps if t is not None and a <= t <= b), None)
        if st is None:
            continue
        first[st] = min(first.get(st, 1 << 62), _ns(e["ts"]))
        last[st] = max(last.get(st, 0), _ns(e["ts"] + e["dur"]))
    order = sorted(first)
    return {s: (first[order[i + 1]] if i + 1 < len(order) else last[s]) - first[s] for i, s in enumerate(order)}


def cpu_step_ns(path: Path) -> dict[int, int]:
    """Per profiled step of one CPU rank: the ProfilerStep#N interval to the next step's start (last: its end)."""
    steps = sorted((_ns(e["ts"]), _ns(e["ts"] + e["dur"]), int(e["name"].split("#")[1])) for e in _events(path)
                   if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))
    return {s: (steps[i + 1][0] if i + 1 < len(steps) else b) - a for i, (a, b, s) in enumerate(steps)}


def run_step_ns(trace_dir: Path, per_rank, last: int, pattern: str = "rank*.pt.trace.json*") -> float:
    """The run's step: the slowest rank's time of each of the last `last` profiled steps, mean over them."""
    ranks = [per_rank(p) for p in sorted(trace_dir.glob(pattern))]
    steps = sorted(set.intersection(*(set(r) for r in ranks)))[-last:]
    return float(np.mean([max(r[s] for r in ranks) for s in steps]))


# --- simulated pair -----------------------------------------------------------------------------------

def _parse(trace_dir: Path, store_dir: Path):
    from tracekit.parse.run import parse_run
    from tracekit.tables.store import RunStore

    parse_run(trace_dir, store_dir, progress=False)
    return RunStore(store_dir)


def _simulate(out: Path, *faults: str) -> Path:
    args = ["simulate", "--dp", "4", "--model", "tiny", "--cluster", "1x8-h100", "--steps", "3", "--seed", "0",
            "--out", str(out)]
    for f in faults:
        args += ["--fault", f]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return out


def test_attribution_on_a_simulated_slow_gpu(tmp_path: Path) -> None:
    base = _simulate(tmp_path / "base")
    new = _simulate(tmp_path / "new", "slow-gpu=1:1.5")
    a = attribute_stores(_parse(base, tmp_path / "sb"), _parse(new, tmp_path / "sn"))
    assert a is not None
    expected = run_step_ns(new, gpu_step_ns, 3) - run_step_ns(base, gpu_step_ns, 3)
    assert expected > 0
    assert a["measured"]["delta_ns"] == pytest.approx(expected, rel=1e-6, abs=10)
    assert a["explained_ns"] == pytest.approx(expected, rel=1e-6, abs=10)
    groups = {g["group"]: g["delta_ns"] for g in a["groups"]}
    # only the slow GPU's kernels changed: the whole change is its compute, on rank 1
    assert groups["compute"] == pytest.approx(expected, rel=1e-6, abs=10)
    by_rank = {r["rank"]: r["delta_ns"] for r in a["by_rank"]}
    assert by_rank[1] == pytest.approx(expected, rel=1e-6, abs=10)
    assert all(abs(by_rank[r]) <= 10 for r in (0, 2, 3))
    # the CLI carries it into diff.json, the Markdown summary and the HTML report
    res = runner.invoke(app, ["diff", str(base), str(new), "--out", str(tmp_path / "d"), "--quiet"])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "d" / "diff.json").read_text())
    assert doc["attribution"]["parts"] == a["parts"] and doc["attribution"]["residual_ns"] == 0
    md = (tmp_path / "d" / "diff.md").read_text()
    assert "| cause of the step change | ms/step | share |" in md
    top = a["parts"][0]
    assert f"| compute: {top['cause'].split(':')[1]} ops | +{top['delta_ns'] / 1e6:,.2f} ms |" in md
    html = (tmp_path / "d" / "diff.html").read_text()
    assert '<section id="attribution">' in html and "By rank" in html


# --- check --expect -----------------------------------------------------------------------------------

def _analysis_doc(step: int, exposed: int, bubble: float | None = None, peak: int | None = None) -> dict:
    secs: dict = {}
    if bubble is not None:
        secs["pipeline"] = {"measured_bubble": bubble}
    if peak is not None:
        secs["memory"] = {"ranks": [{"rank": 0, "peak_allocated": peak}]}
    return {"schema": "tracekit.analysis/1", "inputs": {"ranks": [0], "skipped": []}, "findings": [], "sections": secs,
            "ranks": [{"rank": 0, "steps": 2, "step_ns": 2 * step, "exposed_comm_ns": 2 * exposed, "compute_ns": 0,
                       "comm_ns": 0, "other_ns": 0, "idle_ns": 0, "overlap_ratio": None, "bound": "compute"}]}


def test_check_expect_against_a_previous_run(tmp_path: Path) -> None:
    prev = tmp_path / "prev.json"
    prev.write_text(json.dumps(_analysis_doc(100_000_000, 10_000_000, 0.2, 1 << 30)))
    exp, src = load_expectations(prev)
    assert exp == {"step_ns": 100_000_000, "exposed_comm_ns": 10_000_000, "bubble": 0.2, "peak_memory_bytes": 1 << 30}
    # tolerance 10%: step at most 110 ms; exposed comm at most max(11 ms, 10 ms + 10% of the 100 ms step) = 20 ms;
    # bubble at most 0.2 + 0.1; memory at most 1.1 GiB
    run = _analysis_doc(109_000_000, 25_000_000, 0.29, (1 << 30) + (1 << 26))
    res = {r.name: r for r in check_expectations(run, exp, 0.1, src)}
    assert not res["expect_step_ns"].breached           # 109 <= 110 ms
    assert res["expect_exposed_comm_ns"].breached        # 25 > max(11, 10 + 10) ms
    assert not res["expect_bubble"].breached             # 0.29 <= 0.2 + 0.1
    assert not res["expect_peak_memory_bytes"].breached  # 1.0625 GiB <= 1.1 GiB
    res = {r.name: r for r in check_expectations(_analysis_doc(111_000_000, 19_000_000, 0.31), exp, 0.1)}
    assert res["expect_step_ns"].breached and not res["expect_exposed_comm_ns"].breached and res["expect_bubble"].breached
    assert not res["expect_peak_memory_bytes"].measured  # the run has no memory numbers: reported, not failed
    # the CLI: exit 1 on a miss, 0 when met, 2 on an unreadable file
    cur = tmp_path / "cur.json"
    cur.write_text(json.dumps(_analysis_doc(111_000_000, 10_000_000)))
    out = runner.invoke(app, ["check", str(cur), "--expect", str(prev)])
    assert out.exit_code == 1 and "FAIL expect step_ns" in out.output
    cur.write_text(json.dumps(_analysis_doc(101_000_000, 10_000_000)))
    assert runner.invoke(app, ["check", str(cur), "--expect", str(prev)]).exit_code == 0
    assert runner.invoke(app, ["check", str(cur), "--expect", str(prev), "--tolerance", "0"]).exit_code == 1
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert runner.invoke(app, ["check", str(cur), "--expect", str(bad)]).exit_code == 2


def test_check_expect_against_advice(tmp_path: Path) -> None:
    cand = lambda step, exposed, peak: {"predicted_step_ns": step, "peak_memory_bytes": peak, "changes": ["tp 2 -> 4"],  # noqa: E731
                                        "breakdown_ns": {"compute": step - exposed, "exposed_comm": exposed, "idle": 0}}
    advice = tmp_path / "advice.json"
    advice.write_text(json.dumps({"schema": "tracekit.advice/1", "ranked": [cand(80_000_000, 5_000_000, 1 << 30),
                                                                           cand(90_000_000, 2_000_000, 1 << 29)]}))
    exp, src = load_expectations(advice)
    assert exp["step_ns"] == 80_000_000 and exp["exposed_comm_ns"] == 5_000_000 and exp["bubble"] is None
    assert "top-ranked" in src
    exp1, _ = load_expectations(advice, 1)
    assert exp1["step_ns"] == 90_000_000 and exp1["peak_memory_bytes"] == 1 << 29
    run = _analysis_doc(85_000_000, 4_000_000)
    res = {r.name: r for r in check_expectations(run, exp, 0.05)}
    assert res["expect_step_ns"].breached            # 85 > 80 ms × 1.05 = 84 ms
    assert not res["expect_exposed_comm_ns"].breached  # 4 ms <= 5 ms
    assert not res["expect_peak_memory_bytes"].measured
    assert not {r.name: r for r in check_expectations(run, exp, 0.07)}["expect_step_ns"].breached  # 85 <= 85.6 ms


# --- runtime pairs ------------------------------------------------------------------------------------

SLOW_LINK_S = 0.01
RUNTIME = ["--steps", "5", "--profile-steps", "3", "--moe-every", "0", "--device-us-per-token", "200",
           "--global-batch-size", "8", "--seq-len", "32"]
PAIRS = {"slow_rank": (["--dp", "2"], ["--dp", "2", "--slow-rank", "1", "--slow-factor", "2"]),
         "slow_link": (["--tp", "2"], ["--tp", "2", "--slow-link", f"tp={SLOW_LINK_S}"]),
         "microbatches": (["--pp", "2", "--microbatches", "1"], ["--pp", "2", "--microbatches", "4"])}


def _slept_per_step(run: Path, pg_desc: str, delay_s: float) -> float:
    """The slow-link fault's sleep per profiled step: ops logged on `pg_desc` in the profiled steps (rank 0's
    comms log) × the delay, over the steps."""
    steps = set(json.loads((run / "manifest.json").read_text())["profiled_steps"])
    entries = [json.loads(x) for x in (run / "comms.rank0.jsonl").read_text().splitlines()]
    ops = sum(1 for e in entries if e.get("step") in steps and pg_desc in e.get("process_group", []))
    return ops * delay_s * 1e9 / len(steps)


def _record_pairs(root: Path) -> dict[str, tuple[Path, Path, dict]]:
    """Each pair's runs back to back, all six with the box alone (`quiet_section`: the other test worker's
    jobs beside them slow the ranks unevenly); their parse and attribution after, beside other tests."""
    import os

    env = dict(os.environ, PYTHONPATH=str(REPO))
    recorded = {}
    with quiet_section():
        for name, (base_args, new_args) in PAIRS.items():
            for side, args in (("base", base_args), ("new", new_args)):  # back to back
                d = root / f"{name}_{side}"
                res = subprocess.run([sys.executable, "-m", "instrumented_runtime", *RUNTIME, *args, "--out", str(d)],
                                     cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
                assert res.returncode == 0, res.stderr[-2000:]
                recorded.setdefault(name, []).append(d)
    out = {}
    for name, (base, new) in recorded.items():
        a = attribute_stores(_parse(base, root / f"{name}_sb"), _parse(new, root / f"{name}_sn"))
        out[name] = (base, new, a)
    return out


def _check_pair(name: str, pair: tuple[Path, Path, dict], cause: str, cause_ns, injected_ns: float | None = None) -> list[str]:
    """What is wrong with the pair's attribution ([] when nothing). The cause's part is judged against the
    measured change, or against `injected_ns` where the injected change can be counted from the run's own
    files: a busy box stretches the new run's host gaps too, which the attribution rightly calls `host`."""
    base, new, a = pair
    base_ns = run_step_ns(base, cpu_step_ns, 3)
    measured = run_step_ns(new, cpu_step_ns, 3) - base_ns
    whole = injected_ns if injected_ns is not None else measured
    share = cause_ns(a) / whole if whole else 0.0
    parts = sum(p["delta_ns"] for p in a["parts"])
    print(f"{name}: step {base_ns / 1e6:.1f} ms {measured / 1e6:+.1f} ms; {share:.1%} on {cause}; "
          f"parts sum {parts / 1e6:+.2f} ms ({(parts - measured) / measured:+.2%} off)")
    errors = []
    if abs(measured) <= 0.05 * base_ns:
        errors.append(f"{name}: the injected change does not show in the steps ({measured / 1e6:+.1f} ms)")
    if a["measured"]["delta_ns"] != pytest.approx(measured, rel=0.02):
        errors.append(f"{name}: attribution's measured change {a['measured']['delta_ns']} vs {measured:.0f} from the traces")
    if parts != pytest.approx(measured, rel=0.02):
        errors.append(f"{name}: parts sum to {parts} vs measured {measured:.0f}")
    if share < 0.8 or (injected_ns is not None and share > 1.5):
        errors.append(f"{name}: {share:.1%} on {cause}: {json.dumps(a['parts'] + a['by_rank'])}")
    return errors


@pytest.mark.slow
def test_runtime_pairs_are_explained(tmp_path: Path) -> None:
    """One test (so xdist records the pairs once): 6 runs back to back, ~2 min on the loaded 2-core box."""
    pairs = _record_pairs(tmp_path)
    by_rank = lambda a: {r["rank"]: r["delta_ns"] for r in a["by_rank"]}[1]  # noqa: E731
    group = lambda g: lambda a: {x["group"]: x["delta_ns"] for x in a["groups"]}[g]  # noqa: E731
    part = lambda c: lambda a: {p["cause"]: p["delta_ns"] for p in a["parts"]}[c]  # noqa: E731
    errors = (_check_pair("slow rank", pairs["slow_rank"], "rank 1's durations", by_rank)
              + _check_pair("slow rank", pairs["slow_rank"], "compute", group("compute"))
              + _check_pair("slow tp link", pairs["slow_link"], "comm:tp of the injected delay", part("comm:tp"),
                            _slept_per_step(pairs["slow_link"][1], "mesh_tp", SLOW_LINK_S))
              + _check_pair("more micro-batches", pairs["microbatches"], "schedule", part("schedule")))
    assert not errors, "\n".join(errors)


# --- papercut: a replayed saving next to a text that states another -----------------------------------

def test_diff_markdown_says_which_saving_it_shows() -> None:
    from reports import render_diff_markdown
    from tracekit.compare.diff import diff_analyses

    def doc(findings: list[dict]) -> dict:
        d = _analysis_doc(100_000_000, 10_000_000)
        d["findings"] = findings
        return d

    f = {"kind": "low_bus_bandwidth", "severity": "warning", "ranks": [0, 1], "dim": "tp",
         "summary": "tp collectives reach 1.000 GB/s ...; 9.0 ms lost per step, 4.3 ms of it exposed",
         "evidence": {"op": "all_reduce", "closed_form_saving_ns": 4_300_000, "replayed_saving_ns": 22_500_000},
         "recommendation": "", "est_saving_ns": 22_500_000}
    d = diff_analyses(doc([]), doc([f]))
    row = d["findings"][0]
    assert row["new_closed_form_saving_ns"] == 4_300_000 and row["new_replayed_saving_ns"] == 22_500_000
    md = render_diff_markdown(d)
    assert "– → 22.50 ms (replayed; the text's estimate 4.30 ms)" in md


def test_bandwidth_fix_moves_bytes_faster_only() -> None:
    """`dim_bandwidth` at B GB/s: a transfer of S bus bytes takes at most S / B; one already faster and one
    under MIN_JUDGED_BYTES (latency-bound) keep their time."""
    from tracekit.whatif.fixes import Fix, RunFacts, apply_fixes
    from tracekit.whatif.graph import InstInfo

    g = _graph(10_000, 10_000, 50_000, 2_000)
    # two members of one all_reduce over n=2 (bus factor 2(n-1)/n = 1): 1 MB at 100 GB/s = 10 µs
    g.inst_info = InstInfo(key=np.array(["pg#0"], object), pg_name=np.array(["pg"], object),
                           dim=np.array(["dp"], object), op=np.array(["all_reduce"], object),
                           bytes=np.array([1e6]), n=np.array([2]), io=[[]])
    dur, _ = apply_fixes(g, [Fix("dim_bandwidth", dim="dp", value=100.0)], RunFacts())
    assert dur[5] == dur[6] == 10_000
    dur, _ = apply_fixes(g, [Fix("dim_bandwidth", dim="dp", value=1.0)], RunFacts())  # 1 ms at 1 GB/s: slower
    assert dur[5] == dur[6] == 50_000
    g.inst_info.bytes[0] = 1000.0  # latency-bound
    dur, _ = apply_fixes(g, [Fix("dim_bandwidth", dim="dp", value=100.0)], RunFacts())
    assert dur[5] == dur[6] == 50_000


# --- real traces --------------------------------------------------------------------------------------

SHARED = Path(__import__("os").environ.get("TRACEKIT_SHARED_TRACES", "/work/shared/traces"))
needs_shared = pytest.mark.skipif(not (SHARED / "hta_trace_diff_control").is_dir(), reason="shared traces not present")


@pytest.fixture(scope="module")
def hta_pair(tmp_path_factory: pytest.TempPathFactory):
    """HTA's trace-diff pair (one GPU rank each, recorded on rank 3 and on rank 1, thread ids and stream
    numbers differ), parsed once."""
    root = tmp_path_factory.mktemp("hta_pair")
    return (_parse(SHARED / "hta_trace_diff_control", root / "control"),
            _parse(SHARED / "hta_trace_diff_test", root / "test"))


@needs_shared
def test_attribution_on_hta_trace_diff_pair(hta_pair) -> None:
    control, test = hta_pair
    a = attribute_stores(control, test)
    assert a is not None
    expected = (run_step_ns(SHARED / "hta_trace_diff_test", gpu_step_ns, 8, "*.json.gz")
                - run_step_ns(SHARED / "hta_trace_diff_control", gpu_step_ns, 8, "*.json.gz"))
    assert expected > 20_000_000  # the test run is slower: ~+47 ms per step on the raw traces
    assert a["measured"]["delta_ns"] == pytest.approx(expected, rel=0.02)
    assert sum(p["delta_ns"] for p in a["parts"]) == pytest.approx(expected, rel=0.02)
    # the two runs' nodes are matched despite other ranks, thread ids and stream numbers: most of the change
    # is carried by durations, not left to the shape of the graph
    parts = {p["cause"]: p["delta_ns"] for p in a["parts"]}
    assert abs(parts["schedule"]) < 0.2 * expected


@needs_shared
def test_attribution_of_a_real_trace_against_itself_is_zero(hta_pair) -> None:
    control, _ = hta_pair
    a = attribute_stores(control, control)
    assert a["measured"]["delta_ns"] == 0 and a["residual_ns"] == 0
    assert all(p["delta_ns"] == 0 for p in a["parts"]) and all(r["delta_ns"] == 0 for r in a["by_rank"])


def test_check_expect_picks_the_advice_for_the_runs_layout(tmp_path: Path) -> None:
    def cand(step: int, **layout: int) -> dict:
        return {"predicted_step_ns": step, "peak_memory_bytes": 1 << 30, "changes": [], "layout": layout,
                "breakdown_ns": {"compute": step, "exposed_comm": 0, "idle": 0}}

    advice = tmp_path / "advice.json"
    advice.write_text(json.dumps({"schema": "tracekit.advice/1", "current": cand(120_000_000, dp=4),
                                  "ranked": [cand(80_000_000, pp=2, dp=2), cand(90_000_000, tp=2, dp=2)]}))
    run = _analysis_doc(100_000_000, 0)
    run["sections"]["layout"] = {"mesh_shape": {"dp": 2, "tp": 2, "pp": 1, "cp": 1, "ep": 1}}
    exp, src = load_expectations(advice, run=run)
    assert exp["step_ns"] == 90_000_000 and "#1" in src            # the ranked layout the run has
    run["sections"]["layout"] = {"mesh_shape": {"dp": 4}}
    exp, src = load_expectations(advice, run=run)
    assert exp["step_ns"] == 120_000_000 and "current" in src     # the prediction for the run's own layout
    run["sections"]["layout"] = {"mesh_shape": {"dp": 8}}
    exp, src = load_expectations(advice, run=run)
    assert exp["step_ns"] == 80_000_000 and "none of the advice's" in src
    assert load_expectations(advice, 1, run)[0]["step_ns"] == 90_000_000
