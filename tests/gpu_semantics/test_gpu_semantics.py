"""tracekit on multi-rank GPU traces whose answers are known exactly (generator.py).

Every expected number is computed here from the generator's own intervals (`Trace.kernels`,
`Trace.collectives`) with integer arithmetic, never read from tracekit's output. Definitions
(docs/metrics.md, DESIGN §3): arrival = the collective kernel's start on the device; transfer = first
member's end − last arrival; busbw per NCCL-tests; GPU step N = from the first kernel step N's CPU
ops launched to the next step's first kernel (the last step: to its last kernel's end).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run

from tests.gpu_semantics.generator import BASE_US, Coll, Compute, Spec, covered, simulate, write

MS = 1_000_000
STEP_OPS = [Compute(2 * MS), Compute(1 * MS), Coll("all_reduce", 1 << 20, 1 << 20, 400_000), Compute(MS // 2)]


def run(tmp_path, spec: Spec, comms_log: bool = False, **config):
    trace = simulate(spec)
    write(trace, tmp_path / "traces", comms_log=comms_log)
    store = parse_run(tmp_path / "traces", tmp_path / "store", progress=False).store
    return trace, analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False, **config))


def findings(a, kind):
    return [f for f in a["findings"] if f["kind"] == kind]


def straggler_delay_per_step(trace) -> dict[int, Fraction]:
    """Per late rank: Σ over instances of last arrival − max(second-to-last arrival, the group's
    previous collective's end), divided by the steps (DESIGN §3's delay, from the generator)."""
    out: dict[int, int] = {}
    prev_end = None
    for c in trace.collectives:
        starts = sorted(c.starts.values())
        last_rank = max(c.starts, key=lambda r: (c.starts[r], r))
        ready = starts[-2] if prev_end is None else max(starts[-2], prev_end)
        out[last_rank] = out.get(last_rank, 0) + max(starts[-1] - ready, 0)
        prev_end = max(c.ends.values())
    return {r: Fraction(d, trace.spec.steps) for r, d in out.items()}


def gpu_windows(trace, rank):
    """step -> (lo, hi) of the GPU step windows of one rank, from the generator's kernels."""
    ks = [k for k in trace.kernels if k.rank == rank and k.step is not None]
    steps = sorted({k.step for k in ks})
    first = {s: min(k.ts for k in ks if k.step == s) for s in steps}
    last = {s: max(k.end for k in ks if k.step == s) for s in steps}
    return {s: (first[s], first[steps[i + 1]] if i + 1 < len(steps) else last[s]) for i, s in enumerate(steps)}


def rank_of(a, r):
    return next(x for x in a["ranks"] if x["rank"] == r)


@pytest.mark.parametrize("ahead_ms", [0, 5, 30])
def test_balanced_ranks_with_the_host_ahead_give_device_side_numbers(tmp_path, ahead_ms):
    spec = Spec(world=4, steps=3, step_ops=STEP_OPS, host_ahead_ns=ahead_ms * MS)
    trace, a = run(tmp_path, spec)
    # nobody is late on the device, however far the host runs ahead
    assert not [f for f in findings(a, "straggler") if f["severity"] != "info"]
    # busbw from the device: bytes / (first end − last start) × 2(n−1)/n
    (c0, *_) = trace.collectives
    expect = Fraction(c0.bytes, min(c0.ends.values()) - max(c0.starts.values())) * Fraction(2 * 3, 4)
    (row,) = a["sections"]["bandwidth"]["rows"]
    assert row["busbw_gbps_p50"] == pytest.approx(float(expect), rel=0.01)
    # per rank: the GPU steps, the device's compute, no waiting for peers
    for r in range(4):
        wins = gpu_windows(trace, r)
        got = rank_of(a, r)
        assert got["step_ns"] == sum(hi - lo for lo, hi in wins.values())
        compute = [(k.ts, k.end) for k in trace.kernels if k.rank == r and k.kind == "compute"]
        assert got["compute_ns"] == sum(covered(compute, lo, hi) for lo, hi in wins.values())
        assert got["sync_wait_ns"] == 0


