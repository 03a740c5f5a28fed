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

import msgspec
import pyarrow as pa
from msgspec import UNSET, UnsetType

from tracekit.errors import TraceFormatError
from tracekit.parse.flight_recorder import (COLLECTIVE_COLUMNS, collective_arrays,
                                            entries_to_collectives_skipping_bad, entry_row, pg_config_groups,
                                            size_columns)
from tracekit.tables.schema import conform

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


def read_comms_log_header(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """(header, its process groups) of a comms log, or None when line 1 is not a header (cheap: reads one
    line). The header lacks `pg_config`: the groups are `pg_config_groups` of it (`decode_header`)."""
    with open(path, "rb") as fh:
        line = fh.readline(1 << 20)
    return decode_header(line)


_RAW_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAW_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])
_GROUP_CACHE: dict[tuple[str | None, bytes], list[dict[str, Any]]] = {}
"""pg_config entry (its key, its JSON text) -> `pg_config_groups` of it (`decode_header`)."""
GROUP_CACHE_ENTRIES = 1 << 16
"""Entries `_GROUP_CACHE` holds before it starts over (10,000 ranks in 5-D: a few thousand distinct groups)."""


def decode_header(line: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """(header without `pg_config`, `pg_config_groups(header["pg_config"])`) of a comms log's first line, or
    None when it is not a header object: what `json.loads` and `pg_config_groups` give, with each distinct
    pg_config entry decoded once per process (each of 10,000 ranks' headers repeats the 10,000-rank world
    group: ~50 kB of JSON and 10,000 int() per rank, ~2 ms). The line is split into its fields' JSON texts
    (msgspec.Raw; JSON is context-free, so each text decodes as it would inside the whole line), each field
    and each distinct entry decoded by `json.loads`; anything the split does not take goes to
    `json.loads` whole. The groups may be shared between calls: callers must not change them."""
    try:
        fields = _RAW_OBJECT.decode(line)
        header = {k: json.loads(bytes(v)) for k, v in fields.items() if k != "pg_config"}
        if header.get("type") != "header":
            return None
        groups = _cached_groups(bytes(fields["pg_config"])) if "pg_config" in fields else []
    except (msgspec.DecodeError, ValueError, RecursionError):
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict) or obj.get("type") != "header":
            return None
        return {k: v for k, v in obj.items() if k != "pg_config"}, pg_config_groups(obj.get("pg_config"))
    return header, groups


def _cached_groups(text: bytes) -> list[dict[str, Any]]:
    """`pg_config_groups(json.loads(text))`, each object member or array item decoded once (`_GROUP_CACHE`);
    one entry's groups never depend on another's."""
    stripped = text.lstrip()
    if stripped[:1] == b"{":
        items: list[tuple[str | None, bytes]] = [(k, bytes(v)) for k, v in _RAW_OBJECT.decode(text).items()]
    elif stripped[:1] == b"[":
        items = [(None, bytes(v)) for v in _RAW_ARRAY.decode(text)]
    else:
        return pg_config_groups(json.loads(text))
    if len(_GROUP_CACHE) > GROUP_CACHE_ENTRIES:
        _GROUP_CACHE.clear()
    out: list[dict[str, Any]] = []
    for key, raw in items:
        got = _GROUP_CACHE.get((key, raw))
        if got is None:
            cfg = json.loads(raw)
            got = _GROUP_CACHE[(key, raw)] = pg_config_groups({key: cfg} if key is not None else [cfg])
        out += got
    return out


def parse_comms_log(path: str | Path, *, rank: int | None = None) -> CommsLogParse:
    """Parse one comms log; the rank is `rank=`, else the header's, else None (caller decides).

    A well-formed log (header line, entries of the types `tracekit record` writes, optional footer) is
    decoded in bulk (`_bulk_decode`); anything else goes line by line, keeping what it can."""
    path = Path(path)
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    bulk = _bulk_decode(lines)
    if bulk is not None:
        header, groups, footer, entries = bulk
        table = _bulk_collectives(header, groups, entries, rank)
        if table is not None:
            warnings: list[str] = []
            _footer_warnings(path, footer, len(entries), warnings)
            return _result(path, rank, header, groups, footer, table, warnings)
    return _parse_lines(path, lines, rank)


