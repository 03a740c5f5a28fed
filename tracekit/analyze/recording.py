"""What the recording itself did to the numbers: tracekit's own overhead, and whether the window was long enough.

Overhead: events the parser classified as role `overhead` (tracekit's own work inside the window:
`tracekit::log_collective` inside collectives, `tracekit::flush_collective_log` at step
boundaries, ...). They are never compute (breakdown leaves them out); this section says how much
time they took, per rank, inside the analyzed step windows.

Verdict stability: the per-rank verdict (breakdown's `bound`: the largest of compute, exposed
transfer, sync wait and idle over the analyzed steps) rests on a margin over the runner-up. Per step i the
margin is m_i = (winner ns − runner-up ns), and the verdict's margin is mean(m) / mean(step).
With few, uneven steps that margin is within noise: the verdict is called unstable when
mean(m) < Z · sd(m) / sqrt(n), and the steps needed are the n at which it would clear that bar
with the measured spread, n* = ceil((Z · sd(m) / mean(m))²) (at least n + 1). Fewer than
`MIN_STEPS` steps cannot show a spread at all: then the verdict is unstable unless every step
agrees with it by a margin of at least `CLEAR_MARGIN` of its own time. An unstable verdict whose margin is
known to be small — |mean(m)| + Z · sd(m) / sqrt(n) below `TIE_SHARE` of the mean step, with at least
`MIN_STEPS` steps — is a **near tie** (`tie: true`): the two parts take about the same time, and more steps
would only confirm it (n* grows without bound as the margin goes to 0: 14,239 steps were asked of the
MI300 DDP run for a 0.9% margin); the finding is then info and names both parts, with no recording advice.

Recorder overhead: `tracekit record` times each rank's steps at its step boundaries, profiled against
unprofiled ones (record/step_timing.py), and writes the ratio to manifest.json; this section carries it as
`recorder_overhead` ({"ratio", "by_rank", "profiled_steps", "unprofiled_steps", "rule"}; null when the run
was not recorded that way or no unprofiled step was timed). `tracekit advise` divides the step and compute
times it calibrates on by `ratio`.

Section `recording`:
    {"overhead": [{"rank", "overhead_ns", "step_ns", "share", "by_name": {name: ns}}],
     "recorder_overhead": {...} | null,
     "verdict_stability": [{"rank", "bound", "runner_up", "steps", "margin_share", "margin_sd_share",
                            "stable" (null: one step, cannot be judged), "tie", "steps_needed", "note"}]}
A single step shows no spread: its stability is not judged (`stable: null`, note "1 step: cannot judge
stability") and no `unstable_verdict` is raised from it. The note states the rule that decided, with the
numbers it compared (with 2 steps: each step's own lead against CLEAR_MARGIN; with 3 or more: the mean
margin against Z standard errors).
Finding `unstable_verdict` (warning) lists the ranks whose verdict does not hold and the steps to record; near
ties get an info `unstable_verdict` (`evidence.tie`) naming both parts, without recording advice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc

from tracekit.analyze.breakdown import BreakdownResult
from tracekit.derive import intervals as iv
from tracekit.findings.evidence import Evidence
from tracekit.findings.finding import Finding, FindingKind, Severity
from tracekit.findings.result import AnalyzerResult, section_of
from tracekit.tables.store import RunStore

Z = 2.0
"""Standard errors the mean margin must clear (about 95% one-sided for a few steps)."""
MIN_STEPS = 3
CLEAR_MARGIN = 0.25
TIE_SHARE = 0.05
PRACTICAL_STEPS = 1000
"""Beyond this many steps to settle a verdict, the finding says a near tie rather than asking for them."""
"""An unstable verdict whose margin is, within Z standard errors, under this share of the step is a near tie."""
"""With fewer than MIN_STEPS steps, each step's own margin must be at least this share of its time."""
_PARTS = ("compute", "communication", "sync_wait", "idle")


@dataclass(frozen=True)
class RecordingResult(AnalyzerResult):
    pass


def analyze_recording(store: RunStore, breakdown: BreakdownResult | None) -> RecordingResult:
    steps = section_of(breakdown).get("steps") or []
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for row in steps:
        by_rank.setdefault(row["rank"], []).append(row)
    overhead = [_overhead(store, rank, rows) for rank, rows in sorted(by_rank.items())]
    stability = [_stability(rank, rows) for rank, rows in sorted(by_rank.items()) if rows[0]["step"] is not None]
    findings = _finding([s for s in stability if s["stable"] is not None])
    return RecordingResult(findings=findings, section={"overhead": overhead, "verdict_stability": stability,
                                                       "recorder_overhead": recorder_overhead(store.manifest)})


