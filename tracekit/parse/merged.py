"""Merged multi-rank Kineto files (TraceLens's TraceFusion): every rank's events in one `traceEvents`,
pid = rank·1e8 + raw pid, `args.rank` (and `args.pid_raw`) on the events. Such a file is split into one
Kineto document per rank before parsing, so each rank is parsed as if it had been written alone.

The split keeps every event's JSON text as it is (exact µs fractions; nothing is re-encoded): only each
event's `pid` and `args.rank` are decoded to file it. An event's rank is its `args.rank`, else its
pid // 1e8 (TraceFusion's pid offset). Each rank's document gets the file's other top-level keys and a
`distributedInfo` stating its rank and the number of ranks in the file as the world size (kept from the
file when it has one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from tracekit.parse.gz import read_trace_bytes

PID_STRIDE = 100_000_000
"""TraceFusion's pid offset per rank."""
MARKER = b'"pid_raw"'
"""TraceFusion writes each event's original pid as args.pid_raw."""


class _Args(msgspec.Struct):
    rank: Any = None


class _Event(msgspec.Struct):
    pid: Any = None
    args: Any = None


_EVENTS = msgspec.json.Decoder(list[msgspec.Raw])
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_EVENT = msgspec.json.Decoder(_Event)


def looks_merged(head: bytes) -> bool:
    """The first bytes of a Kineto file carry TraceFusion's marker."""
    return MARKER in head


def _rank_of(raw: msgspec.Raw) -> int | None:
    try:
        e = _EVENT.decode(raw)
    except msgspec.DecodeError:
        return None
    r = event_rank(e.args.get("rank") if isinstance(e.args, dict) else None, e.pid)
    return None if r < 0 else r


def event_rank(rank_arg: Any, pid: Any) -> int:
    """An event's rank in a merged file: its `args.rank`, else its pid // 1e8; -1 when neither is a
    non-negative integer (such an event belongs to every rank)."""
    if rank_arg.__class__ is int and rank_arg >= 0:
        return rank_arg
    if pid.__class__ is int and pid >= 0:
        return pid // PID_STRIDE
    return -1


def event_ranks(rank: np.ndarray, rank_int: np.ndarray, pid: np.ndarray, pid_int: np.ndarray) -> np.ndarray:
    """`event_rank` of many events at once: `rank`/`pid` their values where `rank_int`/`pid_int` say the
    value is an integer (elsewhere ignored)."""
    by_pid = np.where(pid_int & (pid >= 0), pid // PID_STRIDE, -1)
    return np.where(rank_int & (rank >= 0), rank, by_pid)


def split_merged(path: str | Path, out_dir: Path, max_decompressed_bytes: int | None = None) -> dict[int, Path]:
    """One Kineto document per rank of a merged file, written to `out_dir`: {rank: path}. A file whose
    events name fewer than two ranks is not merged: {}."""
    top = _TOP.decode(read_trace_bytes(path, max_decompressed_bytes))
    events = _EVENTS.decode(top.pop("traceEvents", msgspec.Raw(b"[]")))
    by_rank: dict[int, list[msgspec.Raw]] = {}
    unranked: list[msgspec.Raw] = []
    for raw in events:
        r = _rank_of(raw)
        (unranked if r is None else by_rank.setdefault(r, [])).append(raw)
    if len(by_rank) < 2:
        return {}
    info = top.pop("distributedInfo", None)
    base = msgspec.json.decode(info) if info is not None else {}
    base = base if isinstance(base, dict) else {}
    world = base.get("world_size") if isinstance(base.get("world_size"), int) else max(by_rank) + 1
    keys = b"".join(msgspec.json.encode(k) + b":" + bytes(v) + b"," for k, v in top.items())
    out_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for r, evs in sorted(by_rank.items()):
        di = msgspec.json.encode({**base, "rank": r, "world_size": world})
        body = b",".join(bytes(e) for e in [*evs, *unranked])
        p = out_dir / f"{Path(path).name}.rank{r}.json"
        p.write_bytes(b"{" + keys + b'"distributedInfo":' + di + b',"traceEvents":[' + body + b"]}")
        out[r] = p
    return out
