"""Kineto JSON trace (plain or .gz) → the per-rank tables of DESIGN §2.

The file is streamed (read or gunzipped block by block) and its `traceEvents` array read in ~1 MB
chunks cut at event boundaries (see `decode`): by the native column builder (`native`, one C pass that
gives the chunk's columns) where it takes the chunk, else by msgspec, whose complete events hand their
fields to a row list as they are built (the same columns); each chunk becomes column pieces before the
next is read, so neither the JSON text nor all event objects are ever held at once. Unusual layouts, lenient typing
and unreadable input take the whole-document path, which reports errors precisely. Columns are
normalised once: categories lower-cased and unified across schema versions, pid/tid made integers,
times exact int64 ns. Collective calls are assembled in `kineto_collectives`.

Rank placeholder: when the trace states no rank and the caller passes none, the `rank` column of
every table holds -1 (`RANK_UNKNOWN`) and `KinetoParse.table_rank` is -1; the run assembler
overwrites it once it knows the rank (file name, manifest). Rank is never defaulted to 0.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, is_, is_not
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.errors import TraceFormatError
from tracekit.parse import decode as D
from tracekit.parse import native as N
from tracekit.parse.classify import (
    GPU_CATS, ITERATION_OP_CATS, OTHER_DEVICE_CATS, StepWindows, accelerator_of, iteration_windows, device_windows, event_roles, group_dim, kernel_kinds, kernel_steps, kind_column, lane_codes,
    lane_column, step_number,
)
from tracekit.parse.collective_names import is_comm_kernel_name, kernel_op, normalize_op
from tracekit.parse.gz import GZIP_MAGIC, StreamProblem, iter_trace_blocks, read_trace_bytes
from tracekit.parse.kineto_collectives import CollectiveInputs, build_collectives, candidate_codes
from tracekit.parse.memory import is_memory_event, memory_table
from tracekit.parse.merged import event_rank, event_ranks
from tracekit.process_env import gc_paused
from tracekit.tables.schema import conform

RANK_UNKNOWN = -1

# Old (2021-2023) category spellings → the modern lower-case ones.
_CAT_ALIASES = {
    "kernel": "kernel",
    "operator": "cpu_op",
    "runtime": "cuda_runtime",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "python_function": "python_function",
    **OTHER_DEVICE_CATS,
}
KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_STREAM_TID = re.compile(r"^\s*stream\s*(\d+)\s*$", re.I)
_INT_TEXT = re.compile(r"^\s*-?\d+\s*$")


@dataclass
class KinetoParse:
    """Everything one Kineto file says, as table rows."""

    source_file: str
    rank: int | None
    world_size: int | None
    info: dict
    process_groups: list[dict]
    tables: dict[str, pa.Table]
    table_rank: int = RANK_UNKNOWN
    """Rank written into the tables' rank column (-1 when unknown; the run assembler fills it)."""
    phase_counts: dict[str, int] = field(default_factory=dict)
    """Number of events per `ph` (X rows are the events table; the others are not tabled)."""


def is_kineto_trace(path: str | Path, sniff_bytes: int = 4 << 20) -> bool:
    """Cheap check: a JSON object with a `traceEvents` key within the first bytes of the file."""
    try:
        head = _read_head(str(path), sniff_bytes)
    except (OSError, TraceFormatError, ValueError):
        return False
    stripped = head.lstrip()
    if not stripped.startswith(b"{"):
        return False
    return b'"traceEvents"' in head


def _read_head(path: str, n: int) -> bytes:
    with open(path, "rb") as f:
        magic = f.read(2)
        f.seek(0)
        if magic != GZIP_MAGIC:
            return f.read(n)
        from isal import isal_zlib

        dec = isal_zlib.decompressobj(31)
        out = bytearray()
        while len(out) < n:
            chunk = f.read(1 << 16)
            if not chunk:
                break
            try:
                out += dec.decompress(chunk, n - len(out))
            except isal_zlib.error:
                break
            if dec.eof:
                break
        return bytes(out)


CHUNK_BYTES = 1 << 20
"""JSON bytes of events decoded at once; the events of one chunk are turned into columns and freed
before the next is decoded (bounded object memory, cache-resident structs)."""


def parse_kineto(
    path: str | Path, *, rank: int | None = None, max_decompressed_bytes: int | None = None,
    columns: "EventColumns | None" = None,
) -> KinetoParse:
    """Parse one Kineto trace file. Raises TraceFormatError (or a subclass) for unreadable input.
    `columns`: the file's events already decoded (by several processes: parse/split.py)."""
    path = str(path)
    with gc_paused():
        try:  # streamed: the file is read (and gunzipped) one chunk at a time
            cols = columns if columns is not None else decode_columns(
                D.squeeze_whitespace(iter_trace_blocks(path, max_decompressed_bytes, CHUNK_BYTES)))
        except StreamProblem as exc:
            raise exc.error from None
        except OSError:
            cols = None
        repaired = None
        if cols is None:  # unusual layout or content: read and decode the whole document at once
            buf = read_trace_bytes(path, max_decompressed_bytes)
            try:
                trace, lenient = decode_document(path, buf)
            except UnicodeDecodeError as exc:  # msgspec raises it for invalid UTF-8 inside a string
                buf, repaired = _repair_utf8(path, buf, exc)
                trace, lenient = decode_document(path, buf)
            del buf  # the decoded Raw texts keep it alive only until their events are dropped
        try:
            if cols is None:
                parsed = tables_from_document(path, trace, lenient, rank)
            else:
                parsed = tables_from_columns(path, cols, rank)
            if repaired is not None:
                parsed.info["parse_warnings"].append(repaired)
            return parsed
        except TraceFormatError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, OverflowError, pa.ArrowException) as exc:
            raise TraceFormatError(path, f"malformed Kineto content: {type(exc).__name__}: {exc}") from exc


def decode_columns(blocks, exact_close: bool = False, event_ranks: bool = False) -> "EventColumns | None":
    """Columns of a well-formed, typed trace given as byte blocks, decoded chunk by chunk; None means:
    use the whole-document path (it reports errors precisely and handles lenient typing and invalid
    UTF-8). `exact_close`: see `decode.decode_event_chunks`. `event_ranks`: also keep each complete
    event's rank in a merged multi-rank file (`EventColumns.event_ranks`, parse/merged_ranks.py)."""
    cols = EventColumns(None)
    if event_ranks:
        cols.event_ranks = []
    capture = D.row_capture()
    rows, decoder = capture.rows, capture.decoder
    native = N.scan if N.available() else None

    def decode(text: bytes) -> "list | N.NativeChunk":
        rows.clear()
        if native is not None:
            chunk = native(text)
            if chunk is not None:
                return chunk
        return decoder.decode(text)

    def sink(events: "list | N.NativeChunk", text: bytes) -> None:
        if events.__class__ is N.NativeChunk:
            _add_native(cols, events, text)
        else:
            _add_rows(cols, events, rows, text)

    try:
        top = D.decode_event_stream(blocks, CHUNK_BYTES, sink, decode, exact_close)
    except (msgspec.DecodeError, UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError,
            OverflowError, RecursionError, pa.ArrowException):
        return None
    finally:
        rows.clear()
    if top is None:
        return None
    cols.top = top
    return cols


