"""Compares two analyses (before/after): step time, breakdown, findings appeared/resolved/changed, and
per-collective exposed time. Returns a JSON-ready `tracekit.diff/1` document that reports lay out.

Step and breakdown numbers are per rank per step: Σ over ranks of the totals / Σ steps (the mean rank),
plus the slowest rank's per-step time. Findings are matched by identity (kind, dim, the group/op/layer
their evidence names, ranks); a finding matched on everything but its ranks counts as changed, except
for findings about a rank (straggler): another rank is another finding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.document import AnalysisDocument, FindingDoc, RankBreakdown, as_document

if TYPE_CHECKING:
    from tracekit.tables.store import RunStore

Analysis = AnalysisDocument | dict[str, Any]
"""What the comparisons take: the typed document, or an analysis dict (read as the document)."""

DIFF_SCHEMA = "tracekit.diff/1"
BREAKDOWN_PARTS = ("compute_ns", "comm_ns", "exposed_comm_ns", "sync_wait_ns", "other_ns", "idle_ns")
"""sync_wait_ns: the part of exposed_comm_ns spent waiting for late peers (None for analyses from before it)."""
_SCOPE_KEYS = ("pg_name", "pg_desc", "group", "op", "layer", "stage", "expert")
RANK_SUBJECT_KINDS = frozenset({"straggler", "clock_skew"})
"""Kinds whose ranks are what the finding is about: a straggler on another rank is another finding."""


@dataclass(kw_only=True, frozen=True)
class DiffConfig:
    """When a finding present in both runs counts as changed rather than unchanged."""

    min_saving_change_ratio: float = 0.25
    """Relative change of est_saving_ns (vs the larger of the two) that makes a finding 'changed'."""
    min_saving_change_ns: int = 1_000_000
    """…and the absolute change it must also exceed (noise floor)."""


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ranks(doc: AnalysisDocument) -> list[RankBreakdown]:
    return [r for r in doc.ranks if r.steps > 0]


def per_step_means(analysis: Analysis) -> dict[str, float | None]:
    """Mean per-rank, per-step time of each breakdown part and the step; `max_step_ns` is the slowest rank's."""
    ranks = _ranks(as_document(analysis))
    steps = sum(r.steps for r in ranks)
    out: dict[str, float | None] = {}
    for key in ("step_ns",) + BREAKDOWN_PARTS:
        vals = [getattr(r, key) for r in ranks if _num(getattr(r, key))]  # sync_wait_ns: unset in older analyses
        out[key] = (sum(vals) / steps) if ranks and len(vals) == len(ranks) else None
    per_rank = [r.step_ns / r.steps for r in ranks]
    out["max_step_ns"] = max(per_rank) if per_rank else None
    return out


def _delta(base: float | None, new: float | None) -> dict[str, float | None]:
    d = new - base if base is not None and new is not None else None
    ratio = (d / base) if d is not None and base else None
    return {"base_ns": base, "new_ns": new, "delta_ns": d, "delta_ratio": ratio}


def finding_scope(f: FindingDoc) -> tuple[str, ...]:
    """What a finding is about, beyond its kind and dim: the group / op / layer / stage its evidence names."""
    ev = f.evidence
    return tuple(f"{k}={ev[k]}" for k in _SCOPE_KEYS if k in ev and isinstance(ev[k], (str, int)))


def _identity(f: FindingDoc, with_ranks: bool) -> tuple:
    key = (str(f.kind), str(f.dim), finding_scope(f))
    return key + (tuple(sorted(f.ranks)),) if with_ranks else key


def _pair_findings(base: list[FindingDoc], new: list[FindingDoc]
                   ) -> list[tuple[FindingDoc | None, FindingDoc | None]]:
    """Match findings: first on full identity incl. ranks, then leftovers on identity without ranks
    (except RANK_SUBJECT_KINDS, where other ranks make another finding)."""
    pairs: list[tuple[FindingDoc | None, FindingDoc | None]] = []
    left_new = list(new)
    left_base: list[FindingDoc] = []
    for with_ranks in (True, False):
        pool = list(base) if with_ranks else left_base
        left_base = []
        for b in pool:
            if not with_ranks and b.kind in RANK_SUBJECT_KINDS:
                left_base.append(b)
                continue
            key = _identity(b, with_ranks)
            match = next((n for n in left_new if _identity(n, with_ranks) == key), None)
            if match is None:
                left_base.append(b)
            else:
                left_new.remove(next(i for i in left_new if i is match))
                pairs.append((b, match))
    pairs += [(b, None) for b in left_base]
    pairs += [(None, n) for n in left_new]
    return pairs


