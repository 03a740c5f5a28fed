"""Straggler ranks: who arrives last at collectives, how often, by how much, and why (when visible).

Reads the matched instances (matching.py). A rank's delay is the sum, over instances it arrived
last at, of how long the group waited for it beyond the second-to-last member (counted from the end
of the group's previous collective, at most its extra gap since its own: matching's `_late_delay`), per step. A `straggler` finding needs the delay to be a real
share of the step (`min_delay_fraction`) and to dominate the other ranks' (`min_dominance`) —
on a noisy shared box every rank is sometimes last; a straggler is last far more than the rest.
Warning/critical need a large delay (25%/50% of the step) and either counted extra work (a
"compute" cause with more ops than its peers) or strong dominance and being last at
most of its collectives (`last_chance` reports the share expected by chance, 1/group size): on the 2-core box a clean run's slowest rank routinely holds the group
back 10-20% of the step (CPU contention), and that is reported as info. No severity cap for a shared
host: a rank that holds its peers back is a straggler whatever the cause, with its measured delay
as the saving; when every rank shares one host a cause that is not counted work (host idle, contention,
unknown, longer compute on no more ops) carries a caveat (`caveat`: CPU cores shared by several ranks can
make a rank late too), never a lower severity. Two causes are measured on the rank itself rather than timed
against the noise: "data_load" (PyTorch's own DataLoader ranges on it) and "uneven_work" (counted
FLOPs/tokens) need no last-share and warn from 10% of the step. Where every rank's arrivals are device times (GPU traces:
the collective kernel's start, `device_timed` in the section) the host's noise is absorbed by the host
running ahead of the device: warning from 10% of the step at 2x dominance, last at over half of its
collectives (`device_warning_*`). Dominance is over a rank's peers (ranks it meets in a collective) that
are not late with it (`late_with`: the ranks of one slow replica arrive together and take turns being
last; `last_share_with` counts their turns as one).

Cause, where the trace shows it: in the interval before each late arrival (since the rank's previous
collective ended, or its step's start for its first one — a rank without steps: its breakdown window's start;
an arrival with no such interval, queued behind its own previous collective, is not
examined: its delay is the previous one's), compare the straggler with the other members of the instance:
longer compute →
"compute" (also when it runs more ops than its peers and compute plus idle gaps explain the
delay), longer data loading (events.role data_load: PyTorch's own `enumerate(DataLoader)#...`, written
for every job) → "data_load", more host time with no activity → "host_idle" (a user's
`record_function` label — whatever its name — is no activity: a sleep
inside one is host idle as with no label; the label is evidence only: `idle_labels`, the rank's idle
time inside each label before its late arrivals beyond its peers' idle in the same label, the label
named in the cause text when that excess is at least half of the delay examined; when nothing sets the
rank apart, "unknown", said "host-side, cause not visible in the trace"); "uneven_work" when it runs about as many ops as its peers but on more data (FLOPs, or
tokens its MoE router assigned, ≥ 1.25× the peers' median: counts, which CPU contention cannot fake);
"contention" when longer compute and idle come with about as many ops as its
peers and even its size-free ops (views, transposes) run slower — the host is slow (a
descheduled process stretches ops and leaves gaps), not the work bigger — or when longer compute
comes with the same ops and the same counted work (FLOPs or routed tokens); otherwise "unknown".
The excess must explain at least half of the delay.

Section `stragglers`:
    {"steps_counted": int, "mean_step_ns": int,
     "excluded": {"outside_steps", "warmup_step", "outside_profiled_steps"},
     "ranks": [{"rank", "instances", "last_count", "last_share", "last_chance", "delay_ns_per_step",
                "delay_fraction", "dominance", "by_dim": {dim: delay_ns_per_step},
                "late_with": [rank] (only when some), "last_share_with" (idem)}],
     "stragglers": [{"rank", "cause": "compute|uneven_work|contention|data_load|host_idle|unknown",
                     "cause_evidence": {"compute_excess_ns", "data_load_excess_ns", "host_idle_excess_ns",
                     "idle_labels": {label: ns}, "delay_ns", "instances_examined", "op_count_ratio", "shape_free_op_slowdown",
                     "work_ratio", "work_measure": "flops|routed_tokens|gemm_shape_flops|null",
                     "owed_wait_ns_per_step", "owed_wait_by_rank": {rank: ns}}}],   # breakdown.owed_wait
     "thresholds": {...}}
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analyze.breakdown import BreakdownResult, breakdown_ranks
from tracekit.derive import intervals as iv
from tracekit.derive.activity import RankActivities, activities_of, stepless_windows
from tracekit.derive.host_gaps import str_is
from tracekit.derive.matching import MatchedCollectives, MatchingResult, matched_of, row_trace_shift
from tracekit.findings.evidence import StragglerEvidence
from tracekit.findings.finding import SHARED_HOST_CAVEAT, Finding, FindingKind, Severity
from tracekit.findings.result import AnalyzerResult
from tracekit.parse.classify import label_rows
from tracekit.parse.op_shapes import gemm_cost, load_json, tensors
from tracekit.tables.columns import unique_pairs
from tracekit.tables.store import RunStore

if TYPE_CHECKING:  # pandas is imported where matched instances exist (a run without any never needs it)
    import pandas as pd


@dataclass(frozen=True, kw_only=True)
class StragglerConfig:
    """Thresholds, set from measurements on the 2-core box (see tests/analyze/test_runtime_e2e.py):
    clean 2-rank runs there show a "natural" straggler holding the group back 9-21% of the step
    (outliers 43% and 69% at load average 12), slow factors 1.5/2/3 give 41%/58-61%/81%."""

    min_delay_fraction: float = 0.05
    """Delay per step, as a fraction of the step, to report a straggler at all (info)."""
    warning_delay_fraction: float = 0.25
    """... for a warning (with `warning_dominance` and `warning_last_share`)."""
    critical_delay_fraction: float = 0.50
    """... for a critical finding."""
    min_dominance: float = 2.0
    """The straggler's delay must be at least this many times the next rank's to be reported."""
    warning_dominance: float = 3.0
    """... and this many times for a warning."""
    warning_last_share: float = 0.75
    """A warning also needs the rank to be last at this share of its collectives."""
    min_instances: int = 3
    """Fewest instances a rank must have been last at (or all of its instances, at least two)."""
    max_cause_instances: int = 200
    """Late instances examined for the cause (the largest delays first)."""
    cause_min_explained: float = 0.5
    """A cause must explain at least this fraction of the examined delay."""
    more_work_ratio: float = 1.1
    """Longer compute with fewer than this many times the peers' ops ..."""
    uneven_work_ratio: float = 1.25
    """Same ops (op count ratio below `more_work_ratio`) with at least this many times the peers' FLOPs
    or routed tokens is "uneven_work" (longer sequences, a bigger shard)."""
    uneven_work_warning_delay_fraction: float = 0.10
    """Warning threshold for an "uneven_work" or "data_load" straggler: the work excess is counted and the
    loading measured on the rank, not timed against its peers, so the box's timing noise floor
    (`warning_delay_fraction`) does not apply, nor does `warning_last_share`."""
    device_warning_delay_fraction: float = 0.10
    """Warning threshold where every rank's arrivals are device times (GPU traces: the collective
    kernel's start). There the host's timing noise (a descheduled process on a shared CPU box) is
    absorbed by the host running ahead of the device, so `warning_delay_fraction`'s noise floor does
    not apply: a GPU that makes its peers wait 10% of every step is worth a warning on a cluster."""
    device_warning_last_share: float = 0.5
    """... and being last at most (over half) of its collectives, with its `late_with` peers (ranks of
    one slow replica take turns being last): `warning_last_share` guards against the box's noise."""
    device_warning_dominance: float = 2.0
    """... with this dominance (the `min_dominance` of any report): a slow GPU's own group peers wait
    for it and then arrive late at their other groups' collectives, so the runner-up carries a
    propagated share of the same delay and 3x dominance would miss the cause it propagates from."""
    contention_slowdown: float = 1.5
    """... whose size-independent ops (views, transposes) also run this many times slower is
    "contention" (same work, slower host); with normal-speed views it is bigger work ("compute")."""