UTF8_REPAIRED = "invalid UTF-8 byte sequence(s) replaced with U+FFFD"
"""The parse warning after its count (both decoders)."""


def _repair_utf8(path: str, buf, exc: UnicodeDecodeError) -> tuple[bytes, str]:
    """Replace invalid UTF-8 (e.g. Latin-1 names from another cluster) with U+FFFD; keep the rank."""
    text = bytes(buf).decode("utf-8", "replace")
    num_bad = text.count("\ufffd") - bytes(buf).count("\ufffd".encode())
    if num_bad <= 0:
        raise TraceFormatError(path, f"undecodable text: {exc}") from None
    return text.encode("utf-8"), f"{num_bad} {UTF8_REPAIRED}"


def _utf8_error(buf) -> UnicodeDecodeError | None:
    """The first invalid UTF-8 sequence of `buf`, None when it is all valid (asked only after msgspec
    refused the document, so the copy is no cost on the normal path)."""
    try:
        bytes(buf).decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc
    return None


def decode_document(path: str, buf) -> tuple[Any, bool]:
    stripped = bytes(memoryview(buf)[:64]).lstrip()
    if not stripped:
        raise TraceFormatError(path, "empty file")
    if not stripped.startswith(b"{"):
        kind = "array" if stripped.startswith(b"[") else "non-object value"
        raise TraceFormatError(path, f"not a Kineto trace: top level is a JSON {kind}, expected an object")
    try:
        trace = D.TYPED_DECODER.decode(buf)
        lenient = False
    except RecursionError:  # msgspec decodes nested values of Any-typed fields recursively
        raise TraceFormatError(path, "JSON nested too deeply to decode (thousands of levels)") from None
    except msgspec.DecodeError as exc:
        if not isinstance(exc, msgspec.ValidationError):
            bad = _utf8_error(buf)
            if bad is not None:  # the caller repairs it (msgspec >= 0.23 says DecodeError, not UnicodeDecodeError)
                raise bad from None
            raise TraceFormatError(path, f"invalid JSON: {exc}") from None
        try:
            trace = D.LENIENT_DECODER.decode(buf)
            lenient = True
        except RecursionError:
            raise TraceFormatError(path, "JSON nested too deeply to decode (thousands of levels)") from None
        except msgspec.ValidationError as exc2:
            raise TraceFormatError(path, f"not a Kineto trace: {exc2}") from None
        except msgspec.DecodeError as exc2:
            raise TraceFormatError(path, f"invalid JSON: {exc2}") from None
    if trace.traceEvents is None:
        raise TraceFormatError(path, "not a Kineto trace: no traceEvents (e.g. an execution trace)")
    return trace, lenient


# ----------------------------------------------------------------------------------------------
# helpers


def to_int(v: Any) -> int | None:
    if v is None or v.__class__ is int:
        return v
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 2**63 else None
    if isinstance(v, str):
        if _INT_TEXT.match(v):
            return int(v)
        try:
            return int(v.strip(), 0)  # hex such as "0x0"
        except ValueError:
            return None
    return None


