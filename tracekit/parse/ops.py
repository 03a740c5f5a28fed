"""The derived `ops` and `kernel_summary` tables of one rank, from its events and kernels tables.

An op row is a CPU op that launched device work: the kernels whose `External id` names it (Kineto sets
a kernel's External id to the innermost CPU op around its launch, so a `linear` whose `addmm` launched
the GEMM is not counted again: only the `addmm` has kernels). Its device time is the sum of its kernels'
durations (memset and memcpy kernels included, as TraceLens counts them); FLOPs and bytes come from its
recorded shapes (`op_shapes`). Kernels with no External id take their launch's (the runtime call with
the same correlation id). The kernel summary has one row per (kernel name, stream): count, total /
mean / max time, share of the rank's kernel time, and a category — the launching op's when linked, else
the kernel's name's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.parse.cuda_graphs import CapturedNode, graph_launches, match_replay
from tracekit.parse.op_shapes import OpCost, kernel_category, load_json, op_cost
from tracekit.tables.schema import conform
from tracekit.tables.schema import OPS

_OP_COLUMNS = ("name", "cat", "ts", "dur", "external_id", "correlation", "step", "input_dims", "input_types",
               "concrete_inputs")


def _strings(col: Any) -> list:
    return col.cast(pa.string()).to_pylist() if pa.types.is_dictionary(col.type) else col.to_pylist()


class OpCollector:
    """Collects, part by part of a rank's events table, the CPU ops that launched its kernels."""

    def __init__(self, kernels: pa.Table, captured: list[list[CapturedNode]] | None = None) -> None:
        self.kernels = kernels
        self.captured = captured or []
        self.graph_calls: dict[int, str] = {}
        ext = kernels.column("external_id") if kernels.num_rows else pa.array([], pa.int64())
        self.wanted = pc.unique(ext.drop_null()) if kernels.num_rows else pa.array([], pa.int64())
        no_ext = kernels.filter(pc.is_null(ext)) if kernels.num_rows else kernels
        self.corr_wanted = pc.unique(no_ext.column("correlation").drop_null()) if no_ext.num_rows else None
        self.op_parts: list[pa.Table] = []
        self.launch_parts: list[pa.Table] = []

    def add(self, events: pa.Table) -> None:
        """Keep the part's CPU ops that kernels name, and the runtime calls of kernels without External id."""
        if not events.num_rows or not self.kernels.num_rows:
            return
        self.graph_calls.update(graph_launches(events))
        cols = [c for c in _OP_COLUMNS if c in events.column_names]
        cat = events.column("cat").cast(pa.string())
        ops = events.filter(pc.and_(pc.equal(cat, "cpu_op"), pc.is_in(events.column("external_id"),
                                                                       value_set=self.wanted)))
        if ops.num_rows:
            self.op_parts.append(ops.select(cols))
        if self.corr_wanted is not None and len(self.corr_wanted):
            runtime = pc.and_(pc.is_in(events.column("correlation"), value_set=self.corr_wanted),
                              pc.is_valid(events.column("external_id")))
            launch = events.filter(pc.and_(runtime, pc.not_equal(cat, "kernel")))
            if launch.num_rows:
                self.launch_parts.append(launch.select(["correlation", "external_id"]))

    def tables(self, rank: int) -> dict[str, pa.Table]:
        kernels = self.kernels
        graph = pc.is_in(kernels.column("correlation"), value_set=pa.array(list(self.graph_calls), pa.int64())) \
            if kernels.num_rows and self.graph_calls else None
        if graph is not None:  # graph kernels join no op around their launch: their ops are in the capture
            graph = pc.fill_null(graph, False)
            ext = pc.if_else(graph, pa.scalar(None, pa.int64()), kernels.column("external_id"))
            kernels = kernels.set_column(kernels.column_names.index("external_id"), "external_id", ext)
        kernels = self._kernels_with_launch_ext(kernels, graph)
        ops = pa.concat_tables(self.op_parts) if self.op_parts else None
        op_rows = _op_rows(ops, kernels) if ops is not None else []
        by_ext = {r["external_id"]: r["category"] for r in op_rows}
        cats = [by_ext.get(e) for e in kernels.column("external_id").to_pylist()] if kernels.num_rows else []
        if graph is not None:
            graph_rows, graph_cats = _graph_op_rows(kernels, graph, self.graph_calls, self.captured)
            op_rows += graph_rows
            for i, c in graph_cats.items():
                cats[i] = c
        return {"ops": conform("ops", _ops_table(op_rows, rank)),
                "kernel_summary": conform("kernel_summary", kernel_summary(kernels, cats, rank))}

    def _kernels_with_launch_ext(self, k: pa.Table, graph: Any) -> pa.Table:
        if not k.num_rows or not self.launch_parts:
            return k
        launch = pa.concat_tables(self.launch_parts)
        corr = launch.column("correlation").to_pylist()
        ext_of = {c: e for c, e in zip(corr, launch.column("external_id").to_pylist()) if c not in self.graph_calls}
        filled = [e if e is not None else ext_of.get(c) for e, c in
                  zip(k.column("external_id").to_pylist(), k.column("correlation").to_pylist())]
        return k.set_column(k.column_names.index("external_id"), "external_id", pa.array(filled, pa.int64()))