def _steps_and_step_ns(ranks: list[dict[str, Any]], matched: MatchedCollectives) -> tuple[int, int]:
    tot_ns = sum(r["step_ns"] for r in ranks)
    tot_steps = sum(r["steps"] for r in ranks)
    mean_step = int(tot_ns / tot_steps) if tot_steps else 0
    steps = matched.instances["step"].dropna().nunique()
    if steps == 0:
        steps = max((r["steps"] for r in ranks), default=1) or 1
    if mean_step == 0 and steps:
        import pandas as pd

        span = matched.instances["last_end"].max() - matched.instances["first"].min()
        mean_step = int(span / steps) if pd.notna(span) else 0
    return int(steps), mean_step


def _in_step_instances(matched: MatchedCollectives, profiled: set[int]
                       ) -> tuple[MatchedCollectives, dict[str, int]]:
    """Keep instances inside the analyzed steps. When the source numbers steps: those of the profiled
    steps (the `steps` table) if any match — the window the user chose, past warm-up, where the
    trace can explain a delay — else every numbered step but the first (warm-up: lazy init,
    first-call costs) when there are at least three. Set-up and tear-down calls (no step) never count."""
    inst = matched.instances
    steps = inst["step"].dropna()
    if steps.empty:
        return matched, {"outside_steps": 0, "warmup_step": 0, "outside_profiled_steps": 0}
    keep = inst["step"].notna()
    outside = int((~keep).sum())
    warm = unprofiled = 0
    distinct = sorted(steps.unique())
    in_profiled = inst["step"].isin(sorted(profiled))
    if profiled and in_profiled.any():
        unprofiled = int((keep & ~in_profiled).sum())
        keep &= in_profiled
    elif len(distinct) >= 3:
        first = inst["step"] == distinct[0]
        warm = int(first.sum())
        keep &= ~first
    kept = inst[keep]
    rows = matched.rows[matched.rows["key"].isin(kept["key"])]
    return (MatchedCollectives(rows=rows, instances=kept, trace_shift=matched.trace_shift,
                               wait_intervals=matched.wait_intervals, gpu_ranks=matched.gpu_ranks,
                               wait_by_peer=matched.wait_by_peer),
            {"outside_steps": outside, "warmup_step": warm, "outside_profiled_steps": unprofiled})


@dataclass(frozen=True)
class _HostEvents:
    """One rank's host rows with a duration (no stream), as arrays: their spans, which are labels (with the
    labels' names as text), data loading, and the host's own activity (ops and runtime calls, not annotations)."""

    ts: np.ndarray
    end: np.ndarray
    label: np.ndarray
    label_names: np.ndarray
    data_load: np.ndarray
    own: np.ndarray


def _host_events(store: RunStore, rank: int) -> _HostEvents:
    ev = store.rank_table("events", rank, ["name", "cat", "role", "ts", "dur", "stream"])
    ev = ev.filter(pc.and_(pc.is_valid(ev["dur"]), pc.is_null(ev["stream"])))
    ts = ev["ts"].to_numpy().astype(np.int64, copy=False)
    end = ts + ev["dur"].to_numpy().astype(np.int64, copy=False)
    label = label_rows(ev["cat"], ev["role"])
    data_load = str_is(ev["role"], ("data_load",))
    own = ~label & ~str_is(ev["role"], ("step_annotation", "data_load")) & ~str_is(ev["cat"], ("trace",))
    names = pc.fill_null(ev["name"].filter(pa.array(label)).cast(pa.string()), "nan")  # as pandas wrote a null
    return _HostEvents(ts, end, label, names.to_numpy(zero_copy_only=False).astype(object), data_load, own)


def _trace_shift(rows: pd.DataFrame, matched: MatchedCollectives) -> tuple[np.ndarray, np.ndarray]:
    """matching.row_trace_shift of matched rows: (shift to each row's trace clock, known)."""
    return row_trace_shift(rows["rank"].to_numpy(np.int64), rows["source"].to_numpy(object), matched.trace_shift)