def _to_float(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


def _stable_id(text: str) -> int:
    """Deterministic negative id for a non-numeric pid/tid string ("Spans", "PyTorch Profiler")."""
    return -(zlib.crc32(text.encode("utf-8", "replace")) + 1)


class IdCodes:
    """Normalise pid/tid values that may be ints, numeric strings, "stream N" or free text."""

    def __init__(self) -> None:
        self.text_of: dict[int, str] = {}  # id → original free text (kept as thread name)
        self.stream_ids: set[int] = set()  # ids that came from "stream N"

    def convert(self, values: list) -> np.ndarray:
        try:
            return np.fromiter(values, dtype=np.int64, count=len(values))
        except (TypeError, ValueError, OverflowError):
            pass  # some ids are text or missing
        mapping: dict[Any, int | None] = {}

        def conv(v: Any) -> int | None:
            if v not in mapping:
                mapping[v] = self.one(v)
            return mapping[v]

        # Only the few non-int values go through Python; the type test runs in C.
        not_int = np.flatnonzero(~np.fromiter(map(is_, map(type, values), repeat(int)), bool, len(values)))
        vals = list(values)
        for i in not_int.tolist():
            v = conv(values[i])
            vals[i] = 0 if v is None else v
        return np.fromiter(vals, dtype=np.int64, count=len(vals))

    def one(self, v: Any) -> int | None:
        if v is None:
            return None
        if v.__class__ is int:
            return v
        if isinstance(v, float):
            return int(v)
        if isinstance(v, str):
            if _INT_TEXT.match(v):
                return int(v)
            m = _STREAM_TID.match(v)
            if m:
                sid = int(m.group(1))
                self.stream_ids.add(sid)
                return sid
            sid = _stable_id(v)
            self.text_of[sid] = _clip_text(v)
            return sid
        return _stable_id(repr(v))


def normalize_category(cat: Any) -> str | None:
    if cat is None:
        return None
    c = str(cat).strip().lower()
    return _CAT_ALIASES.get(c, c)


MAX_NAME_CHARS = 4096
"""Event names/categories longer than this are cut (real ones are at most a few hundred characters;
megabyte strings from a broken or hostile writer would otherwise be copied into every table and report)."""


def _clip_text(text: str) -> str:
    """One string from the trace (thread name, host, group description) cut to MAX_NAME_CHARS."""
    if len(text) <= MAX_NAME_CHARS:
        return text
    return f"{text[:MAX_NAME_CHARS]}...[{len(text) - MAX_NAME_CHARS} more characters cut]"


def _clip_strings(values: list, what: str, warnings: list[str]) -> list:
    if not values or max(map(len, filter(None, values)), default=0) <= MAX_NAME_CHARS:
        return values
    long = 0
    out = []
    for v in values:
        if v is not None and len(v) > MAX_NAME_CHARS:
            long += 1
            v = f"{v[:MAX_NAME_CHARS]}...[{len(v) - MAX_NAME_CHARS} more characters cut]"
        out.append(v)
    warnings.append(f"{long} event {what} longer than {MAX_NAME_CHARS} characters were cut")
    return out


def _dict_values(values: list) -> pa.Array:
    """The dictionary of a name/category column from its distinct values."""
    arr = pa.array(values, pa.string())
    if isinstance(arr, pa.ChunkedArray):
        raise ValueError("distinct event names or categories exceed 2 GiB of text")
    return arr


def _dict_column(values: list, n: int) -> pa.DictionaryArray:
    arr = pa.array(values, pa.string()) if values else pa.nulls(n, pa.string())
    if isinstance(arr, pa.ChunkedArray):  # over 2 GiB of text (huge strings): encode, then narrow the values
        enc = pa.array(values, pa.large_string()).dictionary_encode()
        try:
            return pa.DictionaryArray.from_arrays(enc.indices, enc.dictionary.cast(pa.string()))
        except (pa.ArrowInvalid, pa.ArrowCapacityError) as exc:
            raise ValueError(f"distinct event names or categories exceed 2 GiB of text ({exc})") from None
    return arr.dictionary_encode()


# ----------------------------------------------------------------------------------------------
# build


class EventColumns:
    """Per-event columns accumulated over decoded chunks (one chunk for the whole-document path)."""

    def __init__(self, top: Any, lenient: bool = False) -> None:
        self.top = top
        self.lenient = lenient
        self.n = 0
        self.names = CodeBook()  # name → code, in first-occurrence order
        self.cats = CodeBook()  # raw category (None included) → code
        self.keep_name: list[bool] = []  # per name code: rows whose full args collectives may read
        self.name_codes: list[np.ndarray] = []
        self.cat_codes: list[np.ndarray] = []
        self.ts: list[np.ndarray] = []
        self.ts_ok: list[np.ndarray] = []
        self.dur: list[np.ndarray] = []
        self.dur_ok: list[np.ndarray] = []
        self.pid: list[np.ndarray] = []
        self.tid: list[np.ndarray] = []
        self.pid_ids = IdCodes()
        self.tid_ids = IdCodes()
        self.ext: list[pa.Array] = []
        self.corr: list[pa.Array] = []
        self.stream: list[pa.Array] = []
        self.device: list[pa.Array] = []
        self.flops: list[pa.Array] = []
        self.coll_name: dict[int, Any] = {}  # row → args["Collective name"] where present
        self.launch_kernel: dict[int, Any] = {}  # row → args["kernel"] (a runtime launch's kernel) where present
        self.shape_books = tuple(CodeBook({b"": 0}) for _ in D.SHAPE_FIELDS)  # JSON text → code (0: absent)
        self.shape_codes: tuple[list[np.ndarray], ...] = tuple([] for _ in D.SHAPE_FIELDS)
        self.args_keep: dict[int, Any] = {}  # row → full args, for collective candidates only
        self.ms: list = []
        self.memory: list = []  # the profiler's `[memory]` instant events (parse/memory.py)
        self.phase_counts: dict[str, int] = {"X": 0, "M": 0}
        self.warnings: list[str] = []
        self.event_ranks: list[np.ndarray] | None = None
        """Only when asked (merged multi-rank files): each complete event's rank, merged.event_rank."""


class CodeBook(dict):
    """value → code; an unseen value gets the next code (so codes follow first occurrence)."""

    def __missing__(self, value: Any) -> int:
        code = self[value] = len(self)
        return code


def _intern(index: CodeBook, values: list) -> np.ndarray:
    """Codes of `values`, adding new values to `index` (one C-level pass; Python only for new values)."""
    return np.fromiter(map(index.__getitem__, values), np.int32, len(values))


def _count_phases(cols: EventColumns, events: list, x_class: type, num_x: int) -> None:
    """Phase counts (and metadata events) of one decoded chunk."""
    counts = cols.phase_counts
    counts["X"] += num_x
    if num_x != len(events):
        by_class = Counter(map(type, events))  # counted in C: flow events can be a third of a trace
        del by_class[x_class]
        M = D.M
        if M in by_class:
            cols.ms.extend(e for e in events if e.__class__ is M)
        if D.I in by_class:
            cols.memory.extend(e for e in events if e.__class__ is D.I and is_memory_event(e))
        for cls, k in by_class.items():
            tag = cls.__struct_config__.tag
            counts[tag] = counts.get(tag, 0) + k


def _add_typed(cols: EventColumns, events: list) -> None:
    """Add one decoded list of tagged-union events (D.X structs)."""
    X = D.X
    xs = [e for e in events if e.__class__ is X]
    _count_phases(cols, events, X, len(xs))
    _add_x(cols, xs)


def _add_rows(cols: EventColumns, events: list, rows: list, piece: bytes) -> None:
    """Add one chunk decoded by the row-capturing decoder (`rows`: its X events' fields, D.ROW_FIELDS
    values per event in one flat list; `piece`: the JSON text it decoded, where the full args of the few
    events that keep them are read)."""
    _count_phases(cols, events, D.row_capture().row_class, len(rows) // D.ROW_WIDTH)
    if rows:
        columns = D.row_columns(rows)
        _add_fields(cols, *columns, full_args=lambda kept: _full_args(piece, columns[2], columns[0], kept))


def _add_native(cols: EventColumns, chunk: "N.NativeChunk", piece: bytes) -> None:
    """Add one natively scanned chunk: the column pieces `_add_rows` makes of the same events."""
    counts = cols.phase_counts
    n = chunk.n
    counts["X"] += n
    cols.ms.extend(chunk.ms)
    cols.memory.extend(e for e in chunk.instants if is_memory_event(e))
    for tag, k in chunk.counts.items():
        if tag != "X":
            counts[tag] = counts.get(tag, 0) + k
    if not n:
        return
    base = cols.n
    codes = _add_names(cols, chunk.names)[chunk.name_idx]
    cols.name_codes.append(codes)
    cols.cat_codes.append(_intern(cols.cats, chunk.cats)[chunk.cat_idx])
    cols.ts.append(chunk.ts)
    cols.ts_ok.append(chunk.ts_ok)
    cols.dur.append(chunk.dur)
    cols.dur_ok.append(chunk.dur_ok)
    pid, tid = chunk.pid, chunk.tid
    if chunk.ids:
        pid, tid = pid.copy(), tid.copy()
        for row, which, value in chunk.ids:
            v = (cols.tid_ids if which else cols.pid_ids).one(value)
            (tid if which else pid)[row] = 0 if v is None else v
    cols.pid.append(pid)
    cols.tid.append(tid)
    values, ok = chunk.ints, chunk.ints_ok
    if chunk.int_texts:
        values, ok = values.copy(), ok.copy()
        for row, k, text in chunk.int_texts:
            v = to_int(text)
            if v is not None:
                values[row, k], ok[row, k] = v, True
    values, missing = np.ascontiguousarray(values.T), np.ascontiguousarray(~ok.T)  # one column per row: contiguous
    ints = [pa.array(values[k], pa.int64(), mask=missing[k]) for k in range(N.N_INTS)]
    _add_ints(cols, *ints)
    cols.flops.append(pa.array(chunk.flops, pa.float64(), mask=~chunk.flops_ok))
    cols.coll_name.update((base + r, v) for r, v in chunk.coll)
    cols.launch_kernel.update((base + r, v) for r, v in chunk.launch)
    for k, (book, shape_codes) in enumerate(zip(cols.shape_books, cols.shape_codes)):
        shape_codes.append(_intern(book, chunk.shape_texts[k])[chunk.shapes[:, k]])
    keep = np.array(cols.keep_name, bool)[codes]
    keep[[r for r, _ in chunk.coll]] = True
    kept = np.flatnonzero(keep).tolist()
    if kept:
        view = memoryview(piece)
        spans = chunk.spans[kept].tolist()
        cols.args_keep.update((base + i, _detach(D.X_DECODER.decode(view[s:e]).args)) for i, (s, e) in zip(kept, spans))
    if cols.event_ranks is not None:  # merged multi-rank files: each row's rank
        pid_int = np.ones(n, bool)
        pid_int[[row for row, which, _ in chunk.ids if not which]] = False
        cols.event_ranks.append(event_ranks(chunk.rank, chunk.rank_ok, chunk.pid, pid_int))
    cols.n += n


def _full_args(piece: bytes, ts: list, names: list, kept: list[int]) -> list:
    """The XArgs of the captured complete events `kept` of `piece`: each read where its text lies, else (rare)
    from a second decode of the whole piece."""
    found = D.full_args(piece, ts, names, kept)
    if found is not None:
        return found
    xs = [e for e in D.EVENTS_DECODER.decode(piece) if e.__class__ is D.X]
    return [xs[i].args for i in kept]


def _add_x(cols: EventColumns, xs: list) -> None:
    """Add complete-event structs (typed or lenient)."""
    fields = [list(map(attrgetter(f), xs)) for f in D.ROW_FIELDS[:7]]
    args = fields[6]
    if cols.lenient:
        args = fields[6] = [a if isinstance(a, D.LXArgs) else D.EMPTY_LARGS for a in args]
    fields += [list(map(attrgetter(f), args)) for f in D.ROW_FIELDS[7:]]
    _add_fields(cols, *fields)


def _add_names(cols: EventColumns, names: list) -> np.ndarray:
    """Codes of event names, new names getting the next codes and their keep-args flag."""
    known = len(cols.names)
    codes = _intern(cols.names, names)
    if len(cols.names) > known:
        new = list(cols.names)[known:]
        cand = set(candidate_codes(new))
        cols.keep_name.extend(i in cand or (bool(nm) and is_comm_kernel_name(nm)) for i, nm in enumerate(new))
    return codes


def merge_columns(parts: list[EventColumns], top: Any) -> EventColumns:
    """The columns of consecutive runs of one trace's events as one (the first part, extended): the
    same columns a single decode of all the runs gives (names and categories coded in first-occurrence
    order, rows numbered from the first part's)."""
    out = parts[0]
    out.top = top
    for p in parts[1:]:
        name_map, cat_map = _add_names(out, list(p.names)), _intern(out.cats, list(p.cats))
        out.name_codes.extend(name_map[c] for c in p.name_codes)
        out.cat_codes.extend(cat_map[c] for c in p.cat_codes)
        for f in ("ts", "ts_ok", "dur", "dur_ok", "pid", "tid", "ext", "corr", "stream", "device", "flops", "ms",
                  "memory"):
            getattr(out, f).extend(getattr(p, f))
        out.coll_name.update((out.n + r, v) for r, v in p.coll_name.items())
        out.launch_kernel.update((out.n + r, v) for r, v in p.launch_kernel.items())
        for book, codes, p_book, p_codes in zip(out.shape_books, out.shape_codes, p.shape_books, p.shape_codes):
            remap = _intern(book, list(p_book))
            codes.extend(remap[c] for c in p_codes)
        out.args_keep.update((out.n + r, v) for r, v in p.args_keep.items())
        for ids, more in ((out.pid_ids, p.pid_ids), (out.tid_ids, p.tid_ids)):
            ids.text_of.update(more.text_of)
            ids.stream_ids |= more.stream_ids
        for tag, k in p.phase_counts.items():
            out.phase_counts[tag] = out.phase_counts.get(tag, 0) + k
        if out.event_ranks is not None:
            out.event_ranks.extend(p.event_ranks)
        out.warnings.extend(p.warnings)
        out.n += p.n
    return out


def _add_fields(cols: EventColumns, names, cats, ts, dur, pids, tids, args, ext, ext_old, corr, stream, device,
                flops, coll, launch, *shapes, full_args=None) -> None:
    """Turn one batch of complete events' fields into column pieces; keep full args only for
    collective candidates (`full_args(rows)`: theirs when `args` lacks D.FULL_ONLY_ARGS)."""
    lenient = cols.lenient
    n = len(names)
    base = cols.n
    if lenient:
        names = [v if isinstance(v, str) else ("" if v is None else str(v)) for v in names]
        cats = [v if (v is None or isinstance(v, str)) else str(v) for v in cats]
    codes = _add_names(cols, names)
    del names
    cols.name_codes.append(codes)
    cols.cat_codes.append(_intern(cols.cats, cats))
    del cats

    both, both_ok = D.raws_to_ns(ts + dur)  # both lists (or both tuples)
    cols.ts.append(both[:n])
    cols.ts_ok.append(both_ok[:n])
    cols.dur.append(both[n:])
    cols.dur_ok.append(both_ok[n:])
    del both, both_ok, ts, dur
    cols.pid.append(cols.pid_ids.convert(pids))
    cols.tid.append(cols.tid_ids.convert(tids))

    def int_col(vals) -> pa.Array:
        if not lenient:
            try:
                return pa.array(vals, pa.int64())
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
                pass  # some values are text ("0x0", "7"): coerce one by one
        return pa.array([to_int(v) for v in vals], pa.int64())

    _add_ints(cols, *map(int_col, (ext, ext_old, corr, stream, device)))
    cols.flops.append(pa.array([_to_float(v) for v in flops] if lenient else flops, pa.float64()))
    has_coll = np.flatnonzero(np.fromiter(map(is_not, coll, repeat(None)), bool, n))
    cols.coll_name.update((base + i, coll[i]) for i in has_coll.tolist())
    has_launch = np.flatnonzero(np.fromiter(map(is_not, launch, repeat(None)), bool, n))
    cols.launch_kernel.update((base + i, str(launch[i])) for i in has_launch.tolist())
    _add_shapes(cols, shapes, n)
    keep = np.array(cols.keep_name, bool)[codes] if n else np.zeros(0, bool)
    keep[has_coll] = True
    kept = np.flatnonzero(keep).tolist()
    if kept:
        full = full_args(kept) if full_args is not None else [args[i] for i in kept]
        cols.args_keep.update((base + i, _detach(a)) for i, a in zip(kept, full))
    if cols.event_ranks is not None:
        cols.event_ranks.append(_event_ranks(list(map(attrgetter("rank"), args)), pids, n))
    cols.n += n


def _add_ints(cols: EventColumns, ext: pa.Array, ext_old: pa.Array, corr: pa.Array, stream: pa.Array,
              device: pa.Array) -> None:
    """One batch's integer args (both decoders): `External id`, else the old `external id`; correlation, stream
    and device as they are."""
    cols.ext.append(pc.coalesce(ext, ext_old))
    cols.corr.append(corr)
    cols.stream.append(stream)
    cols.device.append(device)


def _event_ranks(given: list, pids: list, n: int) -> np.ndarray:
    """merged.event_rank of each event from its args.rank and pid (one conversion when every event
    states a non-negative integer rank, as TraceFusion writes them)."""
    if set(map(type, given)) == {int}:
        ranks = np.fromiter(given, np.int64, n)
        if (ranks >= 0).all():
            return ranks
    return np.fromiter(map(event_rank, given, pids), np.int64, n)


def _add_shapes(cols: EventColumns, shapes: tuple, n: int) -> None:
    """Code the shape texts of the rows that have `Input Dims` (record_shapes CPU ops; the others, most
    rows of most traces, cost one length check)."""
    with_dims = np.flatnonzero(np.fromiter(map(len, shapes[0]), np.int64, n)) if n else np.zeros(0, np.int64)
    pick = with_dims.tolist()
    for book, shape_codes, texts in zip(cols.shape_books, cols.shape_codes, shapes):
        codes = np.zeros(n, np.int32)
        if pick:
            codes[with_dims] = _text_codes(book, list(map(texts.__getitem__, pick)))
        shape_codes.append(codes)


def _text_codes(book: CodeBook, raws: list) -> np.ndarray:
    """Codes of JSON texts (msgspec.Raw) in `book`, new texts getting the next codes in order of first
    occurrence: the texts are hashed in Arrow (one dictionary encode), only the distinct ones in Python."""
    lens = np.fromiter(map(len, raws), np.int64, len(raws))
    offsets = np.zeros(len(raws) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    texts = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(raws), [None, pa.py_buffer(offsets),
                                                                           pa.py_buffer(b"".join(raws))])
    enc = texts.dictionary_encode()
    distinct = enc.dictionary.to_pylist()
    return np.fromiter(map(book.__getitem__, distinct), np.int32, len(distinct))[enc.indices.to_numpy()]


def tables_from_document(path: str, trace: Any, lenient: bool, rank_arg: int | None,
                         step_windows: StepWindows | None = None) -> KinetoParse:
    """Tables from a whole-document decode (typed or lenient); `step_windows`: see `tables_from_columns`."""
    events = trace.traceEvents
    if not isinstance(events, list):
        raise TraceFormatError(path, "traceEvents is not a list")
    trace.traceEvents = None
    cols = EventColumns(trace, lenient)
    if lenient:
        xs = [e for e in events if e.ph == "X"]
        cols.ms = [e for e in events if e.ph == "M"]
        cols.memory = [e for e in events if e.ph == "i" and is_memory_event(e) and e.args is not None]
        phase_counts: dict[str, int] = {}
        for e in events:
            key = str(e.ph)
            phase_counts[key] = phase_counts.get(key, 0) + 1
        cols.phase_counts = phase_counts
        cols.warnings.append("typed decode failed (unknown ph or unexpected field types); used the lenient decoder")
        del events
        _add_x(cols, xs)
        del xs
    else:
        _add_typed(cols, events)
        del events
    return tables_from_columns(path, cols, rank_arg, step_windows)


def _concat(parts: list, dtype) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _concat_arrow(parts: list, dtype: pa.DataType) -> pa.Array:
    return pa.concat_arrays(parts) if parts else pa.array([], dtype)


@dataclass
class _Rows:
    """The complete events of one trace as columns (after every chunk is joined), with what the
    tables derive from them; filled step by step by the functions below."""

    n: int
    ts: np.ndarray
    ts_ok: np.ndarray
    dur: np.ndarray
    dur_ok: np.ndarray
    name_codes: np.ndarray
    cat_codes: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    ext: pa.Array
    corr: pa.Array
    stream_arg: pa.Array
    device_arg: pa.Array
    flops: pa.Array
    coll_names: dict
    args_keep: dict
    launch_kernels: dict = field(default_factory=dict)
    """row → the kernel a runtime launch call names (args.kernel), where present."""
    shape_codes: list = field(default_factory=list)
    """Per SHAPE_FIELDS: each row's code of its JSON text (0: absent)."""
    shape_texts: list = field(default_factory=list)
    """Per SHAPE_FIELDS: the texts by code."""
    end: np.ndarray | None = None
    name_col: Any = None
    name_dict: list = field(default_factory=list)
    cat_col: Any = None
    cat_values: list = field(default_factory=list)
    gpu_row: np.ndarray | None = None
    stream_col: Any = None
    corr_np: np.ndarray | None = None

    def cat_mask(self, *wanted: str) -> np.ndarray:
        codes = [self.cat_values.index(w) for w in wanted if w in self.cat_values]
        return np.isin(self.cat_codes, codes) if codes else np.zeros(self.n, bool)


def _joined_rows(cols: EventColumns) -> _Rows:
    return _Rows(
        n=cols.n, ts=_concat(cols.ts, np.int64), ts_ok=_concat(cols.ts_ok, bool), dur=_concat(cols.dur, np.int64),
        dur_ok=_concat(cols.dur_ok, bool), name_codes=_concat(cols.name_codes, np.int32),
        cat_codes=_concat(cols.cat_codes, np.int32), pid=_concat(cols.pid, np.int64), tid=_concat(cols.tid, np.int64),
        ext=_concat_arrow(cols.ext, pa.int64()), corr=_concat_arrow(cols.corr, pa.int64()),
        stream_arg=_concat_arrow(cols.stream, pa.int64()), device_arg=_concat_arrow(cols.device, pa.int64()),
        flops=_concat_arrow(cols.flops, pa.float64()), coll_names=cols.coll_name, args_keep=cols.args_keep,
        launch_kernels=cols.launch_kernel,
        **_shape_dictionaries(cols))


def _shape_dictionaries(cols: EventColumns) -> dict[str, list]:
    """Each shape field's codes and texts, the texts compact JSON (a pretty-printed trace's indentation
    dropped: the same shapes give the same text whatever the file's layout)."""
    codes, texts = [], []
    for book, parts in zip(cols.shape_books, cols.shape_codes):
        compact: dict[str, int] = {}
        remap = np.zeros(len(book), np.int32)
        for i, raw in enumerate(book):
            if i:
                remap[i] = compact.setdefault(_compact_json(raw), len(compact) + 1)
        texts.append([""] + list(compact))
        codes.append(remap[_concat(parts, np.int32)])
    return {"shape_codes": codes, "shape_texts": texts}


def _compact_json(raw: bytes) -> str:
    try:
        return msgspec.json.encode(msgspec.json.decode(raw)).decode()
    except (msgspec.DecodeError, UnicodeDecodeError):
        return bytes(raw).decode("utf-8", "replace").strip()


def _drop_untimed(rows: _Rows, warnings: list[str]) -> bool:
    """Drop events without a usable ts (exact ns); True when some were dropped."""
    ok = rows.ts_ok
    if ok.all():
        return False
    warnings.append(f"{int((~ok).sum())} complete events without a numeric ts were dropped")
    new_row = np.cumsum(ok) - 1
    keep = pa.array(ok)
    for f in ("ts", "dur", "dur_ok", "name_codes", "cat_codes", "pid", "tid"):
        setattr(rows, f, getattr(rows, f)[ok])
    for f in ("ext", "corr", "stream_arg", "device_arg", "flops"):
        setattr(rows, f, getattr(rows, f).filter(keep))
    rows.shape_codes = [c[ok] for c in rows.shape_codes]
    rows.coll_names = {int(new_row[r]): v for r, v in rows.coll_names.items() if ok[r]}
    rows.launch_kernels = {int(new_row[r]): v for r, v in rows.launch_kernels.items() if ok[r]}
    rows.args_keep = {int(new_row[r]): v for r, v in rows.args_keep.items() if ok[r]}
    rows.n = len(rows.ts)
    return True


def _check_durations(rows: _Rows, warnings: list[str]) -> None:
    """Missing or negative durations become null; `end` = ts + dur (ts where dur is null)."""
    missing = int(rows.n - rows.dur_ok.sum())
    negative = rows.dur_ok & (rows.dur < 0)
    rows.dur_ok &= ~negative
    if missing:
        warnings.append(f"{missing} complete events without dur (null duration)")
    if negative.any():
        warnings.append(f"{int(negative.sum())} complete events with negative dur (null duration)")
    rows.end = rows.ts + np.where(rows.dur_ok, rows.dur, 0)


def _name_and_category_columns(rows: _Rows, name_list: list, raw_cat_list: list, rebuild: bool,
                               warnings: list[str]) -> None:
    """Dictionary columns of names (clipped) and normalised categories."""
    n = rows.n
    long_text = any(len(s) > MAX_NAME_CHARS for s in name_list) or any(
        c is not None and len(c) > MAX_NAME_CHARS for c in raw_cat_list)
    raw_cat_codes = rows.cat_codes
    if rebuild or long_text:  # rare: rebuild from the values, as one list
        names = _clip_strings([name_list[c] for c in rows.name_codes.tolist()], "names", warnings)
        rows.name_col = _dict_column(names, n)
        del names
        cat_raw = _dict_column(_clip_strings([raw_cat_list[c] for c in raw_cat_codes.tolist()], "categories",
                                             warnings), n)
        cat_dict = [normalize_category(c) for c in cat_raw.dictionary.to_pylist()]
        raw_cat_codes = (cat_raw.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)
                         if n else np.zeros(0, np.int32))
    else:
        rows.name_col = pa.DictionaryArray.from_arrays(pa.array(rows.name_codes, pa.int32()), _dict_values(name_list))
        cat_dict = [normalize_category(c) for c in raw_cat_list]
    rows.name_dict = rows.name_col.dictionary.to_pylist()
    rows.name_codes = rows.name_col.indices.to_numpy(zero_copy_only=False) if n else np.zeros(0, np.int32)
    cat_norm_dict = pa.array(sorted({c for c in cat_dict if c is not None}), pa.string())
    rows.cat_values = cat_norm_dict.to_pylist()
    norm_index = {c: i for i, c in enumerate(rows.cat_values)}
    remap = np.array([norm_index[c] if c is not None else -1 for c in cat_dict] + [-1], np.int32)
    rows.cat_codes = remap[raw_cat_codes]  # code -1 (no category) takes the trailing -1
    rows.cat_col = pa.DictionaryArray.from_arrays(pa.array(rows.cat_codes, pa.int32(), mask=rows.cat_codes < 0),
                                                  cat_norm_dict)
    rows.gpu_row = rows.cat_mask(*GPU_CATS)
    # stream: args.stream, else the tid of device rows ("stream 7" → 7)
    stream_np = rows.stream_arg.fill_null(-1).to_numpy(zero_copy_only=False) if n else np.zeros(0, np.int64)
    stream = np.where(stream_np >= 0, stream_np, np.where(rows.gpu_row, rows.tid, -1))
    rows.stream_col = pa.array(stream.astype(np.int32), pa.int32(), mask=stream < 0)
    rows.corr_np = rows.corr.fill_null(-1).to_numpy(zero_copy_only=False) if n else np.zeros(0, np.int64)


def _metadata_names(ms: list) -> tuple[dict[tuple[int, int], str], dict[int, str]]:
    """Thread names by (pid, tid) and process labels by pid, from the metadata (`M`) events."""
    thread_names: dict[tuple[int, int], str] = {}
    process_labels: dict[int, str] = {}
    m_pid, m_tid = IdCodes(), IdCodes()
    for m in ms:
        a = m.args
        if a is None:
            continue
        if m.name == "thread_name" and isinstance(a.name, str):
            thread_names.setdefault((m_pid.one(m.pid), m_tid.one(m.tid)), _clip_text(a.name.strip()))
        elif m.name == "process_labels" and isinstance(a.labels, str):
            process_labels.setdefault(m_pid.one(m.pid), _clip_text(a.labels))
    return thread_names, process_labels


def _step_windows(rows: _Rows) -> StepWindows:
    """The host `ProfilerStep#N` intervals (a null duration counts as 0); without them, on a trace with
    device work, the iterations where the trace repeats (classify.iteration_windows), if any."""
    step_of_code = {code: num for code, num in enumerate(map(step_number, rows.name_dict)) if num is not None}
    if not step_of_code:
        found = None
        if rows.n and rows.cat_mask(*KERNEL_CATS).any():
            ops = np.flatnonzero(rows.cat_mask(*ITERATION_OP_CATS) & ~rows.gpu_row)
            found = iteration_windows(rows.name_dict, rows.name_codes, ops, rows.ts, rows.end, rows.tid,
                                      (int(rows.ts.min()), int(rows.end.max())))
        return found or StepWindows(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    at = np.flatnonzero(np.isin(rows.name_codes, list(step_of_code)) & ~rows.gpu_row)
    nums = np.array([step_of_code[int(rows.name_codes[i])] for i in at], dtype=np.int64)
    return StepWindows(rows.ts[at], np.where(rows.dur_ok[at], rows.dur[at], 0), nums)


def launch_rows(rows: _Rows, corrs: np.ndarray) -> np.ndarray:
    """Row of the host runtime call with each correlation id (-1 when absent; the first such call)."""
    host = np.flatnonzero((rows.corr_np >= 0) & ~rows.gpu_row & ~rows.cat_mask(*KERNEL_CATS))
    order = host[np.argsort(rows.corr_np[host], kind="stable")]
    rt_corr = rows.corr_np[order]
    if len(rt_corr) == 0:
        return np.full(len(corrs), -1, np.int64)
    j = np.searchsorted(rt_corr, corrs)
    jc = np.minimum(j, len(rt_corr) - 1)
    found = (j < len(rt_corr)) & (rt_corr[jc] == corrs) & (corrs >= 0)
    return np.where(found, order[jc], -1)


@dataclass
class _KernelRows:
    rows: np.ndarray
    launch: np.ndarray
    step: np.ndarray
    carry: np.ndarray
    comm: np.ndarray
    kind: np.ndarray


def _kernel_rows(rows: _Rows, windows: StepWindows) -> _KernelRows:
    """Device rows: their launch, step (the launch's), carry-over and kind (parse/classify.py)."""
    k = np.flatnonzero(rows.cat_mask(*KERNEL_CATS))
    launch = launch_rows(rows, rows.corr_np[k])
    step, carry = kernel_steps(rows.ts[k], rows.ts[np.maximum(launch, 0)], launch >= 0, windows)
    comm_name = np.array([bool(nm) and is_comm_kernel_name(nm) for nm in rows.name_dict], bool)
    coll_args = np.isin(k, np.fromiter(rows.coll_names, np.int64, len(rows.coll_names)))
    comm = coll_args | (comm_name[rows.name_codes[k]] if len(k) else np.zeros(0, bool))
    cat = rows.cat_codes[k]
    kind = kernel_kinds(comm, cat == _code(rows.cat_values, "gpu_memcpy"), cat == _code(rows.cat_values, "gpu_memset"))
    return _KernelRows(k, launch, step, carry, comm, kind)


def _comm_kernel_groups(rows: _Rows, kr: _KernelRows, link: dict) -> tuple[list, list]:
    """Op and process group of each comm kernel: its own args, else the call it links to, else its name."""
    ops: list[str | None] = [None] * len(kr.rows)
    pgs: list[str | None] = [None] * len(kr.rows)
    for j in np.flatnonzero(kr.comm).tolist():
        r = int(kr.rows[j])
        call = link.get(r)
        cn = rows.coll_names.get(r)
        op = normalize_op(cn) if cn else None
        if op is None and call is not None:
            op = call["op"]
        ops[j] = op or kernel_op(rows.name_dict[rows.name_codes[r]]) or "unknown"
        pg = rows.args_keep[r].pg_name
        pgs[j] = str(pg) if pg is not None else (call.get("pg_name") if call is not None else None)
    return ops, pgs


def _kernels_table(rows: _Rows, kr: _KernelRows, ops: list, pgs: list, rank: int) -> pa.Table:
    take = pa.array(kr.rows, pa.int64())
    dev = rows.device_arg.take(take) if len(kr.rows) else pa.array([], pa.int64())
    return pa.table({
        "rank": np.full(len(kr.rows), rank, np.int32),
        "name": rows.name_col.take(take),
        "stream": rows.stream_col.take(take),
        "device": pc.coalesce(dev, pa.array(rows.pid[kr.rows])),
        "ts": rows.ts[kr.rows],
        "dur": pa.array(rows.dur[kr.rows], pa.int64(), mask=~rows.dur_ok[kr.rows]),
        "kind": kind_column(kr.kind),
        "correlation": rows.corr.take(take),
        "external_id": rows.ext.take(take),
        "collective_op": pa.array(ops, pa.string()),
        "pg_name": pa.array(pgs, pa.string()),
        "step": pa.array(kr.step, pa.int32(), mask=kr.step < 0),
        "carry_over": kr.carry,
    })


def _events_table(rows: _Rows, thread_col: pa.DictionaryArray, kr: _KernelRows, windows: StepWindows,
                  rank: int) -> pa.Table:
    """Every complete event with its step (device rows: their launch's), role and lane."""
    n = rows.n
    step = windows.at(rows.ts)
    step[kr.rows] = kr.step
    thread_codes = thread_col.indices.fill_null(-1).to_numpy(zero_copy_only=False) if n else np.zeros(0, np.int32)
    lane = lane_codes(thread_col.dictionary.to_pylist(), thread_codes, rows.gpu_row)
    return pa.table({
        "rank": np.full(n, rank, np.int32), "name": rows.name_col, "cat": rows.cat_col, "ts": rows.ts,
        "dur": pa.array(rows.dur, pa.int64(), mask=~rows.dur_ok), "pid": rows.pid, "tid": rows.tid,
        "thread_name": thread_col, "stream": rows.stream_col, "correlation": rows.corr, "external_id": rows.ext,
        "step": pa.array(step, pa.int32(), mask=step < 0), "flops": rows.flops,
        "role": event_roles(rows.name_dict, rows.name_codes, rows.cat_mask("cpu_op"), lane, kr.rows, kr.kind),
        "lane": lane_column(lane),
        **{col: _shape_column(codes, texts) for col, codes, texts in zip(SHAPE_COLUMNS, rows.shape_codes,
                                                                         rows.shape_texts)},
        "launch_kernel": _sparse_text_column(rows.launch_kernels, n),
    })


def _sparse_text_column(values: dict[int, str], n: int) -> pa.DictionaryArray:
    """A dictionary column of n rows holding `values` (row → text), null elsewhere."""
    if not values:
        return pa.nulls(n, pa.string()).dictionary_encode()
    texts = list(dict.fromkeys(values.values()))
    code_of = {t: i for i, t in enumerate(texts)}
    codes = np.full(n, -1, np.int32)
    rows = np.fromiter(values.keys(), np.int64, len(values))
    codes[rows] = np.fromiter((code_of[v] for v in values.values()), np.int32, len(values))
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=codes < 0), pa.array(texts, pa.string()))


