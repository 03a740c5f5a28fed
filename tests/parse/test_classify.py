"""Classification done once in the parser: kernels.step / carry_over (the launching CPU op's step),
steps.device_ts/device_dur, events.role, kernels.kind, process_groups.dim.

Expected values are computed here from the trace JSON itself with plain integer arithmetic (Decimal
µs → ns, correlation → runtime call → enclosing ProfilerStep), never read from tracekit's output;
both drivers (whole file and bounded chunks) must give them."""

from __future__ import annotations

import gzip
import json
import os
from decimal import Decimal
from pathlib import Path

import pytest

from tracekit.parse.chunked import parse_kineto_chunked
from tracekit.parse.classify import group_dim, is_label
from tracekit.parse.kineto import parse_kineto

_DIR = Path(os.environ.get("TRACEKIT_SHARED_TRACES") or Path(__file__).resolve().parents[2].parent / "shared" / "traces")
_KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")


def _x(name, ts, dur, cat="cpu_op", pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _host_ahead_trace() -> tuple[dict, dict[str, str]]:
    """Three host steps of 100 µs; each step's kernels run on the device during the NEXT host step
    (the host a full step ahead). Two kernels left over from before profiling run first. Returns the
    trace and the role of each host event name, labelled by hand."""
    ev = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 9, "args": {"name": "pt_gloo_runloop"}}]
    roles = {}

    def host(name, ts, dur, role, cat="cpu_op", tid=1, **args):
        ev.append(_x(name, ts, dur, cat=cat, tid=tid, **args))
        roles[name] = role

    corr = 100
    for s, t0 in ((1, 1000), (2, 1100), (3, 1200)):
        host(f"ProfilerStep#{s}", t0, 100, "step_annotation", cat="cpu_op" if s != 2 else "user_annotation")
        host(f"enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__ {s}", t0 + 1, 5, "data_load",
             cat="user_annotation")
        host(f"aten::mm {s}", t0 + 10, 20, "compute")
        for k in range(2):  # two launches per step: a compute kernel and a memcpy
            corr += 1
            host(f"cudaLaunchKernel {s}.{k}", t0 + 12 + k, 1, "other", cat="cuda_runtime", correlation=corr)
            cat, name = (("kernel", f"gemm {s}") if k == 0 else ("gpu_memcpy", f"Memcpy HtoD {s}"))
            ev.append(_x(name, t0 + 100 + 20 + 30 * k, 25, cat=cat, pid=0, tid=7, correlation=corr, stream=7, device=0))
        host(f"c10d::allreduce_ {s}", t0 + 40, 10, "comm")
        host(f"_c10d_functional::all_reduce {s}", t0 + 52, 3, "comm")
        host(f"tracekit::flush {s}", t0 + 90, 4, "overhead", cat="user_annotation")
        host(f"gloo:all_reduce {s}", t0 + 41, 8, "comm", cat="user_annotation", tid=9)
        host(f"aten::copy_ worker {s}", t0 + 60, 2, "comm", tid=9)  # on the gloo worker thread
        # a label (our runtime's or any user's record_function): no role by its name, never data loading
        host(f"data:load {s}", t0 + 2, 3, "other", cat="user_annotation")
        host(f"Optimizer.step#SGD.step {s}", t0 + 70, 5, "other", cat="user_annotation")
    # carry-over: device work with no launch in the trace, before the first linked kernel (1120 µs)
    ev.append(_x("leftover_kernel", 1005, 50, cat="kernel", pid=0, tid=7, correlation=5, stream=7, device=0))
    ev.append(_x("leftover_memset", 1060, 10, cat="gpu_memset", pid=0, tid=7, correlation=6, stream=7, device=0))
    # no launch, after the first linked kernel: in no step, not carry-over
    ev.append(_x("late_unlinked", 1390, 5, cat="kernel", pid=0, tid=7, correlation=7, stream=7, device=0))
    # an NCCL kernel (comm by its name), launched in step 3
    corr += 1
    host("cudaLaunchKernelExC nccl", 1260, 1, "other", cat="cuda_runtime", correlation=corr)
    ev.append(_x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1360, 20, cat="kernel", pid=0, tid=8,
                 correlation=corr, stream=8, device=0))
    return {"traceEvents": ev, "distributedInfo": {"rank": 0, "world_size": 1}}, roles


