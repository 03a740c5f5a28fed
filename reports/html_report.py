"""`report.html`: one self-contained page laying out analysis.json (verdict, findings, charts, tables).

Reports compute no metrics: every number comes from analysis.json (top-level `ranks`/`findings` and the
analyzers' `sections`) or the run store's `ranks` table; the page only converts units, sorts and draws.
A section that is missing or has an unexpected shape is shown as "not available" or as plain tables.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from reports.assets import CSS, PLOT_JS, SORT_JS, plotly_js_gz_b64
from reports.escape import h
from reports.format import bandwidth, duration, is_num, ms, nbytes, num, pct, ranks_text, wall_time
from reports.generic import render_generic
from reports import charts
from reports.advice import advice_html
from reports.ops import ops_html
from reports.hang import hang_html
from reports.html_parts import Col, Figures, kv_table, not_available, section, table
from tracekit.document import (SECTION_NAMES, AnalysisDocument, FindingDoc, RankBreakdown, as_document,
                               to_builtins)
from tracekit.document.model import CriticalPathSection

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}

# (anchor, title) in page order; summary.md links to these anchors.
SECTIONS: list[tuple[str, str]] = [
    ("verdict", "Verdict"),
    ("findings", "Findings"),
    ("hang", "Hang post-mortem"),
    ("analyzed", "What was analyzed"),
    ("breakdown", "Per-rank breakdown"),
    ("timeline", "Step timeline"),
    ("critical-path", "Critical path"),
    ("collectives", "Collectives: exposed time"),
    ("pipeline", "Pipeline schedule"),
    ("experts", "Expert load"),
    ("stragglers", "Stragglers"),
    ("bandwidth", "Bandwidth"),
    ("throughput", "Throughput"),
    ("ops", "Ops and kernels"),
    ("memory", "Memory"),
    ("advice", "Layout advice"),
    ("other-sections", "Other analyzer output"),
    ("inputs", "Inputs"),
    ("reproduce", "Reproduce"),
]

# Sections with a dedicated view; anything else in analysis["sections"] goes to "Other analyzer output".
_SHOWN_ELSEWHERE = {"inputs": frozenset({"runs", "rank_spans"})}
"""Parts of otherwise generic sections laid out by their own table (Inputs: runs, traced spans)."""
_KNOWN_SECTIONS = {"layout", "breakdown", "unoverlapped", "matching", "stragglers", "clocks", "pipeline",
                   "experts", "bandwidth", "throughput", "placement", "recommendations", "memory", "critical_path",
                   "advice", "ops", "hang"}


def render_html_parts(analysis: dict[str, Any], store: Any = None) -> list[str | bytes]:
    """The full report page for one analysis (store: optional RunStore for per-rank input details), in
    pieces to write one after the other (`page_parts`)."""
    ctx = Page(analysis, store)
    parts = [
        _verdict(ctx), _findings(ctx), hang_html(ctx.doc.sections.hang, ctx.figs), _analyzed(ctx), _breakdown(ctx), _timeline(ctx), _critical_path(ctx),
        _collectives(ctx),
        _pipeline(ctx), _experts(ctx), _stragglers(ctx), _bandwidth(ctx), _throughput(ctx), ops_html(ctx.doc.sections.ops), _memory(ctx),
        _advice(ctx),
        _other(ctx),
        _inputs(ctx), _reproduce(ctx),
    ]
    return page_parts("tracekit report", _header(ctx), "".join(parts), ctx.figs)


def render_html(analysis: dict[str, Any], store: Any = None) -> str:
    """The full report page for one analysis, as one string."""
    return join_parts(render_html_parts(analysis, store))




class Page:
    """What the report's parts read: `doc`, the typed analysis document (tracekit.document), and — for
    the parts still laid out from plain data — `a`, the same document as dicts and lists."""

    def __init__(self, analysis: AnalysisDocument | dict[str, Any], store: Any) -> None:
        self.doc = as_document(analysis if isinstance(analysis, (dict, AnalysisDocument)) else None)
        self.store = store
        self.figs = Figures()
        raw = analysis.get("sections") if isinstance(analysis, dict) else None
        self.extra_sections: dict[str, Any] = {k: v for k, v in raw.items() if k not in SECTION_NAMES} \
            if isinstance(raw, dict) else {}
        """Sections of a dict that this version's document does not know (shown as they are)."""


def page(title: str, header: str, body: str, figs: Figures,
         nav_items: list[tuple[str, str]] | None = None) -> str:
    """The HTML document as one string (`page_parts`)."""
    return join_parts(page_parts(title, header, body, figs, nav_items))


def page_parts(title: str, header: str, body: str, figs: Figures,
               nav_items: list[tuple[str, str]] | None = None) -> list[str | bytes]:
    """The HTML document: one style block, sortable-table JS, and plotly.js once when there are charts;
    in pieces (plotly.js as the ASCII bytes of its cache: a writer never holds a second copy of it)."""
    nav = "".join(f'<a href="#{a}">{h(t)}</a>' for a, t in (nav_items or SECTIONS) if f'id="{a}"' in body)
    head = (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width,initial-scale=1">'
        # Nothing in this file may reach the network; the policy makes any attempt fail loudly.
        "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; script-src 'unsafe-inline'; "
        "style-src 'unsafe-inline'; img-src data: blob:; font-src data:; connect-src data: blob:\">"
        f"<title>{h(title)}</title><style>{CSS}</style></head><body>"
        f"{header}<nav class=tk-nav>{nav}</nav><main>{body}</main>"
    )
    plotly: list[str | bytes] = []
    if figs.count:
        plotly = ['<script type="text/plain" id="tk-plotlyjs">', plotly_js_gz_b64(), "</script>"]
    return [head, *plotly, f"<script>{SORT_JS}</script><script>{PLOT_JS}</script></body></html>"]


