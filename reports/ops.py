"""The "Ops and kernels" section of report.html and its lines in summary.md, laid out from `sections.ops`.

Computes nothing: every number is in analysis.json (tracekit/analyze/ops.py). The roofline chart is
inline SVG (log-log axes; no script, no WebGL), so it renders in any browser and in the file as saved.
"""

from __future__ import annotations

import math
from typing import Any

from reports.escape import h, md
from reports.format import is_num, ms, num, pct
from reports.html_parts import Col, kv_table, not_available, section, table
from tracekit.document import as_section, to_builtins
from tracekit.document.model import OpsRoofline, OpsSection, OpsTopOpsRow

TITLE = "Ops and kernels"
_CAT_COLORS = {"gemm": "#1f77b4", "attention": "#9467bd", "conv": "#17becf", "elementwise": "#ff7f0e",
               "norm": "#2ca02c", "reduce": "#8c564b", "comm": "#d62728", "memcpy": "#7f7f7f", "other": "#bcbd22"}


def _ms(v: Any) -> str:
    return ms(v, 3).replace(" ms", "")


def _txt(v: Any) -> str:
    return "–" if v is None else str(v)


def _shape(r: OpsTopOpsRow) -> str:
    g = r.gemm
    if isinstance(g, list) and len(g) == 4 and all(is_num(x) for x in g):
        return f"M,N,K = {g[1]},{g[2]},{g[3]}" + ("" if g[0] == 1 else f" ×{g[0]}")
    text = _txt(r.input_dims)
    while ",[]" in text:  # scalars' empty shapes
        text = text.replace(",[]", "")
    return text[:120]


def _tf(v: Any) -> str:
    return num(v, 1) if is_num(v) else "–"


_OP_COLS = [
    Col("name", "op", _txt, False), Col("category", "category", _txt, False), Col("shape", "shape", _txt, False),
    Col("dtype", "dtype", _txt, False), Col("count", "count"), Col("kernel_ns", "device time (ms)", _ms),
    Col("share", "share", pct), Col("tflops", "TFLOP/s", _tf), Col("tbps", "TB/s", lambda v: num(v, 3)),
    Col("intensity", "FLOP/byte", lambda v: num(v, 1)), Col("bound", "bound", _txt, False),
    Col("roof_tflops", "roof TFLOP/s", _tf), Col("pct_of_roof", "% of roof", pct)]


def _with_shape(rows: list[OpsTopOpsRow]) -> list[dict[str, Any]]:
    """Op rows as the table lays them out: their fields and the shape text."""
    return [dict(to_builtins(r), shape=_shape(r)) for r in rows]


def _rank_text(sec: OpsSection) -> str:
    rows = sec.ranks
    if not rows:
        return ""
    body = table(rows, [
        Col("rank", "rank"), Col("device", "device", _txt, False), Col("device_match", "peak table row", _txt, False),
        Col("peak_dtype", "dtype", _txt, False), Col("peak_tflops", "peak TFLOP/s", _tf),
        Col("hbm_tbps", "HBM TB/s", lambda v: num(v, 2)), Col("steps", "steps"),
        Col("step_ns", "step time (ms)", _ms), Col("flops_per_step", "model FLOP/step", lambda v: f"{v:.3e}" if is_num(v) else "–"),
        Col("achieved_tflops", "achieved TFLOP/s", _tf), Col("mfu", "MFU", pct),
        Col("recompute_flops", "recomputed FLOP", lambda v: f"{v:.3e}" if is_num(v) and v else "–"),
        Col("hfu", "HFU", pct),
        Col("flops_coverage", "op time with a FLOP count", pct)])
    return ("<h3>Model FLOPs utilisation</h3><p class=note>MFU = the FLOPs of the ops inside the analyzed steps "
            "(counted from their recorded shapes: GEMM 2·M·N·K, attention, convolution, elementwise…; see "
            "docs/metrics.md) ÷ the summed step time ÷ the device's dense peak for the dtype carrying most "
            "GEMM/attention FLOPs. Ops without a formula (Triton kernels) add no FLOPs: the last column says how "
            "much op time is counted. Peaks come from the device table or --peak-tflops / --peak-bandwidth. "
            "HFU (hardware FLOPs utilisation) also counts the forward ops re-run inside backward (activation "
            "checkpointing, found in the op tree): MFU leaves them out, so HFU = MFU without recomputation.</p>"
            + body)


