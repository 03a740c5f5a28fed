"""Host stalls: time in a step when the training process feeds nothing to its device (DESIGN §3).

A stall is recognised by what the trace shows, not by labels:
- on GPU traces, time when **no device work is queued** (every kernel launched so far has finished:
  the union of [launch, kernel end] over kernels, memcpys and memsets leaves it uncovered) while the
  host is **in a gap** (no host op, runtime call or communication call of the process running) or
  **loading data** (PyTorch's own `enumerate(DataLoader)#...` ranges, written for every job);
- on CPU traces (no device: the host is the device), time when no op runs on the host — ops inside
  a data-loading range are work, its empty parts count as data loading — and the rank is not
  inside a collective or p2p (waiting for peers is not the host's fault).
A user's `record_function` label (any name, e.g. `my_fetch`: see
parse/classify.py `is_label`) is no host activity by itself — only the ops inside it are — so a sleep
or a fetch inside a label is a gap like one with no label. A label only adds evidence: the labels the
stall time falls in (`stall_labels`), and the one covering most of it is named in the summary.
Gaps shorter than MIN_GAP_NS are per-op dispatch overhead, not a stall (data loading on GPU traces
counts whole). A step is only looked at inside the profiler's own span (`_recorded_span`: its
`PyTorch Profiler` event): an annotation that outlives the recording (HTA's triton example: a 13.3 s
ProfilerStep in a 355 ms profile ending 1.7 ms after the step began) is no 13 s stall.

A rank without steps is looked at over the breakdown's one window as one step (derive/activity.py
`stepless_window`: a GPU rank's first to last device event, a CPU rank's first to last event); a rank with no
host op recorded (a file of device events only) has no host gaps to measure.

Per rank: stall time per step, how much of it is data loading, the longest gap. A rank whose stall
recurs — at least STALL_WARNING of the step in every profiled step (the smallest per-step share:
data loading, syncs and sleeps come back each step, a one-off hiccup such as a preempted process
does not) — gets an `idle_host_bound` finding (critical from STALL_CRITICAL, info from STALL_INFO);
the estimated saving is the mean stall time per step (the device would have had work; an upper
bound, since the data must still be produced somewhere). Host gaps on CPU-only ranks that share one
host's cores carry a caveat (`caveat`: a preempted process leaves the same gaps), never a cap. Ranks that
stall alike (`group_alike`: at least ALIKE_MIN_RANKS, or every rank of the run, same severity, cause, label
and device, within ALIKE_SPREAD) are one finding listing them, each rank's numbers in its evidence (`per_rank`).

Section `host_stalls`:
    {"ranks": [{"rank", "steps", "step_ns", "stall_ns", "data_load_ns", "gap_ns", "longest_gap_ns",
                "stall_fraction", "recurring_fraction", "step_fractions": [..], "device": "gpu" | "cpu",
                "data_load_sources": [..],
                "stall_labels": {label: ns}}],          # *_ns: means per step; labels: evidence only
     "thresholds": {"min_gap_ns", "info", "warning", "critical"}}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from tracekit.derive import intervals as iv
from tracekit.derive.activity import SteplessResult, windows_of
from tracekit.derive.host_gaps import MIN_GAP_NS, HostEvents, host_events, long_gaps, np_of as _np, str_is as _str_is
from tracekit.derive.matching import host_count
from tracekit.findings.evidence import HostStallEvidence
from tracekit.findings.finding import SHARED_HOST_CAVEAT, Finding, FindingKind, Severity, severity_by_share
from tracekit.findings.result import AnalyzerResult
from tracekit.tables.store import RunStore

STALL_INFO = 0.05
STALL_WARNING = 0.10
STALL_CRITICAL = 0.30
"""Stall time / step time for an info, warning and critical finding."""

DATA_LOADER_PREFIX = "enumerate(DataLoader)"
"""Only to name where data-loading time came from (evidence); the parser's role decides what it is."""


EVENT_COLUMNS = ["name", "cat", "ts", "dur", "role", "lane", "correlation"]
"""The events columns a rank's stalls need: read once for `host_events`, `_device_queued` and `_recorded_span`."""


def _device_queued(store: RunStore, rank: int, events: pa.Table | None = None) -> iv.IntervalSet | None:
    """Union of [launch, end] over the rank's device work; None on a trace without device work."""
    ks = store.rank_table("kernels", rank, ["ts", "dur", "correlation"])
    kd = _np(ks["dur"], -1)
    ok = kd >= 0
    if not ok.any():
        return None
    kts, kcorr = _np(ks["ts"])[ok], _np(ks["correlation"], -1)[ok]
    ev = events if events is not None else store.rank_table("events", rank, ["cat", "ts", "correlation"])
    rt = _str_is(ev["cat"], ("cuda_runtime", "hip_runtime")) & _np(ev["correlation"].is_valid(), False).astype(bool)
    lcorr, lts = _np(ev["correlation"], -1)[rt], _np(ev["ts"])[rt]
    order = np.argsort(lcorr, kind="stable")
    lcorr, lts = lcorr[order], lts[order]
    starts = kts
    if len(lcorr):  # a kernel is queued from its launch (same correlation id) on
        i = np.clip(np.searchsorted(lcorr, kcorr), 0, len(lcorr) - 1)
        starts = np.where((kcorr >= 0) & (lcorr[i] == kcorr), np.minimum(lts[i], kts), kts)
    return iv.union(starts, kts + kd[ok])