def join_parts(parts: list[str | bytes]) -> str:
    """`page_parts`' pieces as one string."""
    return "".join(p if isinstance(p, str) else p.decode("ascii") for p in parts)


def write_parts(path: Any, parts: list[str | bytes]) -> None:
    """Write `page_parts`' pieces to `path` as UTF-8, piece by piece."""
    with open(path, "wb") as f:
        for p in parts:
            f.write(p if isinstance(p, bytes) else p.encode("utf-8"))


def _header(ctx: Page) -> str:
    doc = ctx.doc
    meta = [f"tracekit {doc.tracekit_version or '?'}", f"{len(doc.inputs.ranks)} rank(s) analysed",
            f"generated {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}"]
    return (f'<header class=tk-head><h1>tracekit report</h1>'
            f'<div class=meta>{" · ".join(h(m) for m in meta)}</div></header>')


def _sev(sev: Any) -> str:
    s = str(sev) if sev in SEVERITY_ORDER else "info"
    return f'<span class="sev {s}">{h(sev)}</span>'


def verdict_text(ctx: Page) -> tuple[str, str]:
    """(css class, sentence) from the ranks' `bound` labels (set by the breakdown analyzer), after the critical
    path's verdict (`critical_path.verdict`: the lanes holding the path, the ranks the others wait for); none where
    the trace_kind section says no verdict can be given (a CUDA-graph capture trace), with its reason."""
    secs = ctx.doc.sections
    if secs.trace_kind is not None and secs.trace_kind.no_verdict_reason:
        return "", f"No verdict: {secs.trace_kind.no_verdict_reason}"
    counts: dict[str, int] = {}
    for r in ctx.doc.ranks:
        counts[r.bound] = counts.get(r.bound, 0) + 1
    top_hang = next((f for f in ctx.doc.findings if f.kind == "hang"), None)
    if secs.hang is not None and secs.hang.hung and top_hang is not None:
        return "hung", f"This job hung: {top_hang.summary.removeprefix('job hung: ')}."
    if not counts:
        return "", "No per-rank breakdown is available for this run, so no verdict can be given."
    top = max(counts, key=lambda k: counts[k])
    label = {"communication": "communication-bound", "compute": "compute-bound", "idle": "idle-bound (host/input)"}
    rest = ", ".join(f"{n} {label.get(k, k)}" for k, n in sorted(counts.items()) if k != top)
    text = f"This run is {label.get(top, top)} on {counts[top]} of {len(ctx.doc.ranks)} ranks"
    text += f" ({rest})." if rest else "."
    path = secs.critical_path.verdict if secs.critical_path is not None else None
    if path is not None and path.text:  # the critical path's lanes: what holds the step, whom ranks wait for
        said = path.text
        return top, f"{said[:1].upper()}{said[1:]} By breakdown: {text[0].lower()}{text[1:]}"
    return top, text


def analysis_caveats(ctx: Page) -> list[FindingDoc]:
    """Findings about the analysis itself (inputs skipped, ranks missing, a verdict that may not hold) at warning
    or above: the findings table lists them after the run's findings, the verdict names them as caveats."""
    return [f for f in ctx.doc.findings if f.about_analysis and f.severity in ("warning", "critical")]


def top_fixes(ctx: Page) -> list[FindingDoc]:
    """The three findings worth most (findings arrive sorted by estimated saving)."""
    return [f for f in ctx.doc.findings if f.est_saving_ns > 0][:3]


def saving_text(f: FindingDoc) -> str:
    """'saves about X per step (replayed)' when the critical path replayed the finding's fix, else the bound."""
    if "replayed_saving_ns" in f.evidence:
        return f"saves about {ms(f.est_saving_ns)} per step (replayed)"
    return f"saves up to {ms(f.est_saving_ns)} per step"


def _verdict(ctx: Page) -> str:
    bound, text = verdict_text(ctx)
    fixes = top_fixes(ctx)
    body = f'<div class="verdict {h(bound)}">{h(text)}</div>'
    caveats = analysis_caveats(ctx)
    if caveats:
        pos = {id(f): i for i, f in enumerate(ctx.doc.findings, 1)}
        body += ("<h3>Caveats about this analysis</h3><ul class=caveats>" + "".join(
            f'<li>{_sev(f.severity)} <a href="#finding-{pos[id(f)]}">{h(f.kind)}</a>: {h(f.summary)}</li>'
            for f in caveats) + "</ul>")
    if fixes:
        items = []
        for f in fixes:
            rec = f.recommendation
            items.append(
                f"<li>{_sev(f.severity)} <b>{h(f.summary or f.kind)}</b>"
                + (f" — {h(rec)}" if rec else "")
                + f' <span class=saving>{h(saving_text(f))}</span>'
                + "</li>")
        body += "<h3>The fixes worth most</h3><ol class=fixes>" + "".join(items) + "</ol>"
    else:
        body += '<p class=note>No finding with an estimated saving.</p>'
    return section("verdict", "Verdict", body)