SHAPE_COLUMNS = ("input_dims", "input_types", "input_strides", "concrete_inputs")
"""The events table's columns for D.SHAPE_FIELDS (same order)."""


def _shape_column(codes: np.ndarray, texts: list[str]) -> pa.DictionaryArray:
    """A dictionary column of JSON texts; rows without the field (code 0) are null."""
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=codes == 0), pa.array(texts, pa.string()))


def _steps_table(windows: StepWindows, kernels: pa.Table, rank: int) -> pa.Table:
    steps = pa.table({"rank": np.full(len(windows.nums), rank, np.int32), "step": windows.nums.astype(np.int32),
                      "ts": windows.ts, "dur": windows.end - windows.ts,
                      "rule": pa.array([windows.rule] * len(windows.nums), pa.string())})
    return device_windows(steps, kernels)


def _trace_identity(trace: Any, rank_arg: int | None, warnings: list[str]) -> tuple[dict | None, int | None, int | None, int]:
    """(distributedInfo, its rank, world size, the rank written into the tables)."""
    di = trace.distributedInfo if isinstance(trace.distributedInfo, dict) else None
    if trace.distributedInfo is not None and di is None:
        warnings.append("distributedInfo is not an object; ignored")
    trace_rank = to_int(di.get("rank")) if di else None
    world_size = to_int(di.get("world_size")) if di else None
    if rank_arg is not None and trace_rank is not None and rank_arg != trace_rank:
        warnings.append(f"rank {rank_arg} given by caller differs from distributedInfo.rank {trace_rank}")
    table_rank = rank_arg if rank_arg is not None else (trace_rank if trace_rank is not None else RANK_UNKNOWN)
    return di, trace_rank, world_size, table_rank


