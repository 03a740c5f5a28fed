"""Plotly figures (as plain JSON specs) and the mesh view, built from analysis sections. Layout only:
values are drawn as the analyzers computed them; shapes the page does not recognise draw nothing."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from reports.escape import h
from reports.format import is_num, ranks_text
from reports.html_parts import Figures, plotly_text, typed
from tracekit.document.model import (ExpertsSection, LayoutRanksRow, LayoutSection, MemorySection, PipelineSection,
                                     StragglersSection, UnoverlappedSection)

COLORS = {"compute": "#2e7d32", "exposed_comm": "#c62828", "comm": "#ef6c00", "other": "#5c6bc0",
          "idle": "#bdbdbd", "fwd": "#1565c0", "bwd": "#6a1b9a", "bwd_input": "#8e24aa", "bwd_weight": "#ab47bc",
          "send": "#00838f", "recv": "#00695c", "critical path": "#d50000", "exposed_transfer": "#ef6c00",
          "waiting_for_peer": "#bdbdbd", "host": "#6d4c41", "host_data_stall": "#9e9e9e", "other_device": "#5c6bc0"}
_PALETTE = ["#ef6c00", "#c62828", "#00838f", "#6d4c41", "#ad1457", "#827717", "#4527a0", "#00695c"]


def _color(name: str, i: int) -> str:
    return COLORS.get(name) or _PALETTE[i % len(_PALETTE)]


def _exact(t: Any) -> int | float:
    """Epoch-scale ns timestamps lose precision as float64 (256 ns at 1.7e18): keep ints exact until the
    origin is subtracted."""
    return int(t) if isinstance(t, int) or float(t).is_integer() else float(t)


def _first(d: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if k in d and d[k] is not None:
            return d[k]
    return None


def _records(data: Any, key: str | None = None) -> list[dict[str, Any]]:
    """Rows from either a list of dicts or a columnar dict of equal-length lists (optionally under `key`)."""
    if key is not None and isinstance(data, dict):
        data = data.get(key)
    if isinstance(data, list):
        return [r for r in data if isinstance(r, dict)]
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        n = {len(v) for v in data.values()}
        if len(n) == 1:
            keys = list(data)
            return [dict(zip(keys, vals)) for vals in zip(*(data[k] for k in keys))]
    return []


# ---------------------------------------------------------------- layout / mesh

def _dims(layout: LayoutSection) -> list[tuple[str, int]]:
    return [(str(k), int(v)) for k, v in layout.mesh_shape.items() if is_num(v)]


def layout_text(layout: LayoutSection) -> str:
    dims = _dims(layout)
    world = layout.world_size
    if not dims:
        return "not inferred" + (f" (world size {world})" if world else "")
    return " × ".join(f"{n}{s}" for n, s in dims) + (f" (world size {world})" if world else "")


_DIM_ORDER = ("pp", "dp", "fsdp", "cp", "ep", "tp")
_DERIVED_PENALTY = {"ep": 2, "fsdp": 1}


def _grid_dims(dims: list[tuple[str, int]], coords: list[LayoutRanksRow]) -> list[str]:
    """Which dims to draw the mesh over: the largest set whose coordinates place every rank in its own cell
    of a full grid (ep is often a product of dp and cp, so it is left out when the others suffice)."""
    from itertools import combinations

    sizes = {n: s for n, s in dims if s > 1}
    names = sorted(sizes, key=lambda n: _DIM_ORDER.index(n) if n in _DIM_ORDER else len(_DIM_ORDER))
    placed = coords
    best: tuple[int, int, tuple[str, ...]] | None = None
    for k in range(len(names), 0, -1):
        for combo in combinations(names, k):
            if int(np.prod([sizes[n] for n in combo])) != len(placed):
                continue
            keys = {tuple(c.coords.get(n) for n in combo) for c in placed}
            if len(keys) == len(placed) and all(is_num(v) for key in keys for v in key):
                score = (k, -sum(_DERIVED_PENALTY.get(n, 0) for n in combo), combo)
                best = score if best is None or score[:2] > best[:2] else best
        if best is not None:
            break
    return list(best[2]) if best else names


def mesh_html(layout: LayoutSection) -> str:
    """The mesh as small tables of ranks placed at the coordinates the layout analyzer reports: the last two
    dims as rows × columns, one table per index of the outer dims."""
    dims = _dims(layout)
    coords = layout.ranks
    names = _grid_dims(dims, coords)
    placed: dict[tuple[int, ...], list[Any]] = {}
    for r in coords:
        c = r.coords  # {dim: index}
        if names and all(is_num(c.get(n)) for n in names):
            placed.setdefault(tuple(int(c[n]) for n in names), []).append(r.rank)
    if not placed:
        if layout.groups:
            from reports.generic import render_generic

            return ('<p class=note>No rank coordinates were inferred; the groups are:</p>'
                    + render_generic(msgspec.to_builtins(layout.groups)))
        return '<p class=note>No rank mesh was reported.</p>'
    shape = [max(k[i] for k in placed) + 1 for i in range(len(names))]
    if len(names) == 1:
        names, shape, placed = [""] + names, [1] + shape, {(0,) + k: v for k, v in placed.items()}
    outer = shape[:-2]
    tables = []
    for idx in np.ndindex(*outer) if outer else [()]:
        caption = ", ".join(f"{n}={i}" for n, i in zip(names, idx))
        head = "".join(f"<th>{h(names[-1])}={j}</th>" for j in range(shape[-1]))
        rows = "".join(
            f"<tr><th>{h(names[-2]) + '=' + str(i) if names[-2] else ''}</th>" + "".join(
                f"<td>{h(', '.join(map(str, placed.get(tuple(idx) + (i, j), []))) or '·')}</td>"
                for j in range(shape[-1])) + "</tr>"
            for i in range(shape[-2]))
        cap = f"<caption>{h(caption)}</caption>" if caption else ""
        tables.append(f"<table class=mesh>{cap}<thead><tr><th></th>{head}</tr></thead><tbody>{rows}</tbody></table>")
    if len(tables) > 64:
        tables = tables[:64] + [f'<p class=note>… {len(tables) - 64} more mesh slices.</p>']
    left_out = [n for n, s in dims if s > 1 and n not in names]
    note = '<p class=note>Each cell is the global rank at those coordinates'
    note += (f"; {h(', '.join(left_out))} groups are spans of these axes (see the groups below).</p>"
             if left_out else ".</p>")
    return note + "<div>" + "".join(tables) + "</div>"


# ---------------------------------------------------------------- breakdown

def breakdown_bars(figs: Figures, rows: list[dict[str, Any]]) -> str:
    """Stacked bar per rank: compute ▸ exposed comm ▸ other ▸ idle (values already per step, ns)."""
    ranks = [r.get("rank") for r in rows]
    labels = [f"r{r}" for r in ranks]
    data = []
    for key, name in (("compute_ns", "compute"), ("exposed_comm_ns", "exposed comm"), ("other_ns", "other"),
                      ("idle_ns", "idle")):
        vals = [r.get(key) / 1e6 if is_num(r.get(key)) else 0.0 for r in rows]
        data.append({"type": "bar", "name": name, "x": labels, "y": typed(vals),
                     "marker": {"color": COLORS[key[:-3] if key != "exposed_comm_ns" else "exposed_comm"]},
                     "hovertemplate": "%{x}: %{y:.2f} ms/step<extra>" + name + "</extra>"})
    layout = {"barmode": "stack", "yaxis": {"title": {"text": "ms per step"}},
              "xaxis": {"type": "category", "title": {"text": "rank"}, "tickangle": -45 if len(rows) > 32 else 0}}
    return figs.add(data, layout, height=360)


# ---------------------------------------------------------------- timeline

def _timeline_rows(tl: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Intervals as dicts; the breakdown section stores them as [rank, lane, start_ns, end_ns] lists
    (lane: a name from `lanes`, or its index)."""
    if isinstance(tl, list):
        return _records(tl), {}
    lanes = tl.get("lanes") if isinstance(tl.get("lanes"), list) else []
    raw = tl.get("intervals")
    rows: list[dict[str, Any]] = []
    if isinstance(raw, list):
        for iv in raw:
            if isinstance(iv, dict):
                rows.append(iv)
            elif isinstance(iv, (list, tuple)) and len(iv) >= 4:
                lane = iv[1]
                if is_num(lane) and 0 <= int(lane) < len(lanes):
                    lane = lanes[int(lane)]
                rows.append({"rank": iv[0], "lane": lane, "start_ns": iv[2], "end_ns": iv[3]})
    else:
        rows = _records(raw)
    return rows, tl