def _previous_ends(rows: pd.DataFrame, ranks: list[int], matched: MatchedCollectives,
                   step_starts: dict[int, np.ndarray] | None = None) -> dict[int, dict[str, int | None]]:
    """rank -> key -> end of the rank's previous collective before that arrival, on its trace clock; for a
    rank's first collective in the window (none before it was recorded), the start of its step holding
    the arrival (`step_starts`: each rank's sorted step starts, trace clock), where known."""
    step_starts = step_starts or {}
    # previous end of each rank's collectives, raw clock: interval before arrival
    allrows = rows[rows["rank"].isin(ranks)].sort_values(["rank", "arrival_raw"])
    prev_end_map: dict[int, dict[str, int | None]] = {}
    for r, grp in allrows.groupby("rank"):
        own = prev_end_map[int(r)] = {}
        # on the trace clock (log and Kineto rows of one rank then order correctly)
        shift, _ = _trace_shift(grp, matched)
        arr = grp["arrival_raw"].to_numpy(dtype=np.int64) + shift
        # end − arrival is exact (Int64); unknown ends never count as a previous end
        lo = np.iinfo(np.int64).min
        ends = ((grp["end"].astype("Int64") - grp["arrival"]).to_numpy(dtype="int64", na_value=0)
                + arr)
        ends[grp["end"].isna().to_numpy()] = lo
        order = np.argsort(arr, kind="stable")
        keys = np.asarray(grp["key"].tolist(), dtype=object)[order]
        arr, ends = arr[order], ends[order]
        prev = np.concatenate(([lo], np.maximum.accumulate(ends)[:-1]))
        # A previous collective still in flight at this arrival (gloo runs an async all-reduce on its own
        # thread and ends it after the rank has moved on: DDP's bucket all-reduce ended 57 us after the
        # same rank's next arrival) leaves the rank no time before the arrival: an empty window, which
        # counts (no compute, loading or idle there), where dropping the rank left a 2-rank instance with
        # no peer to compare the late rank with and the cause "unknown".
        starts = step_starts.get(int(r), np.zeros(0, np.int64))
        for k, a, p in zip(keys.tolist(), arr.tolist(), prev.tolist()):
            if p == lo:  # no collective before it: its step's start (DDP's one bucket a step, 2 steps profiled)
                i = int(np.searchsorted(starts, a, side="right")) - 1
                p = int(starts[i]) if i >= 0 else lo
            own[k] = int(min(p, a)) if lo < p else None
    return prev_end_map


def _step_starts(store: RunStore, ranks: list[int], activity: RankActivities) -> dict[int, np.ndarray]:
    """Each rank's step starts (trace clock), sorted: its profiled steps' (the steps table), or on a rank without
    step rows the start of the breakdown's one window for it (derive/activity.py `stepless_window`: a GPU rank's
    first device event, a CPU rank's first event), so the first collective of a trace without ProfilerStep is
    examined from its window's start as a profiled step's is from the step's."""
    t = store.table("steps", ["rank", "ts"]).to_pandas()
    t = t[t["rank"].isin(ranks) & t["ts"].notna()]
    starts = {int(r): np.sort(g["ts"].to_numpy(np.int64)) for r, g in t.groupby("rank")}
    for r, (lo, _) in stepless_windows(store, activity, [r for r in ranks if int(r) not in starts]).items():
        starts[r] = np.array([lo], np.int64)
    return starts


@dataclass(frozen=True)
class _Busy:
    """One rank's activity, its data-loading intervals (PyTorch's DataLoader ranges), all its busy time,
    and the idle part of each of its labels (evidence only)."""

    act: Any
    data_load: iv.IntervalSet
    busy: iv.IntervalSet
    """Device work, and on a GPU rank also its host's activity (ops and runtime calls on any thread): a
    device idle while its host launches (an autograd thread running the backward) is no host idle."""
    idle_labels: dict[str, iv.IntervalSet]
    device_busy: iv.IntervalSet = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    """Device work only (equal to `busy` on a CPU rank)."""


def _rank_busy(store: RunStore, activity: RankActivities, ranks: list[int],
               seen: dict[int, _Busy] | None = None) -> dict[int, _Busy]:
    """Per rank of `ranks`: its `_Busy` (those in `seen` taken from it, the others added to it: each rank's
    events are read once however many stragglers meet it)."""
    seen = {} if seen is None else seen
    out = {}
    for r in ranks:
        if r in seen:
            out[r] = seen[r]
            continue
        act = activity.get(r)
        ev = _host_events(store, r)

        def spans(rows: np.ndarray) -> iv.IntervalSet:
            return iv.union(ev.ts[rows], ev.end[rows])
        device = busy = iv.merge(act.compute, act.comm, act.other)
        if act.trace_kind == "gpu":  # the host's own activity: ops and runtime calls, not annotations
            busy = iv.merge(device, spans(ev.own))
        idle = _idle_by_name(ev.label_names, ev.ts[ev.label], ev.end[ev.label], busy)
        out[r] = seen[r] = _Busy(act, spans(ev.data_load), busy, idle, device)
    return out


def _idle_by_name(names: np.ndarray, ts: np.ndarray, end: np.ndarray, busy: iv.IntervalSet
                  ) -> dict[str, iv.IntervalSet]:
    """Per label name (as text, in sorted order): the part of its intervals (`ts`, `end`) outside `busy`. Grouped
    by one sort of the names (a pandas groupby cost a frame per name: tens of names on each of a thousand ranks)."""
    if names.size == 0:
        return {}
    uniq, code = np.unique(names, return_inverse=True)
    order = np.argsort(code, kind="stable")
    cuts = np.flatnonzero(np.r_[True, code[order][1:] != code[order][:-1], True])
    return {str(uniq[code[order[a]]]): iv.subtract(iv.union(ts[order[a:b]], end[order[a:b]]), busy)
            for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist())}