def _recorded_span(store: RunStore, rank: int, events: pa.Table | None = None) -> tuple[int, int]:
    """[start, end] of the profiler's own span on the rank (its `PyTorch Profiler` trace event, cat
    `trace`), unbounded when the trace has none: time outside it was not recorded."""
    t = events if events is not None else store.rank_table("events", rank, ["ts", "dur", "cat"])
    dur = _np(t["dur"], -1)
    keep = (dur >= 0) & _str_is(t["cat"], ("trace", "Trace"))
    if not keep.any():
        return np.iinfo(np.int64).min, np.iinfo(np.int64).max
    ts = _np(t["ts"])[keep]
    return int(ts.min()), int((ts + dur[keep]).max())


def _comm_busy(store: RunStore, rank: int) -> iv.IntervalSet:
    t = store.rank_table("collectives", rank, ["ts", "dur", "enqueue_ts", "enqueue_dur"])
    sets = []
    for a, d in (("ts", "dur"), ("enqueue_ts", "enqueue_dur")):
        ts, du = _np(t[a]), _np(t[d], -1)
        ok = _np(t[a].is_valid(), False).astype(bool) & (du >= 0)
        sets.append(iv.union(ts[ok], ts[ok] + du[ok]))
    return iv.merge(*sets)


def _step_stall(host: HostEvents, queued: iv.IntervalSet | None, comm: iv.IntervalSet | None, lo: int, hi: int
                ) -> tuple[iv.IntervalSet, iv.IntervalSet]:
    """(stall, its part in host gaps) of the step [lo, hi)."""
    gaps = long_gaps(host.act, lo, hi)
    if queued is not None:  # GPU: gaps and data loading while the device has nothing queued
        stall = iv.subtract(iv.merge(gaps, iv.clip(host.loading, lo, hi)), queued)
    else:  # CPU: gaps with no op running, outside collectives (waiting for peers)
        stall = iv.subtract(gaps, comm)
    return stall, iv.intersect(stall, gaps)


