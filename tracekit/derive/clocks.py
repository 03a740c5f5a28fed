"""Clock offsets between ranks, and between a rank's collective log and its trace.

Two problems, one module:
1. Ranks on different hosts have different clocks (ranks of one host share one: nothing to correct,
   the estimate is only reported — end jitter of gloo collectives on a busy box is milliseconds). With anchors (`ranks.clock_offset_ns`, filled by
   the parser from the manifest) we use them; otherwise we estimate each rank's offset from the
   collectives themselves: the ends of a blocking collective (all_reduce, all_gather, barrier...)
   are nearly simultaneous on every member, so offset_r = median over instances of
   (end_r − median end of the instance). An offset is applied only when it is large
   (≥ `min_offset_ns`) and consistent (its median absolute deviation ≤ `max_mad_fraction` of it);
   a large but inconsistent offset is "uncorrectable" and yields a `clock_skew` warning.
2. The comms log (`time.time_ns`, wall clock) and the Kineto trace (its own clock, epoch =
   `baseTimeNanoseconds` + ts) differ per rank; `log_to_trace_shift` finds the shift that puts
   log times on the trace clock (0 when they already share one).

derive/matching.py runs the estimator while it matches; the `clocks` analyzer (analyze/clocks.py) publishes
its result as section `clocks`:
    {"method": "anchors|same-host|estimated|none", "reference_rank": int | null, "hosts": int | null,
     "ranks": [{"rank", "offset_ns", "mad_ns", "instances", "applied": bool,
                "status": "anchor|same-host|negligible|corrected|uncorrectable|unmatched"}],
     "log_to_trace": [{"rank", "shift_ns", "method": "same-clock|base_time|unaligned"}],
     "thresholds": {"min_offset_ns", "max_mad_fraction"}}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.tables.columns import equals_any, group_ids, group_order

SYNC_ENDING_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier")


@dataclass(frozen=True, kw_only=True)
class ClockConfig:
    min_offset_ns: int = 1_000_000
    """Offsets smaller than this are indistinguishable from collective end jitter: not applied."""
    max_mad_fraction: float = 0.25
    """An offset is trusted when the spread of its per-instance estimates is at most this fraction of it."""
    min_instances: int = 3
    """Fewest matched instances to estimate an offset from."""
    warn_offset_ns: int = 5_000_000
    """An uncorrectable offset at least this large yields a `clock_skew` warning."""


@dataclass(frozen=True)
class MatchedEnds:
    """The matched rows the estimate reads: one per (instance, rank), as numpy columns."""

    key: np.ndarray
    """int instance id"""
    rank: np.ndarray
    op: np.ndarray
    """object (str or None)"""
    end: np.ndarray
    """int64 ns on the matching clock (0 where unknown)"""
    end_ok: np.ndarray
    """bool: end is known"""


def _end_deviations(m: MatchedEnds) -> dict[int, np.ndarray]:
    """Per rank: how far its end of each matched sync collective lies from the instance's median end."""
    sync = equals_any(m.op, SYNC_ENDING_OPS) & m.end_ok
    key, rank, end = m.key[sync], m.rank[sync], m.end[sync]
    ids, n = group_ids(key)
    keep = np.bincount(ids, minlength=n)[ids] >= 2
    (ids, n), rank, end = group_ids(ids[keep]), rank[keep], end[keep]
    if not ids.size:
        return {}
    # exact ints first (epoch ns), then the small differences from the instance's median
    order, starts, counts = group_order(ids, n, end)
    d = end - end[order][starts][ids]
    ds = d[order].astype(np.float64)
    lo, hi = ds[starts + (counts - 1) // 2], ds[starts + counts // 2]
    dev = d - ((lo + hi) / 2)[ids]
    by_rank: dict[int, np.ndarray] = {}
    order = np.argsort(rank, kind="stable")
    for idx in np.split(order, np.flatnonzero(np.diff(rank[order])) + 1):
        by_rank[int(rank[idx[0]])] = dev[idx]
    return by_rank


def estimate_offsets(ends: MatchedEnds, anchors: dict[int, int | None], config: ClockConfig,
                     same_host: bool = False) -> tuple[dict[str, Any], dict[int, int]]:
    """Offsets from anchors or from ends of matched sync collectives.

    `ends` has one row per (instance key, rank) with its op and end (trace-clock ns).
    `same_host`: every rank ran on one host, so they share a clock: estimates are reported, not applied.
    Returns the section and {rank: offset to subtract from that rank's times}.
    """
    ranks = sorted(set(ends.rank.tolist())) if ends.rank.size else sorted(anchors)
    if anchors and ranks and all(anchors.get(r) is not None for r in ranks):
        rows = [{"rank": r, "offset_ns": int(anchors[r]), "mad_ns": 0, "instances": 0, "applied": True,
                 "status": "anchor"} for r in ranks]
        return ({"method": "anchors", "reference_rank": None, "ranks": rows},
                {r: int(anchors[r]) for r in ranks})
    ref = ranks[0] if ranks else None
    rows, applied = [], {}
    by_rank = _end_deviations(ends)
    for r in ranks:
        d = by_rank.get(r, np.zeros(0))
        if d.size < config.min_instances:
            rows.append({"rank": r, "offset_ns": None, "mad_ns": None, "instances": int(d.size),
                         "applied": False, "status": "unmatched"})
            continue
        off = float(np.median(d))
        mad = float(np.median(np.abs(d - off)))
        rows.append({"rank": r, "offset_ns": int(round(off)), "mad_ns": int(round(mad)),
                     "instances": int(d.size), "applied": False, "status": "negligible"})
    # offsets relative to the reference rank so rank `ref` stays put
    base = next((row["offset_ns"] for row in rows if row["rank"] == ref and row["offset_ns"] is not None), 0)
    for row in rows:
        if row["offset_ns"] is None:
            continue
        row["offset_ns"] -= base
        if same_host:
            row["status"] = "same-host"
            continue
        if abs(row["offset_ns"]) < config.min_offset_ns:
            continue
        if row["mad_ns"] <= config.max_mad_fraction * abs(row["offset_ns"]):
            row["status"], row["applied"] = "corrected", True
            applied[row["rank"]] = row["offset_ns"]
        else:
            row["status"] = "uncorrectable"
    method = "estimated" if rows and any(r["offset_ns"] is not None for r in rows) else "none"
    if same_host:
        method = "same-host"
    return {"method": method, "reference_rank": ref, "ranks": rows}, applied


def log_to_trace_shift(log_times: np.ndarray, trace_lo: int | None, trace_hi: int | None,
                       base_time_ns: int | None) -> tuple[int, str]:
    """Shift to add to comms-log times to land them on the trace clock, and how it was found."""
    if log_times.size == 0 or trace_lo is None or trace_hi is None:
        return 0, "unaligned"
    lo, hi = float(np.min(log_times)), float(np.max(log_times))
    slack = max(trace_hi - trace_lo, 1) + 60_000_000_000  # a minute around the trace

    def overlaps(shift: float) -> bool:
        return lo + shift <= trace_hi + slack and hi + shift >= trace_lo - slack

    if overlaps(0):
        return 0, "same-clock"
    if base_time_ns and overlaps(-base_time_ns):
        return -int(base_time_ns), "base_time"
    return 0, "unaligned"
