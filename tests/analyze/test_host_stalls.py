"""Host stalls recognised from the trace itself: device idle with nothing queued while the host is in a
gap or inside PyTorch's `enumerate(DataLoader)#...`; on CPU traces gaps with no op and no collective.

Expected stall times are computed in each test from the intervals it writes (integer ns arithmetic),
and on the real H100 fixtures from what the capture injected (capture.json: the dataset sleeps 15 ms).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tracekit.analyze.host_stalls import MIN_GAP_NS, analyze_host_stalls
from tracekit.parse.run import parse_run

REPO = Path(__file__).resolve().parents[2]
US, MS = 1_000, 1_000_000
T0 = 1_000_000_000_000  # ns


def _x(name, cat, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": 7, "ts": (T0 + ts) / 1000, "dur": dur / 1000,
            "args": args}


def _kernel(name, ts, dur, corr):
    e = _x(name, "kernel", ts, dur, correlation=corr, stream=7, device=0)
    e["pid"], e["tid"] = 0, 7
    return e


def _launch(ts, corr):
    return _x("cudaLaunchKernel", "cuda_runtime", ts, 5 * US, correlation=corr)


def _write(path: Path, events: list[dict], rank: int = 0, world: int = 1) -> None:
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": world, "backend": "nccl"},
           "traceEvents": events}
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)


def _stalls(tmp_path: Path, events_by_rank: dict[int, list[dict]]):
    for rank, evs in events_by_rank.items():
        _write(tmp_path / "t" / f"rank{rank}.pt.trace.json.gz", evs, rank, len(events_by_rank))
    store = parse_run(tmp_path / "t", tmp_path / "s", progress=False).store
    return analyze_host_stalls(store)


def test_gpu_data_loading_with_nothing_queued_is_a_stall(tmp_path):
    """Step 0..40 ms: the host loads a batch (DataLoader, 15 ms) while the device has nothing queued, then
    launches 3 kernels; a 6 ms host gap while a launched kernel still runs is not a stall; a 4 ms gap
    after the queue drains is."""
    evs = [_x("ProfilerStep#3", "user_annotation", 0, 40 * MS)]
    evs.append(_x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation",
                  MS // 2, 15 * MS))
    kernels = [(16 * MS, 17 * MS, 12 * MS), (17 * MS, 18 * MS, 11 * MS), (18 * MS, 35 * MS, 1 * MS)]  # launch, start, dur
    for i, (launch, start, dur) in enumerate(kernels, 1):
        evs += [_x("aten::mm", "cpu_op", launch - 2 * US, 10 * US), _launch(launch, i), _kernel("gemm", start, dur, i)]
    # host: 18.01 → 24 ms gap (kernels queued until 36 ms), op at 24..36, gap 36..40 with the queue empty
    evs.append(_x("aten::item", "cpu_op", 24 * MS, 12 * MS))
    sec = _stalls(tmp_path, {0: evs}).section
    (r,) = sec["ranks"]
    # stall = from the step start to the first op (16 ms − 2 µs): no op but the DataLoader's annotation
    # (0.5..15.5 ms) and nothing queued (first launch at 16 ms), + the gap 36..40 ms (queue empty after the
    # last kernel ends at 36 ms); the 6 ms gap from 18 ms has kernels queued
    first_op = 16 * MS - 2 * US
    assert MIN_GAP_NS <= 4 * MS
    assert r["device"] == "gpu"
    assert r["data_load_ns"] == 15 * MS
    assert r["stall_ns"] == first_op + (40 * MS - 36 * MS)
    assert r["data_load_sources"] == ["DataLoader"]


def test_gpu_host_ahead_of_device_has_no_stall(tmp_path):
    """The host idles 20 ms after launching 30 ms of kernels: the device has work queued throughout."""
    evs = [_x("ProfilerStep#1", "user_annotation", 0, 30 * MS)]
    for i in range(3):
        launch = (1 + i) * 100 * US
        evs += [_x("aten::mm", "cpu_op", launch - 2 * US, 10 * US), _launch(launch, i + 1),
                _kernel("gemm", 1 * MS + i * 10 * MS, 10 * MS, i + 1)]
    evs.append(_x("aten::item", "cpu_op", 20 * MS, 10 * MS))
    res = _stalls(tmp_path, {0: evs})
    (r,) = res.section["ranks"]
    assert r["stall_ns"] == 0 and not res.findings


def test_cpu_label_sleep_is_a_stall_waiting_for_peers_is_not(tmp_path):
    """CPU ranks: rank 1 sleeps 30 ms inside the runtime's data:load label (no op runs); rank 0 waits for it
    inside the all_reduce (a gloo collective in flight), which is not a host stall."""
    by_rank = {}
    for rank in (0, 1):
        evs = [_x("ProfilerStep#2", "user_annotation", 0, 50 * MS), _x("aten::add", "cpu_op", 0, 2 * MS)]
        if rank == 1:
            evs.append(_x("data:load", "user_annotation", 2 * MS, 30 * MS))
        issue = 2 * MS if rank == 0 else 32 * MS
        evs.append(_x("c10d::allreduce_", "cpu_op", issue, 100 * US))
        ar = _x("gloo:all_reduce", "user_annotation", issue + 100 * US, (30 if rank == 0 else 1) * MS)
        ar["tid"] = 9
        evs += [ar, _x("aten::mul", "cpu_op", 33 * MS, 17 * MS)]
        by_rank[rank] = evs
    res = _stalls(tmp_path, by_rank)
    rows = {r["rank"]: r for r in res.section["ranks"]}
    # rank 1: no op from 2 to 32 ms, no collective in flight → 30 ms
    assert rows[1]["device"] == "cpu" and rows[1]["stall_ns"] == 30 * MS and rows[1]["data_load_ns"] == 30 * MS
    # rank 0: 2.1..32.1 ms is the all_reduce's wait, 32.1..33 ms is under MIN_GAP
    assert rows[0]["stall_ns"] == 0
    (f,) = [f for f in res.findings if f.severity.order >= 2]
    assert f.ranks == (1,) and f.kind.value == "idle_host_bound" and f.evidence.cause == "data_load"
    assert f.est_saving_ns == 30 * MS


@pytest.mark.parametrize("fixture,stalled", [("gpu_h100_hoststall", True), ("gpu_h100", False)])
def test_real_h100_traces(tmp_path, fixture, stalled):
    src = REPO / "fixtures" / fixture
    injected_ms = json.loads((src / "capture.json").read_text()).get("host_stall_ms", 0.0)
    store = parse_run(src, tmp_path / "s", progress=False).store
    res = analyze_host_stalls(store)
    (r,) = res.section["ranks"]
    if stalled:
        # the dataset sleeps `injected_ms` per batch inside enumerate(DataLoader) with the GPU drained
        assert r["data_load_ns"] >= injected_ms * MS and "DataLoader" in r["data_load_sources"]
        (f,) = res.findings
        assert f.severity.value in ("warning", "critical") and f.evidence.cause == "data_load"
    else:  # GPU-bound, the host a step ahead: the device always has work queued
        assert r["stall_ns"] < 0.01 * r["step_ns"] and not res.findings
