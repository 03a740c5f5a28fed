"""The simulator: deterministic, NCCL semantics in the written traces (read back with plain json), the
normal parse path, and tracekit's breakdown against the simulator's answer key."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from tracekit.simulate import ClusterSpec, Faults, ParallelLayout, ModelSpec, simulate, step_time, write_traces

TINY = ModelSpec.preset("tiny")
C8 = ClusterSpec.preset("1x8-h100")


@pytest.fixture(scope="module")
def dp_tp_run(tmp_path_factory):
    res = simulate(TINY, ClusterSpec.preset("2x4-h100"), ParallelLayout(dp=4, tp=2), Faults(slow_gpu={3: 1.5}), steps=3, seed=1)
    out = tmp_path_factory.mktemp("sim") / "dp_tp"
    write_traces(res, out)
    return res, out


def _events(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f, parse_float=Decimal)


def _ns(us: Decimal) -> int:
    return int(us * 1000)


def test_deterministic_per_seed():
    a = simulate(TINY, C8, ParallelLayout(dp=2, tp=2, pp=2, microbatches=2), steps=2, seed=5, without=False)
    b = simulate(TINY, C8, ParallelLayout(dp=2, tp=2, pp=2, microbatches=2), steps=2, seed=5, without=False)
    c = simulate(TINY, C8, ParallelLayout(dp=2, tp=2, pp=2, microbatches=2), steps=2, seed=6, without=False)
    assert a.ground_truth() == b.ground_truth()
    assert a.key["step_ns"] != c.key["step_ns"]
    assert step_time(TINY, C8, ParallelLayout(dp=2, tp=2, pp=2, microbatches=2), steps=2, seed=5) == a.mean_step_ns


def test_collective_kernels_follow_nccl_semantics(dp_tp_run):
    """Read back from the files: members of one (group, Seq) end together, no member starts before its
    launch, and the end is last start + latency + bus bytes / bandwidth of the tier the group spans."""
    res, out = dp_tp_run
    inst = defaultdict(list)
    for r in range(res.ranks):
        doc = _events(out / f"rank{r}.pt.trace.json.gz")
        launch = {e["args"]["correlation"]: _ns(e["ts"]) + _ns(e["dur"]) for e in doc["traceEvents"]
                  if e.get("cat") == "cuda_runtime" and e["name"] == "cudaLaunchKernel"}
        for e in doc["traceEvents"]:
            if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel") and "Seq" in e["args"]:
                a = e["args"]
                start, end = _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])
                assert start >= launch[a["correlation"]]
                inst[(a["Process Group Name"], a["Seq"])].append((r, start, end, a))
    assert len(inst) > 50
    c = res.cluster
    hosts = {r: r // c.gpus_per_host for r in range(res.ranks)}
    for (pg, seq), rows in inst.items():
        a = rows[0][3]
        ranks = json.loads(a["Process Group Ranks"])
        assert sorted(r for r, *_ in rows) == ranks
        assert len({end for _, _, end, _ in rows}) == 1
        n = len(ranks)
        size = {"Float": 4, "BFloat16": 2}[a["dtype"]] * max(a["In msg nelems"], a["Out msg nelems"])
        factor = {"allreduce": Decimal(2 * (n - 1)) / n}.get(a["Collective name"], Decimal(n - 1) / n)
        inter = len({hosts[r] for r in ranks}) > 1
        bw, lat = (c.inter_bw_gbs, c.inter_lat_us) if inter else (c.intra_bw_gbs, c.intra_lat_us)
        expect = max(s for _, s, _, _ in rows) + int(lat * 1000) + int(size * factor / Decimal(str(bw)))
        assert abs(rows[0][2] - expect) <= 1, (pg, seq)


def test_tracekit_parses_and_its_breakdown_matches_the_key(dp_tp_run, tmp_path):
    from tracekit.flow import analyze_store
    from tracekit.parse.run import parse_run

    res, out = dp_tp_run
    parsed = parse_run(out, tmp_path / "store", progress=False)
    assert parsed.skipped == []
    analysis = json.loads(json.dumps(analyze_store(parsed.store), default=str))
    worst = {}
    for row in analysis["ranks"]:
        key = res.key["ranks"][row["rank"]]["total"]
        assert row["steps"] == res.steps
        for f in ("compute_ns", "exposed_comm_ns", "idle_ns"):
            worst[f] = max(worst.get(f, 0.0), abs(row[f] - key[f]) / key["window_ns"])
        worst["step_ns"] = max(worst.get("step_ns", 0.0), abs(row["step_ns"] - key["window_ns"]) / key["window_ns"])
    print(f"\ntracekit vs key, worst |error| / window over ranks: {worst}")
    assert max(worst.values()) <= 0.01, worst


def test_hta_temporal_breakdown_matches_the_key(tmp_path):
    """HTA's TraceAnalysis loads the simulated traces; its temporal breakdown (window: first to last kernel
    launched before the last ProfilerStep; compute = union of compute kernels; idle = no kernel) agrees
    with the key over the same window within 1 percentage point."""
    import logging
    import warnings

    res = simulate(TINY, ClusterSpec.preset("2x2-h100"), ParallelLayout(dp=2, pp=2, microbatches=2),
                   Faults(slow_gpu={1: 1.4}), steps=3, seed=2, without=False)
    write_traces(res, tmp_path)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    try:
        from hta.trace_analysis import TraceAnalysis

        df = TraceAnalysis(trace_dir=str(tmp_path)).get_temporal_breakdown(visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    assert sorted(df["rank"]) == list(range(res.ranks))
    for row in df.to_dict("records"):
        iv = res.intervals(row["rank"])
        m = iv.step < res.steps - 1
        b = iv.breakdown(int(iv.start[m].min()), int(iv.end[m].max()))
        w = b["window_ns"]
        key = {"compute_time_pctg": 100 * b["compute_ns"] / w, "idle_time_pctg": 100 * b["idle_ns"] / w,
               "non_compute_time_pctg": 100 * (b["exposed_comm_ns"] + b["other_ns"]) / w}
        for k, v in key.items():
            assert abs(row[k] - v) <= 1.0, (row["rank"], k, row[k], v)


def test_memory_events_add_up_to_the_keys_peak(dp_tp_run):
    """Kineto `[memory]` instant events: Total Allocated is the running sum of Bytes, and its maximum per rank
    is the peak the key reports; the static part is parameters + gradients + Adam state of the rank's shard."""
    res, out = dp_tp_run
    gt = json.loads((out / ".ground_truth.json").read_text())
    for r in (0, 3):
        doc = _events(out / f"rank{r}.pt.trace.json.gz")
        mem = sorted((e["ts"], e["args"]) for e in doc["traceEvents"] if e.get("name") == "[memory]")
        running = 0
        for _, a in mem:
            running += a["Bytes"]
            assert a["Total Allocated"] == running and a["Total Reserved"] >= running and a["Device Id"] == r % 4
        assert max(a["Total Allocated"] for _, a in mem) == gt["memory"]["peak_allocated_bytes"][str(r)]
        m = TINY
        per_layer = 4 * m.hidden * m.hidden + 3 * m.hidden * m.ffn_dim + 2 * m.hidden
        params = (m.layers * per_layer + 2 * m.vocab * m.hidden) // 2  # tp = 2, both ends on the one stage
        assert abs(mem[0][1]["Bytes"] - params * 18) <= 18 * m.layers  # bf16 weights + fp32 grads + 12 B Adam


