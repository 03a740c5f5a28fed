"""Joins a rank's Kineto collectives with its collective log (comms log or Flight Recorder).

Kineto rows that carry a group and sequence number (NCCL `record_param_comms` args, the runtime's
`comm:` labels) join the log on (pg_name, is_p2p, seq). On gloo the profiler records neither, so
the rest are aligned by issue order and time (`_align_by_time`): a Kineto collective takes the
unused log entry of the same op, compatible group and message size, created before the op started
(allowing for the measured clock skew) whose lead is closest to the typical one. Matched Kineto rows get the log's group, sequence
number (seq_source "log") and any metadata they lack; unmatched ones (ops the log never saw, e.g.
DDP's own broadcasts) are numbered by order within (pg_name, p2p) with seq_source "order".
Both sources' rows stay in the store.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.parse.dict_columns import text_test
from tracekit.tables.columns import table_rows
from tracekit.tables.schema import conform

# Metadata copied from a matched log row into a Kineto row where the Kineto row has none.
_FILL_FROM_LOG = ("pg_name", "pg_desc", "peer", "in_nelems", "out_nelems", "dtype", "bytes",
                  "in_split_sizes", "out_split_sizes", "group_size", "group_ranks", "caller", "step")
# A log entry may be created this long before its Kineto op starts (Python between the log call
# and the c10d op, injected delays) ...
MAX_LEAD_NS = 5_000_000_000
# ... and, in the first (nearest-entry) pass, this long after the op ends (clock offsets).
LAG_TOLERANCE_NS = 2_000_000
# Margin added to the estimated clock offset between the trace and the log.
SKEW_MARGIN_NS = 20_000


@dataclass
class JoinStats:
    kineto_rows: int = 0
    matched_by_seq: int = 0
    matched_by_order: int = 0
    numbered_by_order: int = 0
    group_inferred: int = 0
    no_group: int = 0
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"kineto_rows": self.kineto_rows, "matched_by_seq": self.matched_by_seq,
                "matched_by_order": self.matched_by_order, "numbered_by_order": self.numbered_by_order,
                "group_inferred": self.group_inferred, "no_group": self.no_group}


def _start(row: dict[str, Any]) -> int | None:
    return row["enqueue_ts"] if row["enqueue_ts"] is not None else row["ts"]


def _end(row: dict[str, Any]) -> int | None:
    start = _start(row)
    if start is None:
        return None
    dur = row["enqueue_dur"] if row["enqueue_ts"] is not None else row["dur"]
    return start + max(dur or 0, 0)


def _p2p(row: dict[str, Any]) -> bool:
    return bool(row["is_p2p"]) or row["op"] in ("send", "recv")


def _message_nelems(row: dict[str, Any]) -> int:
    return max(row["in_nelems"] or 0, row["out_nelems"] or 0)


def _compatible(k: dict[str, Any], lr: dict[str, Any]) -> bool:
    """Could log entry `lr` be the call that Kineto row `k` recorded? (op, group, message size)"""
    if k["pg_name"] is not None and lr["pg_name"] != k["pg_name"]:
        return False
    a, b = _message_nelems(k), _message_nelems(lr)
    if a == 0 or b == 0 or a == b:
        return True
    # The profiler may know one side only (coalesced all-gathers: the input list's dims, no output) or
    # name the arguments the other way round: a size both sides recorded is enough.
    return bool({k["in_nelems"], k["out_nelems"]} & {lr["in_nelems"], lr["out_nelems"]} - {None, 0})


def _align_by_time(pending: list[dict[str, Any]], log_rows: list[dict[str, Any]], used: list[bool],
                   shift: int) -> list[tuple[dict[str, Any], int]]:
    """Match Kineto rows without seq to log entries: same op, compatible group and size, issue order.

    The comm layer logs an entry just before it issues the c10d op, so a call's entry was created a
    short, fairly steady time before the op starts (Python in between; longer for batched P2P). The two
    clocks (Kineto's, the log's `time.time_ns()`) may also differ: the profiler converts its own clock to
    wall time with a fit made when it starts, off by tens to hundreds of µs on a loaded host. Pass 1 pairs
    each op with its nearest compatible entry: the median of (op start − entry created) is the typical lead;
    when it is negative the trace clock runs behind by at least that much (the skew). Pass 2 walks the ops in
    order and takes, among unused compatible entries created after the previous match of the op and before
    start + that skew, the one whose lead is closest to the typical lead. No call starts before its entry is
    created, so the trace clock may also run behind by as much as pass 1's smallest lead (an entry nearest to
    several ops counting for the closest only), which the median's skew cuts off (a clock 60 µs off on a loaded
    box left a gloo all_gather without its entry, or matched a recv to the entry of the round before the
    profiler started); pass 2 is also walked with that wider skew, and its matches are kept where they explain
    more of the ops, or as many with leads closer to the typical one in sum.
    """
    per_op: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for i, lr in enumerate(log_rows):
        if not used[i] and lr["enqueue_ts"] is not None:
            per_op[lr["op"]].append((lr["enqueue_ts"] - shift, i))
    for lst in per_op.values():
        lst.sort()
    ordered = sorted((r for r in pending if _start(r) is not None), key=_start)
    nearest = [_nearest_lead(row, per_op, log_rows) for row in ordered]
    leads = sorted(lead for lead, i in nearest if i is not None)
    if not leads:
        return []
    typical = leads[len(leads) // 2]
    skew = max(0, -typical) + SKEW_MARGIN_NS
    out, now_used, cost = _walk(ordered, per_op, log_rows, used, typical, skew)
    claims: dict[int, int] = {}
    for lead, i in nearest:
        if i is not None and (i not in claims or abs(lead) < abs(claims[i])):
            claims[i] = lead
    wide = max(0, -min(claims.values())) + SKEW_MARGIN_NS
    if wide > skew:
        out_wide, used_wide, cost_wide = _walk(ordered, per_op, log_rows, used, typical, wide)
        if (-len(out_wide), cost_wide) < (-len(out), cost):
            out, now_used = out_wide, used_wide
    used[:] = now_used
    return out


def _walk(ordered: list[dict[str, Any]], per_op: dict[str, list[tuple[int, int]]], log_rows: list[dict[str, Any]],
          used: list[bool], typical: int, skew: int) -> tuple[list[tuple[dict[str, Any], int]], list[bool], int]:
    """Pass 2 of `_align_by_time` with `skew`: the matches, `used` after them (a copy) and the matches' summed
    distance from the typical lead."""
    used = list(used)
    out = []
    cost = 0
    last_taken: dict[str, int] = {}
    for row in ordered:
        best = _closest_to_typical(row, per_op, log_rows, used, typical, skew, last_taken.get(row["op"]))
        if best is not None:
            used[best[2]] = True
            last_taken[row["op"]] = best[1]
            out.append((row, best[2]))
            cost += best[0]
    return out, used, cost


def _nearest_lead(row: dict[str, Any], per_op: dict[str, list[tuple[int, int]]],
                  log_rows: list[dict[str, Any]]) -> tuple[int, int | None]:
    """Pass 1: (op start − creation time, index) of the nearest compatible entry ((0, None): no candidate)."""
    cands = per_op.get(row["op"])
    if not cands:
        return 0, None
    start = _start(row)
    pos = bisect.bisect_left(cands, (start, -1))
    best: tuple[int, int | None] = (0, None)
    for j in list(range(pos - 1, max(pos - 64, -1), -1)) + list(range(pos, min(pos + 64, len(cands)))):
        created, i = cands[j]
        if created > _end(row) + LAG_TOLERANCE_NS or created < start - MAX_LEAD_NS:
            continue
        if _compatible(row, log_rows[i]) and (best[1] is None or abs(start - created) < abs(best[0])):
            best = (start - created, i)
    return best


def _closest_to_typical(row: dict[str, Any], per_op: dict[str, list[tuple[int, int]]], log_rows: list[dict[str, Any]],
                        used: list[bool], typical: int, skew: int, previous: int | None) -> tuple[int, int, int] | None:
    """Pass 2: among unused compatible entries created after `previous` and before start + skew (or inside
    the call: `tracekit record` logs from a kernel on the c10d op, tens of µs after its profiler range
    opens), the one whose lead is closest to the typical lead, as (distance, created, index)."""
    cands = per_op.get(row["op"])
    if not cands:
        return None
    start = _start(row)
    hi = bisect.bisect_right(cands, (max(start + skew, _end(row)), len(log_rows)))
    best: tuple[int, int, int] | None = None
    for j in range(hi - 1, -1, -1):
        created, i = cands[j]
        if created < start - MAX_LEAD_NS or (previous is not None and created <= previous):
            break
        distance = abs(start - created - typical)
        if best is not None and start - created - typical > best[0]:
            break  # walking back, leads only grow: nothing closer remains
        if used[i] or not _compatible(row, log_rows[i]):
            continue
        if best is None or distance < best[0]:
            best = (distance, created, i)
    return best


def _group_candidates(row: dict[str, Any], groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rank's groups that could be this row's: same ranks, else same size, else all of them."""
    if row.get("group_ranks"):
        return [g for g in groups if g.get("ranks") and sorted(g["ranks"]) == sorted(row["group_ranks"])]
    if row.get("group_size"):
        return [g for g in groups if g.get("size") == row["group_size"]]
    return list(groups)