def tables_from_columns(path: str, cols: EventColumns, rank_arg: int | None,
                        step_windows: StepWindows | None = None) -> KinetoParse:
    """The tables of one trace from its decoded columns (either driver's: whole file or chunks);
    `step_windows`: steps to use instead of the document's own (the chunked parser's iterations, found over
    the whole trace, for a part of it)."""
    trace, warnings = cols.top, list(cols.warnings)
    di, trace_rank, world_size, table_rank = _trace_identity(trace, rank_arg, warnings)
    rows = _joined_rows(cols)
    name_list, raw_cat_list, tid_text, memory_events = list(cols.names), list(cols.cats), cols.tid_ids.text_of, cols.memory
    ms, phase_counts, lenient = cols.ms, cols.phase_counts, cols.lenient
    del cols
    dropped = _drop_untimed(rows, warnings)
    _check_durations(rows, warnings)
    _name_and_category_columns(rows, name_list, raw_cat_list, dropped, warnings)
    thread_names, process_labels = _metadata_names(ms)
    thread_col = _thread_name_column(rows.pid, rows.tid, thread_names, tid_text, rows.n)
    windows = step_windows if step_windows is not None else _step_windows(rows)
    kr = _kernel_rows(rows, windows)
    coll = build_collectives(CollectiveInputs(
        path=path, name_dict=rows.name_dict, name_codes=rows.name_codes, cat_codes=rows.cat_codes,
        cat_values=rows.cat_values, ts=rows.ts, end=rows.end, dur=rows.dur, dur_ok=rows.dur_ok, pid=rows.pid,
        tid=rows.tid, ext=rows.ext, corr=rows.corr_np, args=rows.args_keep, gpu_row=rows.gpu_row,
        kernel_rows=kr.rows[kr.comm], kernel_launch=kr.launch[kr.comm], step_at=windows.at, lenient=lenient,
        world_size=world_size, only_default_group=_only_default_group(di, world_size)))
    warnings.extend(coll.warnings)
    kernels = _kernels_table(rows, kr, *_comm_kernel_groups(rows, kr, coll.kernel_row_to_call), table_rank)
    coll_tbl = coll.table.set_column(coll.table.column_names.index("rank"), "rank",
                                     pa.array(np.full(coll.table.num_rows, table_rank, np.int32)))
    tables = {
        "events": conform("events", _events_table(rows, thread_col, kr, windows, table_rank)),
        "kernels": conform("kernels", kernels),
        "collectives": conform("collectives", coll_tbl),
        "steps": conform("steps", _steps_table(windows, kernels, table_rank)),
        "memory": memory_table(memory_events, table_rank, windows.at, warnings),
    }
    groups = _process_groups(di, trace_rank, warnings)
    info = _info(trace, di, path, rows.ts, rows.end, rows.n, len(kr.rows), warnings, process_labels)
    info["accelerator"] = accelerator_of(raw_cat_list, rows.name_dict, bool(len(kr.rows)))
    return KinetoParse(source_file=path, rank=trace_rank, world_size=world_size, info=info, process_groups=groups,
                       tables=tables, table_rank=table_rank, phase_counts=phase_counts)


