"""`comms.rank{R}.jsonl` collective logs (written by tracekit/record/commlog.py) → `collectives` rows.

Line 1 is a header (rank, world_size, pg_config), then one Flight Recorder-schema entry per line,
then an optional footer. A rank killed mid-write leaves a cut last line: we keep everything before it
and say so; a log without footer is marked partial. Rows come from the same
`entries_to_collectives` as Flight Recorder dumps.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracekit.errors import TraceFormatError
from tracekit.parse.flight_recorder import entries_to_collectives_skipping_bad, pg_config_groups

SOURCE_COMMS_LOG = "comms-log"
COMMS_LOG_NAME = re.compile(r"^comms\.rank(\d+)\.jsonl$")


@dataclass
class CommsLogParse:
    """One rank's collective log as tables."""

    source_file: str
    rank: int | None
    rank_source: str | None
    world_size: int | None
    version: str | None
    process_groups: list[dict[str, Any]]
    collectives: pa.Table
    partial: bool
    footer: dict[str, Any] | None
    warnings: list[str] = field(default_factory=list)


def read_comms_log_header(path: str | Path) -> dict[str, Any] | None:
    """The header object of a comms log, or None when line 1 is not one (cheap: reads one line)."""
    with open(path, "rb") as fh:
        line = fh.readline(1 << 20)
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) and obj.get("type") == "header" else None


def parse_comms_log(path: str | Path, *, rank: int | None = None) -> CommsLogParse:
    """Parse one comms log; the rank is `rank=`, else the header's, else None (caller decides)."""
    path = Path(path)
    warnings: list[str] = []
    header: dict[str, Any] | None = None
    footer: dict[str, Any] | None = None
    entries: list[dict[str, Any]] = []
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    # A file written to the end finishes with "\n", leaving one empty last element.
    last_index = len(lines) - 1
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            if i == last_index:
                warnings.append(f"{path.name}: last line {i + 1} is cut off (rank stopped mid-write); "
                                f"kept the {len(entries)} entries before it")
            else:
                warnings.append(f"{path.name}: line {i + 1} is not valid JSON; skipped")
            continue
        if not isinstance(obj, dict):
            warnings.append(f"{path.name}: line {i + 1} is not an object; skipped")
            continue
        kind = obj.get("type")
        if kind == "header":
            if header is not None:
                warnings.append(f"{path.name}: second header at line {i + 1} ignored")
            else:
                header = obj
        elif kind == "footer":
            footer = obj
        else:
            entries.append(obj)
    if header is None:
        raise TraceFormatError(str(path), "not a tracekit comms log (no header line)")
    rank_source = "argument" if rank is not None else None
    if rank is None and header.get("rank") is not None:
        rank, rank_source = int(header["rank"]), "comms-log"
    partial = footer is None
    if partial:
        warnings.append(f"{path.name}: no footer, the log is partial (rank did not close it)")
    elif footer.get("entries") is not None and int(footer["entries"]) != len(entries):
        warnings.append(f"{path.name}: footer counts {footer['entries']} entries, file holds {len(entries)}")
    if footer is not None and footer.get("status") not in (None, "ok"):
        warnings.append(f"{path.name}: closed with status {footer.get('status')!r}")
    groups = pg_config_groups(header.get("pg_config"))
    group_ranks = {g["pg_name"]: g["ranks"] for g in groups if g["ranks"]}
    table = entries_to_collectives_skipping_bad(entries, rank=rank if rank is not None else -1,
                                                source=SOURCE_COMMS_LOG, group_ranks=group_ranks,
                                                warnings=warnings, what=path.name)
    ws = header.get("world_size")
    return CommsLogParse(source_file=str(path), rank=rank, rank_source=rank_source,
                         world_size=int(ws) if ws is not None else None,
                         version=header.get("version"), process_groups=groups, collectives=table,
                         partial=partial, footer=footer, warnings=warnings)
