"""Before/after reports from a `tracekit.diff/1` document (tracekit.compare.diff computes it; this only lays it out)."""

from __future__ import annotations

from typing import Any

from reports.escape import h, md
from reports.format import is_num, ms, ranks_text, signed_ms
from reports.html_parts import Col, Figures, kv_table, not_available, section, table
from reports.html_report import page

DIFF_SECTIONS = [("verdict", "Summary"), ("attribution", "Why it changed"), ("breakdown", "Breakdown"), ("findings", "Findings"),
                 ("collectives", "Collectives"), ("ranks", "Per-rank step time")]
_STATUS_MARK = {"appeared": "🆕 appeared", "resolved": "✅ resolved", "changed": "🔁 changed", "unchanged": "= unchanged",
                "absorbed": "↪ absorbed by a bigger finding (not resolved)"}


def _delta_text(d: dict[str, Any] | None) -> str:
    if not isinstance(d, dict) or not is_num(d.get("delta_ns")):
        return "–"
    ratio = f" ({d['delta_ratio'] * 100:+.1f}%)" if is_num(d.get("delta_ratio")) else ""
    return signed_ms(d["delta_ns"]) + ratio


def _headline(diff: dict[str, Any]) -> str:
    step = diff.get("step") or {}
    counts = diff.get("finding_counts") or {}
    parts = []
    if is_num(step.get("base_ns")) and is_num(step.get("new_ns")):
        parts.append(f"Step time {ms(step['base_ns'])} → {ms(step['new_ns'])} ({_delta_text(step)})")
    absorbed = f"{counts['absorbed']} absorbed by bigger ones, " if counts.get("absorbed") else ""
    parts.append(f"findings: {counts.get('appeared', 0)} appeared, {counts.get('resolved', 0)} resolved, "
                 f"{absorbed}{counts.get('changed', 0)} changed, {counts.get('unchanged', 0)} unchanged")
    replay = diff.get("replay") if isinstance(diff.get("replay"), dict) else {}
    rb, rn = replay.get("base") or {}, replay.get("new") or {}
    if is_num(rb.get("all_fixes_saving_ns")) or is_num(rn.get("all_fixes_saving_ns")):
        parts.append(f"all fixes together would save {ms(rb.get('all_fixes_saving_ns'))} → "
                     f"{ms(rn.get('all_fixes_saving_ns'))} per step (replayed)")
    return "; ".join(parts) + "."