def _findings(ctx: Page) -> str:
    if not ctx.doc.findings:
        return section("findings", "Findings", '<p class=note>No findings: nothing above the analyzers\' thresholds.</p>')
    rows = []
    for i, f in enumerate(ctx.doc.findings, 1):
        rows.append(
            f'<tr id="finding-{i}"><td class=n data-v="{i}">{i}</td>'
            f'<td data-v="{SEVERITY_ORDER.get(f.severity, 3)}">{_sev(f.severity)}</td>'
            f"<td>{h(f.kind)}</td><td>{h(f.dim or '–')}</td>"
            f"<td>{h(ranks_text(f.ranks))}</td>"
            f"<td>{h(f.summary)}<details><summary>evidence</summary>{render_generic(f.evidence)}</details></td>"
            f"<td>{h(f.recommendation)}</td>"
            f'<td class=n data-v="{f.est_saving_ns}">'
            f"{h(ms(f.est_saving_ns))}</td></tr>")
    head = "".join(f"<th scope=col>{t}</th>" for t in
                   ("#", "severity", "kind", "dim", "ranks", "summary", "recommendation", "est. saving / step"))
    return section("findings", "Findings",
                   '<p class=note>Sorted by estimated saving: the step time recovered when the finding\'s fix is '
                   'applied to the measured step\'s cross-rank dependency graph and the step is replayed '
                   '(see Critical path); the closed-form bound stays in the evidence. Findings about the analysis '
                   'itself (inputs skipped, ranks missing, a verdict that may not hold) come after the run\'s.</p>'
                   f'<div class=tbl-wrap><table class="tk sortable"><thead><tr>{head}</tr></thead>'
                   f"<tbody>{''.join(rows)}</tbody></table></div>")


def steps_text(ctx: Page) -> str:
    steps = sorted({r.steps for r in ctx.doc.ranks})
    if not steps:
        return "–"
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}–{steps[-1]} (differs by rank)"


def _found_steps_text(rule: str) -> str:
    """The windows a step rule (`step_rule`) found on a trace without ProfilerStep, in words."""
    if rule == "device_span":
        return "first to last device event (no ProfilerStep annotations, no repeats found)"
    return f"iterations found without ProfilerStep ({rule})"


def _window_text(ctx: Page) -> str:
    """Which steps were analysed (breakdown step windows) and the traced span of the first rank's trace."""
    bd = ctx.doc.sections.breakdown
    steps = bd.steps if bd is not None else []
    numbers = sorted({r.step for r in steps if r.step is not None})
    rules = sorted({d.step_rule for d in (bd.rank_details if bd is not None else []) if d.step_rule})
    parts = []
    if numbers and rules in ([], ["profiler_step"]):
        parts.append(f"ProfilerStep {numbers[0]}" + (f"–{numbers[-1]}" if numbers[-1] != numbers[0] else ""))
    elif numbers:
        parts.append(f"iterations {numbers[0]}–{numbers[-1]} found without ProfilerStep ({', '.join(rules)})")
    elif steps and "device_span" in rules:
        parts.append(_found_steps_text("device_span"))
    elif steps:
        parts.append("the whole trace (no ProfilerStep annotations)")
    inp = ctx.doc.sections.inputs
    spans = [r for r in inp.rank_spans or [] if is_num(r.span_ns)] if inp is not None else []
    if spans:
        r0 = min(spans, key=lambda r: r.rank)
        parts.append(f"traced span {duration(r0.span_ns)} on rank {r0.rank} (every rank in Inputs)")
    return "; ".join(parts) or "not recorded"


def _trace_kind_text(ctx: Page) -> str:
    """The trace_kind section's notes (accelerator, graph capture/replay, inference, carry-over, step rule)."""
    tk = ctx.doc.sections.trace_kind
    notes = tk.notes if tk is not None else []
    return "; ".join(notes) if notes else "not recorded"


def _analyzed(ctx: Page) -> str:
    doc = ctx.doc
    ranks, skipped = doc.inputs.ranks, doc.inputs.skipped
    layout = doc.sections.layout
    pairs = [
        ("ranks", f"{len(ranks)} ({ranks_text(ranks)})"),
        ("steps per rank", steps_text(ctx)),
        ("time window", _window_text(ctx)),
        ("trace kind", _trace_kind_text(ctx)),
        ("parallel layout", charts.layout_text(layout) if layout is not None else "not inferred"),
        ("inputs skipped", f"{len(skipped)} (see Inputs)" if skipped else "none"),
        ("tracekit version", doc.tracekit_version or "?"),
        ("command", doc.command or "not recorded"),
    ]
    body = kv_table(pairs)
    if layout is not None:
        body += "<h3>Parallel layout (mesh)</h3>" + charts.mesh_html(layout)
        groups = layout.groups
        if groups:
            body += ("<details><summary>Process groups</summary>" + table(groups, [
                Col("dim", "dim", _txt, False), Col("pg_name", "group", _txt, False),
                Col("pg_desc", "description", _txt, False), Col("size", "size"),
                Col("ranks", "ranks", ranks_text, False), Col("inferred_from", "inferred from", _txt, False),
                Col("confidence", "confidence", _txt, False)], max_rows=2000) + "</details>")
    return section("analyzed", "What was analyzed", body)