def _explained(f: FindingDoc | None) -> bool:
    return f is not None and bool(f.evidence.get("explained_by"))


def _finding_status(b: FindingDoc | None, n: FindingDoc | None, cfg: DiffConfig) -> str:
    if b is None:
        return "appeared"
    if n is None:
        return "resolved"
    if _explained(n) and not _explained(b):
        return "absorbed"
    if b.severity != n.severity or sorted(b.ranks) != sorted(n.ranks):
        return "changed"
    sb, sn = b.est_saving_ns, n.est_saving_ns
    change = abs(sn - sb)
    if change > cfg.min_saving_change_ns and change > cfg.min_saving_change_ratio * max(sb, sn):
        return "changed"
    return "unchanged"


_STATUS_ORDER = {"appeared": 0, "changed": 1, "absorbed": 2, "resolved": 3, "unchanged": 4}


def _still_exposed(b: FindingDoc, base: AnalysisDocument, new: AnalysisDocument) -> bool:
    """A communication finding is not resolved while its dim's exposed time did not fall."""
    if b.kind not in ("unoverlapped_collective", "communication_bound", "low_bus_bandwidth"):
        return False
    op = b.evidence.get("op")
    before = sum(v["exposed_ns"] for (d, o), v in collective_totals(base).items()
                 if d == str(b.dim) and (op is None or o == op))
    after = sum(v["exposed_ns"] for (d, o), v in collective_totals(new).items()
                if d == str(b.dim) and (op is None or o == op))
    return after > 0 and after >= before


def _replayed(f: FindingDoc | None) -> int | None:
    return None if f is None else f.evidence.get("replayed_saving_ns")


def _closed_form(f: FindingDoc | None) -> int | None:
    return None if f is None else f.evidence.get("closed_form_saving_ns")


def diff_findings(base: Analysis, new: Analysis, cfg: DiffConfig) -> list[dict[str, Any]]:
    base, new = as_document(base), as_document(new)
    out = []
    for b, n in _pair_findings(base.findings, new.findings):
        ref = n or b
        assert ref is not None
        status = _finding_status(b, n, cfg)
        if status == "resolved" and b is not None and _still_exposed(b, base, new):
            status = "absorbed"  # gone from the list, but the time it named did not fall: a bigger one covers it
        out.append({
            "status": status,
            "kind": ref.kind, "dim": ref.dim, "scope": list(finding_scope(ref)),
            "base_ranks": None if b is None else list(b.ranks),
            "new_ranks": None if n is None else list(n.ranks),
            "base_severity": None if b is None else b.severity,
            "new_severity": None if n is None else n.severity,
            "base_saving_ns": None if b is None else b.est_saving_ns,
            "new_saving_ns": None if n is None else n.est_saving_ns,
            "base_replayed_saving_ns": _replayed(b), "new_replayed_saving_ns": _replayed(n),
            # the saving the finding's own text states (before the replay replaced est_saving_ns)
            "base_closed_form_saving_ns": _closed_form(b), "new_closed_form_saving_ns": _closed_form(n),
            "absorbed_by": n.evidence.get("explained_by") if status == "absorbed" and n else None,
            "summary": ref.summary,
            "base_summary": None if b is None else b.summary,
        })
    out.sort(key=lambda d: (_STATUS_ORDER[d["status"]], -max(d["base_saving_ns"] or 0, d["new_saving_ns"] or 0)))
    return out


def collective_totals(analysis: Analysis) -> dict[tuple[str, str], dict[str, float]]:
    """Per (dim, op): instances, communication and exposed time summed over ranks and steps, from the
    `unoverlapped` section's per-rank rows (empty when the section is missing)."""
    sec = as_document(analysis).sections.unoverlapped
    out: dict[tuple[str, str], dict[str, float]] = {}
    for r in sec.by_rank_dim_op if sec is not None else []:
        acc = out.setdefault((r.dim or "?", r.op or "?"), {"count": 0, "comm_ns": 0, "exposed_ns": 0})
        acc["count"] += r.instances
        acc["comm_ns"] += r.comm_ns
        acc["exposed_ns"] += r.exposed_ns
    return out


def diff_collectives(base: Analysis, new: Analysis) -> list[dict[str, Any]]:
    b, n = collective_totals(base), collective_totals(new)
    rows = []
    for key in sorted(set(b) | set(n)):
        bb, nn = b.get(key), n.get(key)
        row: dict[str, Any] = {"group": key[0], "op": key[1]}
        for k in ("count", "comm_ns", "exposed_ns"):
            bv = bb.get(k) if bb else None
            nv = nn.get(k) if nn else None
            row[f"base_{k}"] = bv
            row[f"new_{k}"] = nv
            row[f"delta_{k}"] = (nv or 0) - (bv or 0) if (bv is not None or nv is not None) else None
        rows.append(row)
    rows.sort(key=lambda r: -abs(r["delta_exposed_ns"] or 0))
    return rows