def _svg_roofline(roof: OpsRoofline) -> str:
    """A log-log roofline: the memory slope and compute ceiling, one dot per op group (area ~ time)."""
    pts = [p for p in roof.points if is_num(p.intensity) and is_num(p.tflops) and p.intensity > 0 and p.tflops > 0]
    peak, bw = roof.peak_tflops, roof.hbm_tbps
    if not pts or not is_num(peak) or not is_num(bw) or peak <= 0 or bw <= 0:
        return ""
    xs = [p.intensity for p in pts] + [peak / bw]
    ys = [p.tflops for p in pts] + [peak]
    x0, x1 = 10 ** math.floor(math.log10(min(xs)) - 0.3), 10 ** math.ceil(math.log10(max(xs)) + 0.3)
    y0, y1 = 10 ** math.floor(math.log10(min(ys)) - 0.3), 10 ** math.ceil(math.log10(max(ys)) + 0.3)
    w, hgt, left, top = 640, 360, 60, 20

    def sx(v: float) -> float:
        return left + (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)) * w

    def sy(v: float) -> float:
        return top + hgt - (math.log10(v) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)) * hgt

    ridge = peak / bw
    start = max(x0, y0 / bw)
    parts = [f'<line x1="{sx(start):.1f}" y1="{sy(start * bw):.1f}" x2="{sx(ridge):.1f}" y2="{sy(peak):.1f}" '
             'stroke="#444" stroke-width="2"/>',
             f'<line x1="{sx(ridge):.1f}" y1="{sy(peak):.1f}" x2="{sx(x1):.1f}" y2="{sy(peak):.1f}" '
             'stroke="#444" stroke-width="2"/>']
    for d in range(int(math.log10(x0)), int(math.log10(x1)) + 1):
        parts.append(f'<text x="{sx(10 ** d):.1f}" y="{top + hgt + 16}" font-size="11" text-anchor="middle">1e{d}</text>')
    for d in range(int(math.log10(y0)), int(math.log10(y1)) + 1):
        parts.append(f'<text x="{left - 6}" y="{sy(10 ** d) + 4:.1f}" font-size="11" text-anchor="end">1e{d}</text>')
    longest = max(p.kernel_ns for p in pts) or 1
    for p in pts:
        r = 3 + 9 * math.sqrt(p.kernel_ns / longest)
        color = _CAT_COLORS.get(p.category, "#bcbd22")
        parts.append(f'<circle cx="{sx(p.intensity):.1f}" cy="{sy(p.tflops):.1f}" r="{r:.1f}" fill="{color}" '
                     f'fill-opacity="0.6"><title>{h(p.name)}: {num(p.tflops, 1)} TFLOP/s at '
                     f'{num(p.intensity, 1)} FLOP/byte, {h(ms(p.kernel_ns, 3))}</title></circle>')
    legend = " ".join(f'<span style="color:{c}">●</span> {h(k)}' for k, c in _CAT_COLORS.items()
                      if any(p.category == k for p in pts))
    return (f'<figure class=roofline><svg xmlns="http://www.w3.org/2000/svg" width="{w + left + 20}" '
            f'height="{hgt + top + 40}" role="img" aria-label="roofline">'
            f'<rect x="{left}" y="{top}" width="{w}" height="{hgt}" fill="none" stroke="#ccc"/>{"".join(parts)}'
            f'<text x="{left + w / 2}" y="{top + hgt + 34}" font-size="12" text-anchor="middle">arithmetic intensity '
            f'(FLOP/byte)</text><text x="14" y="{top + hgt / 2}" font-size="12" text-anchor="middle" '
            f'transform="rotate(-90 14 {top + hgt / 2})">TFLOP/s</text></svg>'
            f'<figcaption>Roofline of {h(roof.device)} ({h(roof.dtype)}: {num(peak, 1)} TFLOP/s, '
            f'{num(bw, 2)} TB/s, ridge {num(ridge, 1)} FLOP/byte); dot area ~ device time. {legend}</figcaption>'
            "</figure>")