def timeline(figs: Figures, tl: Any) -> str:
    """Gantt of (rank, lane) rows: one bar trace per lane kind so compute, each comm group and idle get a
    colour and a legend entry."""
    rows, meta = _timeline_rows(tl)
    spans = []
    for r in rows:
        start = _first(r, "start_ns", "ts", "start")
        end = _first(r, "end_ns", "end")
        if end is None and is_num(start) and is_num(r.get("dur")):
            end = start + r["dur"]
        lane = _first(r, "lane", "kind", "name")
        if is_num(start) and is_num(end) and lane is not None:
            spans.append((r.get("rank"), str(lane), _exact(start), _exact(end)))
    if not spans:
        return '<p class=note>The timeline holds no intervals.</p>'
    t0 = _first(meta, "t0_ns", "origin_ns", "start_ns")
    if not is_num(t0):
        t0 = min(s[2] for s in spans)
    order = [str(x) for x in meta.get("lanes") or []] if isinstance(meta, dict) else []
    lanes = sorted({s[1] for s in spans}, key=lambda n: (order.index(n) if n in order else len(order), n))
    ranks = sorted({s[0] for s in spans}, key=lambda r: (not is_num(r), r if is_num(r) else str(r)))
    # y categories: every (rank, lane) that has intervals, ranks top to bottom; a rank's `summary:` lanes
    # (the analysis summarised it) share one row
    row = lambda r, lane: f"r{r}" if lane.startswith(SUMMARY) else f"r{r} · {plotly_text(lane)}"  # noqa: E731
    present = {(s[0], s[1]) for s in spans}
    cats = list(dict.fromkeys(row(r, lane) for r in ranks for lane in lanes if (r, lane) in present))
    data = []
    for i, lane in enumerate(lanes):
        sel = [s for s in spans if s[1] == lane]
        y = [row(s[0], lane) for s in sel]
        base = [(s[2] - t0) / 1e6 for s in sel]
        width = [(s[3] - s[2]) / 1e6 for s in sel]
        kind = lane.removeprefix(SUMMARY)
        name = f"{kind} (a rank's row)" if lane.startswith(SUMMARY) else lane
        data.append({"type": "bar", "orientation": "h", "name": plotly_text(name), "y": y, "base": typed(base, "f4"),
                     "x": typed(width, "f4"), "marker": {"color": _color(kind, i), "line": {"width": 0}},
                     "hovertemplate": "%{y}<br>start %{base:.3f} ms, %{x:.3f} ms<extra></extra>"})
    height = min(160 + 18 * len(cats), 2400)
    layout = {"barmode": "overlay", "bargap": 0.15,
              "xaxis": {"title": {"text": "ms since the window start"}},
              "yaxis": {"type": "category", "categoryorder": "array", "categoryarray": cats[::-1],
                        "automargin": True}}
    notes = []
    if isinstance(meta, dict):
        if is_num(meta.get("min_gap_ns")) and meta["min_gap_ns"] > 0:
            notes.append(f"gaps shorter than {meta['min_gap_ns'] / 1e6:.3f} ms are closed in the drawing (not in the numbers)")
        if meta.get("truncated_ranks"):
            notes.append(f"ranks {ranks_text(meta['truncated_ranks'])} left out to stay within "
                         f"{meta.get('max_intervals', '?')} intervals")
    note = f'<p class=note>Down-sampled for display: {h("; ".join(notes))}.</p>' if notes else ""
    return note + _lanes_note(meta) + figs.add(data, layout, height=height)