def _describe(doc: AnalysisDocument, label: str) -> dict[str, Any]:
    return {"label": label, "tracekit_version": doc.tracekit_version or None,
            "command": doc.command, "ranks": len(doc.inputs.ranks),
            "skipped": len(doc.inputs.skipped), "findings": len(doc.findings)}


def diff_analyses(base: Analysis, new: Analysis, *, base_label: str = "base",
                  new_label: str = "new", config: DiffConfig | None = None,
                  attribution: dict[str, Any] | None = None) -> dict[str, Any]:
    """The before/after document (`tracekit.diff/1`). `attribution`: the explained step change
    (tracekit.compare.attribution, from both runs' stores), None when a run has no store or no step to
    replay (e.g. an analysis.json alone)."""
    cfg = config or DiffConfig()
    base, new = as_document(base), as_document(new)
    mb, mn = per_step_means(base), per_step_means(new)
    base_by_rank = {r.rank: r for r in _ranks(base)}
    new_by_rank = {r.rank: r for r in _ranks(new)}
    ranks = []
    for rank in sorted(set(base_by_rank) | set(new_by_rank)):
        b, n = base_by_rank.get(rank), new_by_rank.get(rank)
        bs = b.step_ns / b.steps if b else None
        ns = n.step_ns / n.steps if n else None
        ranks.append({"rank": rank, **_delta(bs, ns),
                      "base_bound": b.bound if b else None, "new_bound": n.bound if n else None})
    findings = diff_findings(base, new, cfg)
    counts = {s: sum(1 for f in findings if f["status"] == s) for s in _STATUS_ORDER}
    if not counts["absorbed"]:
        del counts["absorbed"]  # listed only when a finding was absorbed by a bigger one
    return {
        "schema": DIFF_SCHEMA,
        "base": _describe(base, base_label),
        "new": _describe(new, new_label),
        "step": _delta(mb["step_ns"], mn["step_ns"]),
        "max_step": _delta(mb["max_step_ns"], mn["max_step_ns"]),
        "breakdown": [{"part": k[:-3], **_delta(mb[k], mn[k])} for k in BREAKDOWN_PARTS],
        "ranks": ranks,
        "findings": findings,
        "finding_counts": counts,
        "collectives": diff_collectives(base, new),
        "replay": {"base": _replay_summary(base), "new": _replay_summary(new)},
        "attribution": attribution,
    }


def _replay_summary(doc: AnalysisDocument) -> dict[str, Any] | None:
    """The critical-path section's measured step and the saving of all fixes together (replayed)."""
    sec = doc.sections.critical_path
    if sec is None:
        return None
    together = sec.all_fixes
    return {"measured_step_ns": sec.measured_step_ns,
            "all_fixes_saving_ns": together.saving_ns if together is not None else None,
            "all_fixes_step_ns": together.step_ns if together is not None else None}


def load_analysis(path: str | Path, store_dir: str | Path | None = None, *, progress: bool = False
                  ) -> tuple[dict[str, Any], RunStore | None]:
    """The analysis of PATH: an analysis.json file, an analyze output dir holding one, or a run store /
    trace dir analysed now by tracekit.analyze_run (traces parsed into `store_dir`, or a temporary dir
    that lives until the process ends). Raises NothingToAnalyzeError when no rank is readable."""
    import shlex

    from tracekit.analysis import analyze_run
    from tracekit.errors import NothingToAnalyzeError
    from tracekit.tables.store import RunStore

    path = Path(path)
    if path.is_file():
        return _read_analysis(path), None
    if (path / "analysis.json").is_file():
        store = RunStore(path / "tables") if (path / "tables" / "meta.json").is_file() else None
        return _read_analysis(path / "analysis.json"), store
    run = analyze_run(path, store_dir=store_dir, progress=progress,
                      command=shlex.join(["tracekit", "analyze", str(path)]))
    if not run.document.ranks:
        raise NothingToAnalyzeError(f"{path}: no rank had events to analyse")
    return run.analysis, run.store


def _read_analysis(path: Path) -> dict[str, Any]:
    import json

    from tracekit.errors import NothingToAnalyzeError

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise NothingToAnalyzeError(f"{path}: not a readable analysis.json ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != "tracekit.analysis/1":
        raise NothingToAnalyzeError(f"{path}: not a tracekit analysis (schema {doc.get('schema') if isinstance(doc, dict) else None!r})")
    return doc
