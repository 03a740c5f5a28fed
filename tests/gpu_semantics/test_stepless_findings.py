"""Findings on traces without a ProfilerStep (issue 32): stragglers, host stalls and host-bound launch waits are
measured over the breakdown's one window (a GPU rank's first to last device event), and a host-bound verdict
says what the host did, or that the trace does not show it.

Expected values are computed here from the raw JSON (plain `json`, `Decimal` µs -> integer ns) or from the
generator's own intervals (generator.py), never from tracekit's output:
- launch wait (analyze/host_bound.py's definition): per device event in start order, the time from the end of
  all device work that started before it to min(its start, its launch call's end), where the launch returned
  after that work ended; its busy part lies inside a host op or runtime call (any host thread); each piece of it
  goes to the innermost op running then on the thread of the launch call;
- host stall (analyze/host_stalls.py): host gaps of at least 1 ms (no op or runtime call on any host thread)
  inside the window, outside the union of [launch start, kernel end] over the device work.
Before, these traces had no host finding (host_stalls and host_bound read step rows only) and a generated run
without ProfilerStep examined a straggler's late arrivals from its previous collective only (its first one had
no step start: 2 of 3 arrivals examined, a third of the compute excess missed).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from tests.gpu_semantics.generator import Coll, Compute, Spec, simulate, write
from tests.gpu_semantics.test_real_merged import _intersect, _subtract, _union
from tests.gpu_semantics.test_real_windows import SINGLE_GPU, _doc
from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run

MS = 1_000_000
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
OP_CATS = ("cpu_op", "cuda_runtime", "cuda_driver")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")


def _ns(us) -> int:
    return int(Decimal(str(us)) * 1000)


def _analyze(trace_dir: Path, tmp_path: Path) -> dict:
    store = parse_run(trace_dir, tmp_path / "store", progress=False).store
    return analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False, advice=False))


# ---------------------------------------------------------------- stragglers on a generated run

STEP_OPS = [Compute(20 * MS), Coll("all_reduce", 1 << 24, 1 << 24, 2 * MS), Compute(10 * MS, "aten::addmm"),
            Coll("all_gather", 1 << 22, 1 << 24, 2 * MS), Compute(5 * MS, "aten::relu"),
            Coll("reduce_scatter", 1 << 24, 1 << 22, MS), Compute(3 * MS, "aten::gelu")]
"""One step, three collectives, no op sequence repeating: without ProfilerStep the window is the device span."""
SLOW = 2


def _span_of_slowest_rank(trace) -> int:
    ranks = {k.rank for k in trace.kernels}
    return max(max(k.end for k in trace.kernels if k.rank == r) - min(k.ts for k in trace.kernels if k.rank == r)
               for r in ranks)


def _compute_before_arrivals(trace, rank: int) -> list[int]:
    """Per collective (in order), the rank's compute kernel time between its previous collective's end (its
    first kernel's start for the first) and its arrival (the generator's intervals)."""
    mine = [k for k in trace.kernels if k.rank == rank]
    lo, out = min(k.ts for k in mine), []
    for c in sorted(trace.collectives, key=lambda c: c.starts[rank]):
        hi = c.starts[rank]
        out.append(sum(min(k.end, hi) - max(k.ts, lo) for k in mine if k.kind == "compute" and k.ts < hi and k.end > lo))
        lo = c.ends[rank]
    return out


@pytest.mark.parametrize("keep_profiler_step", [False, True])
def test_straggler_without_profiler_step_is_named_with_the_generators_saving(tmp_path, keep_profiler_step):
    """Rank 2's kernels are 1.4x slower; it arrives last at all three collectives. With or without ProfilerStep
    the straggler finding names it, its replayed saving is the generator's answer for rank 2 at its peers' pace
    within 5%, and its cause evidence examines all three late arrivals, the first one from the window's start:
    the compute excess is the generator's (rank 2's compute before each arrival less the peers' median)."""
    kw = dict(world=4, steps=1, step_ops=STEP_OPS, host_ahead_ns=30 * MS)
    trace = simulate(Spec(slow={SLOW: Fraction(7, 5)}, **kw))
    if not keep_profiler_step:
        for r in trace.events:
            trace.events[r] = [e for e in trace.events[r] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    write(trace, tmp_path / "traces")
    expect = _span_of_slowest_rank(trace) - _span_of_slowest_rank(simulate(Spec(**kw)))
    assert expect > 10 * MS
    per_rank = {r: _compute_before_arrivals(trace, r) for r in range(4)}
    excess = sum(per_rank[SLOW][i] - sorted(per_rank[p][i] for p in range(4) if p != SLOW)[1]
                 for i in range(len(trace.collectives)))
    a = _analyze(tmp_path / "traces", tmp_path)
    rule = a["sections"]["breakdown"]["rank_details"][0]["step_rule"]
    assert rule == ("profiler_step" if keep_profiler_step else "device_span")
    (f,) = [f for f in a["findings"] if f["kind"] == "straggler"]
    assert f["ranks"] == [SLOW]
    assert f["est_saving_ns"] == pytest.approx(expect, rel=0.05)
    assert f["evidence"]["replayed_saving_ns"] == f["est_saving_ns"]
    assert f["evidence"]["instances_examined"] == len(trace.collectives) == 3
    assert f["evidence"]["compute_excess_ns"] == excess
    assert f["evidence"]["op_count_ratio"] == 1.0  # the same kernels on every rank, counted in the window


# ---------------------------------------------------------------- host-bound on real traces (raw JSON)

def _events(folder: str, shared_traces: Path) -> list[dict]:
    doc = _doc(shared_traces / folder / SINGLE_GPU[folder])
    return [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X" and e.get("dur") is not None]


def _total(x: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in x)


def _window(events: list[dict]) -> tuple[int, int, list[tuple[int, int]]]:
    dev = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in events if e.get("cat") in DEVICE_CATS]
    return min(a for a, _ in dev), max(b for _, b in dev), dev


def _host_ops(events: list[dict]) -> list[tuple[int, int, int, str, bool, int | None]]:
    """(tid, start, end, name, is a runtime call, correlation) of the host ops and runtime calls."""
    return [(int(e["tid"]), _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), e["name"], e["cat"] in RUNTIME_CATS,
             (e.get("args") or {}).get("correlation")) for e in events if e.get("cat") in OP_CATS]


