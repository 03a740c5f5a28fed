"""CUDA/HIP-graph replays named by their capture: the vLLM capture trace of the shared corpus, and a replay
built from it as real replays are (one hipGraphLaunch whose correlation id every kernel of the graph carries,
the kernels in the captured order, none of the ops in the replay trace)."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

import tracekit

CAPTURE = "tl_vllm_graph_capture"
LAUNCHES = ("hipLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel")
REPLAYS = 2


def _capture_file(shared: Path) -> Path:
    return next((shared / CAPTURE).glob("*.json.gz"))


def captured_launches(doc: dict) -> list[dict]:
    """The kernel launches between hipStreamBeginCapture and hipStreamEndCapture, in time order."""
    rt = sorted((e for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime"), key=lambda e: Decimal(str(e["ts"])))
    begin = next(Decimal(str(e["ts"])) for e in rt if e["name"] == "hipStreamBeginCapture")
    end = next(Decimal(str(e["ts"])) for e in rt if e["name"] == "hipStreamEndCapture")
    return [e for e in rt if e["name"] in LAUNCHES and begin <= Decimal(str(e["ts"])) <= end]


def build_replay(doc: dict, launches: list[dict]) -> dict:
    """A replay trace: per replay one cpu_op around one hipGraphLaunch, then the graph's kernels on the
    device, each with the launch's correlation id and a distinct duration (position i lasts 1 + i µs)."""
    events = []
    t = 10_000_000
    for rep in range(REPLAYS):
        corr, ext = 900_000 + rep, 800_000 + rep
        events.append({"ph": "X", "cat": "cpu_op", "name": "vllm::execute_model", "pid": 1, "tid": 1, "ts": t,
                       "dur": 50, "args": {"External id": ext}})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "hipGraphLaunch", "pid": 1, "tid": 1, "ts": t + 5,
                       "dur": 20, "args": {"External id": ext, "correlation": corr}})
        k = t + 100
        for i, launch in enumerate(launches):
            events.append({"ph": "X", "cat": "kernel", "name": launch["args"]["kernel"], "pid": 2, "tid": 1, "ts": k,
                           "dur": 1 + i, "args": {"External id": ext, "correlation": corr, "device": 0, "stream": 1}})
            k += 2 + i
        t = k + 1000
    return {"schemaVersion": 1, "deviceProperties": doc["deviceProperties"],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, "traceEvents": events}


@pytest.fixture(scope="module")
def replay(shared_traces, tmp_path_factory):
    with gzip.open(_capture_file(shared_traces), "rt") as fh:
        doc = json.load(fh, parse_float=Decimal)
    launches = captured_launches(doc)
    ops = {e["args"]["External id"]: e["name"] for e in doc["traceEvents"]
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    folder = tmp_path_factory.mktemp("replay") / "trace"
    folder.mkdir()
    (folder / "replay_rank0.json").write_text(json.dumps(build_replay(doc, launches), default=str))
    return folder, launches, ops


def _expected_rows(launches: list[dict], ops: dict) -> Counter:
    """Per replay, (captured op, kernels, their summed ns) of each capturing op instance."""
    per_op: dict[int, list[int]] = {}
    for i, launch in enumerate(launches):
        per_op.setdefault(launch["args"]["External id"], []).append(i)
    one = Counter((ops[ext], len(pos), sum((1 + i) * 1000 for i in pos)) for ext, pos in per_op.items())
    return Counter({k: v * REPLAYS for k, v in one.items()})


def test_every_replayed_kernel_is_named_by_its_captured_op(replay, shared_traces, tmp_path):
    folder, launches, ops = replay
    assert len(launches) == 421
    run = tracekit.analyze_run(folder, tmp_path / "out", capture=shared_traces / CAPTURE)
    rows = run.store.table("ops").to_pylist()
    graph = [r for r in rows if r["launch"] == "graph"]
    assert not [r for r in rows if r["launch"] == "graph_unmatched"]
    assert sum(r["kernel_count"] for r in graph) == REPLAYS * len(launches)
    got = Counter((r["name"], r["kernel_count"], r["kernel_ns"]) for r in graph)
    assert got == _expected_rows(launches, ops)
    assert {r["name"] for r in graph} >= {"aten::addmm", "vllm::unified_attention_with_output", "SortTokens"}
    addmm = [r for r in graph if r["name"] == "aten::addmm"]
    assert all(r["category"] == "gemm" and r["flops"] for r in addmm)


def test_without_capture_graph_kernels_are_grouped_under_their_launch(replay, tmp_path):
    folder, launches, _ = replay
    run = tracekit.analyze_run(folder, tmp_path / "out")
    rows = run.store.table("ops").to_pylist()
    assert [(r["name"], r["launch"], r["kernel_count"]) for r in rows] == \
        [("hipGraphLaunch", "graph_unmatched", len(launches))] * REPLAYS
    notes = run.analysis["sections"]["ops"]["notes"]
    assert any("graph" in n and "--capture" in n for n in notes)


def test_capture_beside_the_replay_is_used_automatically(replay, shared_traces, tmp_path):
    folder, launches, ops = replay
    both = tmp_path / "both"
    both.mkdir()
    (both / "replay_rank0.json").symlink_to(folder / "replay_rank0.json")
    (both / "capture_rank0.json.gz").symlink_to(_capture_file(shared_traces))
    run = tracekit.analyze_run(both, tmp_path / "out")
    assert run.store.ranks() == [0]
    assert not run.store.skipped
    rows = run.store.table("ops").to_pylist()
    got = Counter((r["name"], r["kernel_count"], r["kernel_ns"]) for r in rows if r["launch"] == "graph")
    assert got == _expected_rows(launches, ops)
    assert any("capture trace" in w for w in run.analysis["inputs"].get("warnings") or [])
