"""Cross-rank matching of collective instances: arrival skew vs transfer time (DESIGN §3).

An instance is one collective call seen by every member of its group, keyed by `pg_name` + `seq`
(when a source has no seq, by position within the group on each rank, `seq_basis: "order"`, and
only when the ops at each position agree). P2P ops are not collective instances (their seq counters
are per rank, not per group); instead each send is paired with its receive (the k-th send from src
to dst on a group with the k-th recv at dst from src, by arrival order) and the earlier side's time
until the later side was issued counts as waiting for a late peer (gloo/NCCL move the data only
once both sides are posted), like a collective's wait, so exposed-transfer figures exclude it.
Arrival (DESIGN §3, `arrival_ns`): on GPU ranks the start of the rank's collective on the device (`ts`:
its NCCL/RCCL kernel, or the log's start) — never the host's enqueue, which runs ahead of the device
by up to a step; on CPU backends the op's start on the host (`enqueue_ts`, else `ts`). end = ts + dur.
Skew = last arrival − first arrival; transfer = first member's end − last arrival (all members of an
NCCL collective finish together; the first end is the least delayed by its own rank); a rank's wait =
last arrival − its own arrival; the late rank's delay = last arrival − second-to-last arrival,
counted from the group's previous collective's end and at most its extra gap since its own previous
collective (`_late_delay`); comms-log rows without an end take the profiler's (`fill_log_ends`).
Times are exact int64 ns throughout.
Rows the trace files under no process group are never numbered within a guessed group (that pairs
different steps' calls): `_pair_unnamed` pairs them (group `kineto:?`) only within one step, where the
ranks have as many calls of the op there and the members' ends meet (a collective ends for all once the
last member arrives); the rest are left out (counted in `no_group`; paired rows in `no_group_paired`).

One source per rank, consistently: the comms log when every rank has one (it carries seq), else
flight-recorder dumps, else Kineto; a rank lacking the chosen source falls back to the best it has
(`source.method: "mixed"`). Kineto collectives the log never saw (torch-internal calls, e.g.
DDP's buffer broadcast; the parser leaves them unjoined) are matched too, among themselves, as
groups `kineto:<pg_name or ?>`. Times stay on each source's clock for matching (the parser puts
log times on the trace clock when it can); per-rank clock offsets
are estimated here (see clocks.py) and subtracted before skew is computed.

Section `matching`:
    {"source": {"method": "uniform|mixed|none", "per_rank": {rank: source}},
     "supplement": {"kineto collectives without a log entry": int},
     "seq_basis": {"args|log|order": count of instances},
     "instances": int, "matched": int (≥ 2 ranks), "complete": int (whole group),
     "op_mismatches": int, "p2p_skipped": int, "no_group": int, "no_group_paired": int, "no_device_time": int,
     "warnings": [str],            # the integrity counts above in words (also in analysis.json inputs.warnings)
     "p2p": {"pairs": int, "unpaired": int, "wait_ns": int},
     "by_group": [{"pg_name", "dim", "op", "instances", "skew_ns": {"mean", "p50", "p95", "max"},
                   "transfer_ns": {"mean", "p50", "p95", "max"}}],
     "per_rank": [{"rank", "instances", "last_count", "delay_ns", "wait_ns"}],
     "top_skew": [{"pg_name", "dim", "seq", "op", "step", "skew_ns", "transfer_ns", "first_rank",
                   "last_rank", "delay_ns"}]}          # the 20 largest skews
Result for later analyzers: `MatchingResult` — `matched` (MatchedCollectives) and `clocks` (the
clock estimate the `clocks` analyzer publishes). Computed on numpy columns (columns.py), without
pandas: MatchedCollectives builds its pandas frames when a consumer first reads them.
"""

from __future__ import annotations

from collections import Counter
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa

from tracekit.derive import intervals as iv
from tracekit.derive.clocks import ClockConfig, MatchedEnds, estimate_offsets, log_to_trace_shift
from tracekit.derive.topology import LayoutResult, dims_of
from tracekit.findings.result import AnalyzerResult
from tracekit.layout import rank_to_host
from tracekit.tables.columns import (Column, Columns, LazyFrame, argsort_desc, arrow_columns, concat, cumcount,
                                     equals_any, group_extreme, group_ids, group_order, kept, lookup,
                                     not_null, sorted_unique, take, unique_inverse)
from tracekit.tables.schema import TABLES
from tracekit.tables.store import RunStore

if TYPE_CHECKING:
    import pandas as pd

SOURCE_PRIORITY = ("comms-log", "flight-recorder", "kineto")
LOG_SOURCES = ("comms-log", "flight-recorder")
COLUMNS = ["rank", "source", "pg_name", "seq", "seq_source", "op", "is_p2p", "bytes", "ts", "dur",
           "enqueue_ts", "caller", "step", "group_size", "peer"]


