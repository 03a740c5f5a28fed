"""The replay's processor sharing on CPU ranks that share a host's cores (whatif/sharing.py; docs/metrics.md §8
"Processor sharing"), against a plain-Python processor-sharing simulation of the same job.

Two gloo ranks on one host of K = 2 cores beside an outside load of E = 1 runnable thread (the harness's busy
process): each runnable thread advances min(1, K / (runnable + E)) ns of work per ns. Per step each rank runs a
short Python gap (RESUME of work), `aten::mm` then `aten::relu` (work MM and RELU; twice that on rank 1 in the
2x case, its mm on twice the rows), arrives at the all-reduce, and once both are there each runs TRANSFER of
work (gloo moves the bytes on CPU threads). In the sleep case rank 1 sleeps SLEEP (holding no core) between its
mm and its relu. The simulation gives each run's trace (every op's start and end) and what `tracekit record`
measures of it: each rank's wait share, the part of its runnable time it waited for a core.

The injected cause's replayed saving must equal the simulated difference between the faulty and the clean job
within a few %. A sleeper's peer computed its relu at a whole core while the sleeper slept, and beside it once
the sleep is gone: the simulated difference is 36.0 ms for a 40 ms sleep, which the replay without the model
(each op at the pace it was measured at) over-stated as 40.0. A rank with twice the work: 20.0 ms simulated;
its peer computed beside it throughout, in the faulty as in the clean job, so the op-by-op fix was exact before
too (a check that the model keeps it so).
"""

from __future__ import annotations

import json

import pytest

from tests.analyze.analyze_builders import two_rank_gloo_run
from tracekit.flow import analyze_store

MS = 1_000_000
K, E = 2, 1.0
STEPS = 4
RESUME, MM, RELU, TRANSFER = MS // 4, 12 * MS, 8 * MS, MS
SLEEP = 40 * MS
ROWS = 256


def simulate(work: dict[int, list[tuple[str, float]]], blocked: frozenset[str] = frozenset({"sleep"})
             ) -> tuple[dict[int, dict[str, tuple[float, float]]], float, dict[int, tuple[float, float]]]:
    """One step of the job under processor sharing. `work[rank]`: its segments in order, ("resume" | "mm" |
    "relu" | "transfer", work ns), ("arrive", 0) — "arrive" blocks until every rank arrived — and segments
    named in `blocked` (a sleep; an operator's simulated device time), which last their ns holding no core.
    Returns each rank's segments' (start, end), the step's length (every rank ends its transfer together: the
    next step starts from the same state) and each rank's (CPU time, run-queue wait) in the step."""
    t = 0.0
    pos = {r: 0 for r in work}
    left = {r: float(work[r][0][1]) for r in work}
    begun = {r: {work[r][0][0]: 0.0} for r in work}
    spans: dict[int, dict[str, tuple[float, float]]] = {r: {} for r in work}
    waited = {r: 0.0 for r in work}
    ran = {r: 0.0 for r in work}

    def kind(r):
        return work[r][pos[r]][0] if pos[r] < len(work[r]) else "done"

    while any(kind(r) != "done" for r in work):
        arrived = [r for r in work if kind(r) == "arrive"]
        if len(arrived) == len(work):  # the last member arrived: the transfer begins on every rank
            for r in work:
                spans[r]["arrive"] = (begun[r]["arrive"], t)
                pos[r] += 1
                left[r] = float(work[r][pos[r]][1])
                begun[r][kind(r)] = t
            continue
        runnable = [r for r in work if kind(r) not in ("arrive", "done", *blocked)]
        rate = min(1.0, K / (len(runnable) + E)) if runnable else 1.0
        until = [left[r] / rate for r in runnable] + [left[r] for r in work if kind(r) in blocked]
        dt = min(until)
        for r in work:
            if kind(r) in blocked:
                left[r] -= dt
            elif r in runnable:
                left[r] -= dt * rate
                ran[r] += dt * rate
                waited[r] += dt * (1 - rate)
        t += dt
        for r in work:
            if kind(r) not in ("arrive", "done") and left[r] <= 1e-6:
                spans[r][kind(r)] = (begun[r][kind(r)], t)
                pos[r] += 1
                if kind(r) != "done":
                    left[r] = float(work[r][pos[r]][1])
                    begun[r][kind(r)] = t
    return spans, t, {r: (ran[r], waited[r]) for r in work}


def job(case: str | None) -> dict[int, list[tuple[str, float]]]:
    mult = 2 if case == "twice" else 1
    out = {}
    for r in (0, 1):
        m = mult if r == 1 else 1
        sleep = [("sleep", SLEEP)] if case in ("sleep", "device") and r == 1 else []
        out[r] = [("resume", RESUME), ("mm", MM * m), *sleep, ("relu", RELU * m), ("arrive", 0), ("transfer", TRANSFER)]
    return out


DEVICE = frozenset({"sleep", "mm", "relu"})
"""the "device" case: the ops stand in for a device's time (an operator that sleeps, as the pipeline job's
`device_time`), holding no core; rank 1 sleeps between them (the fault) and its peer waits for it"""