def test_comms_logs_parse_as_flight_recorder_entries(tmp_path):
    """With comms logs, the run store's collectives come from them: same group, seq, op, and the kernel's
    device interval (stored on the trace clock: wall ns minus the traces' baseTimeNanoseconds)."""
    from tracekit.parse.run import parse_run
    from tracekit.simulate.writer import BASE_NS

    res = simulate(TINY, C8, ParallelLayout(dp=2, tp=2, pp=2, microbatches=2), steps=2, seed=3, without=False)
    write_traces(res, tmp_path, comms_logs=True)
    store = parse_run(tmp_path, tmp_path / "store", progress=False).store
    rows = store.table("collectives", ["rank", "source", "pg_name", "seq", "op", "ts", "dur", "is_p2p"]).to_pylist()
    logged = [r for r in rows if r["source"] == "comms-log"]
    kernels = {(r, o.coll.pg.name, o.coll.seq): (o.coll.op, o.d0, o.d1 - o.d0)
               for r, prog in enumerate(res.programs) for o in prog if o.kind == 1 and o.coll.op != "sendrecv"}
    coll = [r for r in logged if not r["is_p2p"]]
    assert len(coll) == len(kernels)
    for r in coll:
        op, ts, dur = kernels[(r["rank"], r["pg_name"], r["seq"])]
        assert (r["op"], r["ts"] + BASE_NS, r["dur"]) == (op, ts, dur)
    assert sum(r["is_p2p"] for r in logged) == sum(o.kind == 1 and o.coll.op == "sendrecv"
                                                   for prog in res.programs for o in prog)