def _ms_cell(v: Any) -> str:
    return ms(v).replace(" ms", "")


_BREAKDOWN_COLS = [
    Col("rank", "rank"), Col("steps", "steps"), Col("step_ns", "step (ms/step)", _ms_cell),
    Col("compute_ns", "compute (ms/step)", _ms_cell), Col("comm_ns", "comm (ms/step)", _ms_cell),
    Col("exposed_comm_ns", "exposed comm (ms/step)", _ms_cell), Col("other_ns", "other (ms/step)", _ms_cell),
    Col("idle_ns", "idle (ms/step)", _ms_cell), Col("overlap_ratio", "overlap", pct),
    Col("bound", "bound", str, numeric=False),
    Col("sync_wait_ns", "of exposed comm: waiting for peers (ms/step)", _ms_cell),
]


def _per_step_rows(ranks: list[RankBreakdown]) -> list[dict[str, Any]]:
    """Per-rank totals shown per step (total / steps): a unit change for display."""
    out = []
    for r in ranks:
        steps = r.steps or 1
        row = to_builtins(r)
        for k in ("step_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "sync_wait_ns", "other_ns", "idle_ns"):
            if is_num(row.get(k)):  # sync_wait_ns: unset in analyses from before it
                row[k] = row[k] / steps
        out.append(row)
    return out


def _breakdown(ctx: Page) -> str:
    if not ctx.doc.ranks:
        return section("breakdown", "Per-rank breakdown", not_available("Per-rank breakdown"))
    rows = _per_step_rows(ctx.doc.ranks)
    fig = charts.breakdown_bars(ctx.figs, rows)
    note = ('<p class=note>Exclusive by priority, so the bars sum to the step: compute ▸ communication that '
            'overlaps nothing ▸ other device work ▸ idle. "comm" is all communication, overlapped or not; '
            'exposed comm includes waiting for late peers (sync wait), the rest is transfer. On GPU traces a '
            'step is the device work its ProfilerStep launched. Definitions: docs/metrics.md in the tracekit '
            'repository.</p>')
    return section("breakdown", "Per-rank breakdown", note + fig + table(rows, _BREAKDOWN_COLS, table_id="ranks-table"))


def _timeline(ctx: Page) -> str:
    bd = ctx.doc.sections.breakdown
    if bd is None or not has_data(ctx, "timeline"):
        return section("timeline", "Step timeline", not_available("Step timeline"))
    return section("timeline", "Step timeline", charts.timeline(ctx.figs, to_builtins(bd.timeline)))


def has_data(ctx: Page, anchor: str) -> bool:
    """Whether the page section `anchor` has anything to show for this run (summary.md links only those)."""
    s = ctx.doc.sections
    if anchor == "breakdown":
        return bool(ctx.doc.ranks)
    if anchor == "timeline":
        return s.breakdown is not None and bool(s.breakdown.timeline.intervals)
    if anchor == "collectives":
        un = s.unoverlapped
        return un is not None and bool(un.by_dim_op or un.by_rank_dim_op or un.top_offenders)
    if anchor == "pipeline":
        pp = s.pipeline
        return pp is not None and (pp.source is not None or pp.diagram is not None or bool(pp.stages))
    if anchor == "experts":
        ex = s.experts
        return ex is not None and bool(ex.heatmap or ex.layers or ex.ranks)
    if anchor == "stragglers":
        return s.stragglers is not None and bool(s.stragglers.ranks)
    if anchor == "bandwidth":
        return s.bandwidth is not None and bool(s.bandwidth.rows)
    if anchor == "throughput":
        return s.throughput is not None or s.placement is not None
    if anchor in ("memory", "advice", "ops"):
        sec = getattr(s, anchor)
        return sec is not None and sec.available
    if anchor == "critical-path":
        return s.critical_path is not None and bool(s.critical_path.steps)
    if anchor == "hang":
        return s.hang is not None
    return True



_CATEGORY_TEXT = {"compute": "compute", "exposed_transfer": "exposed transfer (after the last member arrived)",
                  "waiting_for_peer": "waiting for a peer", "host": "host work (launches, communication calls)",
                  "host_data_stall": "host or data stall (host thread idle, nothing explaining the wait)",
                  "launch_or_idle": "device idle or launch latency", "other_device": "other device work",
                  "step_start_offset": "path began on a rank whose step started at another time",
                  "after_path": "after the path's last op, to the step's end", "unattributed": "not attributed"}


def _critical_path(ctx: Page) -> str:
    sec = ctx.doc.sections.critical_path
    title = "Critical path"
    if sec is None or not has_data(ctx, "critical-path"):
        skipped = sec.skipped if sec is not None else None
        return section("critical-path", title, not_available(title, skipped or "no critical path for this run"))
    shown = next((s for s in sec.steps if s.timeline), sec.steps[-1])
    comp = shown.composition
    step_ns = comp.step_ns or shown.measured_ns
    err = shown.replay_error
    which = f"Step {h(shown.step)}" if shown.step is not None else "The analysed window"
    body = (f"<p>{which}: the chain of ops, waits and transfers across ranks that sets the "
            f"step time ({h(ms(shown.measured_ns))} on rank {h(shown.slowest_rank)}); replaying the "
            f"unchanged dependency graph gives {h(ms(shown.replayed_ns))}"
            + (f" ({h(pct(err, 2))} off)" if is_num(err) else "") + ". Red: the critical path.</p>")
    if sec.skipped:  # steps replayed, no path to follow in any
        body += f"<p class=note>{h(sec.skipped)}.</p>"
    if sec.step_rule:  # windows a step rule found on a trace without ProfilerStep
        body += f"<p class=note>Steps: {h(_found_steps_text(sec.step_rule))}.</p>"
    if shown.timeline:
        body += charts.timeline(ctx.figs, to_builtins(shown.timeline))
    share = lambda v: pct(v / step_ns, 0) if is_num(v) and is_num(step_ns) and step_ns else "–"  # noqa: E731
    by_cat = comp.by_category
    rows = [{"part": _CATEGORY_TEXT.get(k, k), "time": ms(v), "share of the step": share(v)}
            for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1] if is_num(kv[1]) else 0) if v]
    body += "<h3>Where the path's time goes</h3>" + table(rows, [Col(k, k, str, False) for k in ("part", "time", "share of the step")])
    top = sorted(comp.by_rank.items(), key=lambda kv: -kv[1] if is_num(kv[1]) else 0)[:8]
    if top:
        body += ("<p>By rank: " + h(", ".join(f"rank {r} {ms(v)} ({share(v)})" for r, v in top)) + "</p>")
    by_dim = comp.by_dim
    if by_dim:
        body += ("<p>Transfers on the path by dim: " + h(", ".join(f"{d} {ms(v)}" for d, v in sorted(by_dim.items()))) + "</p>")
    body += _whatif_table(sec)
    return section("critical-path", title, body)