def _excess_before_arrivals(members: pd.DataFrame, late: pd.DataFrame, rank: int, matched: MatchedCollectives,
                            prev_end_map: dict[int, dict[str, int | None]], busy: dict[int, _Busy]
                            ) -> tuple[dict[str, float], int, int, dict[str, int]]:
    """The late rank's compute / data-load / idle time before each late arrival minus its peers'
    median, summed; with the delay of the instances examined, their count, and the late rank's idle
    time inside each of its labels there beyond its peers' (the median of their idle time inside the same
    label in their windows, 0 for a peer without it: a label every rank idles in the same way, DDP's forward
    on every rank, says nothing about why this rank is late). Each member's window
    (previous end to arrival) is measured against its rank's intervals in one vectorised pass per rank
    (not one pass per member per instance: a 1,024-rank run's groups have hundreds of members)."""
    excess = {"compute": 0.0, "data_load": 0.0, "host_idle": 0.0, "device_idle": 0.0}
    labelled = dict.fromkeys(busy[rank].idle_labels, 0) if rank in busy else {}
    examined = delay_examined = 0
    keys = members["key"].to_numpy(object)
    rks = members["rank"].to_numpy(np.int64)
    hi = members["arrival_raw"].to_numpy(dtype=np.int64) + _trace_shift(members, matched)[0]
    prev = [prev_end_map.get(r, {}).get(k) for r, k in zip(rks.tolist(), keys.tolist())]
    ok = np.array([p is not None for p in prev], bool)
    lo = np.array([0 if p is None else p for p in prev], np.int64)
    # per member: compute, data load, host idle, device idle in its window (`_Busy`); idle inside each of
    # the late rank's labels
    vals = np.zeros((rks.size, 4), np.int64)
    names = list(busy[rank].idle_labels) if rank in busy else []
    in_label = np.zeros((rks.size, len(names)), np.int64)
    for r in np.unique(rks[ok]).tolist():
        at = np.flatnonzero(ok & (rks == r))
        b, a, z = busy[r], lo[at], hi[at]
        span = z - a
        vals[at, 0] = iv.covered(b.act.compute, a, z)
        vals[at, 1] = iv.covered(b.data_load, a, z)
        vals[at, 2] = span - iv.covered(b.busy, a, z)
        vals[at, 3] = span - iv.covered(b.device_busy, a, z)
        for j, name in enumerate(names):
            spans = b.idle_labels.get(name)
            if spans is not None:
                in_label[at, j] = iv.covered(spans, a, z)
    first_delay = dict(zip(late["key"].tolist()[::-1], late["delay"].tolist()[::-1]))
    for key, grp in members.reset_index(drop=True).groupby("key"):
        # each rank's last member row of the instance (as a dict of rows by rank would keep)
        at = {int(rks[i]): i for i in grp.index.tolist() if ok[i]}
        if rank not in at or len(at) < 2:
            continue
        if hi[at[rank]] <= lo[at[rank]]:
            # no window: the rank reached this collective as its previous one ended (queued behind it on its
            # stream), so nothing before the arrival can say why it was late; the delay is the previous one's
            continue
        others = [i for r, i in at.items() if r != rank]
        med = np.median(vals[others], axis=0)
        mine = vals[at[rank]]
        for i, k in enumerate(("compute", "data_load", "host_idle", "device_idle")):
            excess[k] += int(mine[i]) - float(med[i])
        for j, name in enumerate(names):  # idle inside the label beyond its peers' in the same label
            labelled[name] += int(in_label[at[rank], j]) - int(np.median(in_label[others, j]))
        delay_examined += int(first_delay[key])
        examined += 1
    return excess, delay_examined, examined, {k: v for k, v in sorted(labelled.items(), key=lambda kv: -kv[1]) if v > 0}


def _attribute_cause(store: RunStore, activity: RankActivities, matched: MatchedCollectives, rank: int,
                     cfg: StragglerConfig, busy: dict[int, _Busy] | None = None,
                     counted: dict[tuple[str, int], Any] | None = None,
                     prev_ends: dict[int, dict[str, int | None]] | None = None) -> tuple[str, dict[str, Any]]:
    """The late rank's cause and its evidence. `busy`, `counted` and `prev_ends` (`_previous_ends`) hold what
    earlier stragglers' calls computed per rank: each rank's events and collectives are read once."""
    inst = matched.instances
    late = inst[inst["last_rank"] == rank].sort_values("delay", ascending=False).head(cfg.max_cause_instances)
    rows = matched.rows
    members = rows[rows["key"].isin(late["key"])]
    ranks = sorted(set(members["rank"].tolist()))
    if not _trace_shift(members, matched)[1].all():
        return "unknown", {"reason": "collective times are not on the trace clock for every member"}
    prev_ends = {} if prev_ends is None else prev_ends
    todo = [r for r in ranks if r not in prev_ends]
    if todo:
        prev_ends.update(_previous_ends(rows, todo, matched, _step_starts(store, todo, activity)))
    excess, delay_examined, examined, labelled = _excess_before_arrivals(
        members, late, rank, matched, prev_ends, _rank_busy(store, activity, ranks, busy))
    evidence = {"compute_excess_ns": int(excess["compute"]), "data_load_excess_ns": int(excess["data_load"]),
                "host_idle_excess_ns": int(excess["host_idle"]), "device_idle_excess_ns": int(excess["device_idle"]),
                "idle_labels": labelled,
                "delay_ns": int(delay_examined), "instances_examined": examined}
    if examined == 0 or delay_examined <= 0:
        return "unknown", evidence
    need = cfg.cause_min_explained * delay_examined
    if excess["data_load"] >= need:
        return "data_load", evidence
    return (_classify_excess(store, rank, [r for r in ranks if r != rank], excess, need, evidence, cfg, counted),
            evidence)


def _classify_excess(store: RunStore, rank: int, peers: list[int], excess: dict[str, float], need: float,
                     evidence: dict[str, Any], cfg: StragglerConfig,
                     counted: dict[tuple[str, int], Any] | None = None) -> str:
    """More work, or the same work on a slower host (CPU contention, throttling)? A descheduled
    process runs even its size-free ops slower and shows gaps between ops (host idle). Adds the
    counted measures to `evidence`. `counted`: each rank's measures found so far (`_per_rank`)."""
    counted = {} if counted is None else counted
    ratio = _op_count_ratio(store, rank, peers, counted)
    slowdown = _shape_free_op_slowdown(store, rank, peers, counted)
    evidence["op_count_ratio"] = ratio
    evidence["shape_free_op_slowdown"] = slowdown
    work, measure = _work_ratio(store, rank, peers, counted)
    evidence["work_ratio"] = work
    evidence["work_measure"] = measure
    same_ops = ratio is None or ratio < cfg.more_work_ratio
    if (same_ops and work is not None and work >= cfg.uneven_work_ratio and excess["compute"] > 0
            and excess["compute"] + excess["host_idle"] >= need):
        # the same ops on more data (longer sequences, more tokens): counted, not timed, so CPU
        # contention cannot fake it
        return "uneven_work"
    # a descheduled process stretches its ops too: idle alone, with no longer compute, is a host stall
    slow_host = (ratio is not None and ratio < cfg.more_work_ratio and slowdown is not None
                 and slowdown >= cfg.contention_slowdown and excess["compute"] > 0)
    if slow_host and excess["compute"] + excess["host_idle"] >= need:
        return "contention"
    # the same ops on the same counted work (FLOPs / routed tokens within `more_work_ratio`), yet
    # longer compute: the work is not bigger, the host or device runs it slower
    same_work = (ratio is not None and ratio < cfg.more_work_ratio and work is not None
                 and work < cfg.more_work_ratio)
    if same_work and excess["compute"] >= need and excess["compute"] >= excess["host_idle"]:
        evidence["counted_work_equal"] = True
        return "contention"
    more_work = ratio is not None and ratio >= cfg.more_work_ratio
    if more_work and excess["compute"] > 0 and excess["compute"] + excess["host_idle"] >= need:
        # it runs more ops than its peers: the extra work is the direct cause (on a busy host it
        # also stretches the gaps between ops)
        return "compute"
    best = max(("compute", "host_idle"), key=lambda k: excess[k])
    if excess[best] >= need:
        return best
    return "unknown"


