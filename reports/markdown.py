"""`summary.md`: a short Markdown summary for a pull-request comment, linking into report.html."""

from __future__ import annotations

from typing import Any

from reports.advice import summary_lines
from reports.ops import ops_summary_lines
from reports.escape import md
from reports.format import is_num, ms, ranks_text
from reports.html_report import SECTIONS, Page, steps_text, top_fixes, verdict_text, has_data
from reports.charts import layout_text

SEVERITY_MARK = {"critical": "🔴 critical", "warning": "🟠 warning", "info": "🔵 info"}
MAX_FINDINGS = 5


def render_markdown(analysis: dict[str, Any], report_href: str = "report.html") -> str:
    """Verdict, top findings with estimated savings, what was analyzed, and links to the report's sections."""
    ctx = Page(analysis, None)
    href = report_href.replace(" ", "%20").replace(")", "%29").replace("(", "%28")
    _, verdict = verdict_text(ctx)
    lines = ["## tracekit summary", "", f"**Verdict:** {md(verdict)} ([report]({href}#verdict))", ""]
    kind_notes = (ctx.sec("trace_kind") or {}).get("notes") or []
    if kind_notes:
        lines += [f"**Trace kind:** {md('; '.join(str(n) for n in kind_notes))}", ""]

    fixes = top_fixes(ctx)
    if fixes:
        lines.append("**Fixes worth most:**")
        for i, f in enumerate(fixes, 1):
            replayed = "replayed_saving_ns" in (f.get("evidence") or {})
            saving = (f" — saves {'about' if replayed else 'up to'} **{ms(f['est_saving_ns'])}**/step"
                      + (" (replayed)" if replayed else "")) if is_num(f.get("est_saving_ns")) else ""
            rec = f": {md(f['recommendation'])}" if f.get("recommendation") else ""
            lines.append(f"{i}. {md(f.get('summary') or f.get('kind'))}{rec}{saving}")
        lines.append("")

    if ctx.findings:
        shown = ctx.findings[:MAX_FINDINGS]
        lines += [f"### Findings ({len(ctx.findings)})", "",
                  "| # | severity | kind | ranks | finding | est. saving / step |", "|---:|---|---|---|---|---:|"]
        for i, f in enumerate(shown, 1):
            sev = SEVERITY_MARK.get(str(f.get("severity")), md(f.get("severity")))
            lines.append(
                f"| [{i}]({href}#finding-{i}) | {sev} | {md(f.get('kind'))}{' (' + md(f['dim']) + ')' if f.get('dim') else ''}"
                f" | {md(ranks_text(f.get('ranks')))} | {md(f.get('summary'))} | {ms(f.get('est_saving_ns'))} |")
        if len(ctx.findings) > len(shown):
            lines.append(f"\n…and {len(ctx.findings) - len(shown)} more in the [report]({href}#findings).")
        lines.append("")
    else:
        lines += ["No findings above the analyzers' thresholds.", ""]

    inputs = ctx.a.get("inputs") if isinstance(ctx.a.get("inputs"), dict) else {}
    ranks = inputs.get("ranks") or []
    skipped = inputs.get("skipped") or []
    step_ms = [r["step_ns"] / r["steps"] for r in ctx.ranks
               if is_num(r.get("step_ns")) and is_num(r.get("steps")) and r["steps"]]
    analyzed = [f"{len(ranks)} ranks ({md(ranks_text(ranks))})", f"{md(steps_text(ctx))} steps per rank"]
    layout = ctx.sec("layout")
    if layout:
        analyzed.append(f"layout {md(layout_text(layout))}")
    if step_ms:
        lo, hi = min(step_ms), max(step_ms)
        analyzed.append(f"step time {ms(lo)}" + (f" to {ms(hi)} across ranks" if hi != lo else ""))
    analyzed.append(f"[{len(skipped)} input(s) skipped]({href}#inputs)" if skipped else "no input skipped")
    lines += ["**Analyzed:** " + "; ".join(analyzed) + ".", ""]
    warnings = [w for w in inputs.get("warnings") or [] if w]
    if warnings:
        lines += ["**Input warnings:**"] + [f"- {md(w)}" for w in warnings] + [""]
    errors = [e for e in ctx.a.get("analyzer_errors") or [] if isinstance(e, dict)]
    if errors:
        lines += ["**Analyzer errors (sections left out):**"] + [
            f"- {md(e.get('analyzer'))}: {md(e.get('error'))}" for e in errors] + [""]

    lines += ops_summary_lines(ctx.sec("ops"), href)
    lines += summary_lines(ctx.sec("advice"), href)
    links = [f"[{title}]({href}#{anchor})" for anchor, title in SECTIONS
             if anchor not in ("verdict", "other-sections") and has_data(ctx, anchor)]
    lines += ["**Report:** " + " · ".join(links), ""]
    cmd = ctx.a.get("command")
    footer = f"tracekit {md(ctx.a.get('tracekit_version') or '?')}"
    if cmd:
        footer += f" · {md(cmd)}"
    lines.append(f"<sub>{footer}</sub>")
    return "\n".join(lines) + "\n"
