"""The replayed saving of a pipeline imbalance (issue 32), on hand-built gloo pipeline traces.

A 4-stage pipeline (GPipe or 1F1B, m micro-batches) is simulated here in plain integer arithmetic: each
rank runs its program in order (forward op F_r per micro-batch, backward op 2·F_r, `c10d::recv_` +
`gloo:recv` held until the peer's `c10d::send` is posted, `c10d::send` + an asynchronous `gloo:send`), and
written as Kineto traces the way PyTorch's profiler records a gloo job with no labels and no collective.
The same simulation with every stage at the mean F is the step after "re-split stages evenly": the
finding's replayed saving must equal the difference exactly (the replay starts nothing earlier than the
trace's own order allows, so its schedule is this one).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run

US = 1_000  # ns
P = 4
CALL = 20 * US  # a c10d::send / c10d::recv_ call's own time
RESUME = 1 * US  # from a receive's end to the thread's next op (Python returning from wait())


def program(rank: int, m: int, schedule: str) -> list[tuple[str, int]]:
    """The rank's ops in order: ("F"|"B", mb), ("recv_f"|"recv_b", mb), ("send_f"|"send_b", mb)."""
    first, last = rank == 0, rank == P - 1

    def fwd(i: int) -> list[tuple[str, int]]:
        return ([] if first else [("recv_f", i)]) + [("F", i)] + ([] if last else [("send_f", i)])

    def bwd(i: int) -> list[tuple[str, int]]:
        return ([] if last else [("recv_b", i)]) + [("B", i)] + ([] if first else [("send_b", i)])

    if schedule == "gpipe":
        return [x for i in range(m) for x in fwd(i)] + [x for i in range(m) for x in bwd(i)]
    warm = min(P - 1 - rank, m)  # 1F1B: warm-up forwards, then one forward one backward, then the rest
    ops = [x for i in range(warm) for x in fwd(i)]
    for k in range(m - warm):
        ops += fwd(warm + k) + bwd(k)
    return ops + [x for i in range(m - warm, m) for x in bwd(i)]


def simulate(fwd_ns: list[int], m: int, schedule: str) -> dict[int, list[tuple[str, int, int, int]]]:
    """Per rank its events (name, mb, start, end) in ns from 0; a receive ends when the peer's send was
    posted (the end of its c10d::send call), never before its own call, and the thread resumes `RESUME` later."""
    progs = {r: program(r, m, schedule) for r in range(P)}
    pos, now = dict.fromkeys(range(P), 0), dict.fromkeys(range(P), 0)
    posted: dict[tuple[str, int, int], int] = {}  # (kind, sender, mb) -> time the send was posted
    out: dict[int, list[tuple[str, int, int, int]]] = {r: [] for r in range(P)}
    while any(pos[r] < len(progs[r]) for r in range(P)):
        moved = False
        for r in range(P):
            while pos[r] < len(progs[r]):
                kind, mb = progs[r][pos[r]]
                t = now[r]
                if kind in ("F", "B"):
                    end = t + fwd_ns[r] * (1 if kind == "F" else 2)
                elif kind.startswith("send"):
                    end = t + CALL
                    posted[(kind[-1], r, mb)] = end
                else:
                    src = r - 1 if kind == "recv_f" else r + 1
                    if (kind[-1], src, mb) not in posted:
                        break
                    end = max(t + CALL, posted[(kind[-1], src, mb)])
                out[r].append((kind, mb, t, end))
                now[r], pos[r] = end + (RESUME if kind.startswith("recv") else 0), pos[r] + 1
                moved = True
        assert moved, "deadlock in the schedule"
    return out


def makespan(fwd_ns: list[int], m: int, schedule: str) -> int:
    return max(e for evs in simulate(fwd_ns, m, schedule).values() for *_, e in evs)


