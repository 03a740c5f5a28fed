"""The layout advisor's output laid out: `advice.md` (a pull-request comment), the advice lines of
summary.md and the "Layout advice" section of report.html. Everything comes from the advice document
(advice.json, or analysis.json's `advice` section); nothing is computed here."""

from __future__ import annotations

from typing import Any

from reports.escape import h, md
from reports.html_parts import Col, Figures, plotly_text, table
from tracekit.document.model import AdviceSection

MAX_SUMMARY_ROWS = 5


def layout_text(lay: dict[str, Any]) -> str:
    dims = " × ".join(f"{k}{lay[k]}" for k in ("dp", "tp", "pp", "cp", "ep") if lay[k] > 1) or "1 GPU"
    extra = []
    if lay["pp"] > 1:
        extra.append(f"{lay['schedule']} m={lay['microbatches']}" + (f" v={lay['interleave']}" if lay["interleave"] > 1 else ""))
    if lay["fsdp"]:
        extra.append("FSDP")
    if lay["activation_checkpointing"]:
        extra.append("AC")
    return dims + (f" ({', '.join(extra)})" if extra else "")


def _row(i: str, c: dict[str, Any]) -> str:
    fits = "yes" if c["fits_in_memory"] else "**no**"
    return (f"| {i} | {md(layout_text(c['layout']))} | {c['predicted_step_ns'] / 1e6:.1f} ms | "
            f"{c['tokens_per_s_per_gpu']:,.0f} | {100 * c['mfu']:.0f}% | {c['peak_memory_bytes'] / 2**30:.1f} GiB | "
            f"{fits} | {md(changes_text(c))} | {md(c['why'] or '—')} |")


def changes_text(c: dict[str, Any]) -> str:
    return "(the current layout)" if c.get("is_current") else "; ".join(c["changes"]) or "—"


def current_text(advice: dict[str, Any]) -> str:
    cur = advice.get("current")
    if not cur:
        return ("The measured layout cannot run the target (another GPU count, or a global batch its data-parallel "
                "replicas and micro-batches do not divide): no current row; changes are from the measured layout.")
    return (f"Current layout {layout_text(cur['layout'])}: measured {cur['measured_step_ns'] / 1e6:.1f} ms, "
            f"predicted {cur['predicted_step_ns'] / 1e6:.1f} ms per step, peak memory "
            f"{cur['peak_memory_bytes'] / 2**30:.1f} GiB predicted.")


def memory_text(advice: dict[str, Any]) -> str:
    mc = advice.get("memory_calibration") or {}
    return f"Memory model: {mc.get('note') or 'uncalibrated'}."