SUMMARY = "summary:"
"""Lanes the analysis drew as one row per rank (analyze/breakdown.py)."""


def _lanes_note(meta: Any) -> str:
    """Which ranks have a lane per kind and which one row, as the analysis chose them."""
    if not isinstance(meta, dict):
        return ""
    full = [e for e in meta.get("expanded_ranks") or [] if isinstance(e, dict)]
    rows = meta.get("summarised_ranks") or []
    missing = meta.get("ranks_not_in_run") or []
    text = ""
    if rows:
        why = ", ".join(f"rank {e.get('rank')} ({e.get('why')})" for e in full)
        text = (f"{len(rows)} ranks are drawn as one row each (compute, then communication not under compute, "
                f"other, idle); lanes in full for {why or 'no rank'}. Pick ranks with "
                f"tracekit analyze --timeline-ranks 0-7,12.")
    elif meta.get("chosen_by") == "user":
        text = f"Ranks chosen with --timeline-ranks: {ranks_text([e.get('rank') for e in full])}."
    if missing:
        text += f" Not in the run: {ranks_text(missing)}."
    return f"<p class=note>{h(text.strip())}</p>" if text else ""


# ---------------------------------------------------------------- collectives heatmap

def collective_heatmap(figs: Figures, sec: UnoverlappedSection) -> str:
    """Rank × (dim / op) heatmap of exposed time per step, from the per-rank rows (`by_rank_dim_op`)."""
    cells: dict[tuple[Any, str], float] = {}
    for r in sec.by_rank_dim_op:
        cells[(r.rank, f"{r.dim or '?'} / {r.op or '?'}")] = r.exposed_ns / (r.steps or 1) / 1e6
    if not cells:
        return ""
    ranks = sorted({k[0] for k in cells})
    cols = sorted({k[1] for k in cells})
    z = [[cells.get((r, c)) for c in cols] for r in ranks]
    data = [{"type": "heatmap", "x": [plotly_text(c) for c in cols], "y": [f"r{r}" for r in ranks], "z": z,
             "colorscale": [[0, "#fff5f0"], [0.5, "#fb6a4a"], [1, "#67000d"]],
             "colorbar": {"title": {"text": "ms/step"}}, "xgap": 1, "ygap": 1 if len(ranks) <= 64 else 0,
             "hovertemplate": "%{y} %{x}: %{z:.2f} ms exposed per step<extra></extra>"}]
    layout = {"xaxis": {"type": "category", "automargin": True, "side": "top"},
              "yaxis": {"type": "category", "autorange": "reversed", "title": {"text": "rank"}},
              "margin": {"t": 80}}
    return figs.add(data, layout, height=min(200 + 16 * len(ranks), 1600))


