"""File names of a recording directory (DESIGN §7) and the one way traces get written into it.

A rank's profiler cycles are exported one JSON part at a time into `.parts/`; after each part the
final `rank{R}.pt.trace.json.gz` is rebuilt from all parts and renamed into place, so the file on
disk is always complete. Parts are merged textually (msgspec `Raw`), so Kineto's timestamps are
copied byte for byte. A top-level `"tracekit"` object records the steps, cycles and whether the
trace is partial (cut short by a signal, an exception or a killed rank).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import msgspec

PARTS_DIR = ".parts"
MANIFEST = "manifest.json"
TRACE_META_KEY = "tracekit"


def trace_path(out_dir: str | os.PathLike, rank: int) -> Path:
    return Path(out_dir) / f"rank{rank}.pt.trace.json.gz"


def rank_record_path(out_dir: str | os.PathLike, rank: int) -> Path:
    """Per-rank status + clock anchors, merged into manifest.json by the parent at the end."""
    return Path(out_dir) / f"record.rank{rank}.json"


def flight_recorder_path(out_dir: str | os.PathLike, rank: int) -> Path:
    return Path(out_dir) / f"flight_recorder.rank{rank}.json"


def nccl_dump_prefix(out_dir: str | os.PathLike) -> str:
    """TORCH_NCCL_DEBUG_INFO_TEMP_FILE: NCCL's Flight Recorder appends the rank on timeout."""
    return str(Path(out_dir) / "flight_recorder.nccl_dump.rank")


def part_path(out_dir: str | os.PathLike, rank: int, cycle: int) -> Path:
    return Path(out_dir) / PARTS_DIR / f"rank{rank}.cycle{cycle}.json"


def list_parts(out_dir: str | os.PathLike, rank: int) -> list[Path]:
    parts = Path(out_dir) / PARTS_DIR
    found = sorted(parts.glob(f"rank{rank}.cycle*.json"),
                   key=lambda p: int(p.name.split(".cycle")[1].split(".")[0]))
    return found


RANK_RECORD_SCHEMA = "tracekit.record.rank/1"
"""`schema` of record.rank{R}.json: first key, so `tracekit parse` recognises (and ignores) the file."""


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON via a temp file + rename; keys keep their order (put "schema" first)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])


def merge_trace_parts(parts: list[Path], dest: Path, meta: dict[str, Any]) -> None:
    """Concatenate the `traceEvents` of Kineto JSON exports into one gz trace at `dest` (atomic).

    The other top-level keys come from the first part; `meta` is stored under "tracekit".
    Raises ValueError naming the part when one is not a Kineto JSON object.
    """
    if not parts:
        raise ValueError("no trace parts to merge")
    head: dict[str, msgspec.Raw] | None = None
    event_chunks: list[bytes] = []
    for p in parts:
        try:
            top = _TOP.decode(p.read_bytes())
        except msgspec.DecodeError as exc:
            raise ValueError(f"{p}: not a Kineto JSON trace ({exc})") from None
        if "traceEvents" not in top:
            raise ValueError(f"{p}: no traceEvents")
        if head is None:
            head = top
        body = bytes(top["traceEvents"]).strip()
        inner = body[1:-1].strip()  # drop [ ]
        if inner:
            event_chunks.append(inner)
    assert head is not None
    out = bytearray(b"{")
    for key, raw in head.items():
        if key in ("traceEvents", TRACE_META_KEY):
            continue
        out += json.dumps(key).encode() + b":" + bytes(raw) + b",\n"
    out += json.dumps(TRACE_META_KEY).encode() + b":" + json.dumps(meta, sort_keys=True).encode() + b",\n"
    out += b'"traceEvents":[' + b",\n".join(event_chunks) + b"]}\n"
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    with gzip.open(tmp, "wb", compresslevel=3) as fh:
        fh.write(out)
    os.replace(tmp, dest)


def read_trace_meta(path: Path) -> dict[str, Any] | None:
    """The "tracekit" object of a trace written by `merge_trace_parts` (None if absent)."""
    with gzip.open(path, "rb") as fh:
        top = _TOP.decode(fh.read())
    raw = top.get(TRACE_META_KEY)
    return None if raw is None else json.loads(bytes(raw))