@pytest.mark.parametrize("factor,comms_log", [(Fraction(6, 5), False), (Fraction(3, 2), False),
                                               (Fraction(3, 2), True)])
def test_a_straggler_gpu_is_found_with_its_delay_and_the_wait_is_not_blamed_on_the_network(tmp_path, factor,
                                                                                         comms_log):
    # comms_log: a collective log holding only enqueue times (no device start) beside the traces gives no
    # arrival on a GPU rank: matching takes the kernels instead
    spec = Spec(world=4, steps=4, step_ops=STEP_OPS, slow={2: factor}, host_ahead_ns=20 * MS)
    trace, a = run(tmp_path, spec, comms_log=comms_log, peak_gbps={"world": 20.0})
    assert a["sections"]["matching"]["source"]["method"] == "uniform"
    assert set(a["sections"]["matching"]["source"]["per_rank"].values()) == {"kineto"}
    expect = straggler_delay_per_step(trace)
    assert set(expect) == {2}
    (f,) = findings(a, "straggler")
    assert f["ranks"] == [2]
    if factor >= Fraction(3, 2):  # 1.2x costs ~14% of the step: reported, below the warning share
        assert f["severity"] in ("warning", "critical")
    assert f["evidence"]["delay_ns_per_step"] == pytest.approx(float(expect[2]), rel=0.05)
    # stragglers.py's saving is the measured delay (no cap); the critical-path replay may refine the
    # finding's est_saving_ns and keeps the analyzer's figure as closed_form_saving_ns
    saving = f["evidence"].get("closed_form_saving_ns", f["est_saving_ns"])
    assert saving == pytest.approx(float(expect[2]), rel=0.05)
    # the others wait inside the collective kernel for rank 2: sync wait, not transfer, not comm-bound
    assert not findings(a, "low_bus_bandwidth") and not findings(a, "communication_bound")
    for r in (0, 1, 3):
        wins = gpu_windows(trace, r)
        wait = [(c.starts[r], max(c.starts.values())) for c in trace.collectives]
        transfer = [(max(c.starts.values()), c.ends[r]) for c in trace.collectives]
        got = rank_of(a, r)
        assert got["sync_wait_ns"] == sum(covered(wait, lo, hi) for lo, hi in wins.values())
        assert got["exposed_transfer_ns"] == sum(covered(transfer, lo, hi) for lo, hi in wins.values())
        assert got["bound"] != "communication"
    for u in findings(a, "unoverlapped_collective"):  # what hiding the collective could save: transfer only
        assert u["est_saving_ns"] <= Fraction(sum(c.ends[0] - max(c.starts.values()) for c in trace.collectives),
                                              spec.steps)


NCCL_TESTS_FACTOR = {"all_reduce": lambda n: Fraction(2 * (n - 1), n), "broadcast": lambda n: Fraction(1)}
for _op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
    NCCL_TESTS_FACTOR[_op] = lambda n: Fraction(n - 1, n)