# ---------------------------------------------------------------- pipeline

def pipeline_diagram(figs: Figures, sec: PipelineSection) -> str:
    """Stage × time: one bar per (stage, micro-batch, phase) labelled with the micro-batch; every stage row
    carries a shaded band over the step window, so time no bar covers (the bubble) shows shaded."""
    diagram = sec.diagram
    if diagram is None or not diagram.intervals:
        return ""
    spans = [(r.stage, r.phase or "?", r.microbatch, _exact(r.start_ns), _exact(r.start_ns + r.dur_ns), diagram.step)
             for r in diagram.intervals]
    steps = sorted({s[5] for s in spans if s[5] is not None})
    if steps:  # one step is enough to read the schedule; draw the first one shown by the analyzer
        spans = [s for s in spans if s[5] == steps[0]]
    t0 = min(s[3] for s in spans)
    t1 = max(s[4] for s in spans)
    t1 = max(t1, t0 + diagram.window_ns)
    stages = sorted({s[0] for s in spans})
    phases = sorted({s[1] for s in spans}, key=lambda p: ["fwd", "bwd", "bwd_input", "bwd_weight"].index(p)
                    if p in ("fwd", "bwd", "bwd_input", "bwd_weight") else 9)
    data = [{"type": "bar", "orientation": "h", "name": "idle (bubble)", "y": [f"stage {s}" for s in stages],
             "base": [0.0] * len(stages), "x": [(t1 - t0) / 1e6] * len(stages),
             "marker": {"color": "rgba(198,40,40,0.18)", "line": {"width": 0}}, "hoverinfo": "skip", "width": 0.9}]
    for i, phase in enumerate(phases):
        sel = [s for s in spans if s[1] == phase]
        data.append({"type": "bar", "orientation": "h", "name": plotly_text(phase),
                     "y": [f"stage {s[0]}" for s in sel], "base": [(s[3] - t0) / 1e6 for s in sel],
                     "x": [(s[4] - s[3]) / 1e6 for s in sel], "text": [plotly_text(s[2]) for s in sel],
                     "textposition": "inside", "insidetextanchor": "middle", "width": 0.7,
                     "marker": {"color": _color(phase, i), "line": {"width": 0.5, "color": "#fff"}},
                     "hovertemplate": "%{y} mb %{text}<br>start %{base:.2f} ms, %{x:.2f} ms<extra>"
                                      + plotly_text(phase) + "</extra>"})
    layout = {"barmode": "overlay", "xaxis": {"title": {"text": "ms since the step start"}},
              "yaxis": {"type": "category", "categoryorder": "array",
                        "categoryarray": [f"stage {s}" for s in stages][::-1]}}
    note = f'<p class=note>Step {h(steps[0])} shown; bars are labelled with the micro-batch index.</p>' if steps else ""
    return note + figs.add(data, layout, height=min(150 + 45 * len(stages), 900))


# ---------------------------------------------------------------- experts

