"""Pipeline analyzer on hand-built run stores: schedules simulated from per-stage phase times."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tracekit.analyze.pipeline import analyze_pipeline, theoretical_bubble
from tracekit.config import AnalysisConfig
from tracekit.findings.evidence import CollectiveEvidence
from tracekit.findings.finding import FindingKind
from tracekit.findings.recommend import best_contiguous_split
from tracekit.tables.store import RunStoreWriter

MS = 1_000_000


def simulate(p: int, m: int, fwd_ns: list[int], bwd_ns: list[int], schedule: str) -> list[tuple]:
    """(stage, microbatch, phase, start, end) of a GPipe or 1F1B schedule with free p2p.

    Each stage runs its op list in order; fwd(s,i) waits for fwd(s−1,i), bwd(s,i) for bwd(s+1,i).
    """
    orders = []
    for s in range(p):
        if schedule == "gpipe":
            ops = [("fwd", i) for i in range(m)] + [("bwd", i) for i in range(m)]
        else:
            warm = min(p - s - 1, m)
            ops = [("fwd", i) for i in range(warm)]
            f, b = warm, 0
            while b < m:
                if f < m:
                    ops.append(("fwd", f))
                    f += 1
                ops.append(("bwd", b))
                b += 1
        orders.append(ops)
    end: dict[tuple, int] = {}
    free = [0] * p
    pos = [0] * p
    out = []
    while any(pos[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if pos[s] >= len(orders[s]):
                continue
            ph, i = orders[s][pos[s]]
            dep = (s - 1, "fwd", i) if ph == "fwd" else ((s + 1, "bwd", i) if s + 1 < p else (s, "fwd", i))
            if ph == "fwd" and s == 0:
                dep = None
            if dep is not None and dep not in end:
                continue
            start = max(free[s], end[dep] if dep else 0)
            dur = fwd_ns[s] if ph == "fwd" else bwd_ns[s]
            end[(s, ph, i)] = start + dur
            free[s] = start + dur
            out.append((s, i, ph, start, start + dur))
            pos[s] += 1
            progressed = True
        assert progressed, "schedule deadlocked"
    return out


def write_pipeline_store(path: Path, *, p: int, m: int, fwd_ns: list[int], bwd_ns: list[int],
                         schedule: str, steps: int = 2, dp: int = 1, manifest: dict | None = None,
                         step_extra_ns: int = 5 * MS):
    """A store with pp groups [r, r+dp, ...] (rank = stage·dp + replica) and simulated pipeline rows."""
    w = RunStoreWriter(path, meta={"manifest": manifest or {}})
    world = p * dp
    w.append("ranks", pa.table({"rank": pa.array(range(world), pa.int32()),
                                "clock_offset_ns": pa.array([0] * world, pa.int64())}))
    groups = [[s * dp + d for s in range(p)] for d in range(dp)]
    w.append("process_groups", pa.table({
        "pg_name": [f"pp{d}" for d in range(dp)], "pg_desc": ["mesh_pp"] * dp,
        "ranks": pa.array(groups, pa.list_(pa.int32())), "size": pa.array([p] * dp, pa.int32()),
        "dim": ["pp"] * dp}))
    sched = simulate(p, m, fwd_ns, bwd_ns, schedule)
    span = max(e for *_, e in sched)
    for rank in range(world):
        stage = rank // dp
        rows = {"rank": [], "step": [], "stage": [], "microbatch": [], "phase": [], "ts": [], "dur": []}
        srows = {"rank": [], "step": [], "ts": [], "dur": []}
        for step in range(steps):
            t0 = 1_000 * MS + step * (span + step_extra_ns + 10 * MS)
            srows["rank"].append(rank), srows["step"].append(step)
            srows["ts"].append(t0), srows["dur"].append(span + step_extra_ns)
            for s, i, ph, a, b in sched:
                if s == stage:
                    for k, v in (("rank", rank), ("step", step), ("stage", s), ("microbatch", i), ("phase", ph),
                                 ("ts", t0 + a), ("dur", b - a)):
                        rows[k].append(v)
        w.append("pipeline", pa.table(rows))
        w.append("steps", pa.table(srows))
    return w.close()


def run(store, **cfg):
    return analyze_pipeline(store, AnalysisConfig(**cfg))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 2), (2, 4), (4, 8), (3, 1)])
def test_balanced_bubble_equals_theory(tmp_path, schedule, p, m):
    store = write_pipeline_store(tmp_path / "s", p=p, m=m, fwd_ns=[2 * MS] * p, bwd_ns=[4 * MS] * p,
                                 schedule=schedule, dp=2)
    res = run(store)
    sec = res.section
    expected = (p - 1) / (m + p - 1)
    assert sec["theoretical_bubble"] == pytest.approx(expected)
    assert sec["measured_bubble"] == pytest.approx(expected, abs=1e-9)
    assert sec["num_stages"] == p and sec["num_microbatches"] == m
    if m > 1 and p > 1:
        assert sec["schedule_detected"] == schedule
    assert len(sec["pipelines"]) == 2
    assert sec["imbalance"] == pytest.approx(1.0)
    # the schedule diagram lies inside the window and covers every (stage, microbatch, phase) once
    d = sec["diagram"]
    assert len(d["intervals"]) == 2 * m * p
    assert min(x["start_ns"] for x in d["intervals"]) == 0
    assert max(x["start_ns"] + x["dur_ns"] for x in d["intervals"]) == d["window_ns"]


def test_bubble_falls_with_microbatches_and_advice_predicts_it(tmp_path):
    measured = {}
    for m in (2, 4, 8):
        store = write_pipeline_store(tmp_path / f"m{m}", p=2, m=m, fwd_ns=[2 * MS] * 2, bwd_ns=[4 * MS] * 2,
                                     schedule="1f1b")
        res = run(store)
        measured[m] = res.section["measured_bubble"]
        if m == 2:
            (f,) = [f for f in res.findings if f.kind is FindingKind.PIPELINE_BUBBLE]
            assert f.evidence.recommended_microbatches == 4
            # stage busy time stays (same total compute): window at m=2 is (m+p−1)·6 ms = 18 ms;
            # with twice the micro-batches of half the size, the window is (4+1)·3 ms = 15 ms
            assert f.est_saving_ns == pytest.approx(18 * MS - 15 * MS, rel=1e-6)
            assert f.dim == "pp" and set(f.ranks) == {0, 1}
    assert measured[2] > measured[4] > measured[8]


def test_imbalance_names_slowest_stage_and_resplit(tmp_path):
    # 4 layers split 3,1 at 2 ms fwd / 4 ms bwd per layer
    store = write_pipeline_store(tmp_path / "s", p=2, m=4, fwd_ns=[6 * MS, 2 * MS], bwd_ns=[12 * MS, 4 * MS],
                                 schedule="1f1b", manifest={"layout": {"stage_layers": [3, 1]}})
    res = run(store)
    sec = res.section
    assert sec["imbalance"] == pytest.approx(18 / 12)
    (f,) = [f for f in res.findings if f.kind is FindingKind.PIPELINE_IMBALANCE]
    assert f.ranks == (0,) and f.evidence.slowest_stage == 0
    assert f.evidence.recommended_stage_layers == [2, 2]
    assert "layer 2 from stage 0 to stage 1" in f.recommendation
    # per step stage compute 4·18 = 72 ms vs 4·6 = 24 ms; re-split gives 48/48: (m−1)/m·(72−48) ms
    assert f.est_saving_ns == pytest.approx(3 / 4 * 24 * MS, rel=1e-6)
    # the simulated 1F1B step really shrinks by about that much when re-split
    old = max(e for *_, e in simulate(2, 4, [6 * MS, 2 * MS], [12 * MS, 4 * MS], "1f1b"))
    new = max(e for *_, e in simulate(2, 4, [4 * MS, 4 * MS], [8 * MS, 8 * MS], "1f1b"))
    assert old - new == pytest.approx(f.est_saving_ns, rel=0.35)


def test_best_contiguous_split_brute_force():
    import itertools

    costs = [5.0, 1.0, 1.0, 3.0, 2.0, 2.0]
    best = min((max(sum(costs[a:b]) for a, b in zip((0,) + cuts, cuts + (6,))), cuts)
               for cuts in itertools.combinations(range(1, 6), 2))
    sizes = best_contiguous_split(costs, 3)
    pre = [0, sizes[0], sizes[0] + sizes[1], 6]
    assert max(sum(costs[pre[i]:pre[i + 1]]) for i in range(3)) == best[0]


def test_theoretical_bubble_interleaved():
    assert theoretical_bubble(4, 8, 2) == pytest.approx(3 / 19)
    with pytest.raises(ValueError):
        theoretical_bubble(0, 1)


def _p2p_table(rank: int, ops: list[tuple[str, int, int, int, int]]) -> pa.Table:
    """collectives rows of one rank: (op, peer, ts, dur, step)."""
    return pa.table({"rank": pa.array([rank] * len(ops), pa.int32()), "op": [o[0] for o in ops],
                     "is_p2p": [True] * len(ops), "peer": pa.array([o[1] for o in ops], pa.int32()),
                     "ts": [o[2] for o in ops], "dur": [o[3] for o in ops],
                     "step": pa.array([o[4] for o in ops], pa.int32())})


def test_unlabelled_bubble_from_receive_waits(tmp_path):
    """CPU trace, no group names: stage busy = its step less its receive waits (outstanding receives with no
    op running); window = longest step."""
    w = RunStoreWriter(tmp_path / "s")
    w.append("ranks", pa.table({"rank": pa.array([0, 1], pa.int32())}))
    steps = {0: (0, 100 * MS), 1: (5 * MS, 80 * MS)}
    # rank 0 sends 2 activations, then waits for 2 gradients (10 ms and 5+5 ms overlapping by 2)
    ops = {0: [("send", 1, 1 * MS, MS, 0), ("send", 1, 3 * MS, MS, 0),
               ("recv", 1, 10 * MS, 10 * MS, 0), ("recv", 1, 30 * MS, 5 * MS, 0), ("recv", 1, 33 * MS, 5 * MS, 0)],
           1: [("recv", 0, 5 * MS, 20 * MS, 0), ("recv", 0, 30 * MS, 4 * MS, 0),
               ("send", 0, 50 * MS, MS, 0), ("send", 0, 60 * MS, MS, 0)]}
    for r in (0, 1):
        w.append("steps", pa.table({"rank": pa.array([r], pa.int32()), "step": pa.array([0], pa.int32()),
                                    "ts": [steps[r][0]], "dur": [steps[r][1]]}))
        w.append("collectives", _p2p_table(r, ops[r]))
    # rank 0 computes 16..22 ms while its first gradient receive (10..20 ms) is outstanding: 4 ms of it is work
    w.append("events", pa.table({"rank": pa.array([0], pa.int32()), "name": ["aten::mm"], "ts": [16 * MS],
                                 "dur": [6 * MS], "role": ["compute"], "lane": ["host"]}))
    sec = run(w.close()).section
    assert sec["source"] == "p2p" and sec["num_stages"] == 2 and sec["num_microbatches"] == 2
    assert sec["pipelines"][0]["ranks"] == [0, 1] and sec["schedule_detected"] == "gpipe"
    window = 100 * MS
    busy0 = 100 * MS - (10 - 4 + 8) * MS
    busy1 = 80 * MS - (20 + 4) * MS
    assert sec["measured_bubble"] == pytest.approx(((1 - busy0 / window) + (1 - busy1 / window)) / 2)
    assert sec["theoretical_bubble"] == pytest.approx(1 / 3)


def test_pp_group_name_alone_is_no_pipeline(tmp_path):
    """A group called pp adds evidence; without a p2p graph (no peers) there is nothing to infer from."""
    w = RunStoreWriter(tmp_path / "s")
    w.append("ranks", pa.table({"rank": pa.array([0, 1], pa.int32())}))
    w.append("process_groups", pa.table({"pg_name": ["g"], "pg_desc": ["mesh_pp"],
                                         "ranks": pa.array([[0, 1]], pa.list_(pa.int32())), "dim": ["pp"]}))
    w.append("collectives", pa.table({"rank": pa.array([0, 0], pa.int32()), "op": ["send", "recv"],
                                      "is_p2p": [True, True], "ts": [0, MS], "dur": [MS, MS],
                                      "step": pa.array([0, 0], pa.int32())}))
    assert run(w.close()).section["source"] is None


@pytest.mark.parametrize("shape", ["one_way", "symmetric_exchange", "even_ring"])
def test_p2p_patterns_that_are_not_pipelines(tmp_path, shape):
    w = RunStoreWriter(tmp_path / "s")
    n = 3 if shape == "even_ring" else 2
    w.append("ranks", pa.table({"rank": pa.array(range(n), pa.int32())}))
    for r in range(n):
        if shape == "one_way":
            ops = [("send", 1, 0, MS, 0)] if r == 0 else [("recv", 0, 0, MS, 0)]
        elif shape == "symmetric_exchange":  # both send first, then receive: a halo exchange
            ops = [("send", 1 - r, 0, MS, 0), ("recv", 1 - r, 2 * MS, MS, 0)]
        else:  # ring attention: everyone sends to the next and receives from the previous, both ways alike
            ops = [("send", (r + 1) % n, 0, MS, 0), ("recv", (r - 1) % n, MS, MS, 0),
                   ("send", (r - 1) % n, 3 * MS, MS, 0), ("recv", (r + 1) % n, 4 * MS, MS, 0)]
        w.append("collectives", _p2p_table(r, ops))
    assert run(w.close()).section["source"] is None


def test_no_pipeline(tmp_path):
    w = RunStoreWriter(tmp_path / "s")
    w.append("ranks", pa.table({"rank": pa.array([0], pa.int32())}))
    res = run(w.close())
    assert res.findings == [] and res.section["source"] is None


def test_unlabelled_counts_microbatches_from_first_stage_sends(tmp_path):
    w = RunStoreWriter(tmp_path / "s")
    w.append("ranks", pa.table({"rank": pa.array([0, 1], pa.int32())}))
    for r in (0, 1):
        w.append("steps", pa.table({"rank": pa.array([r, r], pa.int32()), "step": pa.array([0, 1], pa.int32()),
                                    "ts": [0, 200 * MS], "dur": [100 * MS, 100 * MS]}))
    # rank 0 sends 3 activations and receives 3 gradients per step (only rank 0's side is recorded)
    ops = [(op, 1, i * MS + (200 * MS if i >= 6 else 0), MS, 0 if i < 6 else 1)
           for i, op in enumerate(["send", "recv"] * 3 * 2)]
    w.append("collectives", _p2p_table(0, ops))
    sec = run(w.close()).section
    assert sec["num_microbatches"] == 3 and sec["microbatches_source"] == "sends of the first stage"
    assert sec["theoretical_bubble"] == pytest.approx(1 / 4)


def test_exposed_p2p_of_an_inferred_pipeline_is_the_bubble_not_communication():
    """On the default group (dim world) send/recv of ranks in a p2p-inferred pipeline are its idle time."""
    from tracekit.findings.finding import Finding, Severity
    from tracekit.analyze.pipeline import PipelineResult
    from tracekit.assess.reconcile import reconcile
    from tracekit.analyze.unoverlapped import UnoverlappedResult

    pipe = PipelineResult(section={"source": "p2p", "pipelines": [{"ranks": [0, 1]}]})
    unoverlapped = UnoverlappedResult(section={"by_rank_dim_op": [
        {"rank": 1, "dim": "world", "op": "send", "transfer_exposed_ns": 70 * MS},
        {"rank": 1, "dim": "world", "op": "all_reduce", "transfer_exposed_ns": 30 * MS}]})

    def unov(op, rank):
        return Finding(kind=FindingKind.UNOVERLAPPED_COLLECTIVE, severity=Severity.WARNING, summary=f"{op} {rank}",
                       ranks=(rank,), dim="world", evidence=CollectiveEvidence(op=op, transfer_exposed_ns_per_step=9 * MS, share_of_step=0.1),
                       recommendation="x", est_saving_ns=9 * MS)
    bound = Finding(kind=FindingKind.COMMUNICATION_BOUND, severity=Severity.CRITICAL, summary="bound", ranks=(1,),
                    dim=None, recommendation="y", est_saving_ns=50 * MS)
    out = {f.summary: f for f in reconcile([unov("send", 1), unov("all_reduce", 1), unov("send", 2), bound],
                                           pipe, None, unoverlapped)}
    assert out["send 1"].severity is Severity.INFO and out["send 1"].evidence.explained_by.startswith("pipeline")
    assert out["bound"].severity is Severity.INFO and out["bound"].est_saving_ns == 0  # 70% of it is p2p
    assert out["all_reduce 1"].severity is Severity.WARNING and out["send 2"].severity is Severity.WARNING