def _detach(a: Any) -> Any:
    """A copy of an args struct whose Raw texts no longer point into the JSON buffer."""
    raws = {f: getattr(a, f).copy() for f in ("input_dims", "input_type", "concrete_inputs")
            if isinstance(getattr(a, f, None), msgspec.Raw) and len(getattr(a, f))}
    return msgspec.structs.replace(a, **raws) if raws else a


def _code(values: list, name: str) -> int:
    return values.index(name) if name in values else -2


def _thread_name_column(pid: np.ndarray, tid: np.ndarray, names: dict[tuple[int, int], str],
                        tid_text: dict[int, str], n: int) -> pa.DictionaryArray:
    """Thread name of each row from `thread_name` metadata (or the tid's own text)."""
    if n == 0:
        return pa.array([], pa.string()).dictionary_encode()
    by_tid: dict[int, set[str]] = {}
    for (p, t), nm in names.items():
        by_tid.setdefault(t, set()).add(nm)
    for t, text in tid_text.items():
        by_tid.setdefault(t, set()).add(text) if not any(k[1] == t for k in names) else None
    if not by_tid:
        return pa.nulls(n, pa.string()).dictionary_encode()
    label_list: list[str] = []
    label_index: dict[str, int] = {}
    codes = np.full(n, -1, np.int32)

    def code_of(nm: str) -> int:
        if nm not in label_index:
            label_index[nm] = len(label_list)
            label_list.append(nm)
        return label_index[nm]

    tid_enc = pc.dictionary_encode(pa.array(tid))
    utids = tid_enc.dictionary.to_numpy(zero_copy_only=False)
    tcodes = tid_enc.indices.to_numpy(zero_copy_only=False)
    per_code = np.full(len(utids), -1, np.int32)
    ambiguous = []
    for j, t in enumerate(utids):
        cands = by_tid.get(int(t))
        if not cands:
            continue
        if len(cands) == 1:
            per_code[j] = code_of(next(iter(cands)))
        else:
            ambiguous.append((j, int(t)))
    codes = per_code[tcodes]
    for j, t in ambiguous:
        rows = np.flatnonzero(tcodes == j)
        for r_pid in np.unique(pid[rows]):
            nm = names.get((int(r_pid), t))
            if nm is not None:
                sel = rows[pid[rows] == r_pid]
                codes[sel] = code_of(nm)
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=codes < 0), pa.array(label_list, pa.string()))


