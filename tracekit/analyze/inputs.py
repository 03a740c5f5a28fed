"""What the inputs are worth: skipped files, empty traces, missing ranks, ranks of different runs, and
ranks whose times are in other units. Each becomes a warning finding and a line in `inputs.warnings`,
so a partial or mixed folder never yields silent numbers. Ranks read from a collective log only (a partial
recording: `tracekit record --profile-ranks`, `tracekit simulate --trace-ranks`) are present, not missing:
`log_only_ranks` lists them and a line in `inputs.warnings` says which ranks the cross-rank numbers
(matching, stragglers, skew: every rank with a log) and the per-rank breakdowns (traced ranks) cover.

Read from the store only: meta (skipped inputs, parser warnings, world size), `ranks` (per-rank time
range, epoch, stated world size) and `steps`.

Section `inputs`:
    {"world_size": int | null, "ranks": [int], "missing_ranks": [int], "empty_ranks": [int],
     "log_only_ranks": [int],   # read from a collective log only (a partial recording: `--profile-ranks`)
     "traced_ranks": [int],     # ranks with a profiler trace
     "skipped": int, "runs": [{"ranks": [int], "start_ns": int, "end_ns": int, "span_ns": int}] (wall clock, ns),
     "rank_spans": [{"rank", "span_ns"}],   # each rank's first to last event on its own clock
     "world_sizes": {str(world size): [rank]},
     "time_scale": {"measure": "step|span", "groups": [{"ranks": [int], "median_ns": int}],
                    "suspect_ranks": [int]},
     "warnings": [str]}   # parser's run-level warnings first, then this module's
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracekit.derive.matching import is_log_only
from tracekit.findings.evidence import Evidence
from tracekit.findings.finding import Finding, FindingKind, Severity
from tracekit.findings.result import AnalyzerResult
from tracekit.tables.store import RunStore

_NS_PER_S = 1_000_000_000
_YEAR_2000_NS = 946_684_800 * _NS_PER_S
_YEAR_2100_NS = 4_102_444_800 * _NS_PER_S
_MAX_LISTED = 20


@dataclass(frozen=True, kw_only=True)
class InputChecksConfig:
    run_gap_ns: int = 600 * _NS_PER_S
    """Ranks whose recorded time ranges are further apart than this are taken for different runs
    (ranks of one run profile the same steps; host clocks are seconds apart at worst)."""
    unit_ratio: float = 100.0
    """Per-rank time measures (median step, else trace span) this many times apart are in different units
    (Kineto writes µs; a writer putting ns there makes a rank 1000x longer)."""


def _ranks_text(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:_MAX_LISTED]))
    return f"[{shown}{' ...' if len(ranks) > _MAX_LISTED else ''}]"


def _wall_start_end(row: dict[str, Any]) -> tuple[int, int] | None:
    """A rank's trace range on the wall clock: Kineto ts are relative to baseTimeNanoseconds when it is
    present and they are far below it (as the parser decides), else they are epoch times already."""
    first, last, base = row.get("first_ts"), row.get("last_ts"), row.get("base_time_ns")
    if first is None or last is None:
        return None
    epoch = int(base) if base and 0 <= first < int(base) // 2 else 0
    return epoch + int(first), epoch + int(last)


def find_runs(rows: list[dict[str, Any]], gap_ns: int) -> list[dict[str, Any]]:
    """Groups of ranks whose wall-clock ranges lie within `gap_ns` of each other, earliest first."""
    spans = sorted((se[0], se[1], r["rank"]) for r in rows if (se := _wall_start_end(r)) is not None)
    runs: list[dict[str, Any]] = []
    for start, end, rank in spans:
        if runs and start <= runs[-1]["end_ns"] + gap_ns:
            runs[-1]["ranks"].append(rank)
            runs[-1]["end_ns"] = max(runs[-1]["end_ns"], end)
        else:
            runs.append({"ranks": [rank], "start_ns": start, "end_ns": end})
    for run in runs:
        run["ranks"].sort()
        run["span_ns"] = run["end_ns"] - run["start_ns"]
    return runs


def time_scale_groups(measures: dict[int, int], ratio: float) -> list[dict[str, Any]]:
    """Ranks grouped by the order of magnitude of their time measure (groups `ratio`x apart), largest group first."""
    vals = {r: v for r, v in measures.items() if v and v > 0}
    if not vals:
        return []
    order = sorted(vals, key=vals.get)
    groups: list[list[int]] = [[order[0]]]
    for r in order[1:]:
        if vals[r] >= ratio * vals[groups[-1][0]]:
            groups.append([r])
        else:
            groups[-1].append(r)
    out = [{"ranks": sorted(g), "median_ns": int(np.median([vals[r] for r in g]))} for g in groups]
    return sorted(out, key=lambda g: -len(g["ranks"]))


def _plausible_wall(row: dict[str, Any]) -> bool:
    se = _wall_start_end(row)
    return se is not None and _YEAR_2000_NS <= se[0] <= _YEAR_2100_NS


@dataclass(frozen=True)
class InputsResult(AnalyzerResult):
    @property
    def warnings(self) -> list[str]:
        """Run-level warnings: the parser's first, then this module's (analysis.json inputs.warnings)."""
        return (self.section or {}).get("warnings", [])


@dataclass
class _Report:
    """What the checks found so far: findings, and warnings in the order analysis.json lists them."""
    warnings: list[str]
    findings: list[Finding] = field(default_factory=list)

    def add(self, finding: Finding, warn: bool = True) -> None:
        if warn:
            self.warnings.append(finding.summary)
        self.findings.append(finding)


def _check_skipped(skipped: list[dict[str, str]], out: _Report) -> None:
    """1. files that were not used"""
    lost = [s for s in skipped if not s.get("duplicate_of")]
    if lost:
        first = lost[0]
        out.add(Finding(
            kind=FindingKind.INPUT_SKIPPED, severity=Severity.WARNING,
            summary=(f"{len(lost)} input file(s) skipped, e.g. {first['file']}: {first['reason']}"),
            evidence=Evidence(details={"skipped": lost[:_MAX_LISTED], "num_skipped": len(lost)}),
            recommendation="Re-export or replace the skipped files; numbers cover only the ranks that were read.",
        ), warn=False)
    dups = [s for s in skipped if s.get("duplicate_of")]
    if dups:  # parse/run.py: every event of the file is in the one kept for its rank
        first = dups[0]
        out.add(Finding(
            kind=FindingKind.INPUT_SKIPPED, severity=Severity.INFO,
            summary=(f"{len(dups)} input file(s) skipped as duplicates (nothing lost), e.g. {first['file']}: "
                     f"{first['reason']}"),
            evidence=Evidence(details={"skipped": dups[:_MAX_LISTED], "num_skipped": len(dups)}),
            recommendation="Nothing to do: every event of these files is analysed from the file kept for their rank.",
        ), warn=False)


def _check_log_only(by_rank: dict[int, dict[str, Any]], out: _Report) -> list[int]:
    """2a. ranks with a collective log and no trace (a partial recording): present, covered by cross-rank numbers only"""
    log_only = [r for r in sorted(by_rank) if is_log_only(by_rank[r])]
    if log_only:
        traced = len(by_rank) - len(log_only)
        out.warnings.append(
            f"{len(log_only)} of {len(by_rank)} rank(s) have a collective log and no trace (log-only: ranks "
            f"{_ranks_text(log_only)}): matching, stragglers and skew cover all {len(by_rank)} ranks from the logs; "
            f"breakdowns and other per-rank numbers cover the {traced} traced rank(s)")
    return log_only


def _check_empty(by_rank: dict[int, dict[str, Any]], out: _Report) -> list[int]:
    """2. traces without events"""
    empty = [r for r in sorted(by_rank) if not by_rank[r].get("num_events") and by_rank[r].get("source_file")
             and str(by_rank[r].get("source_file")).endswith((".json", ".json.gz")) and not is_log_only(by_rank[r])]
    if empty:
        msg = f"traces of ranks {_ranks_text(empty)} hold no complete events; those ranks have no breakdown"
        out.add(Finding(
            kind=FindingKind.INPUT_SKIPPED, severity=Severity.WARNING, summary=msg, ranks=tuple(empty),
            evidence=Evidence(details={"empty_ranks": empty,
                                  "files": {str(r): by_rank[r].get("source_file") for r in empty[:_MAX_LISTED]}}),
            recommendation="Check that the profiler's trace handler ran to completion on those ranks.",
        ))
    return empty


def _check_missing(world_size: Any, ranks: list[int], out: _Report) -> list[int]:
    """3. missing ranks"""
    if world_size and ranks:
        missing = sorted(set(range(int(world_size))) - set(ranks))
        what = f"world size {world_size}"
    else:  # no input states the world size: a gap below the highest rank is still a missing rank
        missing = sorted(set(range(max(ranks) + 1)) - set(ranks)) if ranks else []
        what = f"no world size stated, highest rank {max(ranks) if ranks else None}"
    if missing:
        msg = (f"{what} but inputs for {len(ranks)} rank(s): ranks {_ranks_text(missing)} "
               "are missing; cross-rank numbers cover the ranks present only")
        out.add(Finding(
            kind=FindingKind.MISSING_RANKS, severity=Severity.WARNING, summary=msg, ranks=tuple(missing),
            evidence=Evidence(details={"world_size": int(world_size) if world_size else None,
                                  "missing_ranks": missing, "num_present": len(ranks)}),
            recommendation="Collect the missing ranks' traces (a rank killed before export writes none).",
        ), warn=False)
    return missing


def _time_measures(store: RunStore, by_rank: dict[int, dict[str, Any]]) -> tuple[str, dict[int, int]]:
    """Each rank's median step, or its trace span when not every rank has steps."""
    durs: dict[int, list[int]] = {}
    if store.has("steps"):
        t = store.table("steps", ["rank", "dur"])
        for r, d in zip(t.column("rank").to_pylist(), t.column("dur").to_pylist()):
            durs.setdefault(int(r), []).append(d)
    if by_rank and set(durs) >= set(by_rank):
        return "step", {r: int(np.median(np.array([d for d in durs[r] if d is not None], np.float64)))
                        for r in sorted(durs)}
    return "span", {r: int(row["last_ts"] - row["first_ts"]) for r, row in by_rank.items()
                    if row.get("first_ts") is not None and row.get("last_ts") is not None}


