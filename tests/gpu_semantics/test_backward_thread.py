"""The thread that called `backward()` waits for autograd's engine thread (issue 32: HTA's MI250 trace).

PyTorch runs a device's backward on its own engine thread (its ops are `autograd::engine::evaluate_function:
...`); the calling thread records nothing until the engine is done, then launches the optimizer. A hand-built
one-GPU trace of three steps (plain dicts, integer µs): the main thread launches the forward, the engine thread
the backward, the main thread the optimizer; every kernel runs 5 µs shortly after its launch returns, so the
device waits on the host throughout. In step 2 one backward launch (of a kernel the trace ran in step 1) takes
5 ms instead of 10 µs, a host thread that lost its core: the repaired launch saves its excess in that step,
and only if the replay knows the main thread waited for the engine (else the main thread's silence is kept and
the repair saves nothing). The same slow launch in step 1, of a kernel the trace had not run before, is a first
launch (the runtime loads the kernel's module): a warm-up, info and no saving.

HTA's MI250 trace is that case: its one 6.5 ms hipLaunchKernel (read here from the raw JSON) launches the
first kernel of its name in the trace, in the trace's only step.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import pytest

from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run

MAIN, ENGINE, STREAM = 1, 2, 7
LAUNCH_US, KERNEL_US, LATENCY_US = 10, 5, 3
SLOW_US = 5_000


def _trace(slow_step: int | None, slow_kernel: str = "bwd_mm") -> tuple[dict, int]:
    """Three steps; returns the trace and the last kernel's end (µs)."""
    ev: list[dict] = []
    corr = [0]
    last_end = [0]
    device_free = [0]

    def launch(tid: int, t: int, kernel: str, dur: int = LAUNCH_US) -> int:
        corr[0] += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid, "ts": t,
                   "dur": dur, "args": {"correlation": corr[0]}})
        k0 = max(t + dur + LATENCY_US, device_free[0])
        ev.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": STREAM, "ts": k0, "dur": KERNEL_US,
                   "args": {"correlation": corr[0], "stream": STREAM, "device": 0}})
        device_free[0] = last_end[0] = k0 + KERNEL_US
        return t + dur

    t = 0
    for step in (1, 2, 3):
        s0 = t
        for i in range(4):  # forward on the main thread
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": MAIN, "ts": t, "dur": 15})
            launch(MAIN, t + 2, "fwd_mm")
            t += 20
        t += 20
        for i in range(4):  # backward on the engine thread
            name = "bwd_mm" if i != 1 else slow_kernel
            dur = SLOW_US if (step == slow_step and i == 1) else LAUNCH_US
            ev.append({"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0",
                       "pid": 1, "tid": ENGINE, "ts": t, "dur": dur + 5})
            t = launch(ENGINE, t + 2, name, dur) + 8
        t += 30  # the main thread returns from backward() and steps the optimizer
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::_foreach_add_", "pid": 1, "tid": MAIN, "ts": t,
                   "dur": 15})
        t = launch(MAIN, t + 2, "sgd") + 40
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": MAIN,
                   "ts": s0, "dur": t - s0 - 1})
    return {"traceEvents": ev, "distributedInfo": {"rank": 0, "world_size": 1}}, last_end[0]


def _analyze(trace: dict, tmp: Path) -> dict:
    (tmp / "in").mkdir(parents=True)
    (tmp / "in" / "rank0.json").write_text(json.dumps(trace))
    store = parse_run(tmp / "in", tmp / "store", progress=False).store
    return analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False, advice=False))


def test_the_caller_of_backward_waits_for_the_engine_thread(tmp_path):
    trace, slow_end = _trace(slow_step=2)
    _, clean_end = _trace(slow_step=None)
    expect = (slow_end - clean_end) * 1000 // 3  # per step, over the 3 steps (ns)
    assert expect == (SLOW_US - LAUNCH_US) * 1000 // 3
    a = _analyze(trace, tmp_path)
    (f,) = [f for f in a["findings"] if f["kind"] == "host_bound"]
    assert f["evidence"]["cause"] == "starved_host"
    assert f["evidence"]["replayed_saving_ns"] == pytest.approx(expect, rel=0.05)


def test_a_slow_first_launch_is_a_warm_up(tmp_path):
    trace, _ = _trace(slow_step=1, slow_kernel="bwd_first")  # a kernel the trace had not run before
    a = _analyze(trace, tmp_path)
    (f,) = [f for f in a["findings"] if f["kind"] == "host_bound"]
    assert f["evidence"]["cause"] == "first_launch" and f["severity"] == "info" and f["est_saving_ns"] == 0
    rows = a["sections"]["host_bound"]["ranks"]
    assert rows[0]["slow_ops_ns"] == 0
    assert rows[0]["first_launch_ns"] == (SLOW_US - LAUNCH_US) * 1000 // 3


def _ns(v) -> int:
    return int(Decimal(str(v)) * 1000)


def test_mi250s_slow_launch_is_the_first_of_its_kernel(shared_traces, tmp_path):
    (path,) = sorted((shared_traces / "hta_amd_mi250").glob("*.json.gz"))
    ev = [e for e in json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)["traceEvents"]
          if e.get("ph") == "X"]
    slow = max((e for e in ev if e["name"] == "hipLaunchKernel"), key=lambda e: _ns(e["dur"]))
    assert _ns(slow["dur"]) > 6_000_000
    kernels = sorted((e for e in ev if e.get("cat") == "kernel"), key=lambda e: _ns(e["ts"]))
    (k,) = [e for e in kernels if e["args"].get("correlation") == slow["args"]["correlation"]]
    assert not [e for e in kernels if e["name"] == k["name"] and _ns(e["ts"]) < _ns(k["ts"])]  # its first launch
    # ... in the first step: inside the earliest ProfilerStep annotation
    first = min((e for e in ev if str(e["name"]).startswith("ProfilerStep#")), key=lambda e: _ns(e["ts"]))
    assert _ns(first["ts"]) <= _ns(slow["ts"]) <= _ns(first["ts"]) + _ns(first["dur"])
    a = _analyze_dir(shared_traces / "hta_amd_mi250", tmp_path)
    (f,) = [f for f in a["findings"] if f["kind"] == "host_bound"]
    assert f["evidence"]["cause"] == "first_launch" and f["severity"] == "info" and f["est_saving_ns"] == 0
    (row,) = a["sections"]["host_bound"]["ranks"]
    assert row["slow_ops_ns"] == 0 and row["first_launch_ns"] >= _ns(slow["dur"]) - 100_000


def _analyze_dir(folder: Path, tmp: Path) -> dict:
    store = parse_run(folder, tmp / "store", progress=False).store
    return analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False, advice=False))