def _launch_wait_by_op(events: list[dict]) -> tuple[int, dict[str, int], int]:
    """(busy launch wait, its time by innermost op name on the launching thread, its part in ops that launch
    nothing: neither a runtime call with a correlation nor enclosing one) over the device span."""
    ops = _host_ops(events)
    launch = {c: (tid, end) for tid, _, end, _, rt, c in ops if rt and c is not None}
    dev = sorted((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), (e.get("args") or {}).get("correlation"))
                 for e in events if e.get("cat") in DEVICE_CATS)
    busy = _union([(a, b) for _, a, b, *_ in ops])
    waits: dict[int, list[tuple[int, int]]] = {}
    prev = None
    for ts, end, corr in dev:
        if prev is not None and corr in launch and min(ts, launch[corr][1]) > prev:
            waits.setdefault(launch[corr][0], []).append((prev, min(ts, launch[corr][1])))
        prev = end if prev is None else max(prev, end)
    launchers = [(tid, a, b) for tid, a, b, _, rt, c in ops if rt and c is not None]
    by_name: dict[str, int] = {}
    total = work = 0
    for tid, spans in waits.items():
        spans = _intersect(_union(spans), busy)
        total += _total(spans)
        mine = [o for o in ops if o[0] == tid]
        cuts = sorted({t for _, a, b, *_ in mine for t in (a, b)} | {t for a, b in spans for t in (a, b)})
        for lo, hi in zip(cuts, cuts[1:]):
            inside = sum(min(b, hi) - max(a, lo) for a, b in spans if a < hi and b > lo)
            holding = [o for o in mine if o[1] <= lo and o[2] >= hi]
            if not inside or not holding:
                continue
            o = max(holding, key=lambda o: (o[1], -o[2]))  # the innermost: latest start, shortest
            by_name[o[3]] = by_name.get(o[3], 0) + inside
            launches = any(t == tid and o[1] <= a and b <= o[2] for t, a, b in launchers)
            work += 0 if o[4] or launches else inside
    return total, by_name, work


def _top(by_name: dict[str, int], n: int = 3) -> list[tuple[str, int]]:
    return sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


@pytest.mark.parametrize("folder,cause", [("hta_critical_path_alexnet", "starved_host"),
                                          ("hta_mixed_et_and_kineto", "host_work")])