# ops whose cost does not depend on tensor sizes: if even these run slower, the rank itself is slow
SHAPE_FREE_OPS = ("aten::as_strided", "aten::view", "aten::t", "aten::transpose", "aten::expand",
                  "aten::detach", "detach", "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze",
                  "aten::permute", "aten::_unsafe_view", "aten::alias", "aten::empty", "aten::empty_strided")


def _per_rank(counted: dict[tuple[str, int], Any] | None, name: str, fn: Callable[[int], Any]) -> Callable[[int], Any]:
    """`fn` (one rank's measure `name`, read from its tables) asked once per rank: each straggler candidate
    compares itself with the members of its late collectives, the same ranks again and again (a 1,024-rank
    run: every candidate read its peers' events anew)."""
    if counted is None:
        return fn

    def once(r: int) -> Any:
        key = (name, r)
        if key not in counted:
            counted[key] = fn(r)
        return counted[key]
    return once


def _analysed(store: RunStore, rank: int, step: pa.ChunkedArray, counted: dict[tuple[str, int], Any] | None
              ) -> pa.ChunkedArray:
    """Mask of a rank's rows (`step`: their step column) inside the steps it is analysed over: those with a
    step; on a rank without step rows, whose one window is the breakdown's (derive/activity.py: first to last
    device event, or event), every row, as the critical path's device-span step reads them (whatif/build.py
    SPAN_STEP). Counting only rows with a step found no op, FLOP or shape there."""
    unstepped = _per_rank(counted, "unstepped", lambda r: store.rank_table("steps", r, ["step"]).num_rows == 0)(rank)
    return pc.or_(pc.is_valid(step), pa.scalar(bool(unstepped)))


def _shape_free_op_slowdown(store: RunStore, rank: int, peers: list[int],
                            counted: dict[tuple[str, int], Any] | None = None) -> float | None:
    """Mean duration of the rank's size-independent ops / the peers' median of theirs. The mean, not
    the median: a descheduled process stretches a few random ops a lot (a heavy tail)."""
    def shape_free_mean(r: int) -> float | None:
        ev = store.rank_table("events", r, ["name", "cat", "dur", "step"])
        names = ev.column("name").cast("string")
        keep = pc.and_(pc.and_(pc.equal(ev["cat"].cast("string"), "cpu_op"), _analysed(store, r, ev["step"], counted)),
                       pc.is_in(names, value_set=pa.array(SHAPE_FREE_OPS)))
        durs = ev.filter(pc.fill_null(keep, False)).column("dur")
        return float(pc.mean(durs).as_py()) if len(durs) else None
    mean = _per_rank(counted, "shape_free_mean", shape_free_mean)
    mine = mean(rank)
    theirs = [m for m in (mean(p) for p in peers) if m]
    if mine is None or not theirs:
        return None
    return round(mine / float(np.median(theirs)), 3)


LEAF_GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
"""The GEMM ops that do the multiply (aten::linear and aten::matmul call them: counting those too would count
one GEMM twice)."""


def _work_ratio(store: RunStore, rank: int, peers: list[int],
                counted: dict[tuple[str, int], Any] | None = None) -> tuple[float | None, str | None]:
    """Load-independent work of the rank in its steps / the peers' median: the FLOPs of its ops when the
    profiler recorded them (with_flops), else the tokens its router assigned (MoE `routing` table:
    tokens × top-k per layer, so tokens processed), else its GEMMs' FLOPs from their recorded shapes
    (`LEAF_GEMM_OPS`, op_shapes.gemm_cost: PyTorch 2.13's CPU profiler writes no FLOPs into the trace, so a
    CPU rank with 2x the batch had no counted work). None when none is there for every rank."""
    ranks = [rank, *peers]

    def flops(r: int) -> float | None:
        ev = store.rank_table("events", r, ["step", "flops"])
        ev = ev.filter(pc.and_(_analysed(store, r, ev["step"], counted), pc.is_valid(ev["flops"])))
        return float(pc.sum(ev["flops"]).as_py()) if ev.num_rows else None

    def tokens(r: int) -> float | None:
        t = store.rank_table("routing", r, ["step", "tokens"]).to_pandas()
        return float(t.groupby("step")["tokens"].sum().median()) if len(t) else None

    def gemm_flops(r: int) -> float | None:  # the GEMMs' FLOPs from their recorded shapes (record_shapes)
        ev = store.rank_table("events", r, ["name", "cat", "step", "input_dims", "input_types", "concrete_inputs"])
        keep = pc.and_(pc.and_(_analysed(store, r, ev["step"], counted), pc.is_valid(ev["input_dims"])),
                       pc.is_in(ev["name"].cast(pa.string()), value_set=pa.array(LEAF_GEMM_OPS)))
        ev = ev.filter(pc.fill_null(keep, False))
        if not ev.num_rows:
            return None
        total, costs = 0, {}
        cols = [ev[c].cast(pa.string()).to_pylist() for c in ("name", "input_dims", "input_types", "concrete_inputs")]
        for key in zip(*cols):
            if key not in costs:
                cost = gemm_cost(key[0], tensors(load_json(key[1]), load_json(key[2]), load_json(key[3])))
                costs[key] = cost.flops if cost is not None and cost.flops else 0
            total += costs[key]
        return float(total) or None

    for measure, fn in (("flops", flops), ("routed_tokens", tokens), ("gemm_shape_flops", gemm_flops)):
        fn = _per_rank(counted, measure, fn)
        vals = [fn(r) for r in ranks]
        if all(v is not None and v > 0 for v in vals):
            return round(vals[0] / float(np.median(vals[1:])), 4), measure
    return None, None


