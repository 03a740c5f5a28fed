"""CUDA / HIP graphs: the kernels a graph replay runs, named by the ops that captured them.

A replay trace launches a captured graph with one `cudaGraphLaunch` / `hipGraphLaunch`: every kernel
of the graph carries that call's correlation id, and none of the ops that built it is in the trace.
The capture trace has those ops: between `…StreamBeginCapture` and `…StreamEndCapture` each kernel
launch call is recorded (its External id names the op; ROCm and newer CUPTI also write the kernel's
name in `args.kernel`), but the kernels do not run. `captured_graphs` reads the capture's nodes in
launch order; `match_replay` pairs each replayed kernel with a node: by kernel name in order where the
capture names its kernels (a node is used once; a replayed kernel no node of that name is left takes
none), else by position when the replay ran as many kernels as the graph has nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracekit.errors import TracekitError
from tracekit.parse.classify import BEGIN_CAPTURE_RE, END_CAPTURE_RE
from tracekit.parse.dict_columns import text_test
from tracekit.parse.kineto import is_kineto_trace, parse_kineto

BEGIN_CAPTURE, END_CAPTURE = BEGIN_CAPTURE_RE, END_CAPTURE_RE  # one spelling, classify's (trace kinds use it too)
GRAPH_LAUNCH = re.compile(r"^(cuda|hip)GraphLaunch")
KERNEL_LAUNCH = re.compile(r"^(cuda|hip)(Ext)?(Module)?Launch(Cooperative)?Kernel|^cuLaunchKernel|^hipExtLaunchKernel")


@dataclass(frozen=True)
class CapturedNode:
    """One kernel launch recorded while a graph was captured, with the op that made it."""

    kernel: str | None
    op_name: str | None
    input_dims: str | None
    input_types: str | None
    concrete_inputs: str | None
    external_id: int | None


def _runtime_rows(events: pa.Table) -> list[dict[str, Any]]:
    cat = events.column("cat").cast(pa.string())
    rt = events.filter(pc.equal(cat, "cuda_runtime"))
    cols = ["name", "ts", "tid", "correlation", "external_id"]
    if "launch_kernel" in events.column_names:
        cols.append("launch_kernel")
    rows = rt.select(cols).to_pylist()
    return sorted(rows, key=lambda r: (r["tid"], r["ts"]))


def _ops_by_external_id(events: pa.Table) -> dict[int, dict[str, Any]]:
    cat = events.column("cat").cast(pa.string())
    ops = events.filter(pc.and_(pc.equal(cat, "cpu_op"), pc.is_valid(events.column("external_id"))))
    out: dict[int, dict[str, Any]] = {}
    for r in ops.select(["name", "ts", "external_id", "input_dims", "input_types", "concrete_inputs"]).to_pylist():
        prev = out.get(r["external_id"])
        if prev is None or r["ts"] >= prev["ts"]:
            out[r["external_id"]] = r
    return out


def has_capture(events: pa.Table) -> bool:
    """Whether any event is a stream-capture begin call (checked on the name dictionary only)."""
    if not events.num_rows:
        return False
    names = events.column("name")
    names = names.combine_chunks() if isinstance(names, pa.ChunkedArray) else names
    values = names.dictionary if pa.types.is_dictionary(names.type) else pc.unique(names)
    return bool(pc.any(pc.match_substring_regex(values, BEGIN_CAPTURE.pattern)).as_py())


def captured_graphs(events: pa.Table) -> list[list[CapturedNode]]:
    """The graphs a capture trace recorded, each its kernel launches in order (one list per capture)."""
    if not events.num_rows:
        return []
    ops = _ops_by_external_id(events)
    graphs: list[list[CapturedNode]] = []
    current: list[CapturedNode] | None = None
    tid = None
    for r in _runtime_rows(events):
        name = r["name"] or ""
        if r["tid"] != tid:
            current, tid = None, r["tid"]
        if BEGIN_CAPTURE.match(name):
            current = []
        elif END_CAPTURE.match(name):
            if current:
                graphs.append(current)
            current = None
        elif current is not None and KERNEL_LAUNCH.match(name):
            op = ops.get(r["external_id"]) or {}
            current.append(CapturedNode(r.get("launch_kernel"), op.get("name"), op.get("input_dims"),
                                        op.get("input_types"), op.get("concrete_inputs"), r["external_id"]))
    return graphs


def graph_launches(events: pa.Table) -> dict[int, str]:
    """Correlation id → name of each graph launch call in a (replay) trace's events."""
    hit = pc.and_(text_test(events.column("cat"), pc.equal, "cuda_runtime"),
                  pc.fill_null(text_test(events.column("name"), pc.match_substring_regex, GRAPH_LAUNCH.pattern), False))
    rows = events.filter(hit).select(["name", "correlation"]).to_pylist()
    return {r["correlation"]: r["name"] for r in rows if r["correlation"] is not None}


def _match_by_name(names: list[str], graph: list[CapturedNode]) -> list[CapturedNode | None]:
    free: dict[str, list[int]] = {}
    for i, node in enumerate(graph):
        free.setdefault(node.kernel or "", []).append(i)
    out: list[CapturedNode | None] = []
    for nm in names:
        slots = free.get(nm)
        out.append(graph[slots.pop(0)] if slots else None)
    return out


def match_replay(names: list[str], graphs: list[list[CapturedNode]]) -> list[CapturedNode | None]:
    """The captured node of each kernel one graph launch ran (names in start order); None where unknown."""
    best: list[CapturedNode | None] = [None] * len(names)
    best_hits = 0
    for graph in graphs:
        if all(node.kernel for node in graph):
            got = _match_by_name(names, graph)
        elif len(graph) == len(names):
            got = list(graph)
        else:
            continue
        hits = sum(g is not None for g in got)
        if hits > best_hits:
            best, best_hits = got, hits
    return best


def load_captured_graphs(path: Path, max_decompressed_bytes: int | None = None
                         ) -> tuple[list[list[CapturedNode]], list[str]]:
    """The graphs of every Kineto trace at `path` (a file, or the trace files of a folder), and notes on
    what could not be read or held no capture."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and is_kineto_trace(p))
    graphs: list[list[CapturedNode]] = []
    notes: list[str] = []
    for f in files:
        try:
            events = parse_kineto(f, max_decompressed_bytes=max_decompressed_bytes).tables["events"]
        except TracekitError as exc:
            notes.append(f"capture trace {f}: not read ({exc})")
            continue
        found = captured_graphs(events)
        if not found:
            notes.append(f"capture trace {f}: no graph capture (no StreamBeginCapture/EndCapture) in it")
        graphs += found
    if not files:
        notes.append(f"capture {path}: no Kineto trace found")
    return graphs, notes
