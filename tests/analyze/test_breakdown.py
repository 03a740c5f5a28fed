"""Breakdown definitions (DESIGN §3) pinned on hand-built tables, numbers worked out by hand."""

from __future__ import annotations

from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store

from tests.analyze.analyze_builders import build_store


def _gpu_rank(r):
    # step [0, 1000): compute [100,400)+[300,500) -> 400; comm [450,700) overlaps compute 50;
    # memcpy [650,800) -> other [700,800) = 100; memset [900,950) = 50; idle = 1000-400-200-150 = 250
    return [
        {"rank": r, "ts": 100, "dur": 300, "kind": "compute", "stream": 7},
        {"rank": r, "ts": 300, "dur": 200, "kind": "compute", "stream": 8},
        {"rank": r, "ts": 450, "dur": 250, "kind": "comm", "pg_name": "1", "stream": 9},
        {"rank": r, "ts": 650, "dur": 150, "kind": "memcpy", "stream": 7},
        {"rank": r, "ts": 900, "dur": 50, "kind": "memset", "stream": 7},
        {"rank": r, "ts": 1200, "dur": 100, "kind": "compute", "stream": 7},  # outside the step: not counted
    ]


def test_gpu_breakdown_is_exclusive_and_sums_to_the_step(tmp_path):
    store = build_store(tmp_path, {
        "ranks": [{"rank": 0, "world_size": 1, "trace_kind": "gpu"}],
        "process_groups": [{"pg_name": "1", "pg_desc": "mesh_tp", "ranks": [0]}],
        "steps": [{"rank": 0, "step": 3, "ts": 0, "dur": 1000}],
        "kernels": _gpu_rank(0),
    })
    a = analyze_store(store)
    assert a["ranks"] == [{"rank": 0, "steps": 1, "step_ns": 1000, "compute_ns": 400, "comm_ns": 250,
                           "exposed_comm_ns": 200, "other_ns": 150, "idle_ns": 250, "overlap_ratio": 0.2,
                           "bound": "compute", "sync_wait_ns": 0, "exposed_transfer_ns": 200, "carry_over_ns": 0,
                           "waited_for": {}}]
    step = a["sections"]["breakdown"]["steps"][0]
    assert step["step"] == 3 and step["ts"] == 0
    lanes = {(i[1], i[2], i[3]) for i in a["sections"]["breakdown"]["timeline"]["intervals"]}
    assert ("compute", 100, 500) in lanes and ("comm:tp", 450, 700) in lanes
    assert ("other", 700, 800) in lanes and ("idle", 0, 100) in lanes and ("idle", 950, 1000) in lanes


def test_cpu_breakdown_uses_training_threads_and_gloo_worker_time(tmp_path):
    main, gloo = "thread 10 (python)", "thread 11 (pt_gloo_runloop)"
    ev = [
        # compute on the training thread: [0,150) (nested ops) and [400,600)
        {"rank": 0, "name": "aten::linear", "cat": "cpu_op", "ts": 0, "dur": 100, "tid": 10, "thread_name": main},
        {"rank": 0, "name": "aten::mm", "cat": "cpu_op", "ts": 50, "dur": 100, "tid": 10, "thread_name": main},
        # issuing the collective: other device/host work, not compute
        {"rank": 0, "name": "c10d::allreduce_", "cat": "cpu_op", "ts": 150, "dur": 10, "tid": 10, "thread_name": main},
        {"rank": 0, "name": "gloo:all_reduce", "cat": "user_annotation", "ts": 155, "dur": 245, "tid": 11,
         "thread_name": gloo},
        {"rank": 0, "name": "aten::add", "cat": "cpu_op", "ts": 400, "dur": 200, "tid": 10, "thread_name": main},
        # an annotation is not compute
        {"rank": 0, "name": "data:load", "cat": "user_annotation", "ts": 600, "dur": 300, "tid": 10, "thread_name": main},
        # an enclosing autograd op that runs a synchronous comm op: the wait inside it is not compute
        {"rank": 0, "name": "autograd::engine::evaluate_function: X", "cat": "cpu_op", "ts": 700, "dur": 200,
         "tid": 10, "thread_name": main},
        {"rank": 0, "name": "aten::mul", "cat": "cpu_op", "ts": 700, "dur": 20, "tid": 10, "thread_name": main},
        {"rank": 0, "name": "comm:all_reduce:mesh_dp", "cat": "cpu_op", "ts": 720, "dur": 170, "tid": 10,
         "thread_name": main},
        {"rank": 0, "name": "aten::div_", "cat": "cpu_op", "ts": 725, "dur": 5, "tid": 10, "thread_name": main},
        {"rank": 0, "name": "gloo:all_reduce", "cat": "user_annotation", "ts": 730, "dur": 150, "tid": 11,
         "thread_name": gloo},
    ]
    coll = [
        {"rank": 0, "source": "kineto", "pg_name": "0", "op": "all_reduce", "ts": 155, "dur": 245, "enqueue_ts": 150},
        {"rank": 0, "source": "kineto", "pg_name": "0", "op": "all_reduce", "ts": 730, "dur": 150, "enqueue_ts": 720},
    ]
    store = build_store(tmp_path, {
        "ranks": [{"rank": 0, "world_size": 1, "trace_kind": "cpu"}],
        "steps": [{"rank": 0, "step": 1, "ts": 0, "dur": 1000}],
        "events": ev, "collectives": coll,
    })
    row = analyze_store(store)["ranks"][0]
    # compute: [0,150) + [400,600) + [700,720) + [725,730) (leaves inside the comm op) + [890,900)
    compute = 150 + 200 + 20 + 5 + 10
    # comm: gloo worker [155,400) + [730,880) = 395, plus the training thread inside comm calls
    # [150,155) + [720,730) + [880,890) = 25 -> 420; the aten::div_ leaf [725,730) inside the call
    # overlaps it, so 5 ns are overlapped and 415 exposed
    assert row["compute_ns"] == compute and row["comm_ns"] == 420 and row["exposed_comm_ns"] == 415
    assert row["overlap_ratio"] == round(5 / 420, 6) and row["other_ns"] == 0
    assert row["idle_ns"] == 1000 - compute - 415
    assert row["bound"] == "communication"   # 415 > 385 compute > 200 idle