def advice_table(advice: dict[str, Any], rows: int | None = None) -> list[str]:
    """The ranked layouts as a Markdown table (best first; `rows` of them) and the search's size."""
    ranked = advice["ranked"][:rows]
    lines = ["| # | layout | step | tokens/s/GPU | MFU | peak memory | fits | changes | why (per step, mean rank) |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [_row(str(i), c) for i, c in enumerate(ranked, 1)]
    more = len(advice["ranked"]) - len(ranked)
    return lines + ["", f"{advice['layouts_considered']} valid layouts considered, {advice['layouts_simulated']} "
                        f"simulated" + (f"; {more} more ranked in the report." if more else ".")]


def _inputs(advice: dict[str, Any]) -> list[str]:
    """The model the advice used and where it and the batch came from."""
    m, src = advice["model"], advice.get("inputs") or {}
    moe = f", {m['experts']} experts top-{m['top_k']}" if m.get("experts") else ""
    line = (f"Model used: {md(str(m['name']))} ({m['layers']} layers, hidden {m['hidden']}, {m['heads']} heads, "
            f"ffn {m['ffn'] or 4 * m['hidden']}, vocab {m['vocab']}, seq {m['seq']}{moe}, micro-batch "
            f"{m['micro_batch_size']})")
    line += f", {md(src['model'])}." if src.get("model") else "."
    parts = [md(src[k]) for k in ("batch", "global_batch") if src.get(k)]
    return [line, ""] + (["Batch: " + "; ".join(parts) + ".", ""] if parts else [])


def render_advice_markdown(advice: dict[str, Any]) -> str:
    t, cal = advice["target"], advice["calibration"]
    warn = [f"> **Warning:** {md(w)}" for w in advice.get("warnings") or []]
    lines = ["## tracekit layout advice", ""] + [x for w in warn for x in (w, "")] + [
             f"Target: {t['gpus']} GPUs ({t['hosts']} hosts × {t['gpus_per_host']}), global batch "
             f"{t['global_batch']} sequences of {advice['model']['seq']} tokens, "
             f"{t['gpu_memory_bytes'] / 2**30:.0f} GiB per GPU.", ""] + _inputs(advice) + [
             "Calibrated from the measured run: " + md("; ".join(cal["notes"])) + ".", "",
             md(memory_text(advice)), ""]
    if advice.get("current"):
        lines += [md(current_text(advice)), ""]
    return "\n".join(lines + advice_table(advice)) + "\n"


def summary_lines(section: AdviceSection | None, href: str) -> list[str]:
    """summary.md's advice: the top rows of the ranked table, or the one line saying why there is none."""
    if section is None:
        return []
    if not section.available or section.advice is None:
        return [f"**Layout advice:** not available: {md(section.reason or 'unknown')}.", ""]
    advice = section.advice  # the advice document (tracekit.advice/1, advice.schema.json)
    return ([f"### Layout advice ([report]({href}#advice))", "", md(current_text(advice)), ""]
            + advice_table(advice, MAX_SUMMARY_ROWS) + [""])


def labelled_rows(advice: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, candidate) in rank order; the current layout first when it ranks below the shown ones."""
    rows = [(f"#{i}" + (" current" if c.get("is_current") else ""), c) for i, c in enumerate(advice["ranked"], 1)]
    cur = advice.get("current")
    if cur and not any(c.get("is_current") for _, c in rows):
        rows.insert(0, ("current", dict(cur, is_current=True)))
    return rows


def advice_chart(figs: Figures, advice: dict[str, Any]) -> str:
    """Predicted step time (bars) and peak memory per rank (markers, right axis) per layout, with the
    current layout's measured step time beside its prediction."""
    rows = labelled_rows(advice)
    if not rows:
        return ""
    x = [plotly_text(f"{k} {layout_text(c['layout'])}") for k, c in rows]
    colors = ["#5c6bc0" if c["fits_in_memory"] else "#bdbdbd" for _, c in rows]
    data = [{"type": "bar", "name": "predicted step (ms)", "x": x, "marker": {"color": colors},
             "y": [c["predicted_step_ns"] / 1e6 for _, c in rows]},
            {"type": "scatter", "mode": "markers", "name": "peak memory per rank (GiB)", "x": x, "yaxis": "y2",
             "y": [c["peak_memory_bytes"] / 2**30 for _, c in rows], "marker": {"color": "#ef6c00", "size": 10}}]
    cur = advice.get("current")
    if cur:
        at = next(x[i] for i, (_, c) in enumerate(rows) if c.get("is_current"))
        data.append({"type": "scatter", "mode": "markers", "name": "measured step (ms)", "x": [at],
                     "y": [cur["measured_step_ns"] / 1e6], "marker": {"color": "#c62828", "symbol": "diamond", "size": 12}})
    cap = advice["target"]["gpu_memory_bytes"] / 2**30
    return figs.add(data, {"yaxis": {"title": "step time (ms)", "rangemode": "tozero"},
                           "yaxis2": {"title": "GiB", "overlaying": "y", "side": "right", "rangemode": "tozero",
                                      "range": [0, 1.1 * max([cap] + [c["peak_memory_bytes"] / 2**30 for _, c in rows])]},
                           "xaxis": {"tickangle": -20}}, height=380)


def _gib(b: Any) -> str:
    return f"{b / 2**30:.1f}"


def advice_html(figs: Figures, section: AdviceSection) -> str:
    """The body of report.html's "Layout advice" section (the section's availability is checked by the caller)."""
    advice = section.advice  # the advice document (tracekit.advice/1): laid out as advice.json holds it
    cal = advice["calibration"]
    rows = [dict(c, rank_text=label, changes_text=changes_text(c)) for label, c in labelled_rows(advice)]
    body = "".join(f"<p class=na><strong>Warning:</strong> {h(w)}</p>" for w in advice.get("warnings") or [])
    body += (f"<p>{h(current_text(advice))}</p><p class=note>Calibrated from the measured run: "
            f"{h('; '.join(cal['notes']))}. {h(memory_text(advice))}</p>")
    body += advice_chart(figs, advice)
    body += table(rows, [
        Col("rank_text", "#", str, False), Col("layout", "layout", layout_text, False),
        Col("predicted_step_ns", "step (ms)", lambda v: f"{v / 1e6:.1f}"),
        Col("tokens_per_s_per_gpu", "tokens/s/GPU", lambda v: f"{v:,.0f}"),
        Col("mfu", "MFU", lambda v: f"{100 * v:.0f}%"), Col("peak_memory_bytes", "peak memory (GiB)", _gib),
        Col("fits_in_memory", "fits", lambda v: "yes" if v else "no", False),
        Col("changes_text", "changes from the current layout", str, False),
        Col("why", "why (per step, mean rank)", lambda v: v or "—", False)])
    skipped = "".join(f"<li>{h(s)}</li>" for s in advice.get("skipped") or [])
    body += f"<p class=note>Left out:</p><ul>{skipped}</ul>" if skipped else ""
    return body + (f"<p class=note>{advice['layouts_considered']} valid layouts for {advice['target']['gpus']} GPUs "
                   f"considered, {advice['layouts_simulated']} simulated.</p>")
