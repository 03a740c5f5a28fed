"""Where a step's gradients are produced: its last backward pass (the overlap what-if's ready points).

A step that accumulates micro-batches (DDP's `no_sync`) or runs pipeline micro-batches finishes its gradients,
and DDP fills its buckets, in the last backward pass only. The overlap what-if spreads each bucket's ready point
over the backward compute from that pass's start (`whatif/fixes.gradient_buckets`); from the step's first
backward kernel it would move buckets ahead of gradients that did not exist yet.

A kernel's external id is its innermost CPU op's: `MmBackward0`'s `aten::mm` has no "backward" in its name,
and is backward's because it runs inside `autograd::engine::evaluate_function: MmBackward0` on the same thread.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tracekit.whatif.build import last_backward_start, launched_by_backward


def _events(rows: list[tuple[str, str, int, int, int, int | None]]) -> pa.Table:
    cat, name, ts, dur, tid, ext = zip(*rows)
    return pa.table({"cat": list(cat), "name": list(name), "ts": pa.array(ts, pa.int64()),
                     "dur": pa.array(dur, pa.int64()), "tid": pa.array(tid, pa.int64()),
                     "external_id": pa.array(ext, pa.int64())})


def test_ops_nested_in_an_autograd_op_launch_backward_kernels():
    ev = _events([
        ("cpu_op", "aten::linear", 0, 100, 1, 1),                                       # forward, main thread
        ("cpu_op", "aten::mm", 10, 80, 1, 2),                                           # inside it: forward
        ("cpu_op", "autograd::engine::evaluate_function: MmBackward0", 200, 100, 2, 3),
        ("cpu_op", "aten::mm", 210, 40, 2, 4),                                          # nested: backward
        ("cpu_op", "aten::convolution_backward", 320, 30, 2, 5),                        # named: backward
        ("cpu_op", "aten::add_", 220, 10, 1, 6),  # the main thread while the engine runs: not nested in it
        ("cpu_op", "aten::mul", 300, 10, 2, 7),   # starts as the engine op ends: after it, not inside
        ("cuda_runtime", "cudaLaunchKernel", 215, 5, 2, 4),  # not an op: carries no pass of its own
    ])
    kernel_ext = np.array([2, 4, 5, 6, 7, 1, -1, 99], np.int64)
    assert launched_by_backward(ev, kernel_ext).tolist() == [False, True, True, False, False, False, False, False]


def test_last_pass_starts_after_the_last_forward_kernel():
    # two accumulated micro-batches, then the optimizer: F F B B | F B B | optimizer (not backward, after it)
    ts = np.array([0, 10, 20, 30, 40, 50, 60, 70, 80], np.int64)
    bwd = np.array([0, 0, 1, 1, 0, 1, 1, 0, 0], bool)
    compute = np.ones(ts.size, bool)
    assert last_backward_start(ts, bwd, compute) == 50
    # a non-compute kernel (a copy, a collective) between the passes does not end a pass
    compute2 = compute.copy()
    compute2[4] = False
    assert last_backward_start(ts, bwd, compute2) == 20
    # one pass: its first backward kernel; no backward: -1
    one = np.array([0, 0, 0, 0, 0, 1, 1, 0, 0], bool)
    assert last_backward_start(ts, one, compute) == 50
    assert last_backward_start(ts, np.zeros(ts.size, bool), compute) == -1


def test_on_a_real_trace_kernels_nested_in_autograd_ops_are_backward(shared_traces, tmp_path):
    """HTA's 2-rank NCCL A100 trace (rank 0): the kernels whose launching op (by External id) is named backward
    or starts inside a backward-named op on its thread, computed from the raw JSON, are the ones tracekit marks.
    Some of them are launched by ops without "backward" in their name (`aten::mul` in `MulBackward0`): before,
    they counted as forward."""
    import gzip
    import json
    from collections import defaultdict

    from tracekit.parse.run import parse_run

    name = "hta_nccl_a100_rank0of2"
    (path,) = sorted((shared_traces / name).glob("*.json.gz"))
    events = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    spans = defaultdict(list)  # thread → spans of its backward-named ops
    for e in ops:
        if "backward" in e["name"].lower():
            spans[e["tid"]].append((e["ts"], e["ts"] + e.get("dur", 0)))

    def inside(e) -> bool:
        return any(a <= e["ts"] < b for a, b in spans.get(e["tid"], ()))

    named = {e["args"]["External id"] for e in ops
             if "External id" in e.get("args", {}) and "backward" in e["name"].lower()}
    backward = {e["args"]["External id"] for e in ops if "External id" in e.get("args", {})
                and ("backward" in e["name"].lower() or inside(e))}
    device = ("kernel", "gpu_memcpy", "gpu_memset")  # the kernels table's rows: kernels, copies, memsets
    kernel_ext = [e["args"].get("External id") for e in events if e.get("cat") in device]
    want = sum(x in backward for x in kernel_ext)
    assert want > sum(x in named for x in kernel_ext) > 0  # nesting adds kernels the names alone miss

    store = parse_run(shared_traces / name, tmp_path / "store", progress=False).store
    (rank,) = store.ranks()
    ev = store.rank_table("events", rank, ["name", "cat", "ts", "dur", "tid", "external_id"])
    ext = store.rank_table("kernels", rank, ["external_id"]).column("external_id").to_numpy(zero_copy_only=False)
    ext = np.nan_to_num(ext.astype(float), nan=-1).astype(np.int64)
    assert ext.size == len(kernel_ext)
    got = launched_by_backward(ev, ext)
    assert int(got.sum()) == want
    assert sorted(ext[got].tolist()) == sorted(int(x) for x in kernel_ext if x in backward)