def _check_time_units(measure: str, groups: list[dict[str, Any]], by_rank: dict[int, dict[str, Any]],
                      out: _Report) -> list[int]:
    """4. time units: one rank's step (or span) 1000x the others'"""
    if len(groups) <= 1:
        return []
    majority = groups[0]
    if len(groups[0]["ranks"]) == len(groups[1]["ranks"]):  # no majority: trust the plausible wall clock
        plausible = [g for g in groups if all(_plausible_wall(by_rank[r]) for r in g["ranks"])]
        majority = plausible[0] if len(plausible) == 1 else None
    suspect = sorted(r for g in groups if g is not majority for r in g["ranks"])
    scale = max(g["median_ns"] for g in groups) / max(min(g["median_ns"] for g in groups), 1)
    what = "median step" if measure == "step" else "trace span"
    if majority is not None:
        msg = (f"times of ranks {_ranks_text(suspect)} are {_order(scale)} those of ranks "
               f"{_ranks_text(majority['ranks'])} ({what}): "
               "written in other units (ns where Kineto writes µs?); their numbers are not comparable")
    else:
        msg = (f"ranks' times differ by {_order(scale)} between ranks "
               f"{' and '.join(_ranks_text(g['ranks']) for g in groups)} "
               f"({what}): one side is written in other "
               "units (ns where Kineto writes µs?); their numbers are not comparable")
    out.add(Finding(
        kind=FindingKind.TIME_UNIT_MISMATCH, severity=Severity.WARNING, summary=msg, ranks=tuple(suspect),
        evidence=Evidence(details={"measure": measure, "groups": groups, "ratio": round(scale, 1)}),
        recommendation="Re-export the traces with one profiler version; Kineto `ts`/`dur` are microseconds.",
    ))
    return suspect