def test_gpu_trace_without_steps_is_one_window_first_to_last_device_event(tmp_path):
    """TraceLens's window: host-only time before the first and after the last device event is not idle."""
    store = build_store(tmp_path, {
        "ranks": [{"rank": 5, "world_size": 8, "first_ts": 1000, "last_ts": 3000}],
        "kernels": [{"rank": 5, "ts": 1500, "dur": 500, "kind": "compute"},
                    {"rank": 5, "ts": 1800, "dur": 400, "kind": "comm"}],
    })
    a = analyze_store(store)
    assert a["ranks"] == [{"rank": 5, "steps": 1, "step_ns": 700, "compute_ns": 500, "comm_ns": 400,
                           "exposed_comm_ns": 200, "other_ns": 0, "idle_ns": 0, "overlap_ratio": 0.5,
                           "bound": "compute", "sync_wait_ns": 0, "exposed_transfer_ns": 200, "carry_over_ns": 0,
                           "waited_for": {}}]
    assert a["sections"]["breakdown"]["steps"][0]["step"] is None
    detail = a["sections"]["breakdown"]["rank_details"][0]
    assert (detail["windows"], detail["step_rule"]) == ("device_span", "device_span")


def test_totals_sum_steps_and_timeline_respects_its_budget(tmp_path):
    kernels, steps = [], []
    for s in range(4):
        base = s * 10_000
        steps.append({"rank": 0, "step": s, "ts": base, "dur": 10_000})
        for k in range(50):  # 50 compute kernels of 100 ns with 50 ns gaps, then a comm kernel
            kernels.append({"rank": 0, "ts": base + k * 150, "dur": 100, "kind": "compute"})
        kernels.append({"rank": 0, "ts": base + 8000, "dur": 1000 + s, "kind": "comm"})
    store = build_store(tmp_path, {"ranks": [{"rank": 0, "world_size": 1}], "steps": steps, "kernels": kernels})
    a = analyze_store(store, AnalysisConfig(max_timeline_intervals=40))
    row = a["ranks"][0]
    per_step = a["sections"]["breakdown"]["steps"]
    assert row["steps"] == 4 and len(per_step) == 4
    for key in ("step_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "other_ns", "idle_ns"):
        assert row[key] == sum(p[key] for p in per_step)
    assert row["compute_ns"] == 4 * 50 * 100 and row["comm_ns"] == 4 * 1000 + 6
    for p in per_step:
        assert p["compute_ns"] + p["exposed_comm_ns"] + p["other_ns"] + p["idle_ns"] == p["step_ns"]
    tl = a["sections"]["breakdown"]["timeline"]
    assert len(tl["intervals"]) <= 40 and tl["min_gap_ns"] > 0 and tl["truncated_ranks"] == []
    assert set(tl["lanes"]) >= {"compute", "comm", "idle"}
