"""The per-rank collective log `comms.rank{R}.jsonl`, in PyTorch Flight Recorder's entry schema.

Shared by the reference runtime's comm layer and `tracekit record`, read by `parse/comms_log.py`.
Line 1 is a header `{"type": "header", "version": ..., "rank", "world_size", "pg_config"}`; every
other line is one entry with Flight Recorder keys (`record_id`, `pg_id`, `process_group`,
`collective_seq_id`, `p2p_seq_id`, `profiling_name`, `time_created_ns`,
`time_discovered_started_ns`, `time_discovered_completed_ns`, `input_sizes`, `input_dtypes`,
`output_sizes`, `output_dtypes`, `state`) plus tracekit extensions (`is_p2p`, `peer`,
`group_ranks`, `in_split_sizes`, `out_split_sizes`, `caller`, `step`, and `source`: how the entry
was seen, e.g. `c10d_dispatcher` or `dispatch_mode` for `tracekit record`). Times are
`time.time_ns()` (wall clock, comparable across ranks of one host). A file whose last line is cut
(rank killed mid-write) stays readable up to that line; `{"type": "footer"}` marks a clean close.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

COMMS_LOG_VERSION = "tracekit.comms/1"

try:  # ~10x faster than json.dumps; the log is written inside the profiled window
    from msgspec.json import encode as _encode
except ImportError:  # pragma: no cover - msgspec is a dependency; keep the recorder working without it
    def _encode(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


COMPLETED = "time_discovered_completed_ns"


def encode_line(obj: dict[str, Any]) -> bytes:
    """One log line's JSON text (no newline), as `CommLog` writes it."""
    return _encode(obj)


def new_entry(*, pg_name: str, pg_desc: str, profiling_name: str, time_created_ns: int,
              time_started_ns: int | None = None, time_completed_ns: int | None = None,
              input_sizes: list, input_dtypes: list[str], output_sizes: list, output_dtypes: list[str],
              is_p2p: bool = False, peer: int | None = None, group_ranks: list[int] | None = None,
              in_split_sizes: list[int] | None = None, out_split_sizes: list[int] | None = None,
              caller: str | None = None, step: int | None = None, seq: int, pg_id: int | None = None,
              source: str | None = None) -> dict[str, Any]:
    """One entry in its final form, less what `CommLog.append` adds (record_id, op_id, state, rank)."""
    entry = {
        "record_id": None, "pg_id": pg_id, "process_group": [pg_name, pg_desc],
        "collective_seq_id": 0 if is_p2p else seq, "p2p_seq_id": seq if is_p2p else 0, "op_id": None,
        "profiling_name": profiling_name, "time_created_ns": int(time_created_ns),
        "time_discovered_started_ns": int(time_started_ns) if time_started_ns else None,
        COMPLETED: int(time_completed_ns) if time_completed_ns else None,
        "input_sizes": input_sizes, "input_dtypes": input_dtypes,
        "output_sizes": output_sizes, "output_dtypes": output_dtypes, "state": None,
        "is_p2p": is_p2p, "peer": peer, "group_ranks": group_ranks,
        "in_split_sizes": in_split_sizes, "out_split_sizes": out_split_sizes,
        "caller": caller, "step": step, "rank": None,
    }
    if source is not None:
        entry["source"] = source
    return entry


def number_entry(entry: dict[str, Any], record_id: int, rank: int) -> dict[str, Any]:
    """What `CommLog.append` adds to a `new_entry` entry: its record_id / op_id, state and the log's rank."""
    entry["record_id"] = entry["op_id"] = record_id
    entry["state"] = ("completed" if entry[COMPLETED] else
                      "started" if entry["time_discovered_started_ns"] else "scheduled")
    entry["rank"] = rank
    return entry


def comms_log_path(out_dir: str | os.PathLike, rank: int) -> Path:
    return Path(out_dir) / f"comms.rank{rank}.jsonl"


