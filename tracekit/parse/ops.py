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

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.parse.cuda_graphs import CapturedNode, graph_launches, match_replay
from tracekit.parse.dict_columns import codes, text_test
from tracekit.parse.op_shapes import OpCost, kernel_category, load_json, op_cost
from tracekit.tables.columns import sorted_unique
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
        cat = events.column("cat")
        ops = events.select(cols).filter(pc.and_(text_test(cat, pc.equal, "cpu_op"),
                                                 pc.is_in(events.column("external_id"), value_set=self.wanted)))
        if ops.num_rows:
            self.op_parts.append(ops)
        if self.corr_wanted is not None and len(self.corr_wanted):
            runtime = pc.and_(pc.is_in(events.column("correlation"), value_set=self.corr_wanted),
                              pc.is_valid(events.column("external_id")))
            launch = events.select(["correlation", "external_id"]).filter(
                pc.and_(runtime, text_test(cat, pc.not_equal, "kernel")))
            if launch.num_rows:
                self.launch_parts.append(launch)

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
        direct = _direct_ops(ops, kernels, rank) if ops is not None else _ops_table([], rank)
        by_ext = dict(zip(direct.column("external_id").to_pylist(), direct.column("category").to_pylist()))
        cats = [by_ext.get(e) for e in kernels.column("external_id").to_pylist()] if kernels.num_rows else []
        parts = [direct]
        if graph is not None:
            graph_rows, graph_cats = _graph_op_rows(kernels, graph, self.graph_calls, self.captured)
            parts.append(_ops_table(graph_rows, rank))
            for i, c in graph_cats.items():
                cats[i] = c
        return {"ops": conform("ops", pa.concat_tables(parts)),
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


DERIVED = ("ops", "kernel_summary")
"""The tables `derived_tables` adds to a parse (a parse worker's share of the per-rank work)."""


def derived_tables(tables: dict[str, Any]) -> dict[str, pa.Table]:
    """`ops` and `kernel_summary` of one parsed trace whose events are in memory (their rank column 0: the
    store writer sets the rank, decided once all inputs are seen), computed where the trace was parsed so a
    run's parse workers share this per-rank work; {} for a trace the writer must finish itself: events
    spilled in parts (the chunked path), or CUDA-graph launches, whose ops come from the run's capture traces."""
    events, kernels = tables.get("events"), tables.get("kernels")
    if not isinstance(events, pa.Table) or not isinstance(kernels, pa.Table) or any(n in tables for n in DERIVED):
        return {}
    collector = OpCollector(kernels)
    collector.add(events)
    if collector.graph_calls:
        return {}
    return collector.tables(0)


class _Distinct:
    """The distinct non-null values of a text column in each group of rows: in sorted order (`of(j)`), the
    first four as value ranks (`first4`, -1 padded), and a code per group equal for equal sets (`sig()`)."""

    def __init__(self, group: np.ndarray, col: Any, num: int) -> None:
        row_codes, values = codes(col)
        known = [c for c, v in enumerate(values) if v is not None]
        ordered = sorted(known, key=values.__getitem__)
        lex = np.full(len(values), -1, np.int64)
        lex[ordered] = np.arange(len(ordered))
        self.sorted_values = [values[c] for c in ordered]
        row_lex = lex[row_codes]
        ok = row_lex >= 0
        width = len(ordered) + 1
        pairs = sorted_unique(group[ok] * width + row_lex[ok])  # by group, then value order
        self.pair_group, self.pair_lex = pairs // width, pairs % width
        self.bounds = np.searchsorted(self.pair_group, np.arange(num + 1))
        rank_in_group = np.arange(len(pairs)) - self.bounds[self.pair_group]
        first4 = np.full((num, 4), -1, np.int64)
        keep = rank_in_group < 4
        first4[self.pair_group[keep], rank_in_group[keep]] = self.pair_lex[keep]
        self.first4 = first4
        self.num = num

    def sig(self) -> np.ndarray:
        """Per group, a code equal for groups with the same set of values (a bit per value when they fit)."""
        if len(self.sorted_values) <= 62:
            mask = np.zeros(self.num, np.int64)
            np.bitwise_or.at(mask, self.pair_group, np.left_shift(1, self.pair_lex))
            return mask
        runs = [self.pair_lex[lo:hi].tobytes() for lo, hi in zip(self.bounds[:-1].tolist(), self.bounds[1:].tolist())]
        seen: dict[bytes, int] = {}
        return np.fromiter((seen.setdefault(r, len(seen)) for r in runs), np.int64, self.num)

    def of(self, j: int) -> list:
        return [self.sorted_values[v] for v in self.pair_lex[self.bounds[j]:self.bounds[j + 1]].tolist()]


@dataclass
class _KernelGroups:
    """The kernels of each External id (`ext`, sorted): count, summed duration, first start, last end,
    smallest step (None where all are null), distinct kinds and names (nulls not counted)."""

    ext: np.ndarray
    count: np.ndarray
    total: np.ndarray
    first: np.ndarray
    last: np.ndarray
    step: list
    kinds: _Distinct
    names: _Distinct


def _kernel_groups(kernels: pa.Table) -> _KernelGroups | None:
    """The kernels grouped by External id (a null duration counts 0); None when none has one."""
    k = kernels.filter(pc.is_valid(kernels.column("external_id")))
    if not k.num_rows:
        return None
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
    no_step = np.iinfo(np.int64).max
    steps = pc.fill_null(k.column("step").cast(pa.int64()), no_step).to_numpy(zero_copy_only=False)
    step = np.full(num, no_step)
    np.minimum.at(step, group, steps)
    return _KernelGroups(exts, np.bincount(group, minlength=num), total, first, last,
                         [None if s == no_step else s for s in step.tolist()],
                         _Distinct(group, k.column("kind"), num), _Distinct(group, k.column("name"), num))


def _innermost(ext: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Per External id, the row of the CPU op it names (the latest-starting one if several share it, the
    last of those if they start together), in order of the id's first row."""
    n = len(ext)
    order = np.lexsort((np.arange(n), ts, ext))
    last = order[np.r_[ext[order][1:] != ext[order][:-1], True]] if n else order
    _, first = np.unique(ext, return_index=True)  # both sorted by External id
    return last[np.argsort(first, kind="stable")]


_COST_FIELDS = ("category", "dtype", "flops", "bytes", "formula", "gemm_batch", "gemm_m", "gemm_n", "gemm_k")


def _direct_ops(ops: pa.Table, kernels: pa.Table, rank: int) -> pa.Table:
    """The ops table's rows of the CPU ops that launched kernels (launch `direct`), ordered by their first
    kernel's start: one per External id that names kernels (its innermost op), with the kernels' totals
    and what its shapes say (`op_cost`, once per distinct name, shapes, kinds and first four kernel
    names: the op whose id comes first in the events gives it)."""
    groups = _kernel_groups(kernels)
    if groups is None or not ops.num_rows:
        return _ops_table([], rank)
    ext = ops.column("external_id").to_numpy(zero_copy_only=False).astype(np.int64)
    rows = _innermost(ext, ops.column("ts").to_numpy(zero_copy_only=False).astype(np.int64))
    at = np.searchsorted(groups.ext, ext[rows])
    found = (at < len(groups.ext)) & (groups.ext[np.minimum(at, len(groups.ext) - 1)] == ext[rows])
    rows, g = rows[found], at[found]
    if not len(rows):
        return _ops_table([], rank)
    op = ops.take(pa.array(rows))
    texts = [codes(op.column(c)) for c in ("name", "input_dims", "input_types", "concrete_inputs")]
    texts[0] = (texts[0][0], [v or "" for v in texts[0][1]])
    names4 = groups.names.first4[g]
    key, key_first = _first_seen_groups(*(c for c, _ in texts), groups.kinds.sig()[g], *(names4[:, i] + 1 for i in range(4)))
    costs = []
    for r in key_first.tolist():
        j = int(g[r])
        name, dims, types, concrete = (values[row_codes[r]] for row_codes, values in texts)
        cost = op_cost(name, load_json(dims), load_json(types), load_json(concrete), set(groups.kinds.of(j)),
                       groups.names.of(j))
        costs.append((cost.category, cost.dtype, cost.flops, cost.bytes, cost.formula, *(cost.gemm or (None,) * 4)))
    order = np.lexsort((ext[rows], groups.first[g]))
    key, g = pa.array(key[order]), g[order]
    op = op.take(pa.array(order))
    op_step = op.column("step").to_pylist()
    step = [s if s is not None else groups.step[j] for s, j in zip(op_step, g.tolist())]
    cols: dict[str, Any] = {
        "step": step, "name": pa.array([texts[0][1][c] for c in texts[0][0][order].tolist()], pa.string()),
        "ts": op.column("ts"), "dur": op.column("dur"), "external_id": op.column("external_id"),
        "input_dims": op.column("input_dims"), "input_types": op.column("input_types"),
        "concrete_inputs": op.column("concrete_inputs"), "kernel_count": groups.count[g], "kernel_ns": groups.total[g],
        "kernel_ts": groups.first[g], "kernel_end": groups.last[g], "launch": ["direct"] * len(g),
        "graph_correlation": pa.nulls(len(g), pa.int64())}
    for i, f in enumerate(_COST_FIELDS):
        cols[f] = pa.array([c[i] for c in costs], _value_type(f)).take(key)
    return pa.table({"rank": pa.array(np.full(len(g), rank, np.int32)),
                     **{f.name: _as(cols[f.name], f.name) for f in OPS if f.name != "rank"}})


def _value_type(name: str) -> pa.DataType:
    t = OPS.field(name).type
    return t.value_type if pa.types.is_dictionary(t) else t


def _as(values: Any, name: str) -> pa.Array:
    """A column of the ops table in the type _ops_table gives it (dictionaries as their plain values)."""
    t = _value_type(name)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        return values.cast(t) if values.type != t else values
    return pa.array(values, t)


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
    name_codes, names = codes(kernels.column("name"))
    kind_codes, kinds = codes(kernels.column("kind"))
    stream_codes, streams = codes(kernels.column("stream"))
    durs = pc.fill_null(kernels.column("dur"), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    group, first = _first_seen_groups(name_codes, stream_codes)
    num = len(first)
    count = np.bincount(group, minlength=num).astype(np.int64)
    total = np.zeros(num, np.int64)
    np.add.at(total, group, durs)
    top = np.zeros(num, np.int64)
    np.maximum.at(top, group, durs)
    op_cat_codes, op_cats = codes(pa.array(op_categories, pa.string()))
    triple, triple_first = _first_seen_groups(name_codes, kind_codes, op_cat_codes)
    cat_of_triple = [_kernel_cat(names[name_codes[r]], kinds[kind_codes[r]], op_cats[op_cat_codes[r]])
                     for r in triple_first.tolist()]
    cat_codes, cat_values = codes(pa.array(cat_of_triple, pa.string()).take(pa.array(triple)))
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


def _first_seen_groups(*codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group per row, first row of each group) of the rows' code tuples, groups numbered in order of
    first occurrence."""
    key = np.zeros(len(codes[0]), np.int64)
    for c in codes:  # renumbered after each column, so the combined key stays below the row count
        key = np.unique(key * (int(c.max()) + 1 if len(c) else 1) + c, return_inverse=True)[1].reshape(-1)
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
