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


LABELS = ("data:load", "my_fetch", None)
"""The same sleep inside our runtime's label, inside any user's label, and with no label."""


def _same_finding_whatever_the_label(results: dict) -> None:
    """One finding per label variant, equal in all but the label named as evidence."""
    keep = lambda f: (f.kind, f.severity, f.ranks, f.est_saving_ns,  # noqa: E731
                      {k: v for k, v in f.evidence.to_json().items() if k != "stall_labels"})
    found = {label: [f for f in res.findings if f.severity.order >= 2] for label, res in results.items()}
    assert all(len(fs) == 1 for fs in found.values()), found
    assert len({repr(keep(fs[0])) for fs in found.values()}) == 1
    for label, (f,) in found.items():
        assert (f"inside the label {label!r}" in f.summary) is (label is not None)


def test_cpu_sleep_is_a_stall_whatever_its_label_waiting_for_peers_is_not(tmp_path):
    """CPU ranks: rank 1 sleeps 30 ms (no op runs) inside a label or none; rank 0 waits for it inside the
    all_reduce (a gloo collective in flight), which is not a host stall. A label is no host activity:
    the stall, its finding and its cause are the trace's; the label is only named."""
    results = {}
    for label in LABELS:
        by_rank = {}
        for rank in (0, 1):
            evs = [_x("ProfilerStep#2", "user_annotation", 0, 50 * MS), _x("aten::add", "cpu_op", 0, 2 * MS)]
            if rank == 1 and label:
                evs.append(_x(label, "user_annotation", 2 * MS, 30 * MS))
            issue = 2 * MS if rank == 0 else 32 * MS
            evs.append(_x("c10d::allreduce_", "cpu_op", issue, 100 * US))
            ar = _x("gloo:all_reduce", "user_annotation", issue + 100 * US, (30 if rank == 0 else 1) * MS)
            ar["tid"] = 9
            evs += [ar, _x("aten::mul", "cpu_op", 33 * MS, 17 * MS)]
            by_rank[rank] = evs
        res = results[label] = _stalls(tmp_path / str(label), by_rank)
        rows = {r["rank"]: r for r in res.section["ranks"]}
        # rank 1: no op from the add's end (2 ms) to the all_reduce's issue (32 ms), no collective in flight
        stall = 32 * MS - 2 * MS
        assert rows[1]["device"] == "cpu" and rows[1]["stall_ns"] == stall and rows[1]["data_load_ns"] == 0
        assert rows[1]["stall_labels"] == ({label: stall} if label else {})
        # rank 0: 2.1..32.1 ms is the all_reduce's wait, 32.1..33 ms is under MIN_GAP
        assert rows[0]["stall_ns"] == 0
        (f,) = [f for f in res.findings if f.severity.order >= 2]
        assert f.ranks == (1,) and f.kind.value == "idle_host_bound" and f.evidence.cause == "host_gap"
        assert f.est_saving_ns == stall
    _same_finding_whatever_the_label(results)


def test_gpu_sleep_with_nothing_queued_is_a_stall_whatever_its_label(tmp_path):
    """GPU rank, steps of 40 ms: an op launches a 4 ms kernel, the host sleeps 20 ms (inside a label or
    none), then launches an 18 ms kernel that runs to the step's end. The stall is the sleep's part with nothing queued, found from the
    trace alone; the label is only named."""
    results = {}
    for label in LABELS:
        evs, kernels, corr = [], [], 0
        for step in range(3):
            t0 = step * 40 * MS
            evs.append(_x(f"ProfilerStep#{step + 1}", "user_annotation", t0, 40 * MS))
            if label:
                evs.append(_x(label, "user_annotation", t0 + MS, 20 * MS))
            for launch, start, dur in ((t0, t0 + MS // 2, 4 * MS), (t0 + 21 * MS, t0 + 22 * MS, 18 * MS)):
                corr += 1
                evs += [_x("aten::mm", "cpu_op", launch, 10 * US), _launch(launch + US, corr),
                        _kernel("gemm", start, dur, corr)]
                kernels.append((launch + US, start + dur))
        res = results[label] = _stalls(tmp_path / str(label), {0: evs})
        (r,) = res.section["ranks"]
        # per step: the host's last op before the sleep ends at t0 + 10 µs, its kernel at t0 + 4.5 ms; the
        # next launch's op starts at t0 + 21 ms: the stall is [t0 + 4.5 ms, t0 + 21 ms)
        queued_until, next_op = (MS // 2 + 4 * MS), 21 * MS
        assert r["device"] == "gpu" and r["stall_ns"] == next_op - queued_until and r["data_load_ns"] == 0
        assert r["stall_labels"] == ({label: next_op - queued_until} if label else {})
    _same_finding_whatever_the_label(results)


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