class MatchedCollectives:
    """Per (instance, rank) rows with corrected times, plus per-instance aggregates.

    Times are exact int64 ns on the matching clock (nullable ones, e.g. end, as pandas Int64); other
    nullable numbers (step, bytes, group_size) are float64 NaN. Matching hands over numpy columns: the
    DataFrames are built on first access (pandas imported then); `n_rows` and `n_instances` never
    build them. A consumer may also pass DataFrames (a subset of another result's)."""

    def __init__(self, rows: pd.DataFrame | LazyFrame, instances: pd.DataFrame | LazyFrame,
                 trace_shift: dict[int, int | None], wait_intervals: dict[int, iv.IntervalSet],
                 gpu_ranks: set[int] | None = None, p2p_pairs: pd.DataFrame | LazyFrame | None = None,
                 wait_by_peer: dict[int, dict[int, iv.IntervalSet]] | None = None,
                 late_finish: dict[int, iv.IntervalSet] | None = None) -> None:
        self._frames: dict[str, Any] = {"rows": rows, "instances": instances, "p2p_pairs": p2p_pairs}
        self.n_rows: int = len(rows)
        """len(rows), without building the frame."""
        self.n_instances: int = len(instances)
        """len(instances), without building the frame."""
        self.trace_shift = trace_shift
        """Per rank: add to this rank's raw matching times to put them on its trace clock (None: unknown)."""
        self.wait_intervals = wait_intervals
        """Per rank, trace clock: waiting for the group's last arrival, or for a P2P op's peer to post the
        other side (ranks with a known shift only)."""
        self.wait_by_peer: dict[int, dict[int, iv.IntervalSet]] = wait_by_peer if wait_by_peer is not None else {}
        """Per rank: `wait_intervals` split by whom it waited for (rank -> disjoint sets; `charge_waits`)."""
        self.late_finish: dict[int, iv.IntervalSet] = late_finish if late_finish is not None else {}
        """Per rank, trace clock: the end of each of its collectives that came after the instance's first
        member's end (DESIGN §3: transfer = first member's end − last arrival), by as much: the data was
        delivered; the rank finished late (on CPU ranks its gloo thread not running; ~0 on GPUs)."""
        self.gpu_ranks: set[int] = gpu_ranks if gpu_ranks is not None else set()
        """Ranks with device kernels: their arrival is the device start (`arrival_ns`)."""

    def _frame(self, name: str) -> Any:
        """The frame `name`, built (once) when it is still numpy columns."""
        f = self._frames[name]
        if isinstance(f, LazyFrame):
            f = self._frames[name] = f.frame()
        return f

    @property
    def rows(self) -> pd.DataFrame:
        """key, pg_name, seq, op, rank, arrival (offset-corrected), arrival_raw, end, wait, is_last, source,
        step, caller, bytes."""
        return self._frame("rows")

    @property
    def instances(self) -> pd.DataFrame:
        """key, pg_name, seq, op, step, n, first, last, first_end, last_end, group_size, seq_basis,
        last_rank, first_rank, second_last, skew, extra_gap, delay, transfer, dim."""
        return self._frame("instances")

    @property
    def p2p_pairs(self) -> pd.DataFrame | None:
        """One row per paired send/recv (`_pair_p2p`): pg_name, src, dst, bytes, step (float64, NaN when
        unknown), device_timed (both sides on GPU ranks) and transfer (int64 ns, matching clock: the first
        side's end − the last side's arrival, as a collective's transfer); None without P2P to pair."""
        return self._frame("p2p_pairs")


_LOG_FILE = re.compile(r"(?:^|[/\\])(?:comms|flight_recorder)\.rank\d+\.jsonl?$")


def is_log_only(row: dict[str, Any]) -> bool:
    """A `ranks` row read from a collective log (comms.rank{R}.jsonl, a Flight Recorder dump) and no profiler
    trace: a rank of a partial recording (`tracekit record --profile-ranks`)."""
    return (not row.get("num_events") and not row.get("trace_kind")
            and (row.get("rank_source") == "comms-log" or bool(_LOG_FILE.search(str(row.get("source_file") or "")))))


def log_only_ranks(store: RunStore) -> set[int]:
    """Ranks with a collective log and no trace (`is_log_only`)."""
    if not store.has("ranks"):
        return set()
    t = store.table("ranks", ["rank", "num_events", "trace_kind", "rank_source", "source_file"]).to_pylist()
    return {int(r["rank"]) for r in t if is_log_only(r)}


def gpu_ranks(store: RunStore) -> set[int]:
    """Ranks whose trace has device kernels (ranks.trace_kind == "gpu"), and the ranks without a trace
    (log-only: a partial recording, `--profile-ranks`) when every traced rank is a GPU rank: one job runs
    one kind of device, so their logs' start times are the collective's start on the device too (an
    arrival from the host's enqueue would put them ahead of the traced ranks by the host's lead)."""
    t = store.table("ranks", ["rank", "trace_kind"]).to_pylist()
    gpu = {r["rank"] for r in t if r["trace_kind"] == "gpu"}
    if gpu and all(r["trace_kind"] in ("gpu", None) for r in t):
        gpu |= {r["rank"] for r in t if r["trace_kind"] is None}
    return gpu


def _on_ranks(rank: np.ndarray, ranks: set[int]) -> np.ndarray:
    """Where a row's rank is one of `ranks`."""
    return np.isin(rank, np.array(sorted(ranks), np.int64))