def store_of(tmp_path, case: str | None, blocked: frozenset[str] = frozenset({"sleep"}), record_cpu: bool = False):
    """The job's run store (`case`: None clean, "sleep", "twice", "device") and its step. The ranks table holds
    each rank's cores and wait share; with `record_cpu` also its runnable time per step (CPU time and run-queue
    wait, from the CPU window `tracekit record` writes)."""
    spans, step_f, cpu = simulate(job(case), blocked)
    wait = {r: w / (c + w) for r, (c, w) in cpu.items()}
    step = round(step_f)
    rows = ROWS * (2 if case == "twice" else 1)

    def per_step(r, s, base):
        n = rows if r == 1 else ROWS
        ev = [{"name": f"aten::{op}", "cat": "cpu_op", "ts": base + round(spans[r][op][0]),
               "dur": round(spans[r][op][1]) - round(spans[r][op][0]),
               "input_dims": json.dumps([[n, 2048], [2048, 2048]] if op == "mm" else [[n, 2048]]),
               "input_types": json.dumps(["float", "float"] if op == "mm" else ["float"])} for op in ("mm", "relu")]
        return ev, base + round(spans[r]["arrive"][0]), base + round(spans[r]["transfer"][1])

    # the ranks table as the parser writes it from the manifest's CPU windows (tests/analyze/test_critical_path.py)
    extra = {r: {"host_cpus": K, "cpu_wait_share": wait[r],
                 **({"cpu_runnable_ns": round(c + w)} if record_cpu else {})} for r, (c, w) in cpu.items()}
    return two_rank_gloo_run(tmp_path, per_step, step, STEPS, 262_164, extra), step


def test_the_simulation_shares_the_cores_as_described():
    spans, step, wait = simulate(job(None))
    # both ranks alike: resume and mm together at 2/3 of a core, relu likewise, the transfer likewise
    assert spans[0] == spans[1] and step == pytest.approx((RESUME + MM + RELU + TRANSFER) * 1.5)
    assert wait[0][1] / sum(wait[0]) == pytest.approx(1 / 3)
    spans, step, wait = simulate(job("sleep"))
    # rank 0 computes its relu alone beside the outside load (a full core) while rank 1 sleeps
    assert spans[0]["relu"][1] - spans[0]["relu"][0] == pytest.approx(RELU)
    assert all(w / (c + w) < 1 / 3 for c, w in wait.values())
    _, step, _ = simulate(job("device"), DEVICE)
    _, clean, _ = simulate(job(None), DEVICE)
    assert step - clean == pytest.approx(SLEEP)  # nothing of the sleep overlapped work that needs a core


CASES = {"sleep": (frozenset({"sleep"}), False), "twice": (frozenset({"sleep"}), False),
         "sleep_recorded": (frozenset({"sleep"}), True), "device": (DEVICE, True)}
"""case -> (what holds no core, the manifest records the ranks' CPU windows)"""


@pytest.mark.parametrize("case", list(CASES))
def test_the_injected_causes_replayed_saving_is_the_simulated_difference(tmp_path, case):
    """The device case: each rank's recorded runnable time is a small share of its busy time in the trace (its
    ops sleep), so its ops keep that share of their time in the replay; taken as CPU work, the peer's ops,
    run while the sleeper slept, slowed beside it and the replay saved 36.7 of the 40 ms (the code before the
    runnable share; the code before the model: 40.0, as it should)."""
    blocked, record_cpu = CASES[case]
    faulty, step = store_of(tmp_path / "faulty", case.removesuffix("_recorded"), blocked, record_cpu)
    _, clean_step, _ = simulate(job(None), blocked)
    diff = step - clean_step
    a = analyze_store(faulty)
    loud = [f for f in a["findings"] if f["severity"] in ("warning", "critical")]
    top = loud[0]
    assert top["kind"] == "straggler" and top["ranks"] == [1], [(f["kind"], f["ranks"]) for f in loud]
    saving = top["evidence"]["replayed_saving_ns"]
    assert abs(saving - diff) <= 0.03 * diff, (saving / MS, diff / MS)


def test_the_clean_job_replays_as_measured(tmp_path):
    """The unchanged graph is the model's fixed point (every node's work at the measured rate takes its time),
    and the fitted outside load is the simulation's."""
    from tracekit.assess.whatif import prepare, run_whatif
    from tracekit.whatif.fixes import Fix
    from tracekit.whatif.sharing import host_shares
    from tracekit.whatif.steps import run_layout

    store, _ = store_of(tmp_path, None)
    inputs = prepare(store)
    out = run_whatif(store, [Fix("rank_compute", rank=0, value=1.0)], inputs)
    assert out["measured_ns"] == out["replayed_ns"]
    assert abs(out["predicted_ns"] - out["measured_ns"]) <= 2_000
    (share,) = host_shares(out["results"][0].graph, run_layout(inputs.layout, inputs.pipeline, store))
    assert share.cores == K and share.load == pytest.approx(E, rel=0.02)