def _ns(v) -> int:
    return int((Decimal(str(v)) * 1000).to_integral_value(rounding="ROUND_HALF_UP"))


def _expected_kernels(doc: dict) -> tuple[dict[tuple, tuple], dict[int, tuple]]:
    """(kernel (name, ts) → (step, carry_over), step → (device_ts, device_dur)) from the JSON alone."""
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    cat = lambda e: str(e.get("cat", "")).lower()  # noqa: E731
    steps = []
    for e in xs:
        name = str(e.get("name", ""))
        if name.startswith("ProfilerStep#") and name[13:].isdigit() and cat(e) not in ("gpu_user_annotation",):
            steps.append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e.get("dur", 0)), int(name[13:])))
    steps.sort()

    def step_at(t):
        inside = [n for s, e, n in steps if s <= t and (t < e or t == s)]
        return inside[-1] if inside else None

    launch = {}
    for e in xs:
        c = (e.get("args") or {}).get("correlation")
        if cat(e) not in _KERNEL_CATS and not cat(e).startswith("gpu_") and cat(e) != "cuda_sync" and c is not None and c not in launch:
            launch[c] = _ns(e["ts"])
    kernels = [e for e in xs if cat(e) in _KERNEL_CATS]
    linked = [_ns(k["ts"]) for k in kernels if (k.get("args") or {}).get("correlation") in launch]
    first = min(linked) if linked else None
    out, spans = {}, {}
    for k in kernels:
        t = _ns(k["ts"])
        c = (k.get("args") or {}).get("correlation")
        if first is None:
            step, carry = step_at(t), False
        elif c in launch:
            step, carry = step_at(launch[c]), False
        else:
            step, carry = None, t < first
        out[(k["name"][:200], t)] = (step, carry)
        if step is not None:
            end = t + max(_ns(k.get("dur", 0)), 0)
            lo, hi = spans.get(step, (t, end))
            spans[step] = (min(lo, t), max(hi, end))
    return out, {s: (lo, hi - lo) for s, (lo, hi) in spans.items()}


def _got(parsed) -> tuple[dict, dict]:
    k = {(r["name"][:200], r["ts"]): (r["step"], r["carry_over"]) for r in parsed.tables["kernels"].to_pylist()}
    s = {r["step"]: (r["device_ts"], r["device_dur"]) for r in parsed.tables["steps"].to_pylist()
         if r["device_ts"] is not None}
    return k, s