def _sized(op: str, n: int, count: int, transfer_ns: int) -> Coll:
    """NCCL-tests buffers: all_gather/gather grow the output n-fold, reduce_scatter/scatter the input."""
    grows_out = op in ("all_gather", "gather")
    grows_in = op in ("reduce_scatter", "scatter")
    return Coll(op, count * (n if grows_in else 1), count * (n if grows_out else 1), transfer_ns)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_bus_bandwidth_follows_nccl_tests_for_every_op(tmp_path, n):
    ops = list(NCCL_TESTS_FACTOR)
    # distinct transfer times per op, one message size each (its own row in the table)
    step_ops = []
    for i, op in enumerate(ops):
        step_ops += [Compute(MS), _sized(op, n, 1 << (16 + i), 150_000 + 37_000 * i + 1)]
    spec = Spec(world=n, steps=2, step_ops=step_ops, host_ahead_ns=7 * MS, slow={n - 1: Fraction(11, 10)})
    trace, a = run(tmp_path, spec)
    rows = {r["op"]: r for r in a["sections"]["bandwidth"]["rows"]}
    assert set(rows) == set(ops)
    for op in ops:
        cs = [c for c in trace.collectives if c.op == op]
        busbw = [Fraction(c.bytes, min(c.ends.values()) - max(c.starts.values())) * NCCL_TESTS_FACTOR[op](n)
                 for c in cs]
        assert rows[op]["group_size"] == n
        assert rows[op]["busbw_gbps_p50"] == pytest.approx(float(sorted(busbw)[len(busbw) // 2]), rel=0.01), op


def test_unknown_message_size_gives_no_bandwidth_figure_and_says_why(tmp_path):
    spec = Spec(world=2, steps=2, step_ops=[Compute(MS), Coll("all_reduce", 1 << 20, 1 << 20, 300_000,
                                                              record_dims=False)])
    _, a = run(tmp_path, spec)
    bw = a["sections"]["bandwidth"]
    assert bw["rows"] == []
    (u,) = bw["unsized"]
    assert u["op"] == "all_reduce" and u["count"] == 2 and "not recorded" in u["reason"]


def test_device_a_step_behind_the_host_is_binned_by_launch(tmp_path):
    # the host runs a whole device step (4 ms + 0.4 ms transfer) ahead: CPU windows hold the next step's
    # launches while the device runs the previous step's kernels
    step_ns = 2 * MS + MS + 400_000 + MS // 2
    spec = Spec(world=2, steps=4, step_ops=STEP_OPS, host_ahead_ns=step_ns)
    trace, a = run(tmp_path, spec)
    for r in range(2):
        wins = gpu_windows(trace, r)
        rows = {x["step"]: x for x in a["sections"]["breakdown"]["steps"] if x["rank"] == r}
        assert set(rows) == set(wins)
        compute = [(k.ts, k.end) for k in trace.kernels if k.rank == r and k.kind == "compute"]
        for s, (lo, hi) in wins.items():
            assert rows[s]["ts"] == BASE_US * 1000 + lo and rows[s]["step_ns"] == hi - lo
            assert rows[s]["compute_ns"] == covered(compute, lo, hi)


def test_a_profiler_step_cpu_op_on_a_cpu_only_rank_is_never_compute(tmp_path):
    # 2021-2023 "Operator" traces and gloo CPU runs record ProfilerStep#N as a cpu_op around the step's ops
    import gzip
    import json

    us0 = 1_700_000_000_000_000
    ops = {1: [(100, 900), (1_500, 2_000), (2_500, 3_700)], 2: [(4_300, 5_000), (6_000, 7_400)]}
    steps = {1: (0, 4_000), 2: (4_000, 8_000)}
    events = [{"ph": "X", "cat": "Operator", "name": f"ProfilerStep#{s}", "pid": 7, "tid": "7",
               "ts": us0 + lo, "dur": hi - lo, "args": {"External id": s}} for s, (lo, hi) in steps.items()]
    events += [{"ph": "X", "cat": "Operator", "name": "aten::conv2d", "pid": 7, "tid": "7", "ts": us0 + a,
                "dur": b - a, "args": {}} for s in ops for a, b in ops[s]]
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 1},
           "traceEvents": events}
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rank0.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    store = parse_run(tmp_path / "traces", tmp_path / "store", progress=False).store
    a = analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False))
    got = rank_of(a, 0)
    assert got["steps"] == 2 and got["step_ns"] == 8_000 * 1000
    assert got["compute_ns"] == sum(b - a for s in ops for a, b in ops[s]) * 1000  # µs -> ns
    assert got["idle_ns"] == got["step_ns"] - got["compute_ns"]