def _whatif_table(sec: CriticalPathSection) -> str:
    rows = [{"finding": f"#{w.finding + 1} {w.kind}", "fix replayed": w.fix,
             "step with the fix": ms(w.step_ns), "saving": ms(w.saving_ns)}
            for w in sec.whatif]
    if not rows:
        return ""
    together = sec.all_fixes
    if together is not None:
        rows.append({"finding": "all of them together", "fix replayed": "; ".join(together.fixes),
                     "step with the fix": ms(together.step_ns), "saving": ms(together.saving_ns)})
    cols = [Col(k, k, str, False) for k in ("finding", "fix replayed", "step with the fix", "saving")]
    return (f"<h3>What if: each finding's fix replayed alone, then all together</h3>"
            f"<p class=note>Measured step (mean over the analyzed steps): {h(ms(sec.measured_step_ns))}. "
            "Savings of different fixes overlap; the last line counts each millisecond once.</p>" + table(rows, cols))


def _ms_cell_opt(v: Any) -> str:
    return ms(v).replace(" ms", "")


def _all_numbers(sec: Any, skip: frozenset[str] = frozenset()) -> str:
    """Everything else the analyzer reported (a section of the document), folded away under the curated view."""
    body = render_generic(to_builtins(sec), skip=skip)
    return f"<details class=all><summary>All numbers of this section</summary>{body}</details>" if body else ""


def _collectives(ctx: Page) -> str:
    title = "Collectives: exposed time"
    sec = ctx.doc.sections.unoverlapped
    if sec is None or not has_data(ctx, "collectives"):
        return section("collectives", title, not_available("Collective exposure", "no collectives in this run"))
    body = ('<p class=note>Exposed = the part of a collective covered by no compute on that rank; "transfer '
            'exposed" leaves out time spent waiting for a late peer (that belongs to the straggler).</p>')
    body += charts.collective_heatmap(ctx.figs, sec)
    by_dim_op = sec.by_dim_op
    if by_dim_op:
        body += "<h3>By dimension and op</h3>" + table(by_dim_op, [
            Col("dim", "dim", _txt, False), Col("op", "op", _txt, False), Col("instances", "instances"),
            Col("comm_ns", "comm (ms)", _ms_cell_opt), Col("exposed_ns", "exposed (ms)", _ms_cell_opt),
            Col("transfer_exposed_ns", "transfer exposed (ms)", _ms_cell_opt), Col("overlap_ratio", "overlap", pct),
            Col("transfer_exposed_ns_per_step", "exposed transfer / step, worst rank (ms)", _ms_cell_opt),
            Col("share_of_step", "share of step", pct), Col("worst_rank", "worst rank")])
    top = sec.top_offenders
    if top:
        body += "<h3>Largest exposed instances</h3>" + table(top, [
            Col("rank", "rank"), Col("dim", "dim", _txt, False), Col("pg_name", "group", _txt, False),
            Col("op", "op", _txt, False), Col("bytes", "bytes", nbytes), Col("caller", "caller", _txt, False),
            Col("step", "step"), Col("dur_ns", "duration (ms)", _ms_cell_opt),
            Col("exposed_ns", "exposed (ms)", _ms_cell_opt), Col("share_of_step", "share of step", pct)])
    return section("collectives", title, body + _all_numbers(
        sec, frozenset({"by_dim_op", "by_rank_dim_op", "top_offenders"})))