@pytest.mark.parametrize("driver", ["whole", "chunked"])
def test_host_a_step_ahead(tmp_path, driver):
    doc, roles = _host_ahead_trace()
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc))
    parsed = (parse_kineto(p) if driver == "whole" else
              parse_kineto_chunked(p, max_memory_bytes=1 << 30, chunk_bytes=2048))
    want_k, want_s = _expected_kernels(doc)
    got_k, got_s = _got(parsed)
    assert got_k == want_k
    assert got_s == want_s
    # the device lags a whole step: step 1's kernels run inside the host's step 2 window
    assert want_k[("gemm 1", 1120_000)] == (1, False) and want_k[("leftover_kernel", 1005_000)] == (None, True)
    ev = parsed.tables["events"].to_pylist()
    got_roles = {r["name"]: r["role"] for r in ev if r["lane"] != "device"}
    assert got_roles == roles
    kinds = {r["name"]: r["kind"] for r in parsed.tables["kernels"].to_pylist()}
    want_kinds = {e["name"]: ("comm" if e["name"].startswith("nccl") else
                              {"kernel": "compute", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}[e["cat"]])
                  for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    assert kinds == want_kinds
    assert {r["name"]: r["role"] for r in ev if r["lane"] == "device"} == want_kinds
    assert {r["name"]: r["step"] for r in ev if r["lane"] == "device"} == {
        name: s for (name, _), (s, _) in want_k.items()}


def test_cpu_only_steps_are_the_annotation_intervals(tmp_path):
    """No kernels: nothing changes — host rows take the enclosing ProfilerStep, no device window."""
    ev = [_x("ProfilerStep#4", 0, 100), _x("aten::add", 10, 5), _x("ProfilerStep#5", 100, 50),
          _x("aten::mul", 120, 5), _x("aten::sub", 170, 5)]
    p = tmp_path / "cpu.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    parsed = parse_kineto(p)
    got = {r["name"]: (r["step"], r["role"]) for r in parsed.tables["events"].to_pylist()}
    assert got == {"ProfilerStep#4": (4, "step_annotation"), "aten::add": (4, "compute"),
                   "ProfilerStep#5": (5, "step_annotation"), "aten::mul": (5, "compute"),
                   "aten::sub": (None, "compute")}
    assert [(r["step"], r["ts"], r["dur"], r["device_ts"]) for r in parsed.tables["steps"].to_pylist()] == [
        (4, 0, 100_000, None), (5, 100_000, 50_000, None)]


@pytest.mark.parametrize("desc, name, dim", [
    ("mesh_tp", "3", "tp"), ("mesh_dp_shard", "1", "fsdp"), ("default_pg", "0", "world"),
    ("mesh_pp", "5", "pp"), ("mesh_dp_cp", "2", "dp"), ("undefined", "7", "unknown"), (None, "9", "unknown"),
    (None, "tp_group", "tp"),
])
def test_group_dim(desc, name, dim):
    assert group_dim(desc, name) == dim


_REAL = ["kineto_resnet50_2021_workers0", "hta_nccl_a100_rank0of2", "hta_amd_mi250", "hta_sampled_2rank",
         "hta_critical_path_alexnet", "hta_gloo_cpu_rank34of300"]


@pytest.mark.parametrize("name", _REAL)
def test_real_traces(name):
    path = sorted((_DIR / name).glob("*.json.gz"))[0]
    with gzip.open(path, "rt") as f:
        doc = json.load(f, parse_float=Decimal)
    parsed = parse_kineto(path)
    want_k, want_s = _expected_kernels(doc)
    got_k, got_s = _got(parsed)
    assert got_k == want_k
    assert got_s == want_s
    ev = parsed.tables["events"]
    role = dict(zip(ev.column("name").to_pylist(), ev.column("role").to_pylist()))
    for e in doc["traceEvents"]:
        nm = str(e.get("name", ""))
        if e.get("ph") == "X" and nm.startswith("ProfilerStep#") and "ts" in e:
            assert role[nm] == "step_annotation"  # the 2021 traces record it as an "Operator": never compute
    lanes = ev.column("lane").to_pylist()
    roles = ev.column("role").to_pylist()
    kinds = set(parsed.tables["kernels"].column("kind").to_pylist())
    assert {r for r, lane in zip(roles, lanes) if lane == "device" and r not in ("other", "step_annotation")} <= kinds


@pytest.mark.parametrize("name, cat, label", [
    ("data:load", "user_annotation", True), ("my_fetch", "user_annotation", True), ("fwd", "user_annotation", True),
    ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", False),
    ("ProfilerStep#3", "user_annotation", False), ("nccl:all_reduce", "user_annotation", False),
    ("tracekit::flush_collective_log", "user_annotation", False), ("aten::mm", "cpu_op", False),
    ("my_fetch", "cpu_op", False)])
def test_labels_are_user_ranges_whose_name_decides_no_role(name, cat, label):
    assert is_label(name, cat) is label
