"""`summary.md`: a short Markdown summary for a pull-request comment, linking into report.html."""

from __future__ import annotations

from typing import Any

from reports.advice import summary_lines
from reports.ops import ops_summary_lines
from reports.escape import md
from reports.format import ms, ranks_text
from reports.html_report import SECTIONS, Page, analysis_caveats, steps_text, top_fixes, verdict_text, has_data
from reports.charts import layout_text
from tracekit.document import AnalysisDocument

SEVERITY_MARK = {"critical": "🔴 critical", "warning": "🟠 warning", "info": "🔵 info"}
MAX_FINDINGS = 5


def render_markdown(analysis: AnalysisDocument | dict[str, Any], report_href: str = "report.html") -> str:
    """Verdict, top findings with estimated savings, what was analyzed, and links to the report's sections."""
    ctx = Page(analysis, None)
    doc = ctx.doc
    href = report_href.replace(" ", "%20").replace(")", "%29").replace("(", "%28")
    _, verdict = verdict_text(ctx)
    lines = ["## tracekit summary", "", f"**Verdict:** {md(verdict)} ([report]({href}#verdict))", ""]
    caveats = analysis_caveats(ctx)
    if caveats:
        lines += ["**Caveats about this analysis:**"] + [f"- {md(f.kind)}: {md(f.summary)}" for f in caveats] + [""]
    kind_notes = doc.sections.trace_kind.notes if doc.sections.trace_kind is not None else []
    if kind_notes:
        lines += [f"**Trace kind:** {md('; '.join(kind_notes))}", ""]

    fixes = top_fixes(ctx)
    if fixes:
        lines.append("**Fixes worth most:**")
        for i, f in enumerate(fixes, 1):
            replayed = "replayed_saving_ns" in f.evidence
            saving = (f" — saves {'about' if replayed else 'up to'} **{ms(f.est_saving_ns)}**/step"
                      + (" (replayed)" if replayed else ""))
            rec = f": {md(f.recommendation)}" if f.recommendation else ""
            lines.append(f"{i}. {md(f.summary or f.kind)}{rec}{saving}")
        lines.append("")

    if doc.findings:
        shown = doc.findings[:MAX_FINDINGS]
        lines += [f"### Findings ({len(doc.findings)})", "",
                  "| # | severity | kind | ranks | finding | est. saving / step |", "|---:|---|---|---|---|---:|"]
        for i, f in enumerate(shown, 1):
            sev = SEVERITY_MARK.get(f.severity, md(f.severity))
            lines.append(
                f"| [{i}]({href}#finding-{i}) | {sev} | {md(f.kind)}{' (' + md(f.dim) + ')' if f.dim else ''}"
                f" | {md(ranks_text(f.ranks))} | {md(f.summary)} | {ms(f.est_saving_ns)} |")
        if len(doc.findings) > len(shown):
            lines.append(f"\n…and {len(doc.findings) - len(shown)} more in the [report]({href}#findings).")
        lines.append("")
    else:
        lines += ["No findings above the analyzers' thresholds.", ""]

    ranks, skipped = doc.inputs.ranks, doc.inputs.skipped
    step_ms = [r.step_ns / r.steps for r in doc.ranks if r.steps]
    analyzed = [f"{len(ranks)} ranks ({md(ranks_text(ranks))})", f"{md(steps_text(ctx))} steps per rank"]
    layout = doc.sections.layout
    if layout is not None:
        analyzed.append(f"layout {md(layout_text(layout))}")
    if step_ms:
        lo, hi = min(step_ms), max(step_ms)
        analyzed.append(f"step time {ms(lo)}" + (f" to {ms(hi)} across ranks" if hi != lo else ""))
    analyzed.append(f"[{len(skipped)} input(s) skipped]({href}#inputs)" if skipped else "no input skipped")
    lines += ["**Analyzed:** " + "; ".join(analyzed) + ".", ""]
    warnings = [w for w in doc.inputs.warnings or [] if w]
    if warnings:
        lines += ["**Input warnings:**"] + [f"- {md(w)}" for w in warnings] + [""]
    if doc.analyzer_errors:
        lines += ["**Analyzer errors (sections left out):**"] + [
            f"- {md(e.analyzer)}: {md(e.error)}" for e in doc.analyzer_errors] + [""]

    lines += ops_summary_lines(doc.sections.ops, href)
    lines += summary_lines(doc.sections.advice, href)
    links = [f"[{title}]({href}#{anchor})" for anchor, title in SECTIONS
             if anchor not in ("verdict", "other-sections") and has_data(ctx, anchor)]
    lines += ["**Report:** " + " · ".join(links), ""]
    footer = f"tracekit {md(doc.tracekit_version or '?')}"
    if doc.command:
        footer += f" · {md(doc.command)}"
    lines.append(f"<sub>{footer}</sub>")
    return "\n".join(lines) + "\n"