def _check_runs(runs: list[dict[str, Any]], stated: dict[str, list[int]], out: _Report) -> None:
    """5. ranks of different runs: disjoint time ranges, or different stated world sizes"""
    reasons = []
    if len(runs) > 1:
        parts = [f"ranks {_ranks_text(run['ranks'])} at {_when(run['start_ns'] - runs[0]['start_ns'])}" for run in runs]
        reasons.append("their traces were recorded at different times: " + "; ".join(parts))
    if len(stated) > 1:
        reasons.append("they state different world sizes: " +
                       "; ".join(f"{ws} by ranks {_ranks_text(rs)}" for ws, rs in sorted(stated.items(), key=lambda kv: int(kv[0]))))
    if reasons:
        msg = ("inputs look like ranks of different runs in one folder (" + "; and ".join(reasons) +
               "); cross-rank numbers (skew, stragglers, matching) compare unrelated times")
        out.add(Finding(
            kind=FindingKind.MIXED_RUNS, severity=Severity.WARNING, summary=msg,
            ranks=tuple(r for run in runs[1:] for r in run["ranks"]) if len(runs) > 1 else (),
            evidence=Evidence(details={"runs": runs, "world_sizes": stated}),
            recommendation="Analyze each run's traces from its own folder.",
        ))


def analyze_inputs(store: RunStore, thresholds: InputChecksConfig | None = None) -> InputsResult:
    cfg = thresholds or InputChecksConfig()
    meta = store.meta
    out = _Report(warnings=[str(w) for w in meta.get("warnings") or []])
    rows = store.table("ranks").to_pylist() if store.has("ranks") else []
    by_rank = {r["rank"]: r for r in rows}
    ranks = sorted(by_rank)
    _check_skipped(store.skipped, out)
    empty = _check_empty(by_rank, out)
    log_only = _check_log_only(by_rank, out)
    world_size = meta.get("world_size")
    missing = _check_missing(world_size, ranks, out)
    measure, values = _time_measures(store, by_rank)
    groups = time_scale_groups(values, cfg.unit_ratio)
    suspect = _check_time_units(measure, groups, by_rank, out)
    runs = find_runs([by_rank[r] for r in ranks if r not in suspect], cfg.run_gap_ns)
    stated: dict[str, list[int]] = {}
    for r in ranks:
        ws = by_rank[r].get("world_size")
        if ws is not None:
            stated.setdefault(str(int(ws)), []).append(r)
    _check_runs(runs, stated, out)
    section = {
        "world_size": int(world_size) if world_size else None, "ranks": ranks, "missing_ranks": missing,
        "empty_ranks": empty, "log_only_ranks": log_only,
        "traced_ranks": [r for r in ranks if not is_log_only(by_rank[r])], "skipped": len(store.skipped), "runs": runs, "world_sizes": stated,
        "rank_spans": [{"rank": r, "span_ns": int(by_rank[r]["last_ts"] - by_rank[r]["first_ts"])} for r in ranks
                       if by_rank[r].get("first_ts") is not None and by_rank[r].get("last_ts") is not None],
        "time_scale": {"measure": measure, "groups": groups, "suspect_ranks": suspect},
        "warnings": out.warnings,
    }
    return InputsResult(findings=out.findings, section=section)


def _order(ratio: float) -> str:
    return f"~{10 ** round(math.log10(ratio)):,}x" if ratio > 0 else "?"


def _when(delta_ns: int) -> str:
    s = delta_ns / _NS_PER_S
    if s < 120:
        return f"+{s:.0f} s"
    if s < 7200:
        return f"+{s / 60:.0f} min"
    if s < 172800:
        return f"+{s / 3600:.1f} h"
    return f"+{s / 86400:.1f} days"