def expert_heatmap(figs: Figures, sec: ExpertsSection) -> str:
    """Layer × expert heatmap of routed tokens, one per step (a dropdown picks the step), from the experts
    section's `heatmap` rows ({step, layer, tokens: [per expert]})."""
    cells: dict[Any, dict[int, list[Any]]] = {}
    for r in sec.heatmap:
        cells.setdefault(r.step, {})[r.layer] = r.tokens
    if not cells:
        return ""
    steps = sorted(cells, key=lambda s: (s is None, s if s is not None else 0))[:32]
    layers = sorted({layer for c in cells.values() for layer in c})
    width = max(len(t) for c in cells.values() for t in c.values())
    unit = "ep rank" if sec.granularity == "ep_rank" else "expert"
    xs = [f"{'r' if unit == 'ep rank' else 'e'}{e}" for e in range(width)]
    data = []
    for i, step in enumerate(steps):
        z = [list(cells[step].get(layer, [])) + [None] * (width - len(cells[step].get(layer, []))) for layer in layers]
        data.append({"type": "heatmap", "x": xs, "y": [f"layer {layer}" for layer in layers], "z": z,
                     "colorscale": "Viridis", "visible": i == 0, "name": f"step {step}", "xgap": 1, "ygap": 1,
                     "colorbar": {"title": {"text": "tokens"}},
                     "hovertemplate": "%{y} %{x}: %{z} tokens<extra>step " + h(step) + "</extra>"})
    layout: dict[str, Any] = {"xaxis": {"type": "category", "title": {"text": unit}},
                              "yaxis": {"type": "category", "autorange": "reversed"}}
    if len(steps) > 1:
        layout["updatemenus"] = [{"type": "dropdown", "x": 0, "y": 1.02, "xanchor": "left", "yanchor": "bottom", "buttons": [
            {"label": f"step {s}", "method": "restyle", "args": ["visible", [j == i for j in range(len(steps))]]}
            for i, s in enumerate(steps)]}]
        layout["margin"] = {"l": 70, "r": 20, "t": 50, "b": 45}
    return figs.add(data, layout, height=min(220 + 30 * len(layers), 900))


# ---------------------------------------------------------------- stragglers

def straggler_bars(figs: Figures, sec: StragglersSection) -> str:
    """Arrival skew attributed to each rank: how long its groups waited for it, per step (stragglers section)."""
    pts = [(r.rank, r.delay_ns_per_step / 1e6) for r in sec.ranks]
    if not pts:
        return ""
    pts.sort()
    data = [{"type": "bar", "x": [f"r{p[0]}" for p in pts], "y": typed([p[1] for p in pts]),
             "marker": {"color": COLORS["exposed_comm"]},
             "hovertemplate": "%{x}: %{y:.2f} ms per step<extra>groups waited for this rank</extra>"}]
    layout = {"xaxis": {"type": "category", "title": {"text": "rank"}},
              "yaxis": {"title": {"text": "delay caused (ms per step)"}}}
    return figs.add(data, layout, height=320)



# ---------------------------------------------------------------- memory

def memory_timeline(figs: Figures, sec: MemorySection) -> str:
    """Allocated bytes over the profiled steps, one line per rank (its main device). SVG `scatter`, not
    `scattergl`: a browser without WebGL showed the WebGL chart as a grey box."""
    seen: set[Any] = set()
    data = []
    for r in sec.ranks:
        tl = r.timeline  # {"t_ns": [...], "allocated": [...]}
        if r.rank in seen or not tl.get("t_ns"):
            continue
        seen.add(r.rank)
        data.append({"type": "scatter", "mode": "lines", "name": f"rank {plotly_text(r.rank)}",
                     "x": typed([t / 1e6 for t in tl["t_ns"]]), "y": typed([b / 2**20 for b in tl["allocated"]]),
                     "line": {"shape": "hv", "width": 1}})
    if not data:
        return ""
    return figs.add(data, {"xaxis": {"title": "ms from the first step's start"},
                           "yaxis": {"title": "allocated (MiB)"}}, height=340)


def memory_split_bars(figs: Figures, sec: MemorySection) -> str:
    """Static vs activation bytes at each rank's peak, stacked."""
    seen: set[Any] = set()
    rows = [r for r in sec.ranks if not (r.rank in seen or seen.add(r.rank))]
    if not rows:
        return ""
    x = [f"r{plotly_text(r.rank)}" for r in rows]
    data = []
    for key, name, color in (("static_bytes", "static", "#5c6bc0"), ("activation_bytes", "activations", "#ef6c00")):
        y = [(getattr(r.split, key) or 0) / 2**20 for r in rows]
        data.append({"type": "bar", "name": name, "x": x, "y": y, "marker": {"color": color}})
    return figs.add(data, {"barmode": "stack", "yaxis": {"title": "MiB at the peak"}}, height=300)