def resolve_groups(rows: list[dict[str, Any]], groups: list[dict[str, Any]]) -> tuple[int, int]:
    """Give each row without a group the one group of this rank that fits it (same ranks or size; the
    rank's only group), noting how; rows several groups could own keep a null pg_name and a
    `match_note` (the matching analyzer pairs them only by their times). Returns (inferred, left without a group)."""
    inferred = unresolved = 0
    for row in rows:
        if row["pg_name"] is not None:
            continue
        cands = _group_candidates(row, groups)
        if len(cands) == 1:
            g = cands[0]
            row["pg_name"], row["pg_desc"] = g["pg_name"], row.get("pg_desc") or g.get("pg_desc")
            row["match_note"] = "group inferred: the only group of this rank with its ranks/size"
            inferred += 1
        else:
            row["seq"], row["seq_source"] = None, None
            why = (f"{len(cands)} of this rank's groups could own it" if groups else
                   "the trace describes no process groups")
            row["match_note"] = (f"no process group recorded; {why}: matched across ranks only where its "
                                 "times pair it (matching._pair_unnamed)")
            unresolved += 1
    return inferred, unresolved


def _take_log_entry(row: dict[str, Any], lr: dict[str, Any], seq_source: str | None) -> None:
    """Fill what the Kineto row lacks from its matched log entry."""
    for col in _FILL_FROM_LOG:
        if row.get(col) is None and lr.get(col) is not None:
            row[col] = lr[col]
    if row["seq"] is None:
        row["seq"] = lr["seq"]
        row["seq_source"] = seq_source
    if row["is_p2p"] is None:
        row["is_p2p"] = lr["is_p2p"]
    if row.get("bytes") is not None:
        row["size_note"] = None  # the log supplied what the trace lacked