def _kernel_groups(kernels: pa.Table) -> dict[int, dict[str, Any]]:
    """External id → its kernels' count, summed duration, first start, last end, step, kinds, names
    (a null duration counts 0; the step is the smallest non-null one; kinds and names distinct)."""
    k = kernels.filter(pc.is_valid(kernels.column("external_id")))
    if not k.num_rows:
        return {}
    ext = k.column("external_id").to_numpy(zero_copy_only=False).astype(np.int64)
    exts, group = np.unique(ext, return_inverse=True)
    group = group.reshape(-1)
    num = len(exts)
    dur = pc.fill_null(k.column("dur"), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    ts = k.column("ts").to_numpy(zero_copy_only=False).astype(np.int64)
    total = np.zeros(num, np.int64)
    np.add.at(total, group, dur)
    first = np.full(num, np.iinfo(np.int64).max)
    np.minimum.at(first, group, ts)
    last = np.full(num, np.iinfo(np.int64).min)
    np.maximum.at(last, group, ts + dur)
    steps = pc.fill_null(k.column("step").cast(pa.int64()), np.iinfo(np.int64).max).to_numpy(zero_copy_only=False)
    step = np.full(num, np.iinfo(np.int64).max)
    np.minimum.at(step, group, steps)
    count = np.bincount(group, minlength=num)
    kinds, names = _distinct_per_group(group, k.column("kind"), num), _distinct_per_group(group, k.column("name"), num)
    no_step = np.iinfo(np.int64).max
    return {e: {"kernel_ns": t, "kernel_count": c, "kernel_ts": f, "kernel_end": l, "step": None if s == no_step else s,
                "kinds": kd, "names": nm}
            for e, t, c, f, l, s, kd, nm in zip(exts.tolist(), total.tolist(), count.tolist(), first.tolist(),
                                                last.tolist(), step.tolist(), kinds, names)}


def _distinct_per_group(group: np.ndarray, col: Any, num: int) -> list[list]:
    """Per group, the distinct non-null values of `col` in its rows."""
    codes, values = _codes(col)
    pairs = np.unique(group * (len(values) + 1) + codes)
    out: list[list] = [[] for _ in range(num)]
    for g, c in zip((pairs // (len(values) + 1)).tolist(), (pairs % (len(values) + 1)).tolist()):
        if values[c] is not None:
            out[g].append(values[c])
    return out


def _innermost(ops: pa.Table) -> dict[int, int]:
    """External id → row of the CPU op it names (the latest-starting one if several share it)."""
    best: dict[int, tuple[int, int]] = {}
    for i, (e, ts) in enumerate(zip(ops.column("external_id").to_pylist(), ops.column("ts").to_pylist())):
        if e not in best or ts >= best[e][0]:
            best[e] = (ts, i)
    return {e: i for e, (_, i) in best.items()}


def _op_rows(ops: pa.Table, kernels: pa.Table) -> list[dict[str, Any]]:
    groups = _kernel_groups(kernels)
    rows_of = _innermost(ops)
    cols = {c: _strings(ops.column(c)) for c in ops.column_names}
    costs: dict[tuple, OpCost] = {}
    out = []
    for ext, i in rows_of.items():
        g = groups.get(ext)
        if g is None:
            continue
        name = cols["name"][i] or ""
        key = (name, cols["input_dims"][i], cols["input_types"][i], cols["concrete_inputs"][i],
               tuple(sorted(g["kinds"])), tuple(sorted(g["names"])[:4]))
        cost = costs.get(key)
        if cost is None:
            cost = costs[key] = op_cost(name, load_json(key[1]), load_json(key[2]), load_json(key[3]),
                                        set(g["kinds"]), sorted(g["names"]))
        step = cols["step"][i] if cols["step"][i] is not None else g["step"]
        out.append({"step": step, "name": name, "category": cost.category, "ts": cols["ts"][i],
                    "dur": cols["dur"][i], "external_id": ext, "dtype": cost.dtype, "input_dims": key[1],
                    "input_types": key[2], "concrete_inputs": key[3], "kernel_count": g["kernel_count"],
                    "kernel_ns": g["kernel_ns"], "kernel_ts": g["kernel_ts"], "kernel_end": g["kernel_end"],
                    "flops": cost.flops, "bytes": cost.bytes, "formula": cost.formula,
                    **dict(zip(("gemm_batch", "gemm_m", "gemm_n", "gemm_k"), cost.gemm or (None,) * 4))})
    for r in out:
        r["launch"] = "direct"
    out.sort(key=lambda r: (r["kernel_ts"], r["external_id"]))
    return out


def _ops_table(rows: list[dict[str, Any]], rank: int) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in OPS if f.name != "rank"}
    return pa.table({"rank": pa.array(np.full(len(rows), rank, np.int32)),
                     **{k: pa.array(v, OPS.field(k).type.value_type if pa.types.is_dictionary(OPS.field(k).type)
                                    else OPS.field(k).type) for k, v in cols.items()}})


def kernel_summary(kernels: pa.Table, op_categories: list, rank: int) -> pa.Table:
    """One row per (kernel name, stream) of a rank's kernels table (`op_categories`: per kernel row, the
    category of the op that launched it, None when no op did), heaviest first (ties: first seen first):
    count, total / mean / max ns (a null duration counts 0), share of the rank's kernel time, and the kind
    and category that hold most of its time (each kernel weighing its duration + 1; ties: first seen)."""
    if not kernels.num_rows:
        return pa.table({"rank": pa.array([], pa.int32())})
    name_codes, names = _codes(kernels.column("name"))
    kind_codes, kinds = _codes(kernels.column("kind"))
    stream_codes, streams = _codes(kernels.column("stream"))
    durs = pc.fill_null(kernels.column("dur"), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    group, first = _first_seen_groups(name_codes, stream_codes)
    num = len(first)
    count = np.bincount(group, minlength=num).astype(np.int64)
    total = np.zeros(num, np.int64)
    np.add.at(total, group, durs)
    top = np.zeros(num, np.int64)
    np.maximum.at(top, group, durs)
    op_cat_codes, op_cats = _codes(pa.array(op_categories, pa.string()))
    triple, triple_first = _first_seen_groups(name_codes, kind_codes, op_cat_codes)
    cat_of_triple = [_kernel_cat(names[name_codes[r]], kinds[kind_codes[r]], op_cats[op_cat_codes[r]])
                     for r in triple_first.tolist()]
    cat_codes, cat_values = _codes(pa.array(cat_of_triple, pa.string()).take(pa.array(triple)))
    weight = durs + 1
    kind_of = _heaviest(group, kind_codes, weight, num)
    cat_of = _heaviest(group, cat_codes, weight, num)
    order = np.argsort(-total, kind="stable")
    grand = int(durs.sum()) or 1
    name_col = [names[c] for c in name_codes[first[order]].tolist()]
    stream_col = [streams[c] for c in stream_codes[first[order]].tolist()]
    return pa.table({
        "rank": pa.array(np.full(num, rank, np.int32)),
        "name": name_col, "stream": pa.array(stream_col, pa.int32()),
        "kind": [kinds[c] for c in kind_of[order].tolist()],
        "category": [cat_values[c] for c in cat_of[order].tolist()],
        "count": pa.array(count[order], pa.int64()),
        "total_ns": pa.array(total[order], pa.int64()),
        "mean_ns": pa.array(total[order] / count[order], pa.float64()),
        "max_ns": pa.array(top[order], pa.int64()),
        "share": pa.array(total[order] / grand, pa.float64()),
    })


def _codes(col: Any) -> tuple[np.ndarray, list]:
    """(code per row, value per code) of a column, codes in order of first occurrence, null a value (None)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):  # its dictionary may hold values no row uses
        col = col.cast(col.type.value_type)
    enc = pc.dictionary_encode(col, null_encoding="encode")
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int64), enc.dictionary.to_pylist()


def _first_seen_groups(*codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group per row, first row of each group) of the rows' code tuples, groups numbered in order of
    first occurrence."""
    key = np.zeros(len(codes[0]), np.int64)
    for c in codes:
        key = key * (int(c.max()) + 1 if len(c) else 1) + c
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    rank_of = np.empty(len(first), np.int64)
    rank_of[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank_of[inverse.reshape(-1)], np.sort(first)


def _heaviest(group: np.ndarray, value: np.ndarray, weight: np.ndarray, num: int) -> np.ndarray:
    """Per group, the value with the largest summed weight (ties: the value first seen in the group)."""
    pair, first = _first_seen_groups(group, value)
    pair_weight = np.zeros(len(first), np.int64)
    np.add.at(pair_weight, pair, weight)
    pair_group = group[first]
    best = np.lexsort((first, -pair_weight, pair_group))  # by group, heaviest first, then first seen
    starts = np.flatnonzero(np.r_[True, pair_group[best][1:] != pair_group[best][:-1]])
    out = np.zeros(num, np.int64)
    out[pair_group[best][starts]] = value[first[best][starts]]
    return out


def _kernel_cat(name: str | None, kind: str | None, op_category: str | None) -> str:
    if kind == "comm":
        return "comm"
    if kind in ("memcpy", "memset"):
        return "memcpy"
    return op_category or kernel_category(name or "")


def _graph_op_rows(kernels: pa.Table, graph: Any, calls: dict[int, str], captured: list[list[CapturedNode]]
                   ) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """Op rows of the kernels graph launches ran: per launch, one row per captured op its kernels match
    (`launch` graph), the rest one row named by the launch call (`launch` graph_unmatched)."""
    idx = pc.indices_nonzero(graph).to_pylist()
    cols = {c: kernels.column(c).take(pa.array(idx)).to_pylist() for c in ("name", "ts", "dur", "correlation", "kind",
                                                                          "step")}
    by_launch: dict[int, list[int]] = {}
    for j, corr in enumerate(cols["correlation"]):
        by_launch.setdefault(corr, []).append(j)
    rows: list[dict[str, Any]] = []
    cats: dict[int, str] = {}
    for corr, members in by_launch.items():
        members.sort(key=lambda j: cols["ts"][j])
        nodes = match_replay([cols["name"][j] or "" for j in members], captured) if captured else [None] * len(members)
        groups: dict[Any, list[int]] = {}
        op_node: dict[Any, CapturedNode] = {}
        for j, node in zip(members, nodes):  # one row per capturing op instance (its External id there)
            key = (node.external_id, node.op_name) if node is not None and node.op_name else None
            groups.setdefault(key, []).append(j)
            if key is not None:
                op_node.setdefault(key, node)
        for key, js in groups.items():
            row = _graph_row(op_node.get(key), js, cols, corr, calls.get(corr) or "GraphLaunch")
            rows.append(row)
            for j in js:
                cats[idx[j]] = row["category"]
    return rows, cats


def _graph_row(node: CapturedNode | None, js: list[int], cols: dict[str, list], corr: int, call: str
               ) -> dict[str, Any]:
    names = sorted({cols["name"][j] or "" for j in js})
    kinds = {cols["kind"][j] for j in js}
    if node is not None:
        cost = op_cost(node.op_name or "", load_json(node.input_dims), load_json(node.input_types),
                       load_json(node.concrete_inputs), kinds, names)
        name, dims, types, concrete, launch = node.op_name, node.input_dims, node.input_types, node.concrete_inputs, "graph"
    else:
        cost = OpCost(kernel_category(names[0]) if len(names) == 1 else "other")
        name, dims, types, concrete, launch = call, None, None, None, "graph_unmatched"
    durs = [cols["dur"][j] or 0 for j in js]
    steps = [cols["step"][j] for j in js if cols["step"][j] is not None]
    return {"step": min(steps) if steps else None, "name": name, "category": cost.category, "ts": None, "dur": None,
            "external_id": None, "dtype": cost.dtype, "input_dims": dims, "input_types": types,
            "concrete_inputs": concrete, "kernel_count": len(js), "kernel_ns": sum(durs),
            "kernel_ts": min(cols["ts"][j] for j in js), "kernel_end": max(cols["ts"][j] + d for j, d in zip(js, durs)),
            "flops": cost.flops, "bytes": cost.bytes, "formula": cost.formula, "launch": launch,
            "graph_correlation": corr,
            **dict(zip(("gemm_batch", "gemm_m", "gemm_n", "gemm_k"), cost.gemm or (None,) * 4))}
