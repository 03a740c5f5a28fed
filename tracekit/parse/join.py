"""Joins a rank's Kineto collectives with its collective log (comms log or Flight Recorder).

Kineto rows that carry a group and sequence number (NCCL `record_param_comms` args, the runtime's
`comm:` labels) join the log on (pg_name, is_p2p, seq). On gloo the profiler records neither, so
the rest are aligned by issue order: each Kineto collective takes the latest not-yet-used log entry
of the same op (and group, when known) created before the Kineto op ended. Matched Kineto rows get
the log's group, sequence number (seq_source "log") and any metadata they lack; unmatched ones are
numbered by order within (pg_name) with seq_source "order". Both sources' rows stay in the store.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from tracekit.tables.schema import conform

# Metadata copied from a matched log row into a Kineto row where the Kineto row has none.
_FILL_FROM_LOG = ("pg_name", "pg_desc", "peer", "in_nelems", "out_nelems", "dtype", "bytes",
                  "in_split_sizes", "out_split_sizes", "group_size", "group_ranks", "caller", "step")
# A log entry may be created this long before its Kineto op starts (Python between the log call
# and the c10d op, injected delays) and this little after it ends (clock rounding).
MAX_LEAD_NS = 5_000_000_000
LAG_TOLERANCE_NS = 2_000_000


@dataclass
class JoinStats:
    kineto_rows: int = 0
    matched_by_seq: int = 0
    matched_by_order: int = 0
    numbered_by_order: int = 0
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"kineto_rows": self.kineto_rows, "matched_by_seq": self.matched_by_seq,
                "matched_by_order": self.matched_by_order, "numbered_by_order": self.numbered_by_order}


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


def join_collectives(kineto: pa.Table, log: pa.Table | None, *, log_shift_ns: int = 0) -> tuple[pa.Table, JoinStats]:
    """Return the Kineto collectives with seq (and missing metadata) filled from `log`.

    `log_shift_ns` is subtracted from log times to put them on the Kineto rows' clock.
    """
    stats = JoinStats(kineto_rows=kineto.num_rows)
    if kineto.num_rows == 0:
        return kineto, stats
    rows = kineto.to_pylist()
    log_rows = log.to_pylist() if log is not None and log.num_rows else []
    used = [False] * len(log_rows)
    by_key: dict[tuple[Any, bool, int], int] = {}
    for i, lr in enumerate(log_rows):
        if lr["seq"] is not None and lr["pg_name"] is not None:
            by_key.setdefault((lr["pg_name"], _p2p(lr), lr["seq"]), i)

    def take(row: dict[str, Any], i: int, seq_source: str | None) -> None:
        used[i] = True
        lr = log_rows[i]
        for col in _FILL_FROM_LOG:
            if row.get(col) is None and lr.get(col) is not None:
                row[col] = lr[col]
        if row["seq"] is None:
            row["seq"] = lr["seq"]
            row["seq_source"] = seq_source
        if row["is_p2p"] is None:
            row["is_p2p"] = lr["is_p2p"]

    # 1. exact: (group, p2p, seq) known on both sides.
    for row in rows:
        if row["seq"] is not None and row["pg_name"] is not None:
            i = by_key.get((row["pg_name"], _p2p(row), row["seq"]))
            if i is not None and not used[i]:
                take(row, i, row["seq_source"])
                stats.matched_by_seq += 1

    # 2. issue order + time: latest unused entry of the same op/group created before the op ended.
    pending = [r for r in rows if r["seq"] is None]
    if pending and log_rows:
        per_op: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for i, lr in enumerate(log_rows):
            if not used[i] and lr["enqueue_ts"] is not None:
                per_op[lr["op"]].append((lr["enqueue_ts"] - log_shift_ns, i))
        for lst in per_op.values():
            lst.sort()
        last_taken: dict[str, int] = {}
        for row in sorted(pending, key=lambda r: (_start(r) is None, _start(r) or 0)):
            start, end = _start(row), _end(row)
            cands = per_op.get(row["op"])
            if start is None or not cands:
                continue
            hi = bisect.bisect_right(cands, (end + LAG_TOLERANCE_NS, len(log_rows)))
            floor = max(start - MAX_LEAD_NS, last_taken.get(row["op"], -(1 << 62)))
            for j in range(hi - 1, -1, -1):
                created, i = cands[j]
                if created < floor:
                    break
                if used[i]:
                    continue
                if row["pg_name"] is not None and log_rows[i]["pg_name"] != row["pg_name"]:
                    continue
                take(row, i, "log")
                last_taken[row["op"]] = created
                stats.matched_by_order += 1
                break

    # 3. no log entry: number by order within (pg_name), 1-based like c10d.
    counters: dict[Any, int] = defaultdict(int)
    for row in sorted(rows, key=lambda r: (_start(r) is None, _start(r) or 0)):
        if row["seq"] is None:
            key = (row["pg_name"], _p2p(row))
            counters[key] += 1
            row["seq"] = counters[key]
            row["seq_source"] = "order"
            stats.numbered_by_order += 1
    if log_rows and stats.numbered_by_order:
        stats.warnings.append(f"{stats.numbered_by_order} of {stats.kineto_rows} profiler collectives have no "
                              f"matching log entry; numbered by order within their group")
    return conform("collectives", pa.Table.from_pylist(rows, schema=kineto.schema)), stats