def recorder_overhead(manifest: dict[str, Any] | None) -> dict[str, Any] | None:
    """The recorder's own timing of profiled vs unprofiled steps, from `tracekit record`'s manifest (at the
    top, or under `tracekit_record` when the program wrote its own manifest)."""
    if not isinstance(manifest, dict):
        return None
    inner = manifest.get("tracekit_record")
    found = manifest.get("recording_overhead") or (inner.get("recording_overhead") if isinstance(inner, dict) else None)
    if not isinstance(found, dict) or not isinstance(found.get("ratio"), (int, float)) or found["ratio"] <= 0:
        return None
    return found


def _parts(row: dict[str, Any]) -> dict[str, int]:
    """The verdict's parts of one step, as `breakdown.verdict` weighs them (compute includes other device
    work; exposed communication less the wait for late peers is "communication", the wait "sync_wait")."""
    wait = row.get("sync_wait_ns") or 0
    return {"compute": row["compute_ns"] + row["other_ns"], "communication": row["exposed_comm_ns"] - wait,
            "sync_wait": wait, "idle": row["idle_ns"]}


def _stability(rank: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    if len(rows) == 1:  # one step shows no spread: stability cannot be judged either way
        p = _parts(rows[0])
        bound = max(_PARTS, key=lambda k: (p[k], k == "compute"))
        return {"rank": rank, "bound": bound, "runner_up": None, "steps": 1, "margin_share": None,
                "margin_sd_share": None, "stable": None, "steps_needed": MIN_STEPS,
                "note": "1 step: cannot judge stability"}
    parts = [_parts(r) for r in rows]
    totals = {k: sum(p[k] for p in parts) for k in _PARTS}
    bound = max(_PARTS, key=lambda k: (totals[k], k == "compute"))
    runner = max((k for k in _PARTS if k != bound), key=lambda k: totals[k])
    margins = np.array([p[bound] - p[runner] for p in parts], dtype=np.float64)
    spans = np.array([max(r["step_ns"], 1) for r in rows], dtype=np.float64)
    n = len(rows)
    mean_m, mean_t = float(margins.mean()), float(spans.mean())
    sd = float(margins.std(ddof=1)) if n > 1 else 0.0
    if n < MIN_STEPS:
        stable = bool(np.all(margins / spans >= CLEAR_MARGIN))
    else:
        stable = mean_m > 0 and mean_m >= Z * sd / math.sqrt(n)
    if stable:
        needed = n
    elif mean_m <= 0 or sd == 0:
        needed = max(MIN_STEPS, 4 * n)
    else:
        var = float(margins.var(ddof=1))
        needed = max(n + 1, MIN_STEPS, math.ceil(Z * Z * var / (mean_m * mean_m)))
    min_step = float(np.min(margins / spans))
    tie = not stable and n >= MIN_STEPS and abs(mean_m) + Z * sd / math.sqrt(n) < TIE_SHARE * mean_t
    note = _why(n, mean_m / mean_t, sd / mean_t, min_step, bool(stable))
    if tie:
        note += (f"; a near tie: the margin is under {100 * TIE_SHARE:.0f}% of the step within {Z:g} standard "
                 "errors, more steps would not separate them")
    return {"rank": rank, "bound": bound, "runner_up": runner, "steps": n,
            "margin_share": mean_m / mean_t, "margin_sd_share": sd / mean_t,
            "stable": bool(stable), "tie": bool(tie), "steps_needed": int(needed), "note": note}


def _why(n: int, margin: float, sd: float, min_step: float, stable: bool) -> str:
    """The rule that decided, in words, with the numbers it compared."""
    if n < MIN_STEPS:
        return (f"{n} steps: every step must lead by at least {100 * CLEAR_MARGIN:.0f}% of its time; "
                f"the smallest lead is {100 * min_step:.1f}%" + ("" if stable else " (not clear)"))
    need = Z * sd / math.sqrt(n)
    return (f"{n} steps: mean margin {100 * margin:.1f}% of the step against {Z:g} standard errors of it "
            f"({100 * need:.1f}%)" + ("" if stable else " (within noise)"))


def _finding(stability: list[dict[str, Any]]) -> list[Finding]:
    ties = [s for s in stability if s.get("tie")]
    bad = [s for s in stability if not s["stable"] and not s.get("tie")]
    out = _tie_finding(ties) if ties else []
    if not bad:
        return out
    need = max(s["steps_needed"] for s in bad)
    have = max(s["steps"] for s in bad)
    worst = min(bad, key=lambda s: s["margin_share"] - Z * s["margin_sd_share"])
    summary = (f"the verdict by breakdown (a rank's largest part of the step) may not hold on {len(bad)} rank(s): "
               f"'{worst['bound']}' does not clearly lead "
               f"'{worst['runner_up']}' (rank {worst['rank']}, {worst['note']})")
    rec = (f"record at least {need} steps (e.g. tracekit record --active {need}); {have} were analyzed")
    if need > PRACTICAL_STEPS:  # a small margin against a wide spread: no recording settles it
        rec = (f"'{worst['bound']}' leads '{worst['runner_up']}' by {100 * worst['margin_share']:.1f}% of the step "
               f"against a step-to-step spread of {100 * worst['margin_sd_share']:.1f}%: about {need} steps would "
               f"settle it, so read the two as a near tie; recording {4 * have} or more steps shows whether the "
               f"spread narrows ({have} were analyzed)")
    return [Finding(kind=FindingKind.UNSTABLE_VERDICT, severity=Severity.WARNING, summary=summary,
                    ranks=tuple(s["rank"] for s in bad),
                    evidence=Evidence(details={
                        "steps_analyzed": have, "steps_needed": need, "z": Z,
                        "per_rank": _per_rank(bad, "steps_needed")}),
                    recommendation=rec)] + out


def _tie_finding(ties: list[dict[str, Any]]) -> list[Finding]:
    """Info: ranks whose two largest parts take about the same time (a near tie, not noise to record away)."""
    worst = max(ties, key=lambda s: abs(s["margin_share"]))
    summary = (f"'{worst['bound']}' and '{worst['runner_up']}' take about the same time on {len(ties)} rank(s) "
               f"(rank {worst['rank']}: {worst['note']}): the verdict is a near tie, both matter")
    return [Finding(kind=FindingKind.UNSTABLE_VERDICT, severity=Severity.INFO, summary=summary,
                    ranks=tuple(s["rank"] for s in ties),
                    evidence=Evidence(details={
                        "tie": True, "tie_share": TIE_SHARE, "z": Z,
                        "per_rank": _per_rank(ties, "steps")}),
                    recommendation=(f"Read both: '{worst['bound']}' and '{worst['runner_up']}' take about the same "
                                    "time; shrinking either pays."))]


def _per_rank(rows: list[dict[str, Any]], steps_key: str) -> dict[str, dict[str, Any]]:
    """The finding's evidence per rank: the verdict, its runner-up, the margin and its spread, and `steps_key`."""
    keys = ("bound", "runner_up", "margin_share", "margin_sd_share", steps_key)
    return {str(s["rank"]): {k: s[k] for k in keys} for s in rows}


def _overhead(store: RunStore, rank: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Time in tracekit's own events (role `overhead`) inside the rank's analyzed windows."""
    win = iv.union(np.array([r["ts"] for r in rows], dtype=np.int64),
                   np.array([r["ts"] + r["step_ns"] for r in rows], dtype=np.int64))
    step_ns = int(sum(r["step_ns"] for r in rows))
    ev = store.rank_table("events", rank, ["name", "ts", "dur", "role"])
    if ev.num_rows:
        ev = ev.filter(pc.fill_null(pc.and_(pc.equal(ev["role"].cast("string"), "overhead"),
                                            pc.is_valid(ev["dur"])), False))
    by_name: dict[str, int] = {}
    total = 0
    if ev.num_rows:
        ts = ev["ts"].to_numpy(zero_copy_only=False).astype(np.int64)
        ends = ts + ev["dur"].to_numpy(zero_copy_only=False).astype(np.int64)
        names = np.array(ev["name"].cast("string").to_pylist(), dtype=object)
        total = iv.total(iv.intersect(iv.union(ts, ends), win))
        for name in sorted(set(names.tolist())):
            m = names == name
            by_name[name] = iv.total(iv.intersect(iv.union(ts[m], ends[m]), win))
    return {"rank": rank, "overhead_ns": int(total), "step_ns": step_ns,
            "share": total / step_ns if step_ns else None, "by_name": by_name}
