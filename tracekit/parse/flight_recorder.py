"""PyTorch Flight Recorder dumps (JSON or pickle) and the entry→row code shared with the comms log.

A dump is `{version, pg_config: {id: {name, desc, ranks}}, pg_status, entries: [...]}` (DESIGN §4);
every entry becomes one `collectives` row. `comms_log.py` writes the same entry schema (plus a few
extensions), so `entries_to_collectives` is the one place where entries are read.
Pickle dumps are only ever read through `safe_pickle` (plain data, no code).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import pyarrow as pa

from tracekit.errors import TraceFormatError
from tracekit.errors import InputTooLargeError
from tracekit.parse.collective_names import dtype_bytes
from tracekit.parse.collective_names import normalize_op as _normalize_name
from tracekit.parse.safe_pickle import load_plain_data, looks_like_pickle
from tracekit.tables.schema import TABLES, conform

SOURCE_FLIGHT_RECORDER = "flight-recorder"
# "send 0->1" / "recv 1<-0" in P2P profiling names: this rank and the peer, as group-local ranks.
_P2P_PEER = re.compile(r"(\d+)\s*(?:->|<-)\s*(\d+)")


def normalize_op(name: str | None) -> str:
    """Map a profiling name ("nccl:all_reduce", "gloo:_allgather_base", "nccl:send 0->1") to COLLECTIVE_OPS.

    The spelling rules live in `collective_names` (shared with the Kineto parser); names that are not
    collective calls (e.g. "nccl:coalesced") become "unknown" here, since a log entry is always a call.
    """
    return _normalize_name(name) or "unknown"


def _nelems(sizes: Any) -> list[int] | None:
    """Per-tensor element counts from a list of shapes (None when sizes are absent)."""
    if sizes is None:
        return None
    out = []
    for shape in sizes:
        if shape is None:
            continue
        out.append(math.prod(int(d) for d in shape))
    return out


def _message_bytes(in_counts: list[int] | None, in_dtypes: Any, out_counts: list[int] | None,
                   out_dtypes: Any) -> int | None:
    """max(input bytes, output bytes), each the sum over tensors of nelems × element size."""
    totals = []
    for counts, dtypes in ((in_counts, in_dtypes), (out_counts, out_dtypes)):
        if not counts:
            continue
        dtypes = list(dtypes or [])
        total = 0
        for i, n in enumerate(counts):
            size = dtype_bytes(dtypes[i] if i < len(dtypes) else (dtypes[0] if dtypes else None))
            if size is None:
                total = None
                break
            total += n * size
        if total is not None:
            totals.append(total)
    return max(totals) if totals else None


def _nonzero_int(value: Any) -> int | None:
    """Flight Recorder writes 0 (JSON) or None (pickle) for times it never observed."""
    if value is None:
        return None
    value = int(value)
    return value if value != 0 else None


def _ranks_list(value: Any) -> list[int] | None:
    """pg_config ranks come as a list or as its text ("[0, 1]")."""
    if value is None:
        return None
    if isinstance(value, str):
        value = value.strip()
        if not value:
            return None
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    if isinstance(value, (list, tuple)):
        return [int(r) for r in value]
    return None


_ENTRY_ERRORS = (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError, RecursionError,
                 pa.ArrowException)


def entries_to_collectives_skipping_bad(entries: list[Mapping[str, Any]], *, rank: int, source: str,
                                        group_ranks: Mapping[str, list[int]] | None, warnings: list[str],
                                        what: str) -> pa.Table:
    """`entries_to_collectives`, but an entry with malformed fields (a dump from another version or a
    broken writer) is dropped and counted in `warnings` instead of failing the whole file."""
    try:
        return entries_to_collectives(entries, rank=rank, source=source, group_ranks=group_ranks)
    except _ENTRY_ERRORS:
        pass
    good = []
    first_error = None
    for e in entries:
        try:
            entries_to_collectives([e], rank=rank, source=source, group_ranks=group_ranks)
        except _ENTRY_ERRORS as exc:
            first_error = first_error or f"{type(exc).__name__}: {exc}"
            continue
        good.append(e)
    warnings.append(f"{what}: {len(entries) - len(good)} malformed entries skipped (first: {first_error})")
    return entries_to_collectives(good, rank=rank, source=source, group_ranks=group_ranks)


def pg_config_groups(pg_config: Any) -> list[dict[str, Any]]:
    """process_groups rows (pg_name, pg_desc, ranks, size, backend) from a Flight Recorder or Kineto pg_config.

    Accepts the dump's `{id: {name, desc, ranks}}` mapping and Kineto's
    `[{pg_name, pg_desc | uid, ranks, pg_size, backend_config}]` list; unnamed placeholder entries
    (gloo dumps carry `{"": {"name": "", ...}}`) are dropped.
    """
    items: Iterable[tuple[Any, Any]]
    if isinstance(pg_config, Mapping):
        items = pg_config.items()
    elif isinstance(pg_config, (list, tuple)):
        items = ((None, v) for v in pg_config)
    else:
        return []
    groups = []
    for key, cfg in items:
        if not isinstance(cfg, Mapping):
            continue
        name = cfg.get("name", cfg.get("pg_name", key))
        if name is None or str(name) == "":
            continue
        ranks = _ranks_list(cfg.get("ranks"))
        desc = cfg.get("desc", cfg.get("pg_desc"))
        if desc in (None, ""):
            desc = cfg.get("uid")
        size = cfg.get("pg_size", cfg.get("size"))
        groups.append({
            "pg_name": str(name),
            "pg_desc": None if desc in (None, "") else str(desc),
            "ranks": ranks,
            "size": int(size) if size is not None else (len(ranks) if ranks else None),
            "backend": cfg.get("backend_config", cfg.get("backend")),
            "dim": None,
        })
    return groups


COLLECTIVE_COLUMNS = ("rank", "source", "pg_name", "pg_desc", "seq", "seq_source", "op", "is_p2p", "peer",
                      "in_nelems", "out_nelems", "dtype", "bytes", "in_split_sizes", "out_split_sizes",
                      "group_size", "group_ranks", "ts", "dur", "enqueue_ts", "state", "name", "caller", "step")


def entries_to_collectives(entries: Iterable[Mapping[str, Any]], *, rank: int, source: str,
                           group_ranks: Mapping[str, list[int]] | None = None) -> pa.Table:
    """Flight Recorder entries (or comms-log entries, same schema) → a `collectives` table.

    seq is `collective_seq_id`, or `p2p_seq_id` for send/recv (then `is_p2p` is true: the two
    counters are separate namespaces). Times of 0/None mean "not observed" and become null.
    """
    cols: dict[str, list[Any]] = {k: [] for k in COLLECTIVE_COLUMNS}
    for e in entries:
        for k, v in entry_row(e, rank=rank, source=source, group_ranks=group_ranks or {}).items():
            cols[k].append(v)
    return conform("collectives", pa.table(collective_arrays(cols)))


def _p2p_peer(e: Mapping[str, Any], is_p2p: bool, ranks_of_group: list[int] | None) -> int | None:
    """The entry's peer, or the group-local peer of its profiling name ("send 0->1" / "recv 1<-0")."""
    peer = e.get("peer")
    name = e.get("profiling_name")
    if peer is None and is_p2p and name:
        m = _P2P_PEER.search(name)
        if m:
            local = int(m.group(2))
            if ranks_of_group and local < len(ranks_of_group):
                peer = ranks_of_group[local]
    return int(peer) if peer is not None else None