def _pipeline(ctx: Page) -> str:
    sec = ctx.doc.sections.pipeline
    if sec is None or not has_data(ctx, "pipeline"):
        return section("pipeline", "Pipeline schedule", not_available("Pipeline schedule", "no pipeline stages in this run"))
    pairs = [("schedule", f"{sec.schedule or 'unknown'}"
                          + (f" (detected {sec.schedule_detected})" if sec.schedule_detected else "")),
             ("stages × chunks per rank", f"{num(sec.num_stages)} × {num(sec.chunks_per_rank)}"),
             ("micro-batches", num(sec.num_microbatches)),
             ("bubble: measured / theoretical", f"{pct(sec.measured_bubble)} / {pct(sec.theoretical_bubble)}"),
             ("imbalance (slowest / mean stage compute)", num(sec.imbalance)),
             ("source", sec.source or "–")]
    body = kv_table(pairs) + charts.pipeline_diagram(ctx.figs, sec)
    stages = sec.stages
    if stages:
        body += "<h3>Stages</h3>" + table(stages, [
            Col("stage", "stage"), Col("ranks", "ranks", ranks_text, False), Col("compute_ns", "compute (ms)", _ms_cell_opt),
            Col("fwd_ns", "fwd (ms)", _ms_cell_opt), Col("bwd_ns", "bwd (ms)", _ms_cell_opt), Col("layers", "layers")])
    return section("pipeline", "Pipeline schedule", body + _all_numbers(sec, frozenset({"diagram", "stages"})))


def _memory(ctx: Page) -> str:
    sec = ctx.doc.sections.memory
    if sec is None or not sec.available:
        reason = (sec.reason if sec is not None else None) or "no memory events in this run"
        return section("memory", "Memory", not_available("Memory", reason))
    mib = lambda b: "–" if not is_num(b) else f"{b / 2**20:.2f}"  # noqa: E731
    body = (f"<p class=note>Counter: {h(sec.counter or '–')} (absolute: the CUDA caching allocator; window: "
            "the CPU profiler counts only what it saw allocated).</p>")
    body += charts.memory_timeline(ctx.figs, sec) + charts.memory_split_bars(ctx.figs, sec)
    ranks = [to_builtins(r) for r in sec.ranks]  # at_peak: a dict the column lays out
    if ranks:
        body += "<h3>Peaks</h3>" + table(ranks, [
            Col("rank", "rank"), Col("device", "device"), Col("peak_allocated", "peak (MiB)", mib),
            Col("peak_step", "step"), Col("at_peak", "at the peak", lambda w: (", ".join(
                f"{k} {v}" for k, v in (w or {}).items() if v is not None)), False),
            Col("activation_held_bytes", "held activations (MiB)", mib),
            Col("in_flight_measured", "in flight (measured)")])
    stages = sec.stages
    if stages:
        body += "<h3>Pipeline stages</h3>" + table(stages, [
            Col("stage", "stage"), Col("ranks", "ranks", ranks_text, False),
            Col("activation_held_bytes", "held activations (MiB)", mib),
            Col("per_microbatch_bytes", "per micro-batch (MiB)", mib),
            Col("in_flight_measured", "in flight (measured)"), Col("in_flight_schedule", "in flight (schedule)"),
            Col("peak_allocated", "peak (MiB)", mib)])
    return section("memory", "Memory", body + _all_numbers(sec, frozenset({"ranks", "stages"})))


def _advice(ctx: Page) -> str:
    sec = ctx.doc.sections.advice
    if sec is None or not sec.available or not isinstance(sec.advice, dict):
        reason = (sec.reason if sec is not None else None) or "the advisor did not run"
        return section("advice", "Layout advice", not_available("Layout advice", reason))
    return section("advice", "Layout advice", advice_html(ctx.figs, sec))


def _experts(ctx: Page) -> str:
    sec = ctx.doc.sections.experts
    if sec is None or not has_data(ctx, "experts"):
        return section("experts", "Expert load", not_available("Expert load", "no expert routing recorded in this run"))
    body = f"<p class=note>Source: {h(sec.source or '–')}, granularity {h(sec.granularity or '–')}.</p>"
    body += charts.expert_heatmap(ctx.figs, sec)
    layers = sec.layers
    if layers:
        body += "<h3>Layers</h3>" + table(layers, [
            Col("layer", "layer"), Col("num_experts", "experts"), Col("skew", "skew (max/mean)"),
            Col("skew_max", "worst step skew"), Col("hot_expert", "hot expert"),
            Col("hot_owner_ranks", "owner ranks", ranks_text, False), Col("tokens_total", "tokens"),
            Col("dropped_total", "dropped"), Col("dropped_fraction", "dropped", pct)])
    ranks = sec.ranks
    if ranks:
        body += "<h3>All-to-all per rank (per step)</h3>" + table(ranks, [
            Col("rank", "rank"), Col("a2a_ns", "all-to-all (ms)", _ms_cell_opt), Col("a2a_calls", "calls"),
            Col("a2a_bytes", "bytes", nbytes), Col("a2a_recv_elems", "received elements"),
            Col("tokens_received", "tokens received"), Col("expert_ns", "expert compute (ms)", _ms_cell_opt)])
    return section("experts", "Expert load", body + _all_numbers(sec, frozenset({"heatmap", "layers", "ranks"})))