def _op_count_ratio(store: RunStore, rank: int, peers: list[int],
                    counted: dict[tuple[str, int], Any] | None = None) -> float | None:
    """The rank's count of compute ops (kernels on GPU, cpu_ops on CPU) in its steps / the peers' median."""
    def compute_ops(r: int) -> int:
        k = store.rank_table("kernels", r, ["kind", "step"])
        if k.num_rows:
            return int(pc.sum(pc.and_(pc.equal(k["kind"].cast("string"), "compute"),
                                      _analysed(store, r, k["step"], counted))).as_py() or 0)
        ev = store.rank_table("events", r, ["cat", "step"])
        return int(pc.sum(pc.and_(pc.equal(ev["cat"].cast("string"), "cpu_op"),
                                  _analysed(store, r, ev["step"], counted))).as_py() or 0)
    if not peers:
        return None
    count = _per_rank(counted, "compute_ops", compute_ops)
    mine, med = count(rank), float(np.median([count(p) for p in peers]))
    return round(mine / med, 4) if med else None


_RECOMMEND = {
    "compute": "Rank {r} computes longer than its peers before collectives: check for a slower device/core, "
               "thermal throttling, CPU contention, or uneven work (sequence lengths, expert load) on it.",
    "uneven_work": "Rank {r} does more work than its peers with the same ops (more FLOPs / tokens: longer "
                   "sequences or a bigger shard): balance the inputs across data-parallel replicas (bucket "
                   "or pack sequences by length, token-based batching).",
    "data_load": "Rank {r} spends longer loading data: add DataLoader workers/prefetching or fix its input shard.",
    "host_idle": "Rank {r} sits idle on the host before collectives: look for sleeps, GC pauses, logging or "
                 "synchronisation on that rank only.",
    "contention": "Rank {r} runs the same ops as its peers but slower: look for CPU oversubscription or "
                  "a noisy neighbour on its host/cores, thermal or power throttling, or a slower device.",
    "unknown": "Rank {r} arrives late at collectives; compare its timeline with a peer's in the report.",
}


@dataclass(frozen=True)
class StragglersResult(AnalyzerResult):
    pass


def _empty(cfg: StragglerConfig, excluded: dict[str, int] | None = None) -> StragglersResult:
    section: dict[str, Any] = {"steps_counted": 0, "mean_step_ns": 0, "ranks": [], "stragglers": []}
    if excluded is not None:
        section["excluded"] = excluded
    section["thresholds"] = asdict(cfg)
    return StragglersResult(section=section)


def _late_ranks(matched: MatchedCollectives, steps: int, step_ns: int) -> list[dict[str, Any]]:
    """The section's `ranks` rows: how often and by how much each rank is last, largest delay first."""
    inst = matched.instances
    counts = matched.rows.groupby("rank").size()
    # share of its instances a rank would be last at by chance (1/members per instance)
    chance = (1.0 / matched.rows["key"].map(inst.set_index("key")["n"])).groupby(matched.rows["rank"]).mean()
    rows = []
    # each rank's summed delay where it is last, per dim (dims sorted) and in all, in one grouping of the
    # instances: a grouping per rank cost ~2 ms each (10,000 ranks: ~20 s)
    by_dims: dict[int, dict[str, int]] = {}
    for (r, d), total in inst.groupby(["last_rank", "dim"])["delay"].sum().items():
        by_dims.setdefault(int(r), {})[str(d)] = int(total / steps)
    last = inst.groupby("last_rank")["delay"].agg(["size", "sum"])
    last_count, last_delay = last["size"].to_dict(), last["sum"].to_dict()
    for r, n in counts.items():
        by_dim, k = by_dims.get(int(r), {}), int(last_count.get(r, 0))
        delay = int(last_delay.get(r, 0) / steps)
        rows.append({"rank": int(r), "instances": int(n), "last_count": k,
                     "last_share": round(k / n, 4) if n else 0.0,
                     "last_chance": round(float(chance.get(r, 0.0)), 4),
                     "delay_ns_per_step": delay,
                     "delay_fraction": round(delay / step_ns, 4) if step_ns else None,
                     "by_dim": by_dim})
    rows.sort(key=lambda x: -x["delay_ns_per_step"])
    _set_dominance(matched, rows, steps)
    return rows


_NONE = np.zeros(0, np.int64)


def _instances_of_ranks(rows: pd.DataFrame, inst: pd.DataFrame) -> dict[int, np.ndarray]:
    """Per rank: the positions (ascending) of the instances of `inst` it is a member of (has a row in)."""
    import pandas as pd

    at = pd.DataFrame({"key": inst["key"].to_numpy(), "pos": np.arange(len(inst), dtype=np.int64)})
    both = at.merge(rows[["key", "rank"]], on="key")
    pair = unique_pairs(both["rank"].to_numpy(np.int64), both["pos"].to_numpy(np.int64))  # by rank
    bounds = np.flatnonzero(np.r_[True, pair[0][1:] != pair[0][:-1], True]) if pair.size else np.zeros(1, int)
    return {int(pair[0][a]): pair[1][a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())}


def _member_sets(rows: pd.DataFrame) -> set[tuple[int, ...]]:
    """The distinct member sets (sorted rank tuples) of the collectives `rows` holds (their ranks per key)."""
    import pandas as pd

    code = pd.factorize(rows["key"])[0].astype(np.int64)
    pair = unique_pairs(code, rows["rank"].to_numpy(np.int64))  # by key, then rank
    bounds = np.flatnonzero(np.r_[True, pair[0][1:] != pair[0][:-1], True]) if pair.size else np.zeros(1, int)
    flat = pair[1].tolist()
    return {tuple(flat[a:b]) for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())}