def _times(e: Mapping[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(start, duration, enqueue) in ns. NCCL measures the kernel with CUDA events (`duration_ms`, older
    dumps `duration`); the watchdog's discovered start/complete times only bound it, so prefer the measured one."""
    created = _nonzero_int(e.get("time_created_ns"))
    started = _nonzero_int(e.get("time_discovered_started_ns"))
    completed = _nonzero_int(e.get("time_discovered_completed_ns"))
    measured_ms = e.get("duration_ms", e.get("duration"))
    if started is not None and isinstance(measured_ms, (int, float)) and measured_ms > 0:
        dur = int(round(float(measured_ms) * 1e6))
    elif started is not None and completed is not None:
        dur = completed - started
    else:
        dur = None
    return started, dur, created


def entry_row(e: Mapping[str, Any], *, rank: int, source: str, group_ranks: Mapping[str, list[int]]) -> dict[str, Any]:
    """One entry as a row of the `collectives` table (COLLECTIVE_COLUMNS)."""
    pg = e.get("process_group") or [None, None]
    pg_name = None if pg[0] in (None, "") else str(pg[0])
    pg_desc = None if len(pg) < 2 or pg[1] in (None, "") else str(pg[1])
    op = normalize_op(e.get("profiling_name"))
    is_p2p = bool(e.get("is_p2p")) or op in ("send", "recv")
    seq = e.get("p2p_seq_id") if is_p2p else e.get("collective_seq_id")
    ranks_of_group = _ranks_list(e.get("group_ranks")) or (group_ranks.get(pg_name) if pg_name else None)
    in_nelems, out_nelems, dtype, nbytes = size_columns(e.get("input_sizes"), e.get("input_dtypes"),
                                                        e.get("output_sizes"), e.get("output_dtypes"))
    started, dur, created = _times(e)
    return {
        "rank": rank, "source": source, "pg_name": pg_name, "pg_desc": pg_desc,
        "seq": int(seq) if seq is not None else None, "seq_source": "log" if seq is not None else None,
        "op": op, "is_p2p": is_p2p, "peer": _p2p_peer(e, is_p2p, ranks_of_group),
        "in_nelems": in_nelems, "out_nelems": out_nelems, "dtype": dtype, "bytes": nbytes,
        "in_split_sizes": _int_list(e.get("in_split_sizes")), "out_split_sizes": _int_list(e.get("out_split_sizes")),
        "group_size": len(ranks_of_group) if ranks_of_group else None, "group_ranks": ranks_of_group,
        "ts": started, "dur": dur, "enqueue_ts": created, "state": e.get("state") or "unknown",
        "name": e.get("profiling_name"), "caller": e.get("caller"),
        "step": int(e["step"]) if e.get("step") is not None else None,
    }


def size_columns(input_sizes: Any, input_dtypes: Any, output_sizes: Any, output_dtypes: Any
                 ) -> tuple[int | None, int | None, str | None, int | None]:
    """(in_nelems, out_nelems, dtype, bytes) of an entry's tensor shapes and dtypes."""
    in_counts, out_counts = _nelems(input_sizes), _nelems(output_sizes)
    in_dtypes, out_dtypes = input_dtypes or [], output_dtypes or []
    return (sum(in_counts) if in_counts is not None else None,
            sum(out_counts) if out_counts is not None else None,
            str((in_dtypes or out_dtypes)[0]) if (in_dtypes or out_dtypes) else None,
            _message_bytes(in_counts, in_dtypes, out_counts, out_dtypes))


def _int_list(value: Any) -> list[int] | None:
    return [int(v) for v in value] if value is not None else None


def collective_arrays(cols: dict[str, list[Any]]) -> dict[str, pa.Array]:
    """Python column lists of the `collectives` table as Arrow arrays of its types."""
    types = {
        "rank": pa.int32(), "source": pa.string(), "pg_name": pa.string(), "pg_desc": pa.string(),
        "seq": pa.int64(), "seq_source": pa.string(), "op": pa.string(), "is_p2p": pa.bool_(),
        "peer": pa.int32(), "in_nelems": pa.int64(), "out_nelems": pa.int64(), "dtype": pa.string(),
        "bytes": pa.int64(), "in_split_sizes": pa.list_(pa.int64()), "out_split_sizes": pa.list_(pa.int64()),
        "group_size": pa.int32(), "group_ranks": pa.list_(pa.int32()), "ts": pa.int64(), "dur": pa.int64(),
        "enqueue_ts": pa.int64(), "state": pa.string(), "name": pa.string(), "caller": pa.string(),
        "step": pa.int32(),
    }
    return {k: pa.array(v, type=types[k]) for k, v in cols.items()}


@dataclass
class FlightRecorderParse:
    """One rank's Flight Recorder dump as tables."""

    source_file: str
    rank: int | None
    rank_source: str | None
    version: str | None
    process_groups: list[dict[str, Any]]
    collectives: pa.Table
    warnings: list[str] = field(default_factory=list)
    entries: pa.Table | None = None
    """The dump's entries as `fr_entries` rows (rank -1 until the rank is known)."""
    status: pa.Table | None = None
    """The dump's pg_status as `fr_status` rows (one row even when it has none)."""
    hang_dump: bool = False
    """Written by `tracekit record`'s hang watch (it supersedes a window dump of the same rank)."""


def is_flight_recorder_dump(doc: Any) -> bool:
    """A decoded document looks like a Flight Recorder dump (entries + pg_config/pg_status/version)."""
    return (isinstance(doc, Mapping) and "traceEvents" not in doc and "entries" in doc
            and any(k in doc for k in ("pg_config", "pg_status", "version")))


def read_flight_recorder_doc(path: str | Path, max_bytes: int | None = None) -> dict[str, Any]:
    """Decode a dump file: pickle (safely) when it starts like one, else JSON."""
    path = Path(path)
    with open(path, "rb") as fh:
        head = fh.read(2)
    if looks_like_pickle(head):
        doc = load_plain_data(path, max_bytes=max_bytes)
    else:
        if max_bytes is not None and path.stat().st_size > max_bytes:
            raise InputTooLargeError(str(path), f"dump is over the {max_bytes}-byte budget")
        try:
            doc = json.loads(path.read_bytes())
        except ValueError as exc:
            raise TraceFormatError(str(path), f"not valid JSON ({exc})") from None
        except RecursionError:
            raise TraceFormatError(str(path), "JSON nested too deeply to decode") from None
    if not is_flight_recorder_dump(doc):
        raise TraceFormatError(str(path), "not a Flight Recorder dump (no entries/pg_config)")
    return doc  # type: ignore[return-value]


def parse_flight_recorder(path: str | Path, *, rank: int | None = None,
                          max_bytes: int | None = None) -> FlightRecorderParse:
    """Parse one dump. The rank comes from `rank=`, else the dump's own `rank` field, else stays None
    (the run assembler then tries the file name)."""
    path = Path(path)
    doc = read_flight_recorder_doc(path, max_bytes=max_bytes)
    rank_source = "argument" if rank is not None else None
    if rank is None and doc.get("rank") is not None:
        rank, rank_source = int(doc["rank"]), "flight-recorder"
    groups = pg_config_groups(doc.get("pg_config"))
    group_ranks = {g["pg_name"]: g["ranks"] for g in groups if g["ranks"]}
    entries = doc.get("entries") or []
    warnings = []
    if not isinstance(entries, list):
        raise TraceFormatError(str(path), "Flight Recorder 'entries' is not a list")
    objects = [e for e in entries if isinstance(e, Mapping)]
    if len(objects) < len(entries):
        warnings.append(f"{len(entries) - len(objects)} Flight Recorder entries are not objects; skipped")
    table = entries_to_collectives_skipping_bad(objects, rank=rank if rank is not None else -1,
                                                source=SOURCE_FLIGHT_RECORDER, group_ranks=group_ranks,
                                                warnings=warnings, what=f"{path.name}: Flight Recorder")
    version = None if doc.get("version") is None else str(doc["version"])
    _check_version(version, path, warnings)
    if not objects:
        warnings.append(f"{path.name}: the dump holds no entries (the rank's recorder kept no pending or "
                        "recent collective); its rank counts as having entered none")
    rank_or = rank if rank is not None else -1
    fr_entries = fr_entry_rows(objects, rank=rank_or, source=SOURCE_FLIGHT_RECORDER, group_ranks=group_ranks)
    dead = doc.get("dead")
    status = fr_status_rows(doc.get("pg_status"), fr_entries, rank=rank_or, source_file=str(path),
                            version=version, num_entries=len(objects), dead=None if dead is None else bool(dead))
    return FlightRecorderParse(source_file=str(path), rank=rank, rank_source=rank_source, version=version,
                               process_groups=groups, collectives=table, warnings=warnings,
                               entries=fr_entries, status=status, hang_dump=HANG_DUMP_KEY in doc)


HANG_DUMP_KEY = "tracekit_hang_dump"
"""Top-level key of the dumps `tracekit record --hang-timeout` writes (record/hang_monitor.py)."""


SUPPORTED_MAJOR = "2"
"""Flight Recorder dump versions read (torch's `version` field: "2.0" ... "2.10"): the fields used are the
ones torch's own analyzer reads (torch/distributed/flight_recorder/components/types.py)."""


def _check_version(version: str | None, path: Path, warnings: list[str]) -> None:
    if version is None:
        warnings.append(f"{path.name}: the dump states no version; read as 2.x")
    elif version.split(".")[0] != SUPPORTED_MAJOR:
        warnings.append(f"{path.name}: dump version {version} is not 2.x; fields read as 2.x, check the result")


def _shapes_text(sizes: Any) -> str | None:
    """[[2048, 5120], [16]] -> "2048x5120, 16" (a scalar tensor is "scalar")."""
    if not isinstance(sizes, (list, tuple)):
        return None
    return ", ".join("x".join(str(int(d)) for d in shape) if shape else "scalar"
                     for shape in sizes if isinstance(shape, (list, tuple)))


def _join_text(values: Any) -> str | None:
    if not isinstance(values, (list, tuple)) or not values:
        return None
    return ", ".join(str(v) for v in values)


MAX_FRAMES = 16
"""Frames kept per entry (innermost first): enough to name the user's call site."""


def frames_text(frames: Any) -> str | None:
    """Flight Recorder `frames` ([{name, filename, line}], innermost first) as 'file:line name' lines."""
    if not isinstance(frames, (list, tuple)) or not frames:
        return None
    lines = []
    for fr in frames[:MAX_FRAMES]:
        if isinstance(fr, Mapping):
            lines.append(f"{fr.get('filename', '?')}:{fr.get('line', '?')} {fr.get('name', '?')}")
    return "\n".join(lines) or None


def _fr_entry_row(e: Mapping[str, Any], rank: int, source: str, group_ranks: Mapping[str, list[int]]) -> dict[str, Any]:
    """The fields of `entry_row` the hang analyzer reads (without its byte counts: half the cost), plus
    the dump's own: record and pg ids, sizes as text, retired, observed times, frames."""
    pg = e.get("process_group") or [None, None]
    pg_name = None if pg[0] in (None, "") else str(pg[0])
    op = normalize_op(e.get("profiling_name"))
    is_p2p = bool(e.get("is_p2p")) or op in ("send", "recv")
    seq = e.get("p2p_seq_id") if is_p2p else e.get("collective_seq_id")
    ranks_of_group = _ranks_list(e.get("group_ranks")) or (group_ranks.get(pg_name) if pg_name else None)
    retired = e.get("retired")
    rid = e.get("record_id")
    return {
        "rank": rank, "source": source, "record_id": int(rid) if rid is not None else None,
        "pg_id": None if e.get("pg_id") is None else str(e.get("pg_id")),
        "pg_name": pg_name, "pg_desc": None if len(pg) < 2 or pg[1] in (None, "") else str(pg[1]),
        "seq": int(seq) if seq is not None else None, "is_p2p": is_p2p,
        "op": op, "name": e.get("profiling_name"), "peer": _p2p_peer(e, is_p2p, ranks_of_group),
        "in_sizes": _shapes_text(e.get("input_sizes")), "out_sizes": _shapes_text(e.get("output_sizes")),
        "dtype": _join_text(e.get("input_dtypes")), "out_dtype": _join_text(e.get("output_dtypes")),
        "state": e.get("state") or "unknown", "retired": None if retired is None else bool(retired),
        "enqueue_ts": _nonzero_int(e.get("time_created_ns")),
        "start_ts": _nonzero_int(e.get("time_discovered_started_ns")),
        "end_ts": _nonzero_int(e.get("time_discovered_completed_ns")),
        "frames": frames_text(e.get("frames")),
    }


def fr_entry_rows(entries: Iterable[Mapping[str, Any]], *, rank: int, source: str,
                  group_ranks: Mapping[str, list[int]] | None = None) -> pa.Table:
    """Entries as `fr_entries` rows (what the hang analyzer reads); a malformed entry is left out
    (the `collectives` reader already counted it in the file's warnings)."""
    schema = TABLES["fr_entries"]
    rows = []
    for e in entries:
        try:
            rows.append(_fr_entry_row(e, rank, source, group_ranks or {}))
        except _ENTRY_ERRORS:
            continue
    try:
        return conform("fr_entries", pa.Table.from_pylist(rows, schema=schema))
    except _ENTRY_ERRORS:  # a field of another type somewhere (e.g. a list as state): those rows go
        good = []
        for row in rows:
            try:
                pa.Table.from_pylist([row], schema=schema)
            except _ENTRY_ERRORS:
                continue
            good.append(row)
        return conform("fr_entries", pa.Table.from_pylist(good, schema=schema))


def _pg_names_by_id(entries: pa.Table) -> dict[str, str]:
    """pg_id -> pg_name from the rank's own entries (pg ids are per rank: only its entries map them)."""
    ids, names = entries.column("pg_id").to_pylist(), entries.column("pg_name").to_pylist()
    return {i: n for i, n in zip(ids, names) if i is not None and n is not None}


def _count(value: Any) -> int | None:
    """A pg_status counter: a number, or its text (torch's JSON dump writes "3")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def fr_status_rows(pg_status: Any, entries: pa.Table, *, rank: int, source_file: str, version: str | None,
                   num_entries: int, dead: bool | None = None) -> pa.Table:
    """The dump's `pg_status` ({pg_id: {last_enqueued_collective, last_started_collective,
    last_completed_collective}}) as `fr_status` rows; one row with null pg_id when there is none."""
    names = _pg_names_by_id(entries)
    base = {"rank": rank, "source_file": source_file, "version": version, "num_entries": num_entries, "dead": dead}
    rows = []
    for key, st in (pg_status.items() if isinstance(pg_status, Mapping) else ()):
        if not isinstance(st, Mapping):
            continue
        num = {k: _count(st.get(f"last_{k}_collective")) for k in ("enqueued", "started", "completed")}
        rows.append({**base, "pg_id": str(key), "pg_name": names.get(str(key)), "last_enqueued": num["enqueued"],
                     "last_started": num["started"], "last_completed": num["completed"]})
    if not rows:
        rows.append({**base, "pg_id": None, "pg_name": None, "last_enqueued": None, "last_started": None,
                     "last_completed": None})
    return conform("fr_status", pa.Table.from_pylist(rows, schema=TABLES["fr_status"]))