def _stragglers(ctx: Page) -> str:
    sec = ctx.doc.sections.stragglers
    if sec is None or not has_data(ctx, "stragglers"):
        return section("stragglers", "Stragglers", not_available("Straggler view", "no collectives matched across ranks"))
    body = ("<p class=note>Per rank: how long its groups waited for it beyond the second-to-last member, per step "
            "(arrival skew attributed to the late rank).</p>" + charts.straggler_bars(ctx.figs, sec))
    flagged = sec.stragglers
    if flagged:
        body += "<h3>Stragglers and likely cause</h3>" + table(flagged, [
            Col("rank", "rank"), Col("cause", "cause", _txt, False),
            Col("cause_evidence", "evidence", lambda v: "; ".join(
                f"{k}={ms(x) if k.endswith('_ns') else x}" for k, x in (v or {}).items()) or "–", False)])
    body += "<h3>Per rank</h3>" + table(sec.ranks, [
        Col("rank", "rank"), Col("instances", "instances"), Col("last_count", "arrived last"),
        Col("last_share", "last share", pct), Col("delay_ns_per_step", "delay caused (ms/step)", _ms_cell_opt),
        Col("delay_fraction", "of step", pct), Col("dominance", "dominance")], table_id="stragglers-table")
    clocks = ctx.doc.sections.clocks
    if clocks is not None:
        body += "<h3>Clock alignment</h3>" + kv_table([("method", clocks.method or "–"),
                                                      ("reference rank", _txt(clocks.reference_rank))])
        if clocks.ranks:
            body += table(clocks.ranks, [
                Col("rank", "rank"), Col("offset_ns", "offset (ms)", _ms_cell_opt), Col("mad_ns", "MAD (ms)", _ms_cell_opt),
                Col("instances", "instances"), Col("applied", "applied", _txt, False), Col("status", "status", _txt, False)])
    return section("stragglers", "Stragglers", body + _all_numbers(sec, frozenset({"ranks", "stragglers"})))


def _bandwidth(ctx: Page) -> str:
    sec = ctx.doc.sections.bandwidth
    rows = sec.rows if sec is not None else []
    if sec is None or not rows:
        return section("bandwidth", "Bandwidth", not_available("Bandwidth table", "no collectives with sizes in this run"))
    body = (f"<p class=note>NCCL-tests convention; time basis: {h(sec.time_basis or '–')}. "
            "GB/s = 10⁹ bytes/s; medians over the instances of each size bucket.</p>")
    body += table(rows, [
        Col("dim", "dim", _txt, False), Col("pg_name", "group", _txt, False), Col("op", "op", _txt, False),
        Col("group_size", "size"), Col("bucket_bytes", "bucket", nbytes), Col("count", "count"),
        Col("bytes_p50", "bytes p50", nbytes), Col("time_ns_p50", "time p50 (ms)", lambda v: ms(v, 3).replace(" ms", "")),
        Col("algbw_gbps_p50", "algbw p50", bandwidth), Col("busbw_gbps_p50", "busbw p50", bandwidth),
        Col("busbw_gbps_max", "busbw max", bandwidth), Col("reference_gbps", "reference", bandwidth),
        Col("reference", "reference basis", _txt, False), Col("low", "low", lambda v: "LOW" if v else "", False)],
        table_id="bandwidth-table")
    return section("bandwidth", "Bandwidth", body + _all_numbers(sec, frozenset({"rows"})))


def _throughput(ctx: Page) -> str:
    parts = []
    tp = ctx.doc.sections.throughput
    if tp is not None:
        parts.append(kv_table([
            ("tokens per step", f"{num(tp.tokens_per_step)} (from {tp.tokens_source or 'nowhere'})"),
            ("step time (slowest rank, mean)", ms(tp.step_ns_mean)),
            ("tokens/s (job)", num(tp.tokens_per_s)),
            ("tokens/s per device", num(tp.tokens_per_s_per_device)),
            ("data-parallel degree", num(tp.dp_degree)), ("world size", num(tp.world_size))]))
        if tp.ranks:
            parts.append(table(tp.ranks, [
                Col("rank", "rank"), Col("device", "device", _txt, False), Col("steps", "steps"),
                Col("step_ns_mean", "step (ms)", _ms_cell_opt), Col("tokens_per_s", "tokens/s"),
                Col("flops_per_step", "FLOP/step"), Col("achieved_tflops", "achieved TFLOP/s"),
                Col("peak_tflops", "peak TFLOP/s"), Col("mfu", "MFU", pct)]))
    pl = ctx.doc.sections.placement
    if pl is not None:
        groups = pl.groups
        parts.append(f"<h3>Placement</h3><p class=note>{h(pl.num_hosts or 0)} host(s), from "
                     f"{h(pl.host_source or 'nowhere')}.</p>")
        if groups:
            parts.append(table(groups, [
                Col("dim", "dim", _txt, False), Col("pg_name", "group", _txt, False),
                Col("ranks", "ranks", ranks_text, False), Col("hosts", "hosts", lambda v: ", ".join(map(str, v or [])), False),
                Col("crosses_hosts", "crosses hosts", _txt, False), Col("heavy", "heavy traffic", _txt, False),
                Col("exposed_ns_per_step", "exposed (ms/step)", _ms_cell_opt)]))
    if not parts:
        return section("throughput", "Throughput", not_available("Throughput and placement"))
    return section("throughput", "Throughput and placement", "".join(parts))