def _set_dominance(matched: MatchedCollectives, rows: list[dict[str, Any]], steps: int) -> None:
    """`dominance`: a rank's delay over the largest delay of its peers (ranks it meets in a collective;
    ranks it never meets, e.g. another pipeline stage, are not) that are not late *with* it. Late
    with it (`late_with`): a peer at least half as late whose collectives with this rank hold neither
    back (less than half the smaller delay): the two arrive together, as the ranks of one slow
    data-parallel replica do (a tp or cp group given longer sequences), so neither dominates the other."""
    inst = matched.instances[["key", "last_rank", "delay"]]
    total = {row["rank"]: row["delay_ns_per_step"] for row in rows}
    peers: dict[int, set[int]] = {}
    for group in _member_sets(matched.rows):
        for r in group:
            peers.setdefault(int(r), set()).update(int(p) for p in group if p != r)
    of = _instances_of_ranks(matched.rows, inst)
    last, delay = inst["last_rank"].to_numpy(np.int64), inst["delay"].to_numpy(np.int64)
    held_by = _held_by(of, last, delay)
    ranked = np.array(sorted(total), np.int64)
    totals = np.array([total[r] for r in ranked.tolist()], np.int64)

    for row in rows:
        r = row["rank"]
        mates = np.array(sorted(peers.get(r, ())), np.int64)
        at = np.minimum(np.searchsorted(ranked, mates), ranked.size - 1)
        if (ranked[at] != mates).any():  # a peer without a row (the rows are matched.rows' ranks)
            raise KeyError(int(mates[ranked[at] != mates][0]))
        theirs = totals[at]
        together: list[int] = []
        if total[r] > 0:  # late with no peer when not late itself (most ranks of a large run): no pair to weigh
            # late with it: a peer at least half as late whose collectives with r (those r was last at, p a
            # member, and those p was) held back less than half the smaller delay
            lo = np.minimum(theirs, total[r])
            cand = (lo > 0) & (2 * lo >= np.maximum(theirs, total[r]))
            held = held_by(r, mates[cand]) + held_by(mates[cand], r)
            together = mates[cand][2 * held < lo[cand] * steps].tolist()
        rest = theirs[~np.isin(mates, together)] if together else theirs
        nxt = int(rest.max()) if rest.size else 0
        row["dominance"] = round(row["delay_ns_per_step"] / nxt, 3) if nxt > 0 else None
        if together:
            row["late_with"] = together
            mine = of.get(r, _NONE)
            row["last_share_with"] = round(float(np.isin(last[mine], [r, *together]).mean()), 4)


def _held_by(of: dict[int, np.ndarray], last: np.ndarray, delay: np.ndarray
             ) -> Callable[[int | np.ndarray, int | np.ndarray], np.ndarray]:
    """held_by(r, p): the summed delay of r's instances (positions `of[r]`) that p arrived last at (p is then a
    member too), for a rank and an array of ranks either way round: every (member, last arriver) pair's sum
    found in one sort instead of a search per pair (10,000 ranks: 4.6 M searches)."""
    ranks = np.array(list(of), np.int64)
    lens = np.array([of[r].size for r in of], np.int64)
    pos = np.concatenate([of[r] for r in of]) if of else _NONE
    member, lasts, delays = np.repeat(ranks, lens), last[pos], delay[pos]
    base = int(min(member.min(), lasts.min())) if pos.size else 0
    span = int(max(member.max(), lasts.max())) - base + 1 if pos.size else 1
    code = (member - base) * span + (lasts - base)  # < 2**63 for any int32 ranks
    order = np.argsort(code, kind="stable")
    code, delays = code[order], delays[order]
    starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]]) if code.size else _NONE
    keys, sums = code[starts], (np.add.reduceat(delays, starts) if starts.size else _NONE)

    def held_by(r: int | np.ndarray, p: int | np.ndarray) -> np.ndarray:
        r, p = np.broadcast_arrays(np.asarray(r, np.int64), np.asarray(p, np.int64))
        inside = (r >= base) & (r < base + span) & (p >= base) & (p < base + span)
        want = np.where(inside, (r - base) * span + (p - base), -1)
        i = np.minimum(np.searchsorted(keys, want), max(keys.size - 1, 0))
        found = inside & (keys.size > 0) & (keys[i] == want) if keys.size else np.zeros(want.shape, bool)
        return np.where(found, sums[i] if keys.size else 0, 0)
    return held_by


_MEASURED_ON_RANK = ("data_load", "uneven_work")
"""Causes measured on the rank itself (PyTorch's DataLoader ranges on it, its counted FLOPs / routed tokens),
not timed against its peers' noise."""


def _severity(row: dict[str, Any], cause: str, ev: dict[str, Any], cfg: StragglerConfig,
              device_timed: bool = False) -> Severity:
    """`device_timed`: every rank's arrivals are device times (see `device_warning_delay_fraction`)."""
    frac = row["delay_fraction"] or 0.0
    # a cause measured on the rank itself (PyTorch's DataLoader ranges on it, its counted work) needs no
    # "last at most collectives" guard against timing noise; counted work not the noise floor either
    evidenced = cause in _MEASURED_ON_RANK
    # "compute" with more ops than its peers is counted extra work too (CPU contention cannot add
    # ops); being last at most collectives is then no fair test either: in a size-2 group a rank is
    # last half the time by chance, so a real straggler in small groups stays well under 75%
    counted_ops = (cause == "compute" and (ev.get("op_count_ratio") or 0.0) >= cfg.more_work_ratio)
    dominance = cfg.device_warning_dominance if device_timed else cfg.warning_dominance
    last_share = max(row["last_share"], row.get("last_share_with", 0.0))
    strong = counted_ops or (
        (row["dominance"] is None or row["dominance"] >= dominance)
        and (last_share >= (cfg.device_warning_last_share if device_timed else cfg.warning_last_share)
             or evidenced))
    # data loading is measured on the rank too (its DataLoader ranges beyond its peers'), as the host-stall
    # finding of the same loading warns from 10%: beside other jobs (1-minute load 12-18 on the 2 cores) a
    # 40 ms DataLoader stall held its peer back 24% of a step the box had stretched to 150 ms (info at 25%)
    warn_frac = (cfg.uneven_work_warning_delay_fraction if cause in _MEASURED_ON_RANK
                 else cfg.device_warning_delay_fraction if device_timed else cfg.warning_delay_fraction)
    if strong and frac >= cfg.critical_delay_fraction:
        return Severity.CRITICAL
    if strong and frac >= warn_frac:
        return Severity.WARNING
    return Severity.INFO