def _match_by_seq(rows: list[dict[str, Any]], log_rows: list[dict[str, Any]], used: list[bool]) -> int:
    """Exact matches: (group, p2p, seq) known on both sides. Returns how many."""
    by_key: dict[tuple[Any, bool, int], int] = {}
    for i, lr in enumerate(log_rows):
        if lr["seq"] is not None and lr["pg_name"] is not None:
            by_key.setdefault((lr["pg_name"], _p2p(lr), lr["seq"]), i)
    matched = 0
    for row in rows:
        if row["seq"] is not None and row["pg_name"] is not None:
            i = by_key.get((row["pg_name"], _p2p(row), row["seq"]))
            if i is not None and not used[i]:
                used[i] = True
                _take_log_entry(row, log_rows[i], row["seq_source"])
                matched += 1
    return matched


def _number_by_order(rows: list[dict[str, Any]]) -> int:
    """Rows of a known group with no seq: numbered by order within (pg_name, p2p), 1-based like c10d."""
    counters: dict[Any, int] = defaultdict(int)
    for row in sorted(rows, key=lambda r: (_start(r) is None, _start(r) or 0)):
        if row["seq"] is None and row["pg_name"] is not None:
            key = (row["pg_name"], _p2p(row))
            counters[key] += 1
            row["seq"], row["seq_source"] = counters[key], "order"
    return sum(counters.values())