def test_carry_over_kernels_are_in_no_step_and_counted(tmp_path):
    spec = Spec(world=2, steps=2, step_ops=STEP_OPS, host_ahead_ns=3 * MS, carry_over=[700_000, 1_100_000],
                memset_ns=60_000)
    trace, a = run(tmp_path, spec)
    for r in range(2):
        carried = sum(k.end - k.ts for k in trace.kernels if k.rank == r and k.kind == "carry")
        wins = gpu_windows(trace, r)
        got = rank_of(a, r)
        assert got["carry_over_ns"] == carried == 1_800_000
        assert got["step_ns"] == sum(hi - lo for lo, hi in wins.values())
        assert min(lo for lo, _ in wins.values()) >= max(k.end for k in trace.kernels
                                                           if k.rank == r and k.kind == "carry")
        # memsets are "other device work", never compute
        memsets = [(k.ts, k.end) for k in trace.kernels if k.rank == r and k.kind == "memset"]
        assert got["other_ns"] == sum(covered(memsets, lo, hi) for lo, hi in wins.values())




def test_check_does_not_blame_a_waiting_rank_for_communication(tmp_path):
    # ranks 0, 1 wait inside every all_reduce for the 3x slower rank 2, longer than they compute: a
    # --max-exposed-comm gate set between their exposed transfer share and their exposed comm share
    # (wait included) holds, and their verdict is waiting for a peer, not communication
    from tracekit.compare.check import Thresholds, evaluate

    spec = Spec(world=3, steps=3, step_ops=STEP_OPS, slow={2: Fraction(3)}, host_ahead_ns=5 * MS)
    trace, a = run(tmp_path, spec)
    share = {}
    for r in range(3):
        wins = gpu_windows(trace, r)
        step = sum(hi - lo for lo, hi in wins.values())
        transfer = [(max(c.starts.values()), c.ends[r]) for c in trace.collectives]
        comm = [(c.starts[r], c.ends[r]) for c in trace.collectives]
        share[r] = (Fraction(sum(covered(transfer, lo, hi) for lo, hi in wins.values()), step),
                    Fraction(sum(covered(comm, lo, hi) for lo, hi in wins.values()), step))
    worst_transfer = max(s[0] for s in share.values())
    worst_exposed = max(s[1] for s in share.values())
    assert worst_exposed > 2 * worst_transfer
    limit = float((worst_transfer + worst_exposed) / 2)
    (res,) = evaluate(a, Thresholds(max_exposed_comm=limit))
    assert res.value == pytest.approx(float(worst_transfer), rel=1e-6) and not res.breached
    assert {rank_of(a, r)["bound"] for r in (0, 1)} == {"sync_wait"}


@pytest.mark.parametrize("dtype,size", [("Int", 4), ("BFloat16", 2), ("Long", 8), ("Byte", 1)])
def test_every_dtype_is_sized_and_its_busbw_exact(tmp_path, dtype, size):
    nelems = 3 << 18
    spec = Spec(world=2, steps=2, step_ops=[Compute(MS), Coll("all_to_all", nelems, nelems, 250_000, dtype=dtype)])
    trace, a = run(tmp_path, spec)
    (row,) = a["sections"]["bandwidth"]["rows"]
    (c, *_) = trace.collectives
    assert row["bytes_p50"] == nelems * size == c.bytes
    expect = Fraction(c.bytes, min(c.ends.values()) - max(c.starts.values())) * Fraction(1, 2)
    assert row["busbw_gbps_p50"] == pytest.approx(float(expect), rel=0.01)


def test_a_straggler_in_a_two_step_window_with_one_collective_per_step_is_found(tmp_path):
    # a short profiled window of a one-bucket DDP job: the late rank is last at both of its collectives
    spec = Spec(world=2, steps=2, step_ops=STEP_OPS, slow={1: Fraction(2)}, host_ahead_ns=3 * MS)
    trace, a = run(tmp_path, spec)
    expect = straggler_delay_per_step(trace)
    (f,) = findings(a, "straggler")
    assert f["ranks"] == [1] and f["evidence"]["last_count"] == f["evidence"]["instances"] == 2
    assert f["evidence"]["delay_ns_per_step"] == pytest.approx(float(expect[1]), rel=0.05)
