"""The profiler's memory events → the `memory` table; CUDA allocator snapshots → `memory_segments`.

With `profile_memory=True` every allocation and free the profiler sees becomes an instant event
`{"ph": "i", "name": "[memory]", "args": {"Device Type", "Device Id", "Addr", "Bytes",
"Total Allocated", "Total Reserved"}}`. The Kineto decoder hands those events here (one list per
file); this module turns them into rows with exact int64 ns times. Events whose numbers are not
integers are dropped and counted in a parse warning, never guessed.

Allocator snapshots (`torch.cuda.memory._snapshot()`, pickled by `tracekit record` at the end of the
window) are read only through `safe_pickle` (plain data; anything that would import or call is
refused) and flattened into one row per segment and per block.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from tracekit.errors import TraceFormatError
from tracekit.parse import decode as D
from tracekit.parse.safe_pickle import load_plain_data
from tracekit.tables.schema import conform, empty

MEMORY_EVENT_NAME = "[memory]"
_INT_FIELDS = ("device_type", "device_id", "bytes", "total_allocated", "total_reserved", "addr")


def is_memory_event(event: Any) -> bool:
    """True for the profiler's `[memory]` instant events (typed or lenient decode)."""
    return getattr(event, "name", None) == MEMORY_EVENT_NAME


def _int_or_none(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def memory_table(events: list, rank: int, step_at: Callable[[np.ndarray], np.ndarray],
                 warnings: list[str]) -> pa.Table:
    """The memory rows of one trace from its `[memory]` instant events (D.I or lenient structs)."""
    if not events:
        return empty("memory")
    ts, ts_ok = D.raws_to_ns([e.ts for e in events])
    args = [e.args for e in events]
    values = {f: _int_column(args, f) for f in _INT_FIELDS}
    ok = ts_ok & values["bytes"].is_valid().to_numpy(zero_copy_only=False) \
        & values["total_allocated"].is_valid().to_numpy(zero_copy_only=False)
    bad = int(len(events) - ok.sum())
    if bad:
        warnings.append(f"{bad} [memory] events without an integer time, Bytes or Total Allocated were dropped")
    keep = np.flatnonzero(ok)
    order = keep[np.argsort(ts[keep], kind="stable")]
    take = pa.array(order, pa.int64())
    pick = lambda f, t: values[f].take(take).cast(t)  # noqa: E731
    step = step_at(ts[order])
    table = pa.table({
        "rank": np.full(len(order), rank, np.int32),
        "ts": ts[order],
        "device_type": pick("device_type", pa.int32()),
        "device": pick("device_id", pa.int32()),
        "bytes": pick("bytes", pa.int64()),
        "total_allocated": pick("total_allocated", pa.int64()),
        "total_reserved": pick("total_reserved", pa.int64()),
        "addr": pick("addr", pa.int64()),
        "step": pa.array(np.where(step >= 0, step, 0), pa.int32(), mask=step < 0),
    })
    return conform("memory", table)


def _int_column(args: list, field: str) -> pa.Array:
    """The events' `field` as int64, null where it is not an integer (`_int_or_none`): one Arrow conversion
    when every value is an int or missing, else value by value."""
    vals = [getattr(a, field, None) for a in args]
    if set(map(type, vals)) <= {int, type(None)}:
        try:
            return pa.array(vals, pa.int64())
        except (pa.ArrowInvalid, OverflowError):
            pass  # beyond int64: value by value below (pyarrow refuses it there too)
    return pa.array([_int_or_none(v) for v in vals], pa.int64())


# ----------------------------------------------------------------------------------------------
# allocator snapshots (CUDA only; torch.cuda.memory._snapshot())



def _frame_text(block: dict) -> str | None:
    frames = block.get("frames") or []
    if not frames or not isinstance(frames[0], dict):
        return None
    f = frames[0]
    return f"{f.get('filename')}:{f.get('line')} {f.get('name')}"


def _segment_rows(seg: dict) -> list[dict[str, Any]]:
    """One row for the segment, one per block inside it."""
    base = {"device": _int_or_none(seg.get("device")), "segment_addr": _int_or_none(seg.get("address")),
            "segment_size": _int_or_none(seg.get("total_size")), "segment_type": seg.get("segment_type")}
    rows = [dict(base, block_addr=None, block_size=None, block_state=None, frame=None)]
    for b in seg.get("blocks") or []:
        if not isinstance(b, dict):
            raise ValueError("a block is not a dict")
        rows.append(dict(base, block_addr=_int_or_none(b.get("address")), block_size=_int_or_none(b.get("size")),
                         block_state=b.get("state"), frame=_frame_text(b)))
    return rows


def parse_memory_snapshot(path: str | Path, rank: int, max_bytes: int | None = None) -> pa.Table:
    """The `memory_segments` rows of one pickled allocator snapshot.

    Raises UnsafeInputError for a pickle that would import or call anything, TraceFormatError for a
    truncated or unexpected one (the caller lists the file as skipped and goes on)."""
    path = str(path)
    snap = load_plain_data(path, max_bytes=max_bytes)  # UnsafeInputError for calls and truncation
    segments = snap.get("segments") if isinstance(snap, dict) else None
    if not isinstance(segments, list):
        raise TraceFormatError(path, "not a CUDA allocator snapshot (no 'segments' list)")
    rows: list[dict[str, Any]] = []
    try:
        for seg in segments:
            if not isinstance(seg, dict):
                raise ValueError("a segment is not a dict")
            rows.extend(_segment_rows(seg))
    except (ValueError, TypeError) as exc:
        raise TraceFormatError(path, f"malformed memory snapshot: {exc}") from None
    if not rows:
        return empty("memory_segments")
    for r in rows:
        r["rank"] = rank
    return conform("memory_segments", pa.Table.from_pylist(rows))