class CommLog:
    """Append-only JSONL writer; thread-safe, flushed at every `flush()` (e.g. each step)."""

    def __init__(self, path: str | os.PathLike, rank: int, world_size: int | None = None,
                 pg_config: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.rank = rank
        self._lock = threading.Lock()
        self._record_id = 0
        self._seq: dict[tuple[str, bool], int] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "wb", buffering=1 << 16)
        self._write({"type": "header", "version": COMMS_LOG_VERSION, "rank": rank,
                     "world_size": world_size, "pg_config": pg_config or {},
                     "time_ns": time.time_ns()})

    def _write(self, obj: dict[str, Any]) -> None:
        self._fh.write(_encode(obj) + b"\n")

    def next_seq(self, pg_name: str, p2p: bool) -> int:
        """Next collective (or p2p) sequence id in group `pg_name`, starting at 1 like c10d."""
        with self._lock:
            key = (pg_name, p2p)
            self._seq[key] = self._seq.get(key, 0) + 1
            return self._seq[key]

    def record(self, *, seq: int | None = None, **fields: Any) -> dict[str, Any]:
        """Write one entry (`new_entry`'s fields); `seq` defaults to the next id of the group (collective
        or p2p counter)."""
        if seq is None:
            seq = self.next_seq(fields["pg_name"], fields.get("is_p2p", False))
        entry = new_entry(seq=seq, **fields)
        self.append([entry])
        return entry

    def append(self, entries: list[dict[str, Any]]) -> None:
        """Number `new_entry` entries (record_id, op_id), give them their state and this log's rank, write them."""
        with self._lock:
            for entry in entries:
                self._record_id += 1
                number_entry(entry, self._record_id, self.rank)
            self._fh.write(b"".join(_encode(e) + b"\n" for e in entries))

    def flush(self) -> None:
        with self._lock:
            self._fh.flush()

    def close(self, status: str = "ok") -> None:
        with self._lock:
            if self._fh.closed:
                return
            self._write({"type": "footer", "status": status, "entries": self._record_id,
                         "time_ns": time.time_ns()})
            self._fh.close()


FR_FIELDS = ("profiling_name", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "time_created_ns",
             "time_discovered_started_ns", "time_discovered_completed_ns", "duration_ms", "state", "pg_id")
"""What a Flight Recorder entry supplies when it replaces ours (device timing, its own sizes and state)."""


def prefer_flight_recorder(path: str | os.PathLike, fr_entries: list[dict[str, Any]]) -> int:
    """Rewrite a closed comms log so that each collective PyTorch's Flight Recorder also holds (same group
    name and collective sequence number) carries the Flight Recorder's fields and `source`
    "flight_recorder" (the entry we logged is kept under `logged`). Returns how many were replaced.

    For NCCL, whose Flight Recorder numbers collectives like our log does there (the group's own
    counter) and times them on the device. P2P entries and entries it does not hold are left as logged.
    """
    by_key = {}
    for fe in fr_entries:
        pg = fe.get("process_group") or [None, None]
        if fe.get("collective_seq_id") and not fe.get("is_p2p"):
            by_key[(str(pg[0]), int(fe["collective_seq_id"]))] = fe
    path = Path(path)
    lines = path.read_bytes().splitlines()
    out, replaced = [], 0
    for raw in lines:
        obj = json.loads(raw)
        fe = None
        if obj.get("type") is None and not obj.get("is_p2p"):
            fe = by_key.get((str((obj.get("process_group") or [None])[0]), int(obj.get("collective_seq_id") or 0)))
        if fe is not None:
            logged = {k: obj.get(k) for k in FR_FIELDS if k in obj}
            obj.update({k: fe[k] for k in FR_FIELDS if k in fe})
            obj["logged"], obj["source"] = logged, "flight_recorder"
            replaced += 1
        out.append(_encode(obj))
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(b"\n".join(out) + b"\n")
    os.replace(tmp, path)
    return replaced