def _info(trace: Any, di: dict | None, path: str, ts: np.ndarray, end: np.ndarray, n: int,
          num_kernels: int, warnings: list[str], process_labels: dict) -> dict:
    devices = trace.deviceProperties if isinstance(trace.deviceProperties, list) else []
    device_names = [str(d.get("name")) for d in devices if isinstance(d, dict) and d.get("name") is not None]
    base = to_int(trace.baseTimeNanoseconds)
    host = trace.host_name or trace.hostname or (di.get("hostname") or di.get("host_name") if di else None)
    sv = trace.schemaVersion
    return {
        "world_size": to_int(di.get("world_size")) if di else None,
        "hostname": _clip_text(str(host)) if host is not None else None,
        "backend": str(di["backend"]) if di and di.get("backend") is not None else None,
        "device_names": device_names,
        "device_memory_bytes": [to_int(d.get("totalGlobalMem")) for d in devices if isinstance(d, dict)
                                and d.get("name") is not None],
        "source_file": path,
        "schema_version": str(sv) if sv is not None else None,
        "trace_kind": "gpu" if num_kernels else "cpu",
        "base_time_ns": base,
        "first_ts": int(ts.min()) if n else None,
        "last_ts": int(end.max()) if n else None,
        "num_events": int(n),
        "clock_offset_ns": None,
        "parse_warnings": list(warnings),
    }