def _finding_rows(diff: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for f in diff.get("findings") or []:
        if not isinstance(f, dict):
            continue
        rows.append({**f, "ranks": ranks_text(f.get("new_ranks") if f.get("new_ranks") is not None else f.get("base_ranks")),
                     "severity": f"{f.get('base_severity') or '–'} → {f.get('new_severity') or '–'}",
                     "scope": ", ".join(map(str, f.get("scope") or [])) or "–"})
    return rows


def render_diff_html(diff: dict[str, Any]) -> str:
    """One self-contained before/after page."""
    figs = Figures()
    base, new = diff.get("base") or {}, diff.get("new") or {}
    parts = [section("verdict", "Summary", f'<div class=verdict>{h(_headline(diff))}</div>' + kv_table([
        ("base", f"{base.get('label')} — {base.get('ranks')} ranks, {base.get('findings')} findings"),
        ("new", f"{new.get('label')} — {new.get('ranks')} ranks, {new.get('findings')} findings"),
        ("mean step (per rank)", f"{ms((diff.get('step') or {}).get('base_ns'))} → "
                                 f"{ms((diff.get('step') or {}).get('new_ns'))} ({_delta_text(diff.get('step'))})"),
        ("slowest rank's step", f"{ms((diff.get('max_step') or {}).get('base_ns'))} → "
                                f"{ms((diff.get('max_step') or {}).get('new_ns'))} ({_delta_text(diff.get('max_step'))})"),
    ]))]

    parts.append(_attribution_html(diff.get("attribution"), figs))
    bd = [r for r in diff.get("breakdown") or [] if isinstance(r, dict)]
    if bd:
        data = [{"type": "bar", "name": h(label), "x": [h(r.get("part")) for r in bd],
                 "y": [(r.get(key) or 0) / 1e6 for r in bd], "marker": {"color": color},
                 "hovertemplate": "%{x}: %{y:.2f} ms/step<extra>" + h(label) + "</extra>"}
                for key, label, color in (("base_ns", f"base: {base.get('label')}", "#90a4ae"),
                                          ("new_ns", f"new: {new.get('label')}", "#1565c0"))]
        fig = figs.add(data, {"barmode": "group", "yaxis": {"title": {"text": "ms per step (mean rank)"}}}, height=320)
        cols = [Col("part", "part", str, False), Col("base_ns", "base (ms/step)", _ms), Col("new_ns", "new (ms/step)", _ms),
                Col("delta_ns", "delta (ms/step)", _signed), Col("delta_ratio", "delta", _signed_pct)]
        parts.append(section("breakdown", "Breakdown (mean rank, per step)", fig + table(bd, cols)))
    else:
        parts.append(section("breakdown", "Breakdown", not_available("Breakdown")))

    rows = _finding_rows(diff)
    if rows:
        cols = [Col("status", "status", str, False), Col("kind", "kind", str, False), Col("dim", "dim", _t, False),
                Col("scope", "scope", str, False), Col("ranks", "ranks", str, False),
                Col("severity", "severity", str, False), Col("summary", "summary", _t, False),
                Col("base_saving_ns", "base saving (ms)", _ms), Col("new_saving_ns", "new saving (ms)", _ms),
                Col("new_closed_form_saving_ns", "new: the text's estimate (ms)", _ms)]
        parts.append(section("findings", "Findings", table(rows, cols, table_id="diff-findings")))
    else:
        parts.append(section("findings", "Findings", "<p class=note>Neither run has findings.</p>"))

    colls = [r for r in diff.get("collectives") or [] if isinstance(r, dict)]
    if colls:
        cols = [Col("group", "group", str, False), Col("op", "op", str, False),
                Col("base_count", "base count"), Col("new_count", "new count"),
                Col("base_exposed_ns", "base exposed (ms)", _ms), Col("new_exposed_ns", "new exposed (ms)", _ms),
                Col("delta_exposed_ns", "delta exposed (ms)", _signed),
                Col("base_comm_ns", "base comm (ms)", _ms), Col("new_comm_ns", "new comm (ms)", _ms),
                Col("delta_comm_ns", "delta comm (ms)", _signed)]
        parts.append(section("collectives", "Collectives (summed over ranks and steps)", table(colls, cols)))
    else:
        parts.append(section("collectives", "Collectives", not_available("Per-collective deltas")))

    ranks = [r for r in diff.get("ranks") or [] if isinstance(r, dict)]
    if ranks:
        cols = [Col("rank", "rank"), Col("base_ns", "base step (ms)", _ms), Col("new_ns", "new step (ms)", _ms),
                Col("delta_ns", "delta (ms)", _signed), Col("base_bound", "base bound", _t, False),
                Col("new_bound", "new bound", _t, False)]
        parts.append(section("ranks", "Per-rank step time", table(ranks, cols)))
    header = (f'<header class=tk-head><h1>tracekit diff</h1><div class=meta>{h(base.get("label"))} → '
              f'{h(new.get("label"))}</div></header>')
    return page("tracekit diff", header, "".join(parts), figs, DIFF_SECTIONS)


_CAUSE_TEXT = {"schedule": "schedule (the graph's shape: micro-batches, ops, collectives; the bubble with them)",
               "host": "host (work between launches, stalls, unexplained gaps)", "other_device": "other device work"}


def _cause_text(cause: Any) -> str:
    c = str(cause)
    if c in _CAUSE_TEXT:
        return _CAUSE_TEXT[c]
    kind, _, what = c.partition(":")
    return {"compute": f"compute: {what} ops", "comm": f"{what} communication"}.get(kind, c)


def _share(v: Any) -> str:
    return f"{v * 100:+.1f}%" if is_num(v) else "–"


def _attribution_note(a: dict[str, Any]) -> str:
    meas, rep = a.get("measured") or {}, a.get("replayed") or {}
    return (f"Measured step (slowest rank, mean over steps) {ms(meas.get('base_ns'))} → {ms(meas.get('new_ns'))} "
            f"({signed_ms(meas.get('delta_ns'))}); the parts ({a.get('method')}, {a.get('replays')} replays of the "
            f"base run's dependency graph with the new run's durations, one cause at a time) sum to "
            f"{signed_ms(a.get('explained_ns'))}, residual {signed_ms(a.get('residual_ns'))} "
            f"({_share(a.get('residual_ratio'))} of the measured change). Waiting for peers is carried by the cause "
            f"that made them late.")


def _attribution_html(a: Any, figs: Figures) -> str:
    if not isinstance(a, dict) or not a.get("parts"):
        return section("attribution", "Why it changed", not_available(
            "The explained change (needs both runs' traces or run stores with replayable steps)"))
    rows = [{**r, "cause": _cause_text(r.get("cause"))} for r in a["parts"] if isinstance(r, dict)]
    data = [{"type": "bar", "orientation": "h", "y": [h(r["cause"]) for r in rows][::-1],
             "x": [(r.get("delta_ns") or 0) / 1e6 for r in rows][::-1], "marker": {"color": "#1565c0"},
             "hovertemplate": "%{y}: %{x:+.2f} ms/step<extra></extra>"}]
    fig = figs.add(data, {"xaxis": {"title": {"text": "ms per step added (slowest rank)"}}, "margin": {"l": 320}},
                   height=80 + 28 * len(rows))
    cols = [Col("cause", "cause", str, False), Col("delta_ns", "change (ms/step)", _signed),
            Col("share", "share of measured change", _signed_pct)]
    by_rank = [r for r in a.get("by_rank") or [] if isinstance(r, dict)]
    rank_cols = [Col("rank", "rank"), Col("delta_ns", "change from this rank's durations (ms/step)", _signed)]
    return section("attribution", "Why it changed", f"<p class=note>{h(_attribution_note(a))}</p>" + fig
                   + table(rows, cols) + ("<h3>By rank (durations and gaps only, without the schedule)</h3>"
                                          + table(by_rank, rank_cols) if by_rank else ""))


def _attribution_markdown(a: Any) -> list[str]:
    if not isinstance(a, dict) or not a.get("parts"):
        return []
    lines = ["| cause of the step change | ms/step | share |", "|---|---:|---:|"]
    for r in a["parts"]:
        if isinstance(r, dict) and (r.get("delta_ns") or r.get("cause") == "schedule"):
            lines.append(f"| {md(_cause_text(r.get('cause')))} | {signed_ms(r.get('delta_ns'))} | {_share(r.get('share'))} |")
    by_rank = [r for r in a.get("by_rank") or [] if isinstance(r, dict) and is_num(r.get("delta_ns"))]
    ranks = ", ".join(f"rank {r.get('rank')} {signed_ms(r['delta_ns'])}" for r in by_rank[:4])
    return lines + ["", md(_attribution_note(a)) + (f" By rank: {md(ranks)}." if ranks else ""), ""]


def render_diff_markdown(diff: dict[str, Any], report_href: str = "diff.html") -> str:
    """A pull-request comment: headline, breakdown deltas, findings that appeared/resolved/changed."""
    base, new = diff.get("base") or {}, diff.get("new") or {}
    lines = ["## tracekit diff", "", f"**{md(base.get('label'))} → {md(new.get('label'))}:** {md(_headline(diff))}", ""]
    lines += _attribution_markdown(diff.get("attribution"))
    bd = [r for r in diff.get("breakdown") or [] if isinstance(r, dict)]
    if bd:
        lines += ["| part (mean rank, per step) | base | new | delta |", "|---|---:|---:|---:|"]
        step = diff.get("step") or {}
        lines.append(f"| **step** | {ms(step.get('base_ns'))} | {ms(step.get('new_ns'))} | {_delta_text(step)} |")
        for r in bd:
            lines.append(f"| {md(r.get('part'))} | {ms(r.get('base_ns'))} | {ms(r.get('new_ns'))} | {_delta_text(r)} |")
        lines.append("")
    changed = [f for f in diff.get("findings") or [] if isinstance(f, dict) and f.get("status") != "unchanged"]
    if changed:
        lines += ["| finding | kind | ranks | est. saving / step |", "|---|---|---|---:|"]
        for f in changed:
            rk = f.get("new_ranks") if f.get("new_ranks") is not None else f.get("base_ranks")
            saving = f"{ms(f.get('base_saving_ns'))} → {ms(f.get('new_saving_ns'))}" + _saving_basis(f)
            lines.append(f"| {_STATUS_MARK.get(str(f.get('status')), md(f.get('status')))}: {md(f.get('summary'))} "
                         f"| {md(f.get('kind'))} | {md(ranks_text(rk))} | {saving} |")
        lines.append("")
    else:
        lines += ["No finding appeared, resolved or changed.", ""]
    colls = [r for r in diff.get("collectives") or [] if isinstance(r, dict) and is_num(r.get("delta_exposed_ns"))]
    if colls:
        lines += ["| collective (group / op), exposed time summed over ranks and steps | base | new | delta |",
                  "|---|---:|---:|---:|"]
        for r in colls[:5]:
            lines.append(f"| {md(r.get('group'))} / {md(r.get('op'))} | {ms(r.get('base_exposed_ns'))} "
                         f"| {ms(r.get('new_exposed_ns'))} | {signed_ms(r.get('delta_exposed_ns'))} |")
        lines.append("")
    lines.append(f"Full before/after report: [{md(report_href)}]({report_href.replace(' ', '%20')})")
    return "\n".join(lines) + "\n"


def _saving_basis(f: dict[str, Any]) -> str:
    """Where the saving comes from when a replay set it: the finding's text states its own closed-form
    estimate, which the replay of the fix on the dependency graph replaced (they can differ)."""
    side = "new" if f.get("new_saving_ns") is not None else "base"
    replayed, closed = f.get(f"{side}_replayed_saving_ns"), f.get(f"{side}_closed_form_saving_ns")
    if not is_num(replayed) or not is_num(closed) or replayed != f.get(f"{side}_saving_ns"):
        return ""
    return f" (replayed; the text's estimate {ms(closed)})" if abs(replayed - closed) >= 50_000 else " (replayed)"


def _ms(v: Any) -> str:
    return ms(v).replace(" ms", "")


def _signed(v: Any) -> str:
    return signed_ms(v).replace(" ms", "")


def _signed_pct(v: Any) -> str:
    return f"{v * 100:+.1f}%" if is_num(v) else "–"


def _t(v: Any) -> str:
    return "–" if v is None else str(v)


__all__ = ["render_diff_html", "render_diff_markdown"]