def test_host_bound_without_profiler_step_names_what_the_host_did(shared_traces, tmp_path, folder, cause):
    """The device span (no ProfilerStep) is the host_bound analyzer's one step: its busy launch wait, the ops
    the launching thread was inside meanwhile (top three named in the summary) and the part inside ops that
    launch nothing are the raw JSON's; the host-bound verdict names that finding with its replayed saving, at
    most the span's device idle. alexnet's wait is mostly inside runtime calls far slower than their median
    (cudaFree, cudaMalloc: slow host ops), mixed_et's inside CPU tensor ops that launch nothing (host work)."""
    events = _events(folder, shared_traces)
    lo, hi, dev = _window(events)
    wait, by_name, work = _launch_wait_by_op(events)
    a = _analyze(shared_traces / folder, tmp_path)
    (row,) = a["sections"]["host_bound"]["ranks"]
    assert row["steps"] == 1 and row["step_ns"] == hi - lo
    assert row["launch_wait_busy_ns"] == wait
    assert list(row["wait_in_ops"].items()) == _top(by_name, 5)
    assert row["host_work_ns"] == work
    (f,) = [f for f in a["findings"] if f["kind"] == "host_bound"]
    assert f["evidence"]["cause"] == cause
    for name, ns in _top(by_name):
        assert f"{name} {ns / 1e6:.2f} ms" in f["summary"]
    idle = (hi - lo) - _total(_union(dev))
    assert 0 < f["evidence"]["replayed_saving_ns"] <= idle
    host = a["sections"]["critical_path"]["verdict"]
    assert host["bound"] == "host-bound"
    assert host["host_cause"]["kind"] == "host_bound"
    assert a["findings"][host["host_cause"]["finding"]] == f
    assert host["host_cause"]["saving_ns"] == f["evidence"]["replayed_saving_ns"]
    assert f["summary"] in host["text"]


def _raw_stall(events: list[dict], ops: list, lo: int, hi: int) -> int:
    """Host gaps of at least 1 ms inside [lo, hi) with no device work queued (launched, not yet ended)."""
    gaps = [(a, b) for a, b in _subtract([(lo, hi)], _union([(a, b) for _, a, b, *_ in ops])) if b - a >= MS]
    start = {c: a for _, a, _, _, rt, c in ops if rt and c is not None}
    queued = _union([(min(start.get((e.get("args") or {}).get("correlation"), _ns(e["ts"])), _ns(e["ts"])),
                      _ns(e["ts"]) + _ns(e["dur"])) for e in events if e.get("cat") in DEVICE_CATS])
    return _total(_subtract(gaps, queued))


def test_host_stall_over_the_device_span(shared_traces, tmp_path):
    """hta_mixed_et_and_kineto: host gaps of at least 1 ms inside the device span with no device work queued
    are its stall (raw JSON), reported as an idle_host_bound finding with its replayed saving."""
    events = _events("hta_mixed_et_and_kineto", shared_traces)
    lo, hi, _ = _window(events)
    ops = _host_ops(events)
    stall = _raw_stall(events, ops, lo, hi)
    assert stall > 0
    a = _analyze(shared_traces / "hta_mixed_et_and_kineto", tmp_path)
    (row,) = a["sections"]["host_stalls"]["ranks"]
    assert row["step_ns"] == hi - lo and row["stall_ns"] == stall
    (f,) = [f for f in a["findings"] if f["kind"] == "idle_host_bound"]
    assert f["evidence"]["stall_ns"] == stall and f["evidence"]["replayed_saving_ns"] > 0
    # the fix removes host gaps, never the host ops between them: the span shortens by at most the host's gaps
    # of 1 ms or more that reach into it (whole: one that began before the span delayed its first launch). It
    # removed CPU tensor ops too, which the graph holds in the gaps between runtime calls: 100.56 ms saved,
    # then host_bound's own replay, for 11.9 ms of stall
    busy = _union([(a, b) for _, a, b, *_ in ops])
    reaching = [(a, b) for a, b in _subtract([(busy[0][0], busy[-1][1])], busy) if b - a >= MS and b > lo and a < hi]
    assert 0 < f["est_saving_ns"] <= _total(reaching)