def _other(ctx: Page) -> str:
    parts = []
    m = ctx.doc.sections.matching
    if m is not None:
        flat = [{**to_builtins(r), **{f"skew_{k}_ns": v for k, v in to_builtins(r.skew_ns).items()},
                 **{f"transfer_{k}_ns": v for k, v in to_builtins(r.transfer_ns).items()}} for r in m.by_group]
        parts.append("<h3>Collective matching</h3>" + kv_table([
            ("source", m.source.method),
            ("instances / matched / complete", f"{num(m.instances)} / {num(m.matched)} / {num(m.complete)}"),
            ("op mismatches", num(m.op_mismatches)), ("p2p skipped", num(m.p2p_skipped)),
            ("without a process group: paired by their times / not matched",
             f"{num(m.no_group_paired)} / {num(m.no_group)}"),
            ("GPU calls without device time (not matched)", num(m.no_device_time))]))
        if flat:
            parts.append(table(flat, [
                Col("dim", "dim", _txt, False), Col("pg_name", "group", _txt, False), Col("op", "op", _txt, False),
                Col("instances", "instances"), Col("skew_p50_ns", "skew p50 (ms)", _ms_cell_opt),
                Col("skew_max_ns", "skew max (ms)", _ms_cell_opt), Col("transfer_p50_ns", "transfer p50 (ms)", _ms_cell_opt),
                Col("transfer_max_ns", "transfer max (ms)", _ms_cell_opt)]))
        parts.append(_all_numbers(m, frozenset({"by_group"})))
    for name in SECTION_NAMES:
        sec = getattr(ctx.doc.sections, name)
        if name not in _KNOWN_SECTIONS and sec is not None:
            parts.append(f"<h3>{h(name)}</h3>" + render_generic(to_builtins(sec),
                                                                skip=_SHOWN_ELSEWHERE.get(name, frozenset())))
    for name, sec in ctx.extra_sections.items():  # sections this version does not know (a newer analysis)
        if isinstance(sec, dict) and sec:
            parts.append(f"<h3>{h(name)}</h3>" + render_generic(sec))
    if not parts:
        return ""
    return section("other-sections", "Other analyzer output", "".join(parts))


def _store_ranks(ctx: Page) -> list[dict[str, Any]]:
    if ctx.store is None:
        return []
    try:
        tbl = ctx.store.table("ranks")
    except Exception as exc:  # a damaged store must not stop the report; say so instead
        return [{"rank": None, "parse_warnings": [f"could not read the store's ranks table: {exc}"]}]
    return tbl.to_pylist()


def _inputs(ctx: Page) -> str:
    inputs = ctx.doc.inputs
    skipped = inputs.skipped
    body = "<h3>Skipped inputs</h3>"
    if skipped:
        body += table(skipped, [Col("file", "file", str, numeric=False), Col("reason", "reason", str, numeric=False)],
                      table_id="skipped-table")
    else:
        body += "<p class=note>No input was skipped.</p>"
    warnings = [w for w in inputs.warnings or [] if w]
    if warnings:  # missing ranks, mixed runs, time units... (tracekit/analyze/inputs.py)
        body += "<h3>Input warnings</h3><ul id=input-warnings>" + "".join(f"<li>{h(w)}</li>" for w in warnings) + "</ul>"
    errors = ctx.doc.analyzer_errors
    if errors:  # analyzers that failed on this input; their sections are missing from the page
        body += "<h3>Analyzer errors</h3><ul id=analyzer-errors>" + "".join(
            f"<li>{h(e.analyzer)}: {h(e.error)}</li>" for e in errors) + "</ul>"
    inp = ctx.doc.sections.inputs
    spans = {r.rank: r.span_ns for r in inp.rank_spans or []} if inp is not None else {}
    rows = [{**r, "span_ns": spans.get(r.get("rank"))} for r in _store_ranks(ctx)]
    runs = inp.runs if inp is not None else []
    if len(runs) > 1 or any(is_num(r.start_ns) for r in runs):
        body += "<h3>Runs (ranks whose traces overlap in time)</h3>" + table(runs, [
            Col("ranks", "ranks", ranks_text, False), Col("start_ns", "started (wall clock)", wall_time, False),
            Col("span_ns", "span", duration)], table_id="runs-table")
    if rows:
        cols = [Col("rank", "rank"), Col("hostname", "host", _txt, False), Col("backend", "backend", _txt, False),
                Col("trace_kind", "kind", _txt, False), Col("source_file", "file", _txt, False),
                Col("num_events", "events"), Col("span_ns", "traced span", duration),
                Col("clock_offset_ns", "clock offset (ms)", ms),
                Col("parse_warnings", "parse warnings", lambda v: "; ".join(map(str, v or [])) or "–", False)]
        body += "<h3>Analysed traces</h3>" + table(rows, cols, table_id="inputs-table")
    return section("inputs", "Inputs", body)


def _txt(v: Any) -> str:
    return "–" if v is None else str(v)


def _reproduce(ctx: Page) -> str:
    cmd = ctx.doc.command
    body = (f"<p>tracekit {h(ctx.doc.tracekit_version or '?')}, analysis schema "
            f"<code>{h(ctx.doc.schema or '?')}</code>.</p>")
    body += f"<pre class=cmd>{h(cmd)}</pre>" if cmd else "<p class=note>The command was not recorded.</p>"
    if ctx.store is not None and isinstance(getattr(ctx.store, "manifest", None), dict):
        run_cmd = ctx.store.manifest.get("command")
        if run_cmd:
            text = " ".join(map(str, run_cmd)) if isinstance(run_cmd, list) else str(run_cmd)
            body += f"<p>Recorded training command:</p><pre class=cmd>{h(text)}</pre>"
    return section("reproduce", "Reproduce", body)


__all__ = ["render_html", "render_html_parts", "write_parts", "SECTIONS"]