def arrival_ns(cols: Columns, on_gpu: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """A rank's arrival at each collective row (DESIGN §3), int64 ns on the row's clock, and where it is
    known: on GPU ranks the collective's start on the device (`ts`) — never the host's enqueue; on CPU
    backends the op's start on the host (`enqueue_ts`, else `ts`)."""
    gpu = _on_ranks(cols["rank"], on_gpu)
    host = np.where(cols["enqueue_ts_ok"], cols["enqueue_ts"], cols["ts"])
    host_ok = cols["enqueue_ts_ok"] | cols["ts_ok"]
    return np.where(gpu, cols["ts"], host), np.where(gpu, cols["ts_ok"], host_ok)


def read_collectives(store: RunStore) -> pa.Table:
    """The collectives table's COLUMNS (no rows when there is none)."""
    if store.has("collectives"):
        return store.table("collectives", COLUMNS)
    return TABLES["collectives"].empty_table().select(COLUMNS)


def choose_sources(cols: Columns, on_gpu: set[int] | None = None) -> tuple[dict[int, str], str]:
    """One collective source per rank (see module doc). On GPU ranks (`on_gpu`) a source counts only
    with device start times (a log that holds only enqueue times cannot give an arrival there)."""
    host_ok = cols["enqueue_ts_ok"] & ~_on_ranks(cols["rank"], on_gpu or set())
    usable = host_ok | cols["ts_ok"]
    rank, source = cols["rank"][usable], cols["source"][usable]
    ranks = set(rank.tolist())
    if not ranks:
        return {}, "none"
    named = not_null(source)
    have: dict[str, set[int]] = {s: set(rank[named & (source == s)].tolist()) for s in set(source[named].tolist())}
    for src in SOURCE_PRIORITY:
        if have.get(src, set()) == ranks:
            return {r: src for r in sorted(ranks)}, "uniform"
    per_rank = {}
    for r in sorted(ranks):
        per_rank[r] = next(s for s in SOURCE_PRIORITY + tuple(sorted(have)) if r in have.get(s, set()))
    return per_rank, "mixed"


def _stats(x: np.ndarray) -> dict[str, int]:
    a = x.astype(float)
    if a.size == 0:
        return {"mean": 0, "p50": 0, "p95": 0, "max": 0}
    return {"mean": int(a.mean()), "p50": int(np.percentile(a, 50)), "p95": int(np.percentile(a, 95)),
            "max": int(a.max())}


def host_count(store: RunStore) -> int | None:
    """Distinct hosts of the run's ranks (ranks table, else manifest), None when unknown."""
    rows = store.table("ranks", ["rank", "hostname"]).to_pylist()
    named = rank_to_host(None, rows)
    if rows and len(named) == len(rows):
        return len(set(named.values()))
    return len(set(rank_to_host((store.manifest or {}).get("hosts")).values())) or None


def _trace_shifts(store: RunStore, cols: Columns, per_rank: dict[int, str]
                  ) -> tuple[dict[int, int | None], list[dict[str, Any]]]:
    """Shift per rank from its matching source's clock to its trace clock (`cols`: every collective row)."""
    rows = {r["rank"]: r for r in store.table("ranks", ["rank", "first_ts", "last_ts", "base_time_ns"]).to_pylist()}
    span = _log_spans(cols, per_rank)
    shifts: dict[int, int | None] = {}
    report = []
    for r, src in per_rank.items():
        if src not in LOG_SOURCES:
            shifts[r] = 0
            continue
        row = rows.get(r, {})
        times = span.get(r, np.zeros(0, np.int64))
        shift, how = log_to_trace_shift(times, row.get("first_ts"), row.get("last_ts"), row.get("base_time_ns"))
        shifts[r] = shift if how != "unaligned" else None
        report.append({"rank": r, "shift_ns": shift, "method": how})
    return shifts, report


def _log_spans(cols: Columns, per_rank: dict[int, str]) -> dict[int, np.ndarray]:
    """Per rank matched from a log: [earliest, latest] of its log rows' times (enqueue and start), what
    `log_to_trace_shift` reads of them; ranks whose log rows hold no time are left out."""
    chosen = _chosen(cols["rank"], per_rank)
    mine = np.flatnonzero((cols["source"] == chosen) & equals_any(chosen, LOG_SOURCES))
    ranks, at = unique_inverse(cols["rank"][mine])
    at = np.concatenate([at.reshape(-1)] * 2)
    values = np.concatenate([cols["enqueue_ts"][mine], cols["ts"][mine]])
    ok = np.concatenate([cols["enqueue_ts_ok"][mine], cols["ts_ok"][mine]])
    lo, has = group_extreme(at, ranks.size, values, ok, largest=False)
    hi, _ = group_extreme(at, ranks.size, values, ok, largest=True)
    return {int(r): np.array([lo[i], hi[i]], np.int64) for i, r in enumerate(ranks.tolist()) if has[i]}


NO_CLOCKS: dict[str, Any] = {"method": "none", "reference_rank": None, "ranks": [], "log_to_trace": []}


def _empty_section(section: dict[str, Any]) -> dict[str, Any]:
    section.update({"seq_basis": {}, "instances": 0, "matched": 0, "complete": 0, "op_mismatches": 0,
                    "p2p_skipped": 0, "no_group": 0, "no_group_paired": 0, "no_device_time": 0,
                    "p2p": {"pairs": 0, "unpaired": 0, "wait_ns": 0},
                    "by_group": [], "per_rank": [], "top_skew": []})
    return section


def fill_log_ends(cols: Columns, shifts: dict[int, int | None]) -> Columns:
    """`cols` with each row's `end` (ts + dur) and `end_ok`. Log rows that carry none (a CPU comms log
    holds enqueue times only) take the end of the profiler's record of the same call (rank, group, p2p,
    seq; the parser joined the two; a call the profiler recorded twice gives none), moved onto the log's
    clock (`shifts`: log + shift = trace; unknown: no fill). Without it the delay rule "count from the
    group's previous collective's end" cannot apply, and each async call queued behind a running one
    adds its queueing skew to the late rank's delay."""
    ok = cols["ts_ok"] & cols["dur_ok"]
    end = np.where(ok, cols["ts"] + cols["dur"], 0)
    keyed = cols["seq_ok"] & not_null(cols["pg_name"])
    kin = (cols["source"] == "kineto") & equals_any(cols["seq_source"], ("args", "log")) & ok & keyed
    need = equals_any(cols["source"], LOG_SOURCES) & ~ok & keyed
    sel = np.flatnonzero(kin | need)
    ids, n = group_ids(cols["rank"][sel], cols["pg_name"][sel], cols["is_p2p"][sel], cols["seq"][sel])
    is_kin = kin[sel]
    once = np.bincount(ids[is_kin], minlength=n) == 1
    kin_end = np.zeros(n, np.int64)
    kin_end[ids[is_kin]] = end[sel[is_kin]]
    found = ~is_kin & once[ids]
    shift, known = lookup(cols["rank"][sel[found]], shifts)
    rows = sel[found][known]
    end[rows] = kin_end[ids[found][known]] - shift[known]
    ok = ok.copy()
    ok[rows] = True
    return {**cols, "end": end, "end_ok": ok}


def _chosen(rank: np.ndarray, per_rank: dict[int, str]) -> np.ndarray:
    """Per row: its rank's chosen source (None for a rank without one)."""
    uniq, inv = unique_inverse(rank)
    return np.array([per_rank.get(r) for r in uniq.tolist()], object)[inv.reshape(-1)]


def _select_rows(cols: Columns, per_rank: dict[int, str], on_gpu: set[int], section: dict[str, Any]
                 ) -> tuple[Columns, Columns, Columns]:
    """Each rank's rows from its chosen source with their arrival, numbered within their group and
    agreeing on the op with at least one other rank (`_agreeing`), its P2P rows, and its rows without a
    group (for `_pair_unnamed`; `cols` holds each row's `end`, see `fill_log_ends`)."""
    chosen = _chosen(cols["rank"], per_rank)
    # collectives the log never saw (torch-internal calls such as DDP's buffer broadcast): the parser
    # leaves their Kineto rows unjoined (seq numbered by order); match them among themselves
    # (and those it could give no group: `_pair_unnamed` pairs them by what their times show, or not)
    unjoined = equals_any(cols["seq_source"], ("order",)) | ~not_null(cols["pg_name"])
    extra = (cols["source"] == "kineto") & unjoined & equals_any(chosen, LOG_SOURCES)
    section["supplement"] = {"kineto collectives without a log entry": int(extra.sum())}
    keep = (cols["source"] == chosen) | extra
    if extra.any():
        pg = cols["pg_name"].copy()
        pg[extra] = [None if p is None else f"kineto:{p}" for p in pg[extra].tolist()]
        cols = {**cols, "pg_name": pg}
    # every selection below made on all rows and each part taken once (a take of ~7 M rows of ~20 columns,
    # strings among them, costs seconds at 10,000 ranks): the same rows, in the same order, as taking the
    # kept rows and then each part of them
    p2p = keep & (cols["is_p2p"] | equals_any(cols["op"], ("send", "recv")))
    section["p2p_skipped"] = int(p2p.sum())
    arrival, arrival_ok = arrival_ns(cols, on_gpu)
    cols = {**cols, "arrival": arrival, "arrival_ok": arrival_ok}
    p2p_rows = take(cols, p2p)
    # a row without a group is never numbered within a guessed group: `_pair_unnamed` pairs it or leaves it out
    grouped = keep & ~p2p
    named = not_null(cols["pg_name"])
    unnamed = take(cols, grouped & ~named)
    grouped &= named
    section["no_device_time"] = int((grouped & ~arrival_ok & _on_ranks(cols["rank"], on_gpu)).sum())
    rows = _numbered(cols, np.flatnonzero(grouped & arrival_ok))
    return _agreeing(rows, section), p2p_rows, unnamed


def _numbered(cols: Columns, idx: np.ndarray) -> Columns:
    """The rows `idx` of `cols` by (rank, group, arrival) (taken once, in that order), each with its seq: from
    the source, else its position within (rank, group); `seq_basis` says which."""
    pg_code, _ = group_ids(cols["pg_name"][idx])
    rows = take(cols, idx[np.lexsort((cols["arrival"][idx], pg_code, cols["rank"][idx]))])
    ids, n = group_ids(rows["rank"], rows["pg_name"])
    position = cumcount(ids, n) + 1
    source = np.where(not_null(rows["seq_source"]), rows["seq_source"], "args")
    rows["seq_basis"] = np.where(rows["seq_ok"], source, "order").astype(object)
    rows["seq"] = np.where(rows["seq_ok"], rows["seq"], position)
    return rows


def _agreeing(rows: Columns, section: dict[str, Any]) -> Columns:
    """The rows of instances (pg_name, seq) whose ranks agree on the op (nulls aside) and that at least
    two rows hold; `section["op_mismatches"]` counts the instances dropped for the op."""
    ids, n = group_ids(rows["pg_name"], rows["seq"])
    named = not_null(rows["op"])
    combos, m = group_ids(ids[named], rows["op"][named])
    inst_of = np.zeros(m, np.int64)
    inst_of[combos] = ids[named]
    mismatch = np.bincount(inst_of, minlength=n) > 1
    section["op_mismatches"] = int(mismatch.sum())
    keep = ~mismatch[ids]
    keep &= np.bincount(ids[keep], minlength=n)[ids] >= 2
    return kept(rows, keep)


UNNAMED_GROUP = "kineto:?"
"""The group of collectives the trace files under no process group, paired by `_pair_unnamed`."""


def _pair_unnamed(rows: Columns) -> np.ndarray:
    """Per row of a collective without a group (offset-corrected): its instance number, or -1.

    Such a call (a torch-internal one such as DDP's buffer broadcast on gloo, whose CPU event names no
    group; NCCL kernels of traces older than the group args) is paired with the calls in the same
    position among the same op's calls of the same step on the other ranks, where every rank that has
    that op's calls in that step has as many, and kept only where the times show a collective: every
    member ends within the quickest member's own time in it of the others (a collective ends for all
    once the last member arrives). Never numbered within a guessed group; across steps, never."""
    ok = rows["arrival_ok"] & rows["step_ok"] & rows["end_ok"] & not_null(rows["op"])
    out = np.full(ok.size, -1, np.int64)
    sel = np.flatnonzero(ok)
    if sel.size < 2:
        return out
    step, op, rank = rows["step"][sel], rows["op"][sel], rows["rank"][sel]
    arrival, end = rows["arrival"][sel], rows["end"][sel]
    own, n_own = group_ids(rank, step, op)
    order = np.lexsort((arrival, own))
    position = np.empty(sel.size, np.int64)
    position[order] = cumcount(own[order], n_own)
    calls = np.bincount(own, minlength=n_own)[own]
    so, n_so = group_ids(step, op)
    even = group_extreme(so, n_so, calls, None, False)[0] == group_extreme(so, n_so, calls, None, True)[0]
    inst, n = group_ids(step, op, position)
    members = np.bincount(inst, minlength=n)
    quickest = group_extreme(inst, n, end - arrival, None, False)[0]
    spread = group_extreme(inst, n, end, None, True)[0] - group_extreme(inst, n, end, None, False)[0]
    good = (members >= 2) & (spread <= quickest)
    keep = even[so] & good[inst]
    out[sel[keep]] = inst[keep]
    return out


def _with_unnamed(rows: Columns, unnamed: Columns, section: dict[str, Any]) -> Columns:
    """`rows` and the calls without a group that `_pair_unnamed` paired, as group UNNAMED_GROUP numbered
    in order of first arrival; `section` counts those left out (`no_group`) and paired (`no_group_paired`)."""
    inst = _pair_unnamed(unnamed)
    paired = take(unnamed, inst >= 0)
    ids, n = group_ids(inst[inst >= 0])
    first = group_extreme(ids, n, paired["arrival"], None, False)[0]
    seq = np.empty(n, np.int64)
    seq[np.argsort(first, kind="stable")] = np.arange(1, n + 1)
    paired["seq"], paired["seq_ok"] = seq[ids], np.ones(ids.size, bool)
    paired["pg_name"] = np.full(ids.size, UNNAMED_GROUP, object)
    paired["seq_basis"] = np.full(ids.size, "order", object)
    section["no_group"] = int((inst < 0).sum())
    section["no_group_paired"] = int(ids.size)
    return concat([rows, paired]) if ids.size else rows


def _estimate_clocks(store: RunStore, rows: Columns, log_report: list[dict[str, Any]]
                     ) -> tuple[dict[str, Any], dict[int, int]]:
    """Clock offsets estimated on the matching clock (`log_report`: each rank's log-to-trace shift)."""
    anchors = {r["rank"]: r["clock_offset_ns"] for r in store.table("ranks", ["rank", "clock_offset_ns"]).to_pylist()}
    key, _ = group_ids(rows["pg_name"], rows["seq"])
    ends = MatchedEnds(key=key, rank=rows["rank"], op=rows["op"], end=rows["end"], end_ok=rows["end_ok"])
    hosts = host_count(store)
    clocks, offsets = estimate_offsets(ends, anchors, ClockConfig(), same_host=hosts == 1)
    clocks["hosts"] = hosts
    clocks["log_to_trace"] = log_report
    clocks["thresholds"] = {"min_offset_ns": ClockConfig().min_offset_ns,
                            "max_mad_fraction": ClockConfig().max_mad_fraction}
    return clocks, offsets


def _first_of(ids: np.ndarray, n: int, values: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
    """Per group: the value of its first row (row order) among `where` (None when it has none)."""
    sel = np.flatnonzero(where) if where is not None else np.arange(ids.size)
    first = np.full(n, ids.size, np.int64)
    np.minimum.at(first, ids[sel], sel)
    return np.concatenate([values, np.array([None], object)]).astype(object)[first]


def _aggregate_instances(rows: Columns, dims: dict[str, str]) -> Columns:
    """One row per instance in (pg_name, seq) order: first/last arrival and rank, ends, skew, delay,
    transfer; adds each row's `inst` (its instance), `wait` and `is_last` to `rows`."""
    ids, n = group_ids(rows["pg_name"], rows["seq"])
    arrival, rank = rows["arrival"], rows["rank"]
    # who arrived first / last, and by how much the last one trailed the second-to-last
    srt, starts, counts = group_order(ids, n, arrival, rank)
    lo, hi, hi2 = srt[starts], srt[starts + counts - 1], srt[starts + np.maximum(counts - 2, 0)]
    inst: Columns = {"pg_name": _first_of(ids, n, rows["pg_name"]), "seq": rows["seq"][lo],
                  "op": _first_of(ids, n, rows["op"], not_null(rows["op"])), "n": counts,
                  "first": arrival[lo], "last": arrival[hi], "seq_basis": _first_of(ids, n, rows["seq_basis"]),
                  "last_rank": rank[hi], "first_rank": rank[lo], "second_last": arrival[hi2]}
    for name, col, largest in (("step", "step", False), ("first_end", "end", False), ("last_end", "end", True),
                               ("group_size", "group_size", True)):
        inst[name], inst[name + "_ok"] = group_extreme(ids, n, rows[col], rows[col + "_ok"], largest)
    inst["skew"] = inst["last"] - inst["first"]
    inst["extra_gap"], inst["extra_gap_ok"] = _extra_gap(rows, hi, hi2)
    inst["delay"] = _late_delay(inst)
    inst["transfer"] = np.maximum(inst["first_end"] - inst["last"], 0)
    inst["transfer_ok"] = inst["first_end_ok"]
    inst["dim"] = np.array([dims.get(p, "unknown") for p in inst["pg_name"].tolist()], object)
    rows["inst"] = ids
    rows["wait"] = inst["last"][ids] - arrival
    rows["is_last"] = rank == inst["last_rank"][ids]
    return inst


def _extra_gap(rows: Columns, last: np.ndarray, second_last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per instance (`last` / `second_last`: its last and second-to-last arriving rows): how much longer
    the last rank took from the end of its own previous collective in the group to this arrival than
    the second-to-last rank took from its own (unknown when either has no previous end). On gloo the
    last arriver's collective also ends last, so it arrives last at the next one too; its gap, not its
    arrival, says whether it was slow again."""
    rg, _ = group_ids(rows["rank"], rows["pg_name"])
    by_seq = np.lexsort((rows["seq"], rg))
    same = np.zeros(by_seq.size, bool)
    same[1:] = rg[by_seq][1:] == rg[by_seq][:-1]
    prev_end = np.zeros(by_seq.size, np.int64)
    prev_end[1:] = rows["end"][by_seq][:-1]
    prev_ok = same & np.concatenate([[False], rows["end_ok"][by_seq][:-1]])
    gap, gap_ok = np.zeros(by_seq.size, np.int64), np.zeros(by_seq.size, bool)
    gap[by_seq] = rows["arrival"][by_seq] - prev_end
    gap_ok[by_seq] = prev_ok
    return gap[last] - gap[second_last], gap_ok[last] & gap_ok[second_last]


def _late_delay(inst: Columns) -> np.ndarray:
    """The late rank's delay: how long the group waited for it beyond everyone else, counting only from
    when the group's previous collective ended (async calls queue behind it anyway), and no more than
    its extra gap since its own previous collective (`_extra_gap`) where both ranks' ends are known."""
    pg, n = inst["pg_name"], inst["last"].size
    prev_end, prev_ok = np.zeros(n, np.int64), np.zeros(n, bool)
    prev_end[1:] = inst["last_end"][:-1]
    prev_ok[1:] = inst["last_end_ok"][:-1] & (pg[1:] == pg[:-1])
    second = inst["second_last"]
    ready = np.where(prev_ok & (prev_end > second), prev_end, second)
    delay = inst["last"] - ready
    delay = np.where(~inst["extra_gap_ok"] | (delay <= inst["extra_gap"]), delay, inst["extra_gap"])
    return np.maximum(delay, 0).astype(np.int64)


def _summarise(section: dict[str, Any], rows: Columns, inst: Columns, dims: dict[str, str]) -> None:
    """The section's counts, per-group and per-rank statistics and largest skews."""
    complete = ~inst["group_size_ok"] | (inst["n"] >= np.where(inst["group_size_ok"], inst["group_size"], 0))
    basis = Counter(inst["seq_basis"].tolist())  # keys in order of first appearance, as pandas counts
    names, counts = list(basis), np.array(list(basis.values()), np.int64)
    section.update({
        "seq_basis": {str(names[i]): int(counts[i]) for i in argsort_desc(counts)},
        "instances": int(inst["n"].size), "matched": int(inst["n"].size), "complete": int(complete.sum()),
    })
    section["by_group"] = _by_group(inst, dims)
    section["per_rank"] = _per_rank(rows, inst)
    section["top_skew"] = [{
        "pg_name": inst["pg_name"][i], "dim": inst["dim"][i], "seq": int(inst["seq"][i]), "op": inst["op"][i],
        "step": int(inst["step"][i]) if inst["step_ok"][i] else None, "skew_ns": int(inst["skew"][i]),
        "transfer_ns": int(inst["transfer"][i]) if inst["transfer_ok"][i] else None,
        "first_rank": int(inst["first_rank"][i]), "last_rank": int(inst["last_rank"][i]),
        "delay_ns": int(inst["delay"][i]),
    } for i in argsort_desc(inst["skew"])[:20].tolist()]


def _by_group(inst: Columns, dims: dict[str, str]) -> list[dict[str, Any]]:
    """Per (group, op), sorted: instances and skew / transfer statistics (instances without an op aside)."""
    idx = np.flatnonzero(not_null(inst["op"]))
    gid, m = group_ids(inst["pg_name"][idx], inst["op"][idx])
    order, starts, counts = group_order(gid, m)
    out = []
    for g in range(m):
        sel = idx[order[starts[g]:starts[g] + counts[g]]]
        pg, op = inst["pg_name"][sel[0]], inst["op"][sel[0]]
        known = sel[inst["transfer_ok"][sel]]
        out.append({"pg_name": pg, "dim": dims.get(pg, "unknown"), "op": op, "instances": int(sel.size),
                    "skew_ns": _stats(inst["skew"][sel]), "transfer_ns": _stats(inst["transfer"][known])})
    return out


def _per_rank(rows: Columns, inst: Columns) -> list[dict[str, Any]]:
    """Per rank with matched rows, ascending: its instances, how often it arrived last, the delay it
    caused there and its own wait."""
    ranks, at = unique_inverse(rows["rank"])
    at = at.reshape(-1)
    last_at = np.searchsorted(ranks, inst["last_rank"])
    wait, delay = np.zeros(ranks.size, np.int64), np.zeros(ranks.size, np.int64)
    np.add.at(wait, at, rows["wait"])
    np.add.at(delay, last_at, inst["delay"])
    n, lasts = np.bincount(at, minlength=ranks.size), np.bincount(last_at, minlength=ranks.size)
    return [{"rank": int(r), "instances": int(n[i]), "last_count": int(lasts[i]), "delay_ns": int(delay[i]),
             "wait_ns": int(wait[i])} for i, r in enumerate(ranks.tolist())]


def _apply_offsets(rows: Columns, offsets: dict[int, int]) -> None:
    """Keep each row's raw arrival (`arrival_raw`) and move arrival and end onto the common clock."""
    off, _ = lookup(rows["rank"], offsets)
    rows["arrival_raw"] = rows["arrival"]
    rows["arrival"] = rows["arrival"] - off
    rows["end"] = np.where(rows["end_ok"], rows["end"] - off, 0)


def match_collectives(store: RunStore, dims: dict[str, str]
                      ) -> tuple[MatchedCollectives | None, dict[str, Any], dict[str, Any]]:
    """(matched instances or None, the clock estimate, the `matching` section)."""
    cols = arrow_columns(read_collectives(store))
    on_gpu = gpu_ranks(store)
    per_rank, method = choose_sources(cols, on_gpu)
    section: dict[str, Any] = {"source": {"method": method, "per_rank": {str(k): v for k, v in per_rank.items()}}}
    if not per_rank:
        return None, dict(NO_CLOCKS), _empty_section(section)
    shifts, log_report = _trace_shifts(store, cols, per_rank)
    rows, p2p, unnamed = _select_rows(fill_log_ends(cols, shifts), per_rank, on_gpu, section)
    clocks, offsets = _estimate_clocks(store, rows, log_report)
    _apply_offsets(rows, offsets)
    _apply_offsets(unnamed, offsets)
    rows = _with_unnamed(rows, unnamed, section)
    p2p_waits, section["p2p"], pairs = _pair_p2p(p2p, offsets, on_gpu)
    inst = _aggregate_instances(rows, dims)
    _summarise(section, rows, inst, dims)
    section["warnings"] = integrity_warnings(section)
    rows["waited_for"] = inst["last_rank"][rows["inst"]].astype(np.int64)
    waits = {k: np.concatenate([rows[k], p2p_waits[k]]) for k in ("rank", "source", "arrival_raw", "wait", "waited_for")}
    wait_sets, wait_by_peer = _wait_intervals(waits, shifts)
    keys = _keys(inst["pg_name"], inst["seq"])
    matched = MatchedCollectives(rows=_rows_frame(rows, keys), instances=_instances_frame(inst, keys), trace_shift=shifts,
                                 wait_intervals=wait_sets, gpu_ranks=on_gpu, p2p_pairs=pairs,
                                 wait_by_peer=wait_by_peer, late_finish=_late_finish(rows, inst, shifts))
    return matched, clocks, section


def _keys(pg: np.ndarray, seq: np.ndarray) -> Callable[[], np.ndarray]:
    """The instance key column (pg_name#seq), made when a frame is first built and then kept: the instances'
    frame and the rows' (each row its instance's key: one string per instance, not per row) share it."""
    held: list[np.ndarray] = []

    def build() -> np.ndarray:
        if not held:
            held.append(np.array([f"{p}#{s}" for p, s in zip(pg.tolist(), seq.tolist())], object))
        return held[0]
    return build


def _rows_frame(rows: Columns, keys: Callable[[], np.ndarray]) -> LazyFrame:
    """`MatchedCollectives.rows`: times exact (Int64: NA when unknown); step and bytes float64 with NaN; `keys`:
    the instances' keys (`_keys`), each row's its instance's (`inst`)."""
    inst = rows["inst"]
    return LazyFrame(len(rows["rank"]), {
        "key": Column("object", lambda: keys()[inst]), "pg_name": Column("object", rows["pg_name"]),
        "seq": Column("int64", rows["seq"]), "op": Column("object", rows["op"]),
        "rank": Column("Int32", rows["rank"]), "arrival": Column("int64", rows["arrival"]),
        "arrival_raw": Column("int64", rows["arrival_raw"]), "end": Column("Int64", rows["end"], rows["end_ok"]),
        "wait": Column("int64", rows["wait"]), "is_last": Column("bool", rows["is_last"]),
        "source": Column("object", rows["source"]), "step": Column("float64", rows["step"], rows["step_ok"]),
        "caller": Column("object", rows["caller"]), "bytes": Column("float64", rows["bytes"], rows["bytes_ok"])})


def _instances_frame(inst: Columns, keys: Callable[[], np.ndarray] | None = None) -> LazyFrame:
    """`MatchedCollectives.instances`: times exact (Int64: NA when unknown); step and group_size float64; `keys`:
    their key column's maker (`_keys`; default: one of its own)."""
    def col(name: str, dtype: str = "int64") -> Column:
        return Column(dtype, inst[name], inst.get(name + "_ok"))

    n = len(inst["n"])
    return LazyFrame(n, {
        "key": Column("object", keys or _keys(inst["pg_name"], inst["seq"])), "pg_name": col("pg_name", "object"),
        "seq": col("seq"), "op": col("op", "object"), "step": col("step", "float64"), "n": col("n", "Int64"),
        "first": col("first"), "last": col("last"), "first_end": col("first_end", "Int64"),
        "last_end": col("last_end", "Int64"), "group_size": col("group_size", "float64"),
        "seq_basis": col("seq_basis", "object"), "last_rank": col("last_rank"), "first_rank": col("first_rank"),
        "second_last": col("second_last"), "skew": col("skew"),
        "extra_gap": col("extra_gap", "Int64" if n else "float64"),  # as pandas left it with no instance
        "delay": col("delay"), "transfer": col("transfer", "Int64"), "dim": col("dim", "object")})


def integrity_warnings(section: dict[str, Any]) -> list[str]:
    """What matching left out, in words for the user (analysis.json inputs.warnings, console, report)."""
    out = []
    if section.get("op_mismatches"):
        out.append(f"{section['op_mismatches']} collective instance(s) whose ranks disagree on the op were left "
                   "out of cross-rank matching")
    if section.get("no_group"):
        out.append(f"{section['no_group']} collective call(s) recorded without a process group were left out of "
                   "cross-rank matching (paired only within a step where their ends show one collective; never "
                   "numbered within a guessed group)")
    if section.get("no_device_time"):
        out.append(f"{section['no_device_time']} collective call(s) on GPU ranks have no device time (no kernel): "
                   "no arrival, left out of cross-rank matching")
    return out


def _p2p_sides(p2p: Columns, offsets: dict[int, int], on_gpu: set[int]) -> Columns:
    """The P2P rows that can pair (one direction, peer and arrival known), ordered by (src, dst, group,
    send, arrival) with `k`: the row's position among its direction's sends (or recvs)."""
    ops = [o or "" for o in p2p["op"].tolist()]
    is_send = np.array(["send" in o for o in ops], bool)
    is_recv = np.array(["recv" in o for o in ops], bool)
    ok = p2p["peer_ok"] & p2p["arrival_ok"] & (is_send ^ is_recv)
    p = {"rank": p2p["rank"][ok], "peer": p2p["peer"][ok], "source": p2p["source"][ok], "send": is_send[ok],
         "arrival_raw": p2p["arrival"][ok],
         "pg_name": np.array([g if g is not None else "?" for g in p2p["pg_name"][ok].tolist()], object),
         "dur": np.where(p2p["dur_ok"], p2p["dur"], -1)[ok],
         "bytes": np.where(p2p["bytes_ok"], p2p["bytes"].astype(np.float64), np.nan)[ok],
         "step": np.where(p2p["step_ok"], p2p["step"].astype(np.float64), np.nan)[ok],
         "gpu": _on_ranks(p2p["rank"][ok], on_gpu)}
    p["arrival"] = p["arrival_raw"] - lookup(p["rank"], offsets)[0]
    p["src"] = np.where(p["send"], p["rank"], p["peer"])
    p["dst"] = np.where(p["send"], p["peer"], p["rank"])
    pg_code, _ = group_ids(p["pg_name"])
    p = take(p, np.lexsort((p["arrival"], p["send"], pg_code, p["dst"], p["src"])))
    p["k"] = cumcount(*group_ids(p["src"], p["dst"], p["pg_name"], p["send"]))
    return p


def _pair_p2p(p2p: Columns, offsets: dict[int, int], on_gpu: set[int]
              ) -> tuple[Columns, dict[str, int], LazyFrame | None]:
    """Pair sends with receives (k-th send src->dst on a group <-> k-th recv at dst from src) and give
    each side its wait for the other: rows (rank, source, arrival_raw, wait, waited_for), counts, and the pairs'
    transfers (`MatchedCollectives.p2p_pairs`; None without P2P rows that can pair)."""
    total = int(p2p["rank"].size)
    p = _p2p_sides(p2p, offsets, on_gpu)
    if p["rank"].size == 0:
        empty = {"rank": np.zeros(0, np.int64), "source": np.zeros(0, object),
                 "arrival_raw": np.zeros(0, np.int64), "wait": np.zeros(0, np.int64),
                 "waited_for": np.zeros(0, np.int64)}
        return empty, {"pairs": 0, "unpaired": total, "wait_ns": 0}, None
    ids, n = group_ids(p["src"], p["dst"], p["pg_name"], p["k"])
    sends, recvs = np.flatnonzero(p["send"]), np.flatnonzero(~p["send"])
    recv_of = np.full(n, -1, np.int64)
    recv_of[ids[recvs]] = recvs
    partner = recv_of[ids[sends]]
    s, r = sends[partner >= 0], partner[partner >= 0]
    last = np.maximum(p["arrival"][s], p["arrival"][r])
    waits = {"rank": np.concatenate([p["rank"][s], p["rank"][r]]),
             "source": np.concatenate([p["source"][s], p["source"][r]]),
             "arrival_raw": np.concatenate([p["arrival_raw"][s], p["arrival_raw"][r]]),
             "wait": np.concatenate([last - p["arrival"][s], last - p["arrival"][r]]),
             # each side waits for the other (a zero wait, the later side's, is charged to no one)
             "waited_for": np.concatenate([p["rank"][r], p["rank"][s]])}
    return waits, {"pairs": int(s.size), "unpaired": total - 2 * int(s.size),
                   "wait_ns": int(waits["wait"].sum())}, _pair_transfers(take(p, s), take(p, r), last)


def _pair_transfers(snd: Columns, rcv: Columns, last: np.ndarray) -> LazyFrame:
    """Per send/recv pair: its transfer (first side's end − last side's arrival, clipped at 0; 0 when
    either side's duration is unknown), message size, step and whether both sides are device-timed."""
    first_end = np.minimum(snd["arrival"] + snd["dur"], rcv["arrival"] + rcv["dur"])
    transfer = np.where((snd["dur"] < 0) | (rcv["dur"] < 0), 0, np.clip(first_end - last, 0, None))
    return LazyFrame(int(last.size), {
        "pg_name": Column("object", snd["pg_name"]), "src": Column("int64", snd["src"]),
        "dst": Column("int64", snd["dst"]), "bytes": Column("float64", np.fmax(snd["bytes"], rcv["bytes"])),
        "step": Column("float64", np.where(np.isnan(snd["step"]), rcv["step"], snd["step"])),
        "device_timed": Column("bool", snd["gpu"] & rcv["gpu"]), "transfer": Column("int64", transfer)})


def row_trace_shift(rank: np.ndarray, source: np.ndarray, shifts: dict[int, int | None]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Per row: what to add to its raw times to reach its rank's trace clock (exact int64, 0 where
    unknown) and whether it is known. Kineto rows are on the trace clock already; log rows need their
    rank's shift (`shifts`, MatchedCollectives.trace_shift)."""
    shift, known = lookup(rank, shifts)
    kineto = source == "kineto"
    return np.where(kineto, 0, shift), kineto | known


def _wait_intervals(rows: Columns, shifts: dict[int, int | None]
                    ) -> tuple[dict[int, iv.IntervalSet], dict[int, dict[int, iv.IntervalSet]]]:
    """Per rank, on its trace clock: the time between its arrival and the last member's arrival (a P2P
    side: the other side's), and the same time split by whom it waited for (`waited_for`: the
    instance's last arrival, the P2P peer) into disjoint sets (`charge_waits`)."""
    out: dict[int, iv.IntervalSet] = {}
    by_peer: dict[int, dict[int, iv.IntervalSet]] = {}
    rank = rows["rank"].astype(np.int64)
    shift, ok = row_trace_shift(rank, rows["source"], shifts)
    start = rows["arrival_raw"].astype(np.int64) + shift
    wait = rows["wait"].astype(np.int64)
    peer = rows["waited_for"].astype(np.int64)
    order = np.argsort(rank, kind="stable")
    bounds = np.flatnonzero(np.diff(rank[order])) + 1
    for idx in np.split(order, bounds):
        idx = idx[ok[idx]]
        if idx.size == 0:
            continue
        r = int(rank[idx[0]])
        out[r] = iv.union(start[idx], start[idx] + wait[idx])
        idx = idx[wait[idx] > 0]
        by_peer[r] = charge_waits(start[idx], start[idx] + wait[idx], peer[idx])
    return out, by_peer


def _late_finish(rows: Columns, inst: Columns, shifts: dict[int, int | None]) -> dict[int, iv.IntervalSet]:
    """Per rank, on its trace clock: [its end − (its end − the instance's first member's end), its end) for
    each collective it ended after the first member did (`MatchedCollectives.late_finish`)."""
    ids = rows["inst"]
    ok = rows["end_ok"].astype(bool) & inst["first_end_ok"][ids].astype(bool)
    late = np.where(ok, rows["end"] - inst["first_end"][ids], 0)
    rank = rows["rank"].astype(np.int64)
    shift, known = row_trace_shift(rank, rows["source"], shifts)
    end = rows["arrival_raw"].astype(np.int64) + shift + (rows["end"] - rows["arrival"])  # its end, trace clock
    keep = known & (late > 0)
    out: dict[int, iv.IntervalSet] = {}
    for r in np.unique(rank[keep]).tolist():
        m = keep & (rank == r)
        out[int(r)] = iv.union(end[m] - late[m], end[m])
    return out


def charge_waits(starts: np.ndarray, ends: np.ndarray, peers: np.ndarray) -> dict[int, iv.IntervalSet]:
    """One rank's wait intervals [starts, ends) split by whom each waited for (`peers`), as disjoint sets
    whose union is the union of the intervals: where waits overlap (collectives in flight on several
    streams), the time goes to the wait that ends last, the arrival that holds the rank longest."""
    if starts.size == 0:
        return {}
    o = np.lexsort((-ends, starts))
    s, e, p = starts[o], ends[o], peers[o]
    top = np.maximum.accumulate(e)  # the latest end among the waits begun so far ...
    holder = np.maximum.accumulate(np.where(e == top, np.arange(e.size), 0))  # ... and whose it is
    cuts = sorted_unique(np.concatenate([s, e]))
    seg_lo, seg_hi = cuts[:-1], cuts[1:]
    at = np.searchsorted(s, seg_lo, side="right") - 1
    covered = (at >= 0) & (top[np.maximum(at, 0)] > seg_lo)
    seg_lo, seg_hi, who = seg_lo[covered], seg_hi[covered], p[holder[at[covered]]]
    return {int(q): iv.union(seg_lo[who == q], seg_hi[who == q]) for q in np.unique(who).tolist()}


@dataclass(frozen=True)
class MatchingResult(AnalyzerResult):
    matched: MatchedCollectives | None = None
    """None when no rank has collectives."""
    clocks: dict[str, Any] = field(default_factory=lambda: dict(NO_CLOCKS))
    """The clock estimate (offsets per rank, log-to-trace shifts, hosts): the `clocks` section."""


def matched_of(matching: MatchingResult | None) -> MatchedCollectives | None:
    return matching.matched if matching is not None else None


def analyze_matching(store: RunStore, layout: LayoutResult | None) -> MatchingResult:
    matched, clocks, section = match_collectives(store, dims_of(layout))
    return MatchingResult(findings=[], section=section, matched=matched, clocks=clocks)