def test_host_work_fix_keeps_the_idle_gaps(shared_traces, tmp_path):
    """hta_mixed_et_and_kineto: host_bound's cause is host work (CPU tensor ops between launches). Its fix moves
    that work off the step and leaves the host's idle gaps, which the stall fix removes: where the host sat in a
    gap of at least 1 ms with no device work queued (the raw JSON's stall), the device still has nothing to run,
    so the saving is at most the span's device idle less that stall. Removing the whole gaps, idle included,
    replayed 100.56 ms, above that bound."""
    events = _events("hta_mixed_et_and_kineto", shared_traces)
    lo, hi, dev = _window(events)
    stall = _raw_stall(events, _host_ops(events), lo, hi)
    idle = (hi - lo) - _total(_union(dev))
    a = _analyze(shared_traces / "hta_mixed_et_and_kineto", tmp_path)
    (f,) = [f for f in a["findings"] if f["kind"] == "host_bound"]
    assert f["evidence"]["cause"] == "host_work"
    assert 0 < f["evidence"]["replayed_saving_ns"] <= idle - stall


def test_host_bound_verdict_without_a_host_finding_says_the_cause_is_not_visible(shared_traces, tmp_path):
    """hta_triton: one kernel, launched once; with no earlier device work the device never waited for a launch
    (raw JSON), so no host finding can say what the host did: the host-bound verdict says the cause is not
    visible in the trace."""
    events = _events("hta_triton", shared_traces)
    assert sum(1 for e in events if e.get("cat") in DEVICE_CATS) == 1
    a = _analyze(shared_traces / "hta_triton", tmp_path)
    assert not [f for f in a["findings"] if f["kind"] in ("host_bound", "idle_host_bound")]
    verdict = a["sections"]["critical_path"]["verdict"]
    assert verdict["bound"] == "host-bound"
    assert verdict["host_cause"]["finding"] is None
    assert "cause not visible in the trace" in verdict["text"]


def test_device_only_trace_has_no_host_finding(shared_traces, tmp_path):
    """A merged trace of NCCL kernels only (no host event at all, raw JSON): its device span has no host op,
    so no host gap can be measured (before, the span read as 97% host stall) and no analyzer fails."""
    path = shared_traces / "amdhpc_cifar_resnet_ddp4_mi300_merged" / "merged_nccl_only.json.gz"
    events = [e for e in _doc(path)["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
    assert events and not [e for e in events if e.get("cat") in OP_CATS]
    a = _analyze(path, tmp_path)
    assert not a.get("analyzer_errors")
    assert a["sections"]["host_stalls"]["ranks"] == []
    assert not [f for f in a["findings"] if f["kind"] in ("host_bound", "idle_host_bound")]


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.mark.parametrize("fixture", ["dp_ddp", "tp"])
def test_cpu_ranks_without_profiler_step_are_replayed(tmp_path, fixture):
    """A CPU (gloo) run with its ProfilerStep annotations taken out: each rank's window is its first to its last
    event (the breakdown's `trace` rule), and the critical path replays that window as one step instead of
    skipping the run. The measured step is the longest rank window (raw JSON: first event start to last event
    end) and the unchanged replay reproduces it within 2%."""
    (tmp_path / "t").mkdir()
    longest = 0
    for f in sorted((FIXTURES / fixture).glob("rank*.pt.trace.json.gz")):
        doc = _doc(f)
        doc["traceEvents"] = [e for e in doc["traceEvents"]
                              if not str(e.get("name", "")).startswith("ProfilerStep#")]
        timed = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]
        longest = max(longest, max(_ns(e["ts"]) + _ns(e["dur"]) for e in timed) - min(_ns(e["ts"]) for e in timed))
        # Decimal µs written back as the same JSON numbers (exact ns), not as strings or rounded floats
        text = re.sub(r'"(ts|dur)": "(-?[0-9.]+)"', r'"\1": \2', json.dumps(doc, default=str))
        (tmp_path / "t" / f.name.removesuffix(".gz")).write_text(text)
    a = _analyze(tmp_path / "t", tmp_path)
    assert {d["step_rule"] for d in a["sections"]["breakdown"]["rank_details"]} == {"trace"}
    cp = a["sections"]["critical_path"]
    assert cp["skipped"] is None and cp["step_rule"] == "trace"
    (step,) = cp["steps"]
    assert step["step"] is None and step["measured_ns"] == longest
    assert abs(step["replayed_ns"] - longest) <= 0.02 * longest