def test_predict_matches_the_full_simulation_and_orders_layouts():
    """The fast path gives the full simulation's step time and peak memory; activation checkpointing
    trades memory for time; halving tp at the same global batch costs memory per GPU."""
    from tracekit.simulate import predict

    lay = ParallelLayout(dp=2, tp=4)
    full = simulate(TINY, C8, lay, steps=2, seed=4, without=False)
    p = predict(TINY, C8, lay, steps=2, seed=4)
    assert p.step_ns == full.mean_step_ns
    assert p.peak_memory_bytes == [full.peak_memory(r) for r in range(full.ranks)]
    ckpt = predict(TINY, C8, ParallelLayout(dp=2, tp=4, activation_checkpointing=True), steps=2, seed=4)
    assert ckpt.max_memory_bytes < p.max_memory_bytes and ckpt.step_ns > p.step_ns
    assert predict(TINY, C8, ParallelLayout(dp=4, tp=2), steps=2, seed=4).max_memory_bytes > p.max_memory_bytes


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 1), ("zb", 2)])
def test_pipeline_schedules_finish_and_the_bubble_falls_with_microbatches(schedule, v):
    """Every schedule's order (torch's for interleaved / zero bubble) runs without deadlock (sends are
    asynchronous to the host, as NCCL's), and more micro-batches shrink the non-compute share of stage 0."""
    share = {}
    for m in (4, 8):
        res = simulate(TINY, C8, ParallelLayout(pp=4, dp=2, schedule=schedule, virtual_stages=v, microbatches=m), steps=1,
                       seed=0, without=False)
        k = res.key["ranks"][0]["total"]
        share[m] = 1 - k["compute_ns"] / k["window_ns"]
    assert share[8] < share[4]


@pytest.mark.parametrize("layout", [ParallelLayout(pp=2, cp=4, schedule="zb", microbatches=4, virtual_stages=2),
                                    ParallelLayout(pp=2, cp=2, schedule="interleaved", microbatches=4, virtual_stages=2)],
                         ids=["zb-cp4", "interleaved-cp2"])
def test_a_bounded_launch_queue_delays_the_host_but_never_deadlocks_a_pipeline(layout):
    """Pipelines with ring attention: a P2P waiting for the peer stage sits on a comm stream; with one
    launch queue for all streams it held back the compute launches the peer needed (at 1024 launches on
    a 70B-size model; here at 4-64 on a small one). Per stream, each depth replays the unbounded step."""
    from tracekit.simulate import executor
    from tracekit.simulate.api import T0_NS
    from tracekit.simulate.key import answer_key
    from tracekit.simulate.program import build_programs, make_world

    def step_ns(depth: int) -> int:
        progs = build_programs(make_world(ModelSpec.preset("tiny"), ClusterSpec.preset("1x8-h100"), layout,
                                          Faults(), 0), 2)
        executor.run(progs, T0_NS, depth)
        executor.finish_colls(progs)
        return answer_key(progs, (), 2)["mean_step_ns"]

    unbounded = step_ns(10**9)
    assert [step_ns(d) for d in (4, 16, 64)] == [unbounded] * 3