def rank_stalls(store: RunStore, rank: int, window: tuple[int, int] | None = None) -> dict[str, Any] | None:
    """Stall totals of one rank over its profiled steps, or over `window` (a rank without steps: the breakdown's
    one window, derive/activity.py `stepless_window`) as one step; None without either."""
    steps = [s for s in store.rank_table("steps", rank, ["ts", "dur"]).to_pylist() if s["dur"]]
    if not steps and window is not None:
        steps = [{"ts": window[0], "dur": window[1] - window[0]}]
    if not steps:
        return None
    events = store.rank_table("events", rank, EVENT_COLUMNS)
    host = host_events(store, rank, events)
    if not host.act[0].size and not host.loading[0].size:
        return None  # no host op recorded (a trace of device events only): its gaps are not the host's
    queued = _device_queued(store, rank, events)
    comm = _comm_busy(store, rank) if queued is None else None
    seen_lo, seen_hi = _recorded_span(store, rank, events)
    del events
    tot = {"step_ns": 0, "stall_ns": 0, "data_load_ns": 0, "gap_ns": 0, "longest_gap_ns": 0}
    in_labels = dict.fromkeys(host.labels, 0)
    # every label's intervals at once, with the label each belongs to: a step's stall is measured against
    # all of them in one pass (the overlap of two disjoint sets is the same from either side)
    label_names = list(host.labels)
    label_of = np.repeat(np.arange(len(label_names)), [host.labels[n][0].size for n in label_names])
    label_lo = np.concatenate([host.labels[n][0] for n in label_names]) if label_names else iv.empty()[0]
    label_hi = np.concatenate([host.labels[n][1] for n in label_names]) if label_names else iv.empty()[1]
    per_step = []
    for s in steps:
        # a step annotation reaching past everything the profiler recorded (a 13 s ProfilerStep around
        # a 1.5 ms trace) holds no observed time there: the window ends with the rank's last record
        lo, hi = max(s["ts"], seen_lo), min(s["ts"] + s["dur"], seen_hi)
        if hi <= lo:
            continue
        stall, gap_part = _step_stall(host, queued, comm, lo, hi)
        tot["step_ns"] += hi - lo
        tot["stall_ns"] += iv.total(stall)
        per_step.append(iv.total(stall) / max(hi - lo, 1))
        tot["data_load_ns"] += iv.overlap(stall, host.loading)
        tot["gap_ns"] += iv.total(gap_part)
        if len(gap_part[0]):
            tot["longest_gap_ns"] = max(tot["longest_gap_ns"], int(np.max(gap_part[1] - gap_part[0])))
        if label_names and len(stall[0]):
            per_label = np.zeros(len(label_names), np.int64)
            np.add.at(per_label, label_of, iv.covered(stall, label_lo, label_hi))
            for name, ns in zip(label_names, per_label.tolist()):
                in_labels[name] += ns
    n = len(per_step)
    if n == 0:
        return None
    out = {k: int(v // n) if k != "longest_gap_ns" else int(v) for k, v in tot.items()}
    out.update(rank=rank, steps=n, device="gpu" if queued is not None else "cpu",
               stall_fraction=tot["stall_ns"] / tot["step_ns"] if tot["step_ns"] else 0.0,
               recurring_fraction=min(per_step), step_fractions=per_step,
               data_load_sources=sorted({_source(nm) for nm in host.data_names}),
               stall_labels=_by_coverage(in_labels, host.labels, n))
    return out


def _by_coverage(in_labels: dict[str, int], labels: dict[str, iv.IntervalSet], n: int) -> dict[str, int]:
    """Labels holding stall time, most first (innermost first among equals: a label nested in another)."""
    order = sorted((k for k, v in in_labels.items() if v), key=lambda k: (-in_labels[k], iv.total(labels[k]), k))
    return {k: int(in_labels[k] // n) for k in order}


def _source(name: str) -> str:
    return "DataLoader" if name.startswith(DATA_LOADER_PREFIX) else "label"


def _severity(frac: float) -> Severity | None:
    return severity_by_share(frac, STALL_INFO, STALL_WARNING, STALL_CRITICAL)


def _what(r: dict[str, Any]) -> tuple[bool, str | None, str]:
    """(the stall is mostly data loading, the label holding most of it if most, where the device stands)."""
    loading = r["data_load_ns"] >= r["stall_ns"] / 2
    label = next(iter(r["stall_labels"]), None)  # evidence: the label holding most of the stall, if most
    if label is not None and 2 * r["stall_labels"][label] < r["stall_ns"]:
        label = None
    where = ("with no device work queued" if r["device"] == "gpu"
             else "(no op running, no collective in flight)")
    return loading, label, where


def _finding(r: dict[str, Any], shared_host: bool) -> Finding | None:
    """`shared_host`: several CPU-only ranks on one host's cores (a host gap there may be preemption:
    a caveat on the cause, never a lower severity)."""
    sev = _severity(r["recurring_fraction"])
    if sev is None:
        return None
    loading, label, where = _what(r)
    what = ("loading data" if loading else "in host gaps") + (f" inside the label {label!r}" if label else "")
    summary = (f"rank {r['rank']} stalls {r['stall_ns'] / 1e6:.1f} ms per step ({r['stall_fraction']:.0%} of the "
               f"step) {what} {where}")
    rec = ("Feed the device ahead of time: more DataLoader workers, pin_memory and prefetch_factor, or move "
           "preprocessing off the training loop." if loading else
           "Find what the training thread waits for between ops (host syncs such as .item()/.cpu(), "
           "logging, checkpointing, garbage collection, sleeps) and move it off the step or overlap it.")
    ev = {k: r[k] for k in ("stall_ns", "data_load_ns", "gap_ns", "longest_gap_ns", "step_ns", "stall_fraction",
                            "recurring_fraction", "step_fractions", "device", "data_load_sources",
                            "stall_labels")}
    ev["cause"] = "data_load" if loading else "host_gap"
    if shared_host and r["device"] == "cpu" and not loading:
        ev["caveat"] = SHARED_HOST_CAVEAT
    return Finding(kind=FindingKind.IDLE_HOST_BOUND, severity=sev, summary=summary, ranks=(r["rank"],),
                   dim=None, evidence=HostStallEvidence.of(ev), recommendation=rec, est_saving_ns=int(r["stall_ns"]))


ALIKE_MIN_RANKS = 4
"""At least this many ranks that stall alike get one finding naming them all (`group_alike`), not one each:
a reader compares two or three findings side by side, while a thousand ranks of one job stalling the same
way are one fact (one cause, one fix on all of them), and a list of them buries the rank that is different.
Fewer ranks group too when they are every rank of the run: no peer without the stall sets a pace for one
rank's fix, so fixing one alone saves nothing and only the fix on all of them shows the cost."""
ALIKE_SPREAD = 0.10
"""Ranks stall alike when their stall per step is within this share above the smallest of them (same
severity, cause, label and device): a rank stalling more than that stands apart, with its own finding."""


def group_alike(findings: list[Finding], rows: dict[int, dict[str, Any]]) -> list[Finding]:
    """`findings` (one per rank) with each set of at least ALIKE_MIN_RANKS ranks that stall alike
    (ALIKE_SPREAD) replaced by one finding listing them (`_group_finding`): its fix is the stall removed on
    every one of them, replayed together (what fixing the cause saves: ranks that stall alike and meet at
    collectives wait for each other, so fixing one of them alone saves nothing). Order: as `findings`, each
    group where its first rank's finding was."""
    keys: dict[tuple, list[int]] = {}
    for i, f in enumerate(findings):
        loading, label, _ = _what(rows[f.ranks[0]])
        key = (f.severity, loading, label, f.evidence.details.get("device"), f.evidence.details.get("caveat"))
        keys.setdefault(key, []).append(i)
    group_of: dict[int, list[int]] = {}
    for idx in keys.values():
        idx = sorted(idx, key=lambda i: (findings[i].evidence.stall_ns, findings[i].ranks[0]))
        a = 0
        while a < len(idx):
            lo = findings[idx[a]].evidence.stall_ns
            b = a
            while b < len(idx) and findings[idx[b]].evidence.stall_ns <= lo + ALIKE_SPREAD * lo:
                b += 1
            if b - a >= ALIKE_MIN_RANKS or b - a == len(rows) > 1:
                members = sorted(idx[a:b])
                group_of[members[0]] = members
                group_of.update({i: [] for i in members[1:]})
            a = b
    out = []
    for i, f in enumerate(findings):
        members = group_of.get(i)
        if members is None:
            out.append(f)
        elif members:
            out.append(_group_finding([findings[j] for j in members], [rows[findings[j].ranks[0]] for j in members]))
    return out


def _group_finding(members: list[Finding], rows: list[dict[str, Any]]) -> Finding:
    """One finding for ranks that stall alike: the evidence of the rank stalling most (`representative_rank`)
    and each rank's numbers (`per_rank`); the closed-form saving is the longest stall (they stall side by
    side: removing every one saves at most that)."""
    top = max(range(len(rows)), key=lambda i: (rows[i]["stall_ns"], -rows[i]["rank"]))
    f, r = members[top], rows[top]
    ranks = tuple(sorted(int(x["rank"]) for x in rows))
    loading, label, where = _what(r)
    what = ("loading data" if loading else "in host gaps") + (f" inside the label {label!r}" if label else "")
    lo, hi = min(x["stall_ns"] for x in rows) / 1e6, r["stall_ns"] / 1e6
    flo, fhi = min(x["stall_fraction"] for x in rows), max(x["stall_fraction"] for x in rows)
    size = f"{hi:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f}"
    share = f"{fhi:.0%}" if f"{flo:.0%}" == f"{fhi:.0%}" else f"{flo:.0%}-{fhi:.0%}"
    shown = ", ".join(map(str, ranks[:8])) + (f", ... ({len(ranks)} ranks)" if len(ranks) > 8 else "")
    summary = (f"{len(ranks)} ranks stall alike, {size} ms per step ({share} of the step) each, {what} {where}: "
               f"ranks {shown}")
    per_rank = [{k: x[k] for k in ("rank", "stall_ns", "data_load_ns", "gap_ns", "longest_gap_ns", "step_ns",
                                   "stall_fraction", "recurring_fraction")} for x in sorted(rows, key=lambda x: x["rank"])]
    ev = dataclasses.replace(f.evidence, details={**f.evidence.details, "representative_rank": int(r["rank"]),
                                                  "alike_ranks": len(ranks), "per_rank": per_rank})
    return dataclasses.replace(f, ranks=ranks, summary=summary, evidence=ev)


@dataclass(frozen=True)
class HostStallsResult(AnalyzerResult):
    pass


def analyze_host_stalls(store: RunStore, stepless: SteplessResult | None = None) -> HostStallsResult:
    """Section `host_stalls` and `idle_host_bound` findings (a rank without steps over the breakdown's one
    window, `stepless`'s)."""
    windows = windows_of(store, stepless)
    ranks = [r for r in (rank_stalls(store, rank, windows.get(rank)) for rank in store.ranks()) if r is not None]
    shared_host = len(ranks) > 1 and host_count(store) == 1
    findings = [f for f in (_finding(r, shared_host) for r in ranks) if f is not None]
    findings = group_alike(findings, {r["rank"]: r for r in ranks})
    section = {"ranks": ranks, "thresholds": {"min_gap_ns": MIN_GAP_NS, "info": STALL_INFO,
                                              "warning": STALL_WARNING, "critical": STALL_CRITICAL}}
    return HostStallsResult(findings=findings, section=section)