def _cause_text(cause: str, ev: dict[str, Any]) -> str:
    """The cause in words; a label holding the rank's idle time (at least half the delay examined) is
    named: it tells what the idle time was, the trace already showed that it was idle."""
    if cause == "unknown" and ev.get("instances_examined"):
        return "host-side, cause not visible in the trace"  # nothing before its late arrivals sets it apart
    if cause == "data_load":  # the role is PyTorch's own DataLoader ranges (enumerate(DataLoader)#...)
        return "data loader (longer inside PyTorch's DataLoader than its peers)"
    text = cause.replace("_", " ")
    label, idle = next(iter((ev.get("idle_labels") or {}).items()), (None, 0))
    if cause == "host_idle" and label is not None and 2 * idle >= ev.get("delay_ns", 0) > 0:
        text += f" inside the label {label!r}"
    return text


def _host_may_explain(cause: str, ev: dict[str, Any], cfg: StragglerConfig) -> bool:
    """Could CPU cores shared by several ranks explain the cause? Yes unless it is counted work: more ops
    than its peers ("compute" at `more_work_ratio`), or more FLOPs/tokens ("uneven_work", data loading)."""
    if cause == "compute":
        return (ev.get("op_count_ratio") or 0.0) < cfg.more_work_ratio
    return cause in ("contention", "host_idle", "unknown")


def _finding(row: dict[str, Any], cause: str, ev: dict[str, Any], sev: Severity, step_ns: int) -> Finding:
    r = row["rank"]
    frac = row["delay_fraction"] or 0.0
    dim = max(row["by_dim"], key=row["by_dim"].get) if row["by_dim"] else None
    return Finding(
        kind=FindingKind.STRAGGLER, severity=sev, ranks=(r,), dim=dim,
        summary=(f"rank {r} arrives last at {row['last_count']} of {row['instances']} collectives and "
                 f"holds its groups back {row['delay_ns_per_step'] / 1e6:.2f} ms per step "
                 f"({100 * frac:.1f}% of the step)"
                 + (f"; its peers wait for it {ev['owed_wait_ns_per_step'] / 1e6:.2f} ms per step in all"
                    if ev.get("owed_wait_ns_per_step") else "")
                 + f"; cause: {_cause_text(cause, ev)}"),
        evidence=StragglerEvidence(cause=cause, delay_ns_per_step=row["delay_ns_per_step"], details={
                  "last_count": row["last_count"], "instances": row["instances"],
                  "last_share": row["last_share"], "last_chance": row["last_chance"],
                  "mean_step_ns": step_ns, "dominance": row["dominance"], "by_dim": row["by_dim"],
                  **({"late_with": row["late_with"]} if row.get("late_with") else {}),
                  **ev}),
        recommendation=_RECOMMEND[cause].format(r=r),
        est_saving_ns=max(int(row["delay_ns_per_step"]), 0))


def analyze_stragglers(store: RunStore, matching: MatchingResult | None, breakdown: BreakdownResult | None,
                       activity: RankActivities | None, thresholds: StragglerConfig | None = None
                       ) -> StragglersResult:
    cfg = thresholds or StragglerConfig()
    matched = matched_of(matching)
    if matched is None or matched.n_instances == 0:
        return _empty(cfg)
    profiled = {int(x) for x in store.table("steps", ["step"]).column("step").to_pylist()}
    matched, excluded = _in_step_instances(matched, profiled)
    if matched.n_instances == 0:
        return _empty(cfg, excluded)
    steps, step_ns = _steps_and_step_ns(breakdown_ranks(breakdown), matched)
    rows = _late_ranks(matched, steps, step_ns)
    one_host = matching.clocks.get("hosts") == 1
    device_timed = bool(matched.gpu_ranks) and set(matched.rows["rank"].unique()) <= matched.gpu_ranks
    activity = activities_of(store, activity)
    owed = {o["rank"]: o for o in ((breakdown.section or {}).get("owed_wait", []) if breakdown is not None else [])}
    findings, stragglers, busy, counted, prev_ends = [], [], {}, {}, {}
    for row in rows:
        frac = row["delay_fraction"] or 0.0
        dominant = row["dominance"] is None or row["dominance"] >= cfg.min_dominance
        # a rank last at every one of its (at least two) collectives needs no more of them: a short
        # profiled window (2 steps of a one-bucket DDP job) holds only that many
        enough = row["last_count"] >= min(cfg.min_instances, max(row["instances"], 2))
        if not (frac >= cfg.min_delay_fraction and dominant and row["last_count"] > 0):
            continue
        cause, ev = _attribute_cause(store, activity, matched, row["rank"], cfg, busy, counted, prev_ends)
        # Too few late arrivals to tell a straggler from timing noise, unless the cause is measured on the
        # rank itself (its DataLoader ranges, its counted work), which noise cannot fake: one DDP bucket a
        # step over 2 profiled steps, the rank with 2x the batch last at 1 of 2 (a busy process beside
        # delayed its peer at the other) holding its peer back 32% of the step, 13x its peer's delay.
        if not enough and cause not in _MEASURED_ON_RANK:
            continue
        if row["rank"] in owed:  # the wait it caused on the others (breakdown: their sync wait charged to it)
            ev = {**ev, "owed_wait_ns_per_step": owed[row["rank"]]["owed_ns_per_step"],
                  "owed_wait_by_rank": owed[row["rank"]]["by_rank"]}
        stragglers.append({"rank": row["rank"], "cause": cause, "cause_evidence": ev})
        if one_host and _host_may_explain(cause, ev, cfg):
            # no cap: a rank that holds its peers back is a straggler whatever the cause, and its
            # measured delay is what removing the cause saves; the cause only carries a caveat
            ev = {**ev, "caveat": SHARED_HOST_CAVEAT}
        findings.append(_finding(row, cause, ev, _severity(row, cause, ev, cfg, device_timed), step_ns))
    section = {"steps_counted": steps, "mean_step_ns": step_ns, "ranks": rows, "stragglers": stragglers,
               "excluded": excluded, "thresholds": asdict(cfg), "device_timed": device_timed}
    return StragglersResult(findings=findings, section=section)