def numbered_without_log(kineto: pa.Table) -> tuple[pa.Table, int]:
    """`_number_by_order` as columns, for a rank with no log whose rows all name their group (the other steps
    of `join_collectives` then change nothing): the rows without seq numbered 1, 2, ... within (pg_name, p2p)
    in order of their start (enqueue time, else start; rows without one last, ties in table order), seq_source
    "order". (A 1,024-rank run's 580,000 collectives: ~12 s as row dicts in the main process.)"""
    seq = kineto.column("seq")
    todo = np.flatnonzero(seq.is_null().to_numpy(zero_copy_only=False))
    if todo.size == 0:
        return kineto, 0
    start = pc.coalesce(kineto.column("enqueue_ts"), kineto.column("ts"))
    unknown = start.is_null().to_numpy(zero_copy_only=False)[todo]
    at = pc.fill_null(start, 0).to_numpy()[todo]
    p2p = (pc.fill_null(kineto.column("is_p2p"), False).to_numpy(zero_copy_only=False)
           | text_test(kineto.column("op"), pc.is_in, pa.array(["send", "recv"]))
           .fill_null(False).to_numpy(zero_copy_only=False))[todo]
    _, pg = np.unique(kineto.column("pg_name").to_numpy(zero_copy_only=False)[todo], return_inverse=True)
    group = pg.reshape(-1) * 2 + p2p
    order = np.lexsort((todo, at, unknown))  # by start, unknown last, then table order
    by_group = np.argsort(group[order], kind="stable")
    cut = np.r_[0, np.flatnonzero(np.diff(group[order][by_group])) + 1]
    counts = np.diff(np.r_[cut, by_group.size])
    number = np.empty(todo.size, np.int64)
    number[order[by_group]] = np.arange(by_group.size) - np.repeat(cut, counts) + 1
    values = pc.fill_null(seq, 0).to_numpy().copy()
    values[todo] = number
    source = np.array(kineto.column("seq_source").to_pylist(), dtype=object)
    source[todo] = "order"
    out = kineto.set_column(kineto.schema.get_field_index("seq"), kineto.schema.field("seq"),
                            pa.array(values, type=seq.type, mask=np.zeros(values.size, bool)))
    i = out.schema.get_field_index("seq_source")
    return out.set_column(i, out.schema.field(i), pa.array(source, type=out.schema.field(i).type)), int(todo.size)


def join_collectives(kineto: pa.Table, log: pa.Table | None, *, log_shift_ns: int = 0,
                     groups: list[dict[str, Any]] | None = None) -> tuple[pa.Table, JoinStats]:
    """Return the Kineto collectives with seq (and missing metadata) filled from `log`.

    `log_shift_ns` is subtracted from log times to put them on the Kineto rows' clock. `groups`: the
    process groups this rank belongs to (its trace's distributedInfo), for rows that name none.
    """
    stats = JoinStats(kineto_rows=kineto.num_rows)
    if kineto.num_rows == 0:
        return kineto, stats
    if (log is None or log.num_rows == 0) and kineto.column("pg_name").null_count == 0:
        joined, stats.numbered_by_order = numbered_without_log(kineto)  # steps 1-3 change nothing: step 4
        return conform("collectives", joined), stats
    rows = table_rows(kineto)  # to_pylist's rows, column by column (~4x faster on a rank's thousands)
    log_rows = table_rows(log) if log is not None and log.num_rows else []
    used = [False] * len(log_rows)
    stats.matched_by_seq = _match_by_seq(rows, log_rows, used)  # 1. exact
    pending = [r for r in rows if r["seq"] is None]  # 2. issue order + time (gloo): see `_align_by_time`
    if pending and log_rows:
        for row, i in _align_by_time(pending, log_rows, used, log_shift_ns):
            _take_log_entry(row, log_rows[i], "log")
            stats.matched_by_order += 1
    # 3. no group recorded and none from the log: the group the rank's own description pins down, or none
    stats.group_inferred, stats.no_group = resolve_groups(rows, groups or [])
    if stats.no_group:
        stats.warnings.append(f"{stats.no_group} of {stats.kineto_rows} profiler collectives name no process group "
                              f"and none could be inferred: matched across ranks only where their times pair them")
    stats.numbered_by_order = _number_by_order(rows)  # 4. no log entry
    if log_rows and stats.numbered_by_order:
        stats.warnings.append(f"{stats.numbered_by_order} of {stats.kineto_rows} profiler collectives have no "
                              f"matching log entry; numbered by order within their group")
    return conform("collectives", pa.Table.from_pylist(rows, schema=kineto.schema)), stats