def _x(name: str, cat: str, t: int, dur: int, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": t / US, "dur": dur / US, "args": args}


def write_traces(out: Path, fwd_ns: list[int], m: int, schedule: str) -> None:
    """One Kineto trace per rank: ProfilerStep#1 over the rank's program; sends and receives as gloo
    records them (c10d call with the peer in Concrete Inputs, then the gloo: annotation)."""
    out.mkdir(parents=True)
    t0 = 1_000_000 * US  # trace clock origin (all ranks on one host clock)
    dims = {"Input Dims": [[[4, 32]], [], [], []], "Input type": ["TensorList", "", "Scalar", "Scalar"]}
    sim = simulate(fwd_ns, m, schedule)
    taken = {(kind[-1], r - 1 if kind == "recv_f" else r + 1, mb): a + CALL
             for r, evs in sim.items() for kind, mb, a, _ in evs if kind.startswith("recv")}
    for r, evs in sim.items():
        end = max(e for *_, e in evs)
        te = [_x("ProfilerStep#1", "user_annotation", t0, end)]
        for kind, mb, a, b in evs:
            if kind in ("F", "B"):
                te.append(_x("aten::addmm" if kind == "F" else "AddmmBackward0", "cpu_op", t0 + a, b - a))
                continue
            peer = r + 1 if kind in ("send_f", "recv_b") else r - 1
            c10d = "c10d::send" if kind.startswith("send") else "c10d::recv_"
            te.append(_x(c10d, "cpu_op", t0 + a, CALL, **dims, **{"Concrete Inputs": ["", "", str(peer), "0"]}))
            # an isend's record runs on until the peer's receive took the data (its call ended): over the
            # sender's next ops where the peer posts late
            gloo_end = b if kind.startswith("recv") else max(b, taken[(kind[-1], r, mb)])
            te.append(_x(f"gloo:{kind[:4]}", "user_annotation", t0 + a + 1 * US, gloo_end - a - 1 * US,
                         **{"Input Dims": [[4, 32]], "Input type": ["float"]}))
        doc = {"schemaVersion": 1, "traceEvents": te, "distributedInfo": {
            "backend": "gloo", "rank": r, "world_size": P, "pg_count": 1,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": P, "ranks": list(range(P))}]}}
        with gzip.open(out / f"rank{r}.pt.trace.json.gz", "wt") as fh:
            json.dump(doc, fh)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_resplit_saving_of_a_hand_built_pipeline_is_exact(schedule, tmp_path):
    ms = 1_000_000
    m = 4
    faulty = [2 * ms, 6 * ms, 2 * ms, 2 * ms]  # stage 1 holds 3x the layers of each other stage
    even = [int(np.mean(faulty))] * P  # the same 12 "layers" re-split 3/3/3/3
    write_traces(tmp_path / "traces", faulty, m, schedule)
    store = parse_run(tmp_path / "traces", tmp_path / "store", progress=False).store
    analysis = analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False))
    assert not store.has("collectives") or not [
        c for c in store.table("collectives").to_pylist() if c["op"] not in ("send", "recv")]  # a pure pipeline
    sec = analysis["sections"]["pipeline"]
    assert sec["num_stages"] == P and sec["num_microbatches"] == m and sec["schedule_detected"] == schedule
    cp = analysis["sections"]["critical_path"]
    (step,) = cp["steps"]
    measured, expect_step = makespan(faulty, m, schedule), makespan(even, m, schedule)
    assert step["measured_ns"] == measured and step["replayed_ns"] == measured
    top = analysis["findings"][0]
    assert top["kind"] == "pipeline_imbalance" and top["severity"] in ("warning", "critical") and top["ranks"] == [1]
    ev = top["evidence"]
    print(f"\n{schedule}: step {measured / ms:.1f} ms, even split {expect_step / ms:.1f} ms, "
          f"replayed saving {ev['replayed_saving_ns'] / ms:.3f} ms (closed form {ev['closed_form_saving_ns'] / ms:.1f})")
    assert ev["replayed_saving_ns"] == measured - expect_step
    assert top["est_saving_ns"] == measured - expect_step
    # waiting for the peer is not a host stall: of the path, host_data_stall holds only the threads' short
    # times between calls (the resumes after receives, the gloo records' starts), under 1% of the step
    assert step["composition"]["by_category"].get("host_data_stall", 0) <= 0.01 * measured


def test_send_recv_rows_come_from_the_source_that_times_them():
    """With a collective in the run the matching source is the comms log, whose send/recv rows hold
    enqueue times only; the replay's links take each rank's profiler rows then, its log rows where the log
    times them."""
    from tests.analyze.analyze_builders import table
    from tracekit.whatif.steps import p2p_rows
    from tracekit.derive.matching import COLUMNS
    from tracekit.tables.columns import arrow_columns, strings

    ms = 1_000_000

    def rows(timed_log: bool) -> list[dict]:
        out = []
        for r in (0, 1):
            out.append({"rank": r, "source": "comms-log", "pg_name": "0", "seq": 1, "op": "all_reduce",
                        "enqueue_ts": 50 * ms, "step": 1})
            op, peer = ("send", 1) if r == 0 else ("recv", 0)
            log = {"rank": r, "source": "comms-log", "pg_name": "0", "op": op, "is_p2p": True, "peer": peer,
                   "enqueue_ts": 10 * ms, "step": 1}
            out.append({**log, "ts": 10 * ms, "dur": ms} if timed_log else log)
            out.append({"rank": r, "source": "kineto", "pg_name": "0", "op": op, "is_p2p": True, "peer": peer,
                        "enqueue_ts": 10 * ms, "ts": 10 * ms, "dur": 2 * ms, "step": 1})
        return out

    for timed_log, want in ((False, "kineto"), (True, "comms-log")):
        cols = arrow_columns(table("collectives", rows(timed_log)).select(COLUMNS))
        got = p2p_rows(cols)
        assert got is not None and sorted(got["rank"].tolist()) == [0, 1]
        assert set(strings(got["source"]).tolist()) == {want}
        assert got["ts_ok"].all() and got["dur_ok"].all()