def parse_comms_logs_task(items: list[tuple[str, int]]) -> list[tuple[CommsLogParse | None, str | None]]:
    """An engine task (`map_ranks`): `parse_comms_log` of each (path, rank), or None and the reason it could
    not be parsed (what parse_run reports as the file's skip reason)."""
    from tracekit.tables.arrow_env import defer_pandas

    defer_pandas()  # a worker's first pyarrow conversion would import pandas for nothing
    out: list[tuple[CommsLogParse | None, str | None]] = []
    for path, rank in items:
        try:
            out.append((parse_comms_log(path, rank=rank), None))
        except Exception as exc:
            out.append((None, f"could not be parsed ({type(exc).__name__}: {exc})"))
    return out


def _parse_lines(path: Path, lines: list[bytes], rank: int | None) -> CommsLogParse:
    """The line-by-line reader: every line on its own, bad ones skipped with a warning."""
    warnings: list[str] = []
    header: dict[str, Any] | None = None
    footer: dict[str, Any] | None = None
    entries: list[dict[str, Any]] = []
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
    row_rank = _row_rank(header, rank)
    groups = pg_config_groups(header.get("pg_config"))
    _footer_warnings(path, footer, len(entries), warnings)
    table = entries_to_collectives_skipping_bad(entries, rank=row_rank, source=SOURCE_COMMS_LOG,
                                                group_ranks=_group_ranks(groups), warnings=warnings,
                                                what=path.name)
    return _result(path, rank, header, groups, footer, table, warnings)


def _row_rank(header: dict[str, Any], rank: int | None) -> int:
    """The rank the rows carry: `rank=`, else the header's, else -1."""
    if rank is not None:
        return rank
    return int(header["rank"]) if header.get("rank") is not None else -1


def _group_ranks(groups: list[dict[str, Any]]) -> dict[str, list[int]]:
    return {g["pg_name"]: g["ranks"] for g in groups if g["ranks"]}


def _footer_warnings(path: Path, footer: dict[str, Any] | None, num_entries: int, warnings: list[str]) -> None:
    if footer is None:
        warnings.append(f"{path.name}: no footer, the log is partial (rank did not close it)")
    elif footer.get("entries") is not None and int(footer["entries"]) != num_entries:
        warnings.append(f"{path.name}: footer counts {footer['entries']} entries, file holds {num_entries}")
    if footer is not None and footer.get("status") not in (None, "ok"):
        warnings.append(f"{path.name}: closed with status {footer.get('status')!r}")


def _result(path: Path, rank: int | None, header: dict[str, Any], groups: list[dict[str, Any]],
            footer: dict[str, Any] | None, table: pa.Table, warnings: list[str]) -> CommsLogParse:
    rank_source = "argument" if rank is not None else None
    if rank is None and header.get("rank") is not None:
        rank, rank_source = int(header["rank"]), "comms-log"
    ws = header.get("world_size")
    return CommsLogParse(source_file=str(path), rank=rank, rank_source=rank_source,
                         world_size=int(ws) if ws is not None else None,
                         version=header.get("version"), process_groups=groups, collectives=table,
                         partial=footer is None, footer=footer, warnings=warnings)


# ---- bulk decode ---------------------------------------------------------------------------------------
# A log as `tracekit record` (and the simulator) writes it is decoded in one msgspec call into typed
# structs, and each distinct (group, op, sizes, dtypes, peer, ...) is turned into its row columns once by
# `entry_row` itself, so the rows are those of the line-by-line reader by construction. Anything the types
# below do not accept (a cut line, a malformed entry, a header in the middle) sends the whole file to the
# line-by-line reader, which keeps what it can and says what it skipped.

class _Entry(msgspec.Struct):
    """The entry fields `entry_row` reads, typed as the writer writes them (lists as tuples: hashable)."""

    type: str | None = None
    process_group: tuple[str | None, ...] | None = None
    profiling_name: str | None = None
    is_p2p: bool | None = None
    collective_seq_id: int | None = None
    p2p_seq_id: int | None = None
    peer: int | None = None
    group_ranks: tuple[int, ...] | None = None
    input_sizes: tuple[tuple[int, ...] | None, ...] | None = None
    output_sizes: tuple[tuple[int, ...] | None, ...] | None = None
    input_dtypes: tuple[str, ...] | None = None
    output_dtypes: tuple[str, ...] | None = None
    in_split_sizes: tuple[int, ...] | None = None
    out_split_sizes: tuple[int, ...] | None = None
    time_created_ns: int | None = None
    time_discovered_started_ns: int | None = None
    time_discovered_completed_ns: int | None = None
    duration_ms: float | None | UnsetType = UNSET
    duration: float | None | UnsetType = UNSET
    state: str | None = None
    caller: str | None = None
    step: int | None = None


