"""The "Hang post-mortem" section of report.html: lays out analysis.json's `hang` section (analyze/hang.py).

Root causes first (the ranks whose absence explains the others' waits, their kind, the collective and
their last entries and stacks), then each stuck process group (the collective it is stuck at, who
entered it, who is missing, and every member's last enqueued / started / completed collective), then
mismatches and unpaired P2P. Computes nothing: every value comes from the section.
"""

from __future__ import annotations

from typing import Any

from reports.escape import h
from reports.format import is_num, ranks_text
from reports.html_parts import Col, cell_text, kv_table, plotly_text, section, table
from tracekit.document import as_section
from tracekit.document.model import HangSection

_KIND = {"missing": "never entered the collective", "dead": "process died", "no_dump": "left no dump",
         "mismatch": "entered it with another op, size or dtype"}


def _txt(v: Any) -> str:
    return cell_text(v)


def _collective_text(c: dict[str, Any] | None) -> str:
    if not isinstance(c, dict):
        return "–"
    return (f"group {c.get('pg_name')} ({c.get('pg_desc') or 'no description'}): {c.get('op')} #{c.get('seq')} "
            f"in {c.get('in_sizes') or '?'} out {c.get('out_sizes') or '?'} {c.get('dtype') or ''}")


def _roots(sec: HangSection) -> str:
    parts = []
    for i, r in enumerate(sec.root_causes, 1):
        if not isinstance(r, dict):
            continue
        parts.append(f"<h4>Root cause {i}: rank(s) {h(ranks_text(r.get('ranks')))} — {h(_KIND.get(r.get('kind'), r.get('kind')))}</h4>")
        parts.append(kv_table([("stuck collective", _collective_text(r.get("collective"))),
                               ("ranks waiting on them", ranks_text(r.get("blocked_ranks")))]))
        last = r.get("last_entries") or {}
        if last:
            rows = [{"rank": k, **v} for k, v in last.items() if isinstance(v, dict)]
            parts.append("<p class=note>Their last recorded entries:</p>" + table(rows, [
                Col("rank", "rank", _txt, False), Col("op", "op", _txt, False), Col("seq", "seq", _txt, False),
                Col("in_sizes", "in sizes", _txt, False), Col("dtype", "dtype", _txt, False),
                Col("state", "state", _txt, False)]))
        for rank, frames in (r.get("frames") or {}).items():
            parts.append(f"<details><summary>stack of rank {h(rank)}</summary><pre>{h(frames)}</pre></details>")
    return "".join(parts)


def _stuck_rows(sec: HangSection) -> list[dict[str, Any]]:
    rows = []
    for g in sec.groups:
        st = g.get("stuck") if isinstance(g, dict) else None
        if isinstance(st, dict):
            rows.append({"pg_name": g.get("pg_name"), "pg_desc": g.get("pg_desc"), "op": st.get("op"),
                         "seq": st.get("seq"), "in_sizes": st.get("in_sizes"), "dtype": st.get("dtype"),
                         "entered": st.get("entered"), "missing": st.get("missing"), "no_dump": st.get("no_dump")})
    return rows


def _last_entered_chart(figs: Any, sec: HangSection) -> str:
    """One marker per rank at the time it entered its last collective (ms after the earliest of them)."""
    rows = [r for r in sec.last_entered if is_num(r.get("enqueue_ts"))]
    none = [r.get("rank") for r in sec.last_entered if not is_num(r.get("enqueue_ts"))]
    if not rows or figs is None:
        return ""
    t0 = min(r["enqueue_ts"] for r in rows)
    data = [{"type": "scatter", "mode": "markers+text", "name": "last entered",
             "x": [(r["enqueue_ts"] - t0) / 1e6 for r in rows], "y": [f"r{r['rank']}" for r in rows],
             "text": [plotly_text(f"{r.get('op')} #{r.get('seq')} g{r.get('pg_name')}") for r in rows],
             "textposition": "middle right", "marker": {"size": 9},
             "hovertemplate": "%{y}: %{text} at %{x:.3f} ms<extra></extra>"}]
    layout = {"xaxis": {"title": {"text": "ms after the earliest rank's last entry"}},
              "yaxis": {"type": "category", "autorange": "reversed"}, "showlegend": False}
    note = (f"<p class=note>Ranks whose dump holds no entry: {h(ranks_text(none))}.</p>" if none else "")
    return ("<h3>The last collective each rank entered</h3>"
            + figs.add(data, layout, height=min(140 + 18 * len(rows), 1200)) + note)


def hang_html(sec: HangSection | dict[str, Any] | None, figs: Any = None) -> str:
    """The section, or "" when the run has no dumps. The groups' and root causes' records are laid out
    as analysis.json holds them (dicts: analyze/hang.py)."""
    sec = as_section(HangSection, sec) if sec != {} else None
    if sec is None:
        return ""
    dumps = sec.dumps
    head = kv_table([("verdict", "hung" if sec.hung else "no hang: no pending collective lacks a rank"),
                     ("ranks with a dump", ranks_text(dumps.ranks)),
                     ("dumps with no entries", ranks_text(dumps.empty) or "–"),
                     ("group members without a dump", ranks_text(dumps.no_dump) or "–"),
                     ("ranks whose process died", ranks_text(dumps.dead) or "–")])
    body = head + _roots(sec) + _last_entered_chart(figs, sec)
    stuck = _stuck_rows(sec)
    if stuck:
        body += "<h3>Stuck process groups</h3>" + table(stuck, [
            Col("pg_name", "group", _txt, False), Col("pg_desc", "description", _txt, False),
            Col("op", "op", _txt, False), Col("seq", "seq", _txt, False), Col("in_sizes", "in sizes", _txt, False),
            Col("dtype", "dtype", _txt, False), Col("entered", "entered", _txt, False),
            Col("missing", "missing", _txt, False), Col("no_dump", "no dump", _txt, False)], table_id="hang-groups")
    mism = [{"pg_name": g.get("pg_name"), **m} for g in sec.groups
            for m in g.get("mismatches") or [] if isinstance(m, dict)]
    if mism:
        body += "<h3>Mismatched calls (same sequence number, other op/size/dtype)</h3>" + table(mism, [
            Col("pg_name", "group", _txt, False), Col("seq", "seq", _txt, False), Col("expected", "most ranks", _txt, False),
            Col("ranks", "mismatched ranks", _txt, False), Col("entries", "their calls", _txt, False)])
    p2p = sec.p2p_unmatched
    if p2p:
        body += "<h3>Unpaired send/recv</h3>" + table(p2p, [
            Col("waiting_rank", "waiting rank", _txt, False), Col("op", "op", _txt, False),
            Col("peer", "peer (absent)", _txt, False), Col("pg_name", "group", _txt, False),
            Col("in_sizes", "sizes", _txt, False)])
    members = [{"pg_name": g.get("pg_name"), **m} for g in sec.groups if g.get("stuck")
               for m in g.get("members") or [] if isinstance(m, dict)]
    if members:
        body += ("<details><summary>Last collective each member of a stuck group enqueued / started / completed"
                 "</summary>" + table(members, [
                     Col("pg_name", "group", _txt, False), Col("rank", "rank", _txt, False),
                     Col("last_enqueued", "enqueued", _txt, False), Col("last_started", "started", _txt, False),
                     Col("last_completed", "completed", _txt, False)]) + "</details>")
    return section("hang", "Hang post-mortem", body)