def _only_default_group(di: dict | None, world_size: int | None) -> bool:
    """distributedInfo lists one process group, the default one (all ranks of the world)."""
    cfg = di.get("pg_config") if di else None
    if isinstance(cfg, dict):
        cfg = list(cfg.values())
    if not isinstance(cfg, list) or len(cfg) != 1 or not isinstance(cfg[0], dict):
        return False
    ranks = cfg[0].get("ranks")
    ranks = _parse_int_list(ranks) if isinstance(ranks, str) else ranks
    return cfg[0].get("pg_desc") == "default_pg" or (world_size is not None and ranks == list(range(world_size)))


def _process_groups(di: dict | None, trace_rank: int | None, warnings: list[str]) -> list[dict]:
    if not di:
        return []
    cfg = di.get("pg_config")
    if cfg is None:
        return []
    if isinstance(cfg, dict):  # some writers key groups by name
        cfg = [dict(v, pg_name=v.get("pg_name", k)) if isinstance(v, dict) else v for k, v in cfg.items()]
    if not isinstance(cfg, list):
        warnings.append("distributedInfo.pg_config is neither a list nor an object; ignored")
        return []
    count = to_int(di.get("pg_count"))
    if count is not None and count != len(cfg):
        warnings.append(f"distributedInfo.pg_count {count} disagrees with {len(cfg)} pg_config entries")
    out = []
    for g in cfg:
        if not isinstance(g, dict) or g.get("pg_name") is None:
            warnings.append("pg_config entry without pg_name skipped")
            continue
        ranks = g.get("ranks")
        if isinstance(ranks, str):
            ranks = _parse_int_list(ranks)
        ranks = [int(r) for r in ranks] if isinstance(ranks, list) and all(to_int(r) is not None for r in ranks) else None
        size = to_int(g.get("pg_size"))
        if size is None and ranks is not None:
            size = len(ranks)
        desc = g.get("pg_desc")
        if desc is None:
            desc = g.get("uid")
        out.append({
            "pg_name": _clip_text(str(g["pg_name"])),
            "pg_desc": _clip_text(str(desc)) if desc is not None else None,
            "ranks": ranks,
            "size": size,
            "backend": str(g["backend_config"]) if g.get("backend_config") is not None else None,
            "dim": group_dim(str(desc) if desc is not None else None, str(g["pg_name"])),
            "seen_by": [trace_rank] if trace_rank is not None else None,
        })
    return out


def _parse_int_list(text: str) -> list[int] | None:
    try:
        v = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    return v if isinstance(v, list) else None