_ENTRIES = msgspec.json.Decoder(list[_Entry])


def _duration(e: _Entry) -> int | None:
    """`flight_recorder._times`'s duration: the measured one (ms) when started, else completed - started."""
    started = e.time_discovered_started_ns or None
    if started is None:
        return None
    measured = e.duration if e.duration_ms is UNSET else e.duration_ms
    if measured is not None and measured is not UNSET and measured > 0:
        return int(round(float(measured) * 1e6))
    completed = e.time_discovered_completed_ns or None
    return completed - started if completed is not None else None


def _bulk_decode(lines: list[bytes]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None,
                                              list[_Entry]] | None:
    """(header, its process groups, footer, entries) of a well-formed log, else None."""
    body = [ln for ln in lines if ln.strip()]
    if not body:
        return None
    head = decode_header(body[0])
    if head is None:
        return None
    header, groups = head
    try:
        footer = json.loads(body[-1]) if len(body) > 1 and b'"footer"' in body[-1] else None
    except (ValueError, RecursionError):
        return None
    if footer is not None:
        if not isinstance(footer, dict) or footer.get("type") != "footer":
            return None
        body = body[:-1]
    try:
        entries = _ENTRIES.decode(b"[" + b",".join(body[1:]) + b"]")
    except (msgspec.DecodeError, ValueError, RecursionError):
        return None
    if any(e.type in ("header", "footer") for e in entries):
        return None
    return header, groups, footer, entries


def _plain(e: _Entry) -> dict[str, Any]:
    """The entry as the mapping `entry_row` reads (absent keys left out; tuples read as the lists would)."""
    return {k: v for k, v in msgspec.structs.asdict(e).items() if v is not UNSET}


def _bulk_collectives(header: dict[str, Any], groups: list[dict[str, Any]], entries: list[_Entry],
                      rank: int | None) -> pa.Table | None:
    """The `collectives` rows of decoded entries, the same as `entry_row`'s; None when one is malformed.

    The columns of an entry's group, op, peer and caller come from `entry_row` once per distinct value and
    are taken by index; those of its shapes and dtypes once per distinct shapes (`size_columns`, as
    `entry_row` computes them); split sizes (which differ per all_to_all) are copied as they are."""
    try:
        row_rank = _row_rank(header, rank)
        group_ranks = _group_ranks(groups)
        index: dict[tuple, int] = {}
        uniques: list[dict[str, Any]] = []
        rows: list[int] = []
        sizes: dict[tuple, tuple] = {}
        size_rows: list[tuple] = []
        for e in entries:
            key = (e.process_group, e.profiling_name, e.is_p2p, e.peer, e.group_ranks, e.caller)
            i = index.get(key)
            if i is None:
                i = index[key] = len(uniques)
                uniques.append(entry_row(_plain(e), rank=row_rank, source=SOURCE_COMMS_LOG, group_ranks=group_ranks))
            rows.append(i)
            key = (e.input_sizes, e.input_dtypes, e.output_sizes, e.output_dtypes)
            got = sizes.get(key)
            if got is None:
                got = sizes[key] = size_columns(*key)
            size_rows.append(got)
        p2p = [u["is_p2p"] for u in uniques]
        seq = [e.p2p_seq_id if p2p[i] else e.collective_seq_id for e, i in zip(entries, rows)]
        cols = {
            "seq": seq, "seq_source": ["log" if s is not None else None for s in seq],
            "in_split_sizes": [None if e.in_split_sizes is None else list(e.in_split_sizes) for e in entries],
            "out_split_sizes": [None if e.out_split_sizes is None else list(e.out_split_sizes) for e in entries],
            "ts": [e.time_discovered_started_ns or None for e in entries],
            "dur": [_duration(e) for e in entries],
            "enqueue_ts": [e.time_created_ns or None for e in entries],
            "state": [e.state or "unknown" for e in entries],
            "step": [e.step for e in entries],
        }
        for j, c in enumerate(("in_nelems", "out_nelems", "dtype", "bytes")):
            cols[c] = [x[j] for x in size_rows]
        take = pa.array(rows, type=pa.int32())
        static = collective_arrays({c: [u[c] for u in uniques] for c in COLLECTIVE_COLUMNS if c not in cols})
        per_entry = collective_arrays(cols)
        columns = {c: (static[c].take(take) if c in static else per_entry[c]) for c in COLLECTIVE_COLUMNS}
        return conform("collectives", pa.table(columns))
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError, RecursionError,
            pa.ArrowException):
        return None