def ops_html(sec: OpsSection | dict[str, Any] | None) -> str:
    sec = as_section(OpsSection, sec)
    if sec is None or not sec.available:
        reason = (sec.reason if sec is not None else None) or "no op launched device work in this run"
        return section("ops", TITLE, not_available(TITLE, reason))
    gemm = sec.gemm
    body = "<p class=note>One row per op and input shape (all ranks and steps): the device time of the kernels " \
           "it launched, its FLOPs and bytes from the recorded shapes, and where it sits under the roofline.</p>"
    body += "".join(f"<p class=note><strong>Note:</strong> {h(n)}</p>" for n in sec.notes)
    body += kv_table([("GEMM shapes", num(gemm.shapes)), ("GEMM device time", ms(gemm.kernel_ns, 3)),
                      ("GEMM TFLOP/s (time-weighted)", _tf(gemm.tflops))])
    worst = _with_shape(sec.worst)
    if worst:
        body += ("<h3>Heavy ops furthest from their roof</h3>"
                 "<p class=note>Ops taking at least 5% of the device time, lowest % of roof first.</p>"
                 + table(worst, _OP_COLS))
    body += _rank_text(sec)
    cats = sec.categories
    if cats:
        body += "<h3>Categories</h3>" + table(cats, [
            Col("category", "category", _txt, False), Col("ops", "ops"), Col("kernel_ns", "device time (ms)", _ms),
            Col("share", "share", pct), Col("flops", "FLOPs", lambda v: f"{v:.3e}" if is_num(v) else "–")])
    if sec.roofline is not None:
        body += "<h3>Roofline</h3>" + _svg_roofline(sec.roofline)
    top = _with_shape(sec.top_ops)
    body += f"<h3>Top {len(top)} ops by device time</h3>" + table(top, _OP_COLS, table_id="ops-table")
    kernels = sec.kernels
    if kernels:
        body += "<h3>Kernels</h3>" + table(kernels, [
            Col("name", "kernel", lambda v: _txt(v)[:160], False), Col("category", "category", _txt, False),
            Col("kind", "kind", _txt, False), Col("streams", "streams", lambda v: ", ".join(map(str, v or [])), False),
            Col("count", "count"), Col("total_ns", "total (ms)", _ms), Col("mean_ns", "mean (ms)", _ms),
            Col("max_ns", "max (ms)", _ms), Col("share", "share", pct)], table_id="kernels-table")
    return section("ops", TITLE, body)


def ops_summary_lines(sec: OpsSection | dict[str, Any] | None, href: str, top: int = 5) -> list[str]:
    """Top ops (and MFU) for summary.md; nothing when the run has no ops."""
    sec = as_section(OpsSection, sec)
    if sec is None or not sec.available:
        return []
    lines = ["**Top ops by device time** ([all]({}#ops)):".format(href), "",
             "| op | shape | device time | share | TFLOP/s | % of roof |", "|---|---|---:|---:|---:|---:|"]
    for r in sec.top_ops[:top]:
        lines.append(f"| {md(r.name)} | {md(_shape(r))} | {ms(r.kernel_ns, 3)} | {pct(r.share)} "
                     f"| {_tf(r.tflops)} | {pct(r.pct_of_roof)} |")
    mfu = [f"rank {r.rank} {pct(r.mfu)}" + (f" (HFU {pct(r.hfu)})" if is_num(r.hfu) and r.recompute_flops else "")
           for r in sec.ranks if is_num(r.mfu)]
    gemm = sec.gemm
    extra = []
    if mfu:
        extra.append("MFU " + ", ".join(mfu[:8]) + (" …" if len(mfu) > 8 else ""))
    if is_num(gemm.tflops):
        extra.append(f"GEMMs {num(gemm.tflops, 1)} TFLOP/s time-weighted over {gemm.shapes} shapes")
    lines.append("")
    if extra:
        lines += ["; ".join(extra) + ".", ""]
    return lines
