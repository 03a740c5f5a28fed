"""CUDA-graph use of one rank from its host events (parse/classify.py `graph_mode`, `workload_of`): the
capture spans, the launches inside them and the graph launches, counted by hand from the events below."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tracekit.parse.classify import Names, graph_mode, workload_of


def _rank(events):
    names = Names.of(pa.array([n for n, _, _ in events], pa.string()).dictionary_encode())
    ts = np.array([t for _, t, _ in events], np.int64)
    return names, ts, ts + np.array([d for _, _, d in events], np.int64)


EVENTS = [
    ("cudaStreamBeginCapture", 100, 5),      # span 100 .. 400 (the first end at or after it: 390 + 10)
    ("cudaLaunchKernel", 150, 5),            # inside
    ("cudaLaunchKernel", 399, 1),            # inside (a span's end is inclusive)
    ("cudaStreamEndCapture", 390, 10),
    ("cudaLaunchKernel", 450, 5),            # between the spans: run, not captured
    ("cudaStreamBeginCapture", 500, 5),      # begins 500 and 520 share the end 700
    ("cudaStreamBeginCapture", 520, 5),
    ("cudaLaunchKernel", 600, 5),            # inside both: counted once
    ("cudaStreamEndCapture", 690, 10),
    ("cudaStreamBeginCapture", 900, 5),      # no end after it: a span of one instant
    ("cudaLaunchKernel", 900, 3),            # at that instant: inside
    ("cudaLaunchKernel", 905, 3),            # after it
    (None, 950, 1),
]


def test_capture_only_counts_each_launch_inside_any_span_once():
    names, ts, end = _rank(EVENTS)
    g = graph_mode(names, ts, end, num_kernels=2)
    assert g == {"mode": "capture_only", "captures": 4, "captured_launches": 4, "graph_launches": 0,
                 "kernels_run": 2}
    assert graph_mode(names, ts, end, num_kernels=4)["mode"] == "eager"  # as many kernels ran as were captured


def test_a_graph_launch_is_a_replay():
    names, ts, end = _rank(EVENTS + [("cudaGraphLaunch", 1_000, 5), ("cudaGraphLaunch", 1_100, 5)])
    g = graph_mode(names, ts, end, num_kernels=0)
    assert (g["mode"], g["graph_launches"], g["captured_launches"]) == ("graph_replay", 2, 4)


def test_no_capture_no_launch_inside():
    names, ts, end = _rank([("cudaLaunchKernel", 10, 5), ("cudaStreamEndCapture", 20, 5)])
    assert graph_mode(names, ts, end, num_kernels=1) == {
        "mode": "eager", "captures": 0, "captured_launches": 0, "graph_launches": 0, "kernels_run": 1}


def test_workload_from_backward_nodes_and_optimizer_steps():
    names, _, _ = _rank([("autograd::engine::evaluate_function: MmBackward0", 0, 1), ("aten::mm", 1, 1),
                         ("aten::mm", 2, 1)])
    w = workload_of(names, num_host_ops=3)
    assert w["workload"] == "training" and w["backward_ops"] == 1
    names, _, _ = _rank([("aten::mm", 1, 1), (None, 2, 1)])
    assert workload_of(names, num_host_ops=1)["workload"] == "inference"
    assert workload_of(names, num_host_ops=0)["workload"] == "unknown"
