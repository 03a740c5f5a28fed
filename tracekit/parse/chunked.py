"""Bounded-memory parse of one Kineto trace too large for the one-shot parser: same tables, in chunks.

The file is streamed (gunzip on the fly) and cut into runs of whole events at event boundaries
(`EventChunks`); each run is wrapped back into a small trace (the file's own top-level fields around
a shorter `traceEvents`) and parsed by the normal parser (`kineto.tables_from_document`), so every column is
computed by the same code. What one chunk cannot know is supplied from two small global sets:

- Pass 1 collects the *context*: metadata (`M`) events, ProfilerStep events, every event collective
  assembly reads (record_param_comms / c10d / gloo / nccl ops, user annotations, comm kernels and
  their launches), and a compact map correlation → launch time of every host runtime call.
- Pass 2 parses each chunk with the metadata events in front (thread names) and the step events
  behind (each row's step; those rows are dropped again), fixes the step of device rows from the
  launch map (their launch may sit in another chunk) and spills the chunk's events to Arrow IPC.
- The context alone is then parsed once: it gives the collectives, steps, process groups and the
  op/group of comm kernels exactly as the whole file would.

Peak memory is about one chunk's parse plus the context (see `chunk_bytes_for`), not the file.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Union

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.errors import InputTooLargeError, TraceFormatError
from tracekit.parse import decode as D
from tracekit.parse import kineto as K
from tracekit.parse.classify import (GRAPH_LAUNCH_NAMES, ITERATION_OP_CATS, StepWindows, accelerator_of,
                                     device_windows, iteration_windows, kernel_steps, step_number)
from tracekit.parse.collective_names import is_comm_kernel_name
from tracekit.parse.gz import GZIP_MAGIC, gzip_pieces
from tracekit.parse.kineto_collectives import classify_collective_names
from tracekit.parse.spilled import SpilledTable
from tracekit.process_env import LIBC as _LIBC, release_memory

_READ = 4 << 20
_HEAD_LIMIT = 64 << 20
"""How far into the file the `traceEvents` key is looked for."""
_MIN_CHUNK = 1 << 20
CHUNK_SHARE_OF_BUDGET = 8
"""Measured: peak memory above the interpreter is ~7x the chunk (cut buffer, chunk, light scan of it, its parse)."""
class _ScanArgs(msgspec.Struct, gc=False, frozen=True):
    """The two args keys the context scan reads (every other key is skipped by the decoder)."""

    correlation: Any = None
    coll_name: Any = msgspec.field(default=None, name="Collective name")


_NO_ARGS = _ScanArgs()


class _ScanEvent(msgspec.Struct, gc=False):
    """A light, lenient view of one event for the context scan (the parser itself decides typed vs lenient)."""

    ph: Any = None
    name: Any = ""
    cat: Any = None
    ts: msgspec.Raw = D.NO_RAW
    dur: msgspec.Raw = D.NO_RAW
    tid: Any = None
    args: Union[_ScanArgs, None] = _NO_ARGS


class _BadUtf8(Exception):
    """A chunk holds invalid UTF-8: parse again with `EventChunks.repair_utf8` (as the one-shot parser
    repairs the document)."""


def _is_utf8_error(exc: Exception) -> bool:
    return isinstance(exc, UnicodeDecodeError) or "utf-8" in str(exc).lower()


class _NeedLenient(Exception):
    """A chunk fails the typed decode: the whole file is parsed leniently, like the one-shot parser does."""


_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_SKIP = msgspec.json.Decoder(msgspec.Raw)  # validates and skips a value; its result is dropped at once
_SCAN_LIST = msgspec.json.Decoder(list[_ScanEvent])
# Per-event warnings of the parser (counts summed over chunks), in the parser's order.
_COUNT_WARNING = re.compile(r"^(\d+) (complete events .*|event \S+ longer than .*|\[memory\] events .*)$")
_COUNT_ORDER = ("complete events without a numeric ts", "complete events without dur",
                "complete events with negative dur", "event names", "event categories")
_LENIENT_WARNING = "typed decode failed"
_KERNEL_CATS = frozenset(K.KERNEL_CATS)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def bound_allocator() -> None:
    """Fixed glibc thresholds for the bounded-memory path: blocks over 128 KiB (chunk buffers, decoded
    lists) are mmapped and unmapped on free, and the heap top is trimmed past 128 KiB. glibc's default
    raises the mmap threshold after the first large free, so later chunk buffers land in the heap and
    fragment it (measured at a 64 MB budget on a 255 MB trace: peak 191 → 149 MB resident). Arrow
    then allocates from the same malloc: its default mimalloc pool keeps freed segments (another ~30 MB
    resident there; peak 149 → 133 MB)."""
    if _LIBC is not None and hasattr(_LIBC, "mallopt"):
        _LIBC.mallopt(_M_MMAP_THRESHOLD, 128 << 10)
        _LIBC.mallopt(_M_TRIM_THRESHOLD, 128 << 10)
        pa.set_memory_pool(pa.system_memory_pool())


def chunk_bytes_for(max_memory_bytes: int) -> int:
    return max(max_memory_bytes // CHUNK_SHARE_OF_BUDGET, _MIN_CHUNK)


# ---- streaming the file and cutting it at event boundaries ---------------------------------------

def _blocks(path: str, max_decompressed_bytes: int | None) -> Iterator[bytes]:
    """Decompressed bytes of the file, block by block (gzip members concatenated)."""
    total = 0
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == GZIP_MAGIC
            f.seek(0)
            if not gz:
                while block := f.read(_READ):
                    total += len(block)
                    if max_decompressed_bytes is not None and total > max_decompressed_bytes:
                        raise InputTooLargeError(path, f"file is over the {max_decompressed_bytes}-byte budget")
                    yield block
                return
            yield from gzip_pieces(f, path, max_decompressed_bytes, _READ, _READ)
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read: {exc.strerror or exc}") from None


class EventChunks:
    """Iterates a Kineto file's `traceEvents` as byte runs of whole events, about `chunk_bytes` each.

    After iteration `head` is everything before the `"traceEvents"` key and `tail` everything after
    the array, so `head + b'"traceEvents":[' + events + b']' + tail` is a valid trace again.
    """

    def __init__(self, path: str, chunk_bytes: int, max_decompressed_bytes: int | None = None) -> None:
        self.path, self.chunk_bytes, self.max_bytes = path, chunk_bytes, max_decompressed_bytes
        self.head: bytes | None = None
        self.tail: bytes | None = None
        self.repair_utf8 = False
        """set after a decode met invalid UTF-8: every chunk's invalid sequences become U+FFFD"""
        self.replaced = 0
        """invalid UTF-8 sequences replaced over the last iteration"""

    def __iter__(self) -> Iterator[bytes]:
        self.replaced = 0
        for chunk in self._chunks():
            yield self._valid(chunk) if self.repair_utf8 else chunk
        if self.repair_utf8:
            self.head, self.tail = self._valid(self.head or b""), self._valid(self.tail or b"")

    def _valid(self, chunk: bytes) -> bytes:
        try:
            chunk.decode("utf-8")
            return chunk
        except UnicodeDecodeError:
            text = chunk.decode("utf-8", "replace")
            self.replaced += text.count("\ufffd") - chunk.count("\ufffd".encode())
            return text.encode("utf-8")

    def _chunks(self) -> Iterator[bytes]:
        blocks = D.squeeze_whitespace(_blocks(self.path, self.max_bytes))  # no byte-by-byte walk over whitespace
        buf = bytearray()
        eof = False

        def more() -> bool:
            nonlocal eof
            b = next(blocks, None)
            if b is None:
                eof = True
                return False
            buf.extend(b)
            return True

        # the top-level key; a file without it is left to the one-shot parser's error
        while True:
            key = buf.find(b'"traceEvents"')
            if key >= 0:
                m = re.compile(rb"\s*:\s*\[").match(buf, key + len(b'"traceEvents"'))
                if m:
                    break
                if len(buf) - key > 4096 or not more():
                    raise TraceFormatError(self.path, "traceEvents is not a list")
                continue
            if len(buf) > _HEAD_LIMIT or not more():  # never hold a whole non-trace file
                raise TraceFormatError(self.path, "not a Kineto trace: no traceEvents (e.g. an execution trace)")
        self.head = bytes(buf[:key])
        pos = m.end()
        window = self.chunk_bytes
        while True:
            while len(buf) - pos < window + 64 and not eof:
                more()
            while pos < len(buf) and buf[pos] in b" \t\r\n,":
                pos += 1
            if pos >= len(buf):
                if eof:
                    raise TraceFormatError(self.path, "invalid JSON: the traceEvents array is not closed")
                continue
            if buf[pos] == ord("]"):
                rest = bytearray(buf[pos + 1:])
                for b in blocks:
                    rest.extend(b)
                self.tail = bytes(rest)
                return
            cut = self._cut(buf, pos, min(len(buf), pos + window), eof)
            if cut is None:
                if eof and pos + window >= len(buf):
                    raise TraceFormatError(self.path, "invalid JSON inside traceEvents")
                window *= 2  # one event larger than the window: widen it
                continue
            window = self.chunk_bytes
            with memoryview(buf) as view:
                out = bytes(view[pos:cut + 1])  # one copy (slicing the bytearray itself would make two)
            yield out
            del out
            del buf[:cut + 1]
            pos = 0

    @staticmethod
    def _cut(buf: bytearray, pos: int, end: int, eof: bool) -> int | None:
        """Index of the `}` closing the last whole event in buf[pos:end] (checked by decoding)."""
        c = buf.rfind(b"}", pos, end)
        while c >= pos:
            j = c + 1
            while j < len(buf) and buf[j] in b" \t\r\n":
                j += 1
            if j < len(buf) and buf[j] in b",]" and _is_event_run(buf, pos, c):
                return c
            c = buf.rfind(b"}", pos, c)
        return None


def _is_event_run(buf: bytearray, pos: int, c: int) -> bool:
    """Whether buf[pos:c+1] is a comma-separated run of whole JSON values. Decoded in place: the bytes
    around it (a separator or whitespace) are set to '[' and ']' for the check, then restored."""
    if pos == 0 or c + 1 >= len(buf):
        try:
            _SKIP.decode(b"[" + bytes(buf[pos:c + 1]) + b"]")
            return True
        except msgspec.DecodeError:
            return False
    before, after = buf[pos - 1], buf[c + 1]
    buf[pos - 1], buf[c + 1] = ord("["), ord("]")
    view = memoryview(buf)
    try:
        _SKIP.decode(view[pos - 1:c + 2])
        return True
    except msgspec.DecodeError:
        return False
    finally:
        view.release()
        buf[pos - 1], buf[c + 1] = before, after


def _wrap(head: bytes, tail: bytes, parts: list[bytes]) -> bytes:
    return head + b'"traceEvents":[' + b",".join(p for p in parts if p) + b"]" + tail


# ---- pass 1: the context ----------------------------------------------------------------------------

@dataclass
class _Context:
    lenient: bool = False
    meta: list[tuple[int, bytes]] = field(default_factory=list)  # M events
    steps: list[tuple[int, bytes]] = field(default_factory=list)  # host ProfilerStep events
    coll: list[tuple[int, bytes]] = field(default_factory=list)  # what collective assembly reads
    launch_corr: list[np.ndarray] = field(default_factory=list)
    launch_ts: list[np.ndarray] = field(default_factory=list)
    launch_idx: list[np.ndarray] = field(default_factory=list)
    comm_corr: set[int] = field(default_factory=set)
    kernel_corr: list[np.ndarray] = field(default_factory=list)  # every device row's correlation (-1: none)
    kernel_ts: list[np.ndarray] = field(default_factory=list)
    phase_counts: dict[str, int] = field(default_factory=dict)
    step_missing_dur: int = 0
    step_negative_dur: int = 0
    num_events: int = 0
    memory: list[pa.Table] = field(default_factory=list)  # each chunk's `[memory]` rows (parse/memory.py)
    raw_cats: list = field(default_factory=list)  # every raw category seen (classify.accelerator_of)
    host_names: list = field(default_factory=list)  # every host event name seen (classify.accelerator_of)
    # what classify.iteration_windows reads, for a trace without ProfilerStep: host op / graph launch rows
    it_names: dict = field(default_factory=dict)  # name -> code
    it_tids: dict = field(default_factory=dict)  # raw tid -> code
    it_rows: list = field(default_factory=list)  # (name code, ts, end, tid code, is an op)
    span: list = field(default_factory=list)  # [first ts, last end] of every timed complete event


def _name_class(cache: dict[str, str | None], nm: str) -> str | None:
    if nm not in cache:
        cls = next((k for k, v in classify_collective_names([nm]).items() if v), None)
        cache[nm] = cls if cls in ("rpc", "nccl", "gloo", "c10d") else None
    return cache[nm]


def _scan_chunk(ctx: _Context, chunk: bytes, base: int, classes: dict, cats: dict) -> None:
    """Add one chunk's share of the context (events numbered from `base` in file order)."""
    doc = b"[" + chunk + b"]"
    raws = _RAW_LIST.decode(doc)
    events = _SCAN_LIST.decode(doc)
    del doc  # the raws keep it alive until this chunk is done
    for e in events:
        key = str(e.ph)
        ctx.phase_counts[key] = ctx.phase_counts.get(key, 0) + 1
    ctx.num_events += len(events)
    ctx.meta.extend((base + i, bytes(raws[i])) for i, e in enumerate(events) if e.ph == "M")
    xi = [i for i, e in enumerate(events) if e.ph == "X"]
    if xi:
        _scan_complete_events(ctx, [events[i] for i in xi], [raws[i] for i in xi], [base + i for i in xi],
                              classes, cats)


def _scan_complete_events(ctx: _Context, xs: list, raws: list, index: list[int], classes: dict, cats: dict) -> None:
    """Steps, what collective assembly reads, every kernel's correlation and every launch's time."""
    ts, ts_ok = D.raws_to_ns([e.ts for e in xs])
    dur, dur_ok = D.raws_to_ns([e.dur for e in xs])
    launches: list[tuple[int, int, int]] = []
    kernels: list[tuple[int, int]] = []
    for j, e in enumerate(xs):
        if not ts_ok[j]:
            continue  # the parser drops it too
        nm = e.name if isinstance(e.name, str) else ("" if e.name is None else str(e.name))
        cat_raw = e.cat if (e.cat is None or isinstance(e.cat, str)) else str(e.cat)
        if cat_raw not in cats:
            cats[cat_raw] = K.normalize_category(cat_raw)
        cat = cats[cat_raw]
        a = e.args if e.args is not None else _NO_ARGS
        gpu = cat in K.GPU_CATS
        if not gpu and step_number(nm) is not None:
            ctx.steps.append((index[j], bytes(raws[j])))
            ctx.step_missing_dur += int(not dur_ok[j])
            ctx.step_negative_dur += int(bool(dur_ok[j]) and dur[j] < 0)
        end = int(ts[j]) + (int(dur[j]) if dur_ok[j] and dur[j] > 0 else 0)
        if ctx.span:
            ctx.span[0], ctx.span[1] = min(ctx.span[0], int(ts[j])), max(ctx.span[1], end)
        else:
            ctx.span = [int(ts[j]), end]
        is_op = cat in ITERATION_OP_CATS
        if not gpu and (is_op or nm in GRAPH_LAUNCH_NAMES):
            code = ctx.it_names.setdefault(nm, len(ctx.it_names))
            tid = ctx.it_tids.setdefault(e.tid if isinstance(e.tid, (int, str)) else str(e.tid), len(ctx.it_tids))
            ctx.it_rows.append((code, int(ts[j]), end, tid, is_op))
        corr = K.to_int(a.correlation)
        corr = corr if corr is not None and corr >= 0 else -1
        if cat in _KERNEL_CATS:
            kernels.append((corr, int(ts[j])))
            if a.coll_name is not None or (nm and is_comm_kernel_name(nm)):
                ctx.coll.append((index[j], bytes(raws[j])))
                if corr >= 0:
                    ctx.comm_corr.add(corr)
            continue
        if not gpu and corr >= 0:
            launches.append((corr, int(ts[j]), index[j]))
        if cat == "user_annotation" or (not gpu and _name_class(classes, nm) is not None):
            ctx.coll.append((index[j], bytes(raws[j])))
    if kernels:
        k = np.array(kernels, np.int64)
        ctx.kernel_corr.append(k[:, 0].copy())
        ctx.kernel_ts.append(k[:, 1].copy())
    if launches:
        la = np.array(launches, np.int64)
        ctx.launch_corr.append(la[:, 0].copy())
        ctx.launch_ts.append(la[:, 1].copy())
        ctx.launch_idx.append(la[:, 2].copy())


# ---- the parse ------------------------------------------------------------------------------------

@dataclass
class _LaunchMap:
    """correlation → time of the first host call with it (what the parser calls a kernel's launch), and
    the two whole-trace facts the carry-over rule needs (whether any kernel is linked, the first linked
    kernel's start)."""

    corr: np.ndarray
    ts: np.ndarray
    idx: np.ndarray
    any_linked: bool = False
    first_linked_ts: int | None = None

    @classmethod
    def build(cls, ctx: _Context) -> "_LaunchMap":
        corr = np.concatenate(ctx.launch_corr) if ctx.launch_corr else np.zeros(0, np.int64)
        ts = np.concatenate(ctx.launch_ts) if ctx.launch_ts else np.zeros(0, np.int64)
        idx = np.concatenate(ctx.launch_idx) if ctx.launch_idx else np.zeros(0, np.int64)
        ctx.launch_corr, ctx.launch_ts, ctx.launch_idx = [], [], []
        uniq, first = np.unique(corr, return_index=True)  # first occurrence in file order
        launches = cls(uniq, ts[first], idx[first])
        k_corr = np.concatenate(ctx.kernel_corr) if ctx.kernel_corr else np.zeros(0, np.int64)
        k_ts = np.concatenate(ctx.kernel_ts) if ctx.kernel_ts else np.zeros(0, np.int64)
        ctx.kernel_corr, ctx.kernel_ts = [], []
        _, linked = launches.times(k_corr)
        launches.any_linked = bool(linked.any())
        launches.first_linked_ts = int(k_ts[linked].min()) if launches.any_linked else None
        return launches

    def times(self, corrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(launch time, found) of each correlation id."""
        if len(self.corr) == 0 or len(corrs) == 0:
            return np.zeros(len(corrs), np.int64), np.zeros(len(corrs), bool)
        j = np.minimum(np.searchsorted(self.corr, corrs), len(self.corr) - 1)
        found = (self.corr[j] == corrs) & (corrs >= 0)
        return np.where(found, self.ts[j], 0), found


def _device_steps(table: pa.Table, cat_col: str | None, launches: _LaunchMap, windows: StepWindows) -> pa.Table:
    """Device rows take the step of their launch (which may be in another chunk); kernels also get carry_over."""
    if table.num_rows == 0:
        return table
    if cat_col is not None:
        cats = table.column(cat_col).cast(pa.string())
        mask = pc.fill_null(pc.is_in(cats, pa.array(sorted(_KERNEL_CATS))), False).to_numpy(zero_copy_only=False)
    else:
        mask = np.ones(table.num_rows, bool)
    if not mask.any():
        return table
    rows = np.flatnonzero(mask)
    corr = table.column("correlation").fill_null(-1).to_numpy(zero_copy_only=False)[rows]
    own = table.column("ts").to_numpy(zero_copy_only=False)[rows]
    launch_ts, linked = launches.times(corr)
    steps, carry = kernel_steps(own, launch_ts, linked, windows, launches.any_linked, launches.first_linked_ts)
    col = table.column("step").to_numpy(zero_copy_only=False).astype(np.float64)
    valid = table.column("step").is_valid().to_numpy(zero_copy_only=False)
    new = np.where(valid, col, -1).astype(np.int64)
    new[rows] = steps
    table = table.set_column(table.column_names.index("step"), "step",
                             pa.array(new.astype(np.int32), pa.int32(), mask=new < 0))
    if cat_col is None:
        table = table.set_column(table.column_names.index("carry_over"), "carry_over", pa.array(carry))
    return table


def _decoder(lenient: bool):
    return D.LENIENT_DECODER if lenient else D.TYPED_DECODER


def _build_bytes(path: str, data: bytes, lenient: bool, step_windows: StepWindows | None = None) -> Any:
    """The parser's own path for a document: chunked typed decode, else whole-document (typed or lenient);
    `step_windows`: the steps to use instead of the document's own (iterations found over the whole trace)."""
    if not lenient:
        cols = K.decode_columns(data)
        if cols is not None:
            return K.tables_from_columns(path, cols, None, step_windows)
    try:
        trace = _decoder(lenient).decode(data)
    except msgspec.ValidationError as exc:
        if not lenient:
            raise _NeedLenient() from None
        raise TraceFormatError(path, f"not a Kineto trace: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        if _is_utf8_error(exc):
            raise _BadUtf8() from exc
        raise TraceFormatError(path, f"invalid JSON: {exc}") from None
    return K.tables_from_document(path, trace, lenient, None, step_windows)


def parse_kineto_chunked(path: str | Path, *, max_memory_bytes: int, max_decompressed_bytes: int | None = None,
                         chunk_bytes: int | None = None, spill_dir: str | None = None,
                         lazy_events: bool = False) -> Any:
    """Same KinetoParse as `kineto.parse_kineto(path)`, holding one chunk at a time.

    The events table comes back memory-mapped from Arrow IPC files (deleted once mapped), or with
    `lazy_events` as a `SpilledTable` of the chunks' files, to be read one part at a time."""
    path = str(path)
    bound_allocator()
    chunks = EventChunks(path, chunk_bytes or chunk_bytes_for(max_memory_bytes), max_decompressed_bytes)
    with K.gc_paused():
        try:
            return _parse_chunks(path, chunks, spill_dir, lazy_events)
        except _BadUtf8:
            chunks.repair_utf8 = True  # invalid UTF-8 (e.g. Latin-1 names): replaced, the rank kept
        try:
            return _parse_chunks(path, chunks, spill_dir, lazy_events)
        except _BadUtf8 as exc:
            raise TraceFormatError(path, f"undecodable text: {exc.__cause__}") from None


def _parse_chunks(path: str, chunks: EventChunks, spill_dir: str | None, lazy_events: bool) -> Any:
    """Pass 1 (the context), then the typed passes (lenient on a retry)."""
    ctx = _Context()
    try:
        _pass1(ctx, chunks)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(path, f"not a Kineto trace: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        if _is_utf8_error(exc):
            raise _BadUtf8() from exc
        raise TraceFormatError(path, f"invalid JSON: {exc}") from None
    iterations = _iterations(ctx)
    launches = _LaunchMap.build(ctx)
    need = set(launches.idx[np.isin(launches.corr, np.fromiter(ctx.comm_corr, np.int64, len(ctx.comm_corr)))].tolist())
    try:
        return _parse_passes(path, ctx, chunks, launches, need, spill_dir, lazy_events, iterations)
    except _NeedLenient:
        ctx.lenient = True  # like the one-shot parser: one event fails the typed decode, all go lenient
        return _parse_passes(path, ctx, chunks, launches, need, spill_dir, lazy_events, iterations)


def _iterations(ctx: _Context) -> StepWindows | None:
    """A trace without ProfilerStep but with device work: the iterations the one-shot parser finds where the
    whole trace repeats (classify.iteration_windows over every chunk's host ops), so that every chunk's
    events, the collectives and the steps table take their steps from them; None otherwise."""
    rows, ctx.it_rows = ctx.it_rows, []
    if ctx.steps or not ctx.kernel_ts or not ctx.span:
        return None
    names = [""] * len(ctx.it_names)
    for nm, code in ctx.it_names.items():
        names[code] = nm
    arr = np.array([r[:4] for r in rows], np.int64).reshape(-1, 4)
    ops = np.flatnonzero(np.array([r[4] for r in rows], bool)) if rows else np.zeros(0, np.int64)
    order = np.argsort(arr[:, 1], kind="stable")  # file order is not time order across threads
    arr, ops = arr[order], np.flatnonzero(np.isin(order, ops))
    return iteration_windows(names, arr[:, 0], ops, arr[:, 1], arr[:, 2], arr[:, 3], (ctx.span[0], ctx.span[1]))


def _parse_passes(path: str, ctx: _Context, chunks: EventChunks, launches: "_LaunchMap", need: set[int],
                  spill_dir: str | None, lazy_events: bool = False, iterations: StepWindows | None = None) -> Any:
    """Pass 2 and the context parse (typed, or lenient on the retry); `iterations`: the steps of a trace
    without ProfilerStep, found over the whole trace (`_iterations`), given to every partial parse."""
    head, tail = chunks.head or b"{", chunks.tail or b"}"
    meta_part = b",".join(r for _, r in ctx.meta)
    step_part = b",".join(r for _, r in ctx.steps)
    try:
        # the context alone: collectives, steps, groups, comm-kernel ops as the whole file gives them
        picked: list[tuple[int, bytes]] = []
        workdir = tempfile.mkdtemp(prefix="tracekit-chunks-", dir=spill_dir)
        handed_over = False
        try:
            if iterations is None:
                steps_only = _build_bytes(path, _wrap(head, tail, [step_part]), ctx.lenient).tables["steps"]
                windows = StepWindows.from_table(steps_only)
            else:
                windows = iterations
            ev_files, kernel_parts, counts, total_rows, first, last = _pass2(
                path, ctx, chunks, head, tail, meta_part, step_part, need, picked, launches, windows, workdir,
                iterations)
            context_events = sorted(ctx.meta + ctx.coll + ctx.steps + picked)
            full = _build_bytes(path, _wrap(head, tail, [b",".join(_dedupe(context_events))]), ctx.lenient,
                                iterations)
            if lazy_events:
                events = SpilledTable(ev_files, full.tables["events"].schema, total_rows, workdir)
                handed_over = True
            else:
                events = _load(ev_files, full.tables["events"].schema)
        finally:
            if not handed_over:
                shutil.rmtree(workdir, ignore_errors=True)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, pa.ArrowException) as exc:
        raise TraceFormatError(path, f"malformed Kineto content: {type(exc).__name__}: {exc}") from exc
    kernels = _fix_comm_kernels(kernel_parts, full.tables["kernels"])
    warnings = _merge_warnings(counts, full.info["parse_warnings"], ctx.lenient)
    if chunks.replaced:
        warnings.append(f"{chunks.replaced} {K.UTF8_REPAIRED}")
    info = dict(full.info, first_ts=first, last_ts=last, num_events=total_rows,
                trace_kind="gpu" if kernels.num_rows else "cpu", parse_warnings=warnings,
                accelerator=accelerator_of(ctx.raw_cats, ctx.host_names, bool(kernels.num_rows)))
    tables = dict(full.tables, events=events, kernels=kernels, steps=device_windows(full.tables["steps"], kernels),
                  memory=_by_time(ctx.memory) if ctx.memory else full.tables["memory"])
    phase_counts = dict(ctx.phase_counts) if ctx.lenient else {"X": 0, "M": 0, **ctx.phase_counts}
    return replace(full, info=info, tables=tables, phase_counts=phase_counts)


def _pass1(ctx: _Context, chunks: EventChunks) -> None:
    classes: dict = {}
    cats: dict = {}
    base = 0
    for chunk in chunks:
        before = ctx.num_events
        _scan_chunk(ctx, chunk, base, classes, cats)
        base += ctx.num_events - before
        del chunk  # not alive while the next one is cut
        release_memory()
    ctx.raw_cats, ctx.host_names = list(cats), list(classes)


def _dedupe(items: list[tuple[int, bytes]]) -> list[bytes]:
    out, last = [], None
    for i, raw in items:
        if i != last:
            out.append(raw)
            last = i
    return out


def _pass2(path, ctx, chunks, head, tail, meta_part, step_part, need, picked, launches, windows, workdir,
           iterations=None):
    """Parse every chunk with the metadata in front and the steps behind; spill its events."""
    ctx.memory.clear()
    counts: dict[str, int] = {}
    order: list[str] = []
    ev_files: list[str] = []
    kernel_parts: list[pa.Table] = []
    total_rows = 0
    first = last = None
    n_steps = len(ctx.steps)
    base = 0
    for k, chunk in enumerate(chunks):
        if need:
            raws = _RAW_LIST.decode(b"[" + chunk + b"]")
            for i in range(len(raws)):
                if base + i in need:
                    picked.append((base + i, bytes(raws[i])))
            base += len(raws)
            del raws
        kp = _build_bytes(path, _wrap(head, tail, [meta_part, chunk, step_part]), ctx.lenient, iterations)
        for w in kp.info["parse_warnings"]:
            m = _COUNT_WARNING.match(w)
            if m:
                if m.group(2) not in counts:
                    order.append(m.group(2))
                    counts[m.group(2)] = 0
                counts[m.group(2)] += int(m.group(1))
        ev = kp.tables["events"]
        ev = ev.slice(0, ev.num_rows - n_steps)
        ev = _device_steps(ev, "cat", launches, windows)
        kt = _device_steps(kp.tables["kernels"], None, launches, windows)
        ctx.memory.append(kp.tables["memory"])
        del kp
        if ev.num_rows:
            ts = ev.column("ts")
            end = pc.add(ts, pc.fill_null(ev.column("dur"), 0))
            lo, hi = pc.min(ts).as_py(), pc.max(end).as_py()
            first = lo if first is None else min(first, lo)
            last = hi if last is None else max(last, hi)
        total_rows += ev.num_rows
        p = os.path.join(workdir, f"events.{k}.arrows")
        with pa.OSFile(p, "wb") as sink, pa.ipc.new_stream(sink, ev.schema) as w:
            w.write_table(ev)
        ev_files.append(p)
        kernel_parts.append(kt)
        del ev, chunk
        release_memory()
    # the appended step rows were counted once per chunk
    for key, n in (("complete events without dur (null duration)", ctx.step_missing_dur),
                   ("complete events with negative dur (null duration)", ctx.step_negative_dur)):
        if key in counts:
            counts[key] -= n * len(ev_files)
    rank = lambda k: next((i for i, p in enumerate(_COUNT_ORDER) if k.startswith(p)), len(_COUNT_ORDER))  # noqa: E731
    counts = {k: counts[k] for k in sorted(order, key=rank) if counts[k] > 0}
    return ev_files, kernel_parts, counts, total_rows, first, last


def _by_time(parts: list[pa.Table]) -> pa.Table:
    table = pa.concat_tables(parts)
    return table.take(pc.sort_indices(table, [("ts", "ascending")]))


def _load(files: list[str], schema: pa.Schema) -> pa.Table:
    """Memory-map the spilled chunk tables and unlink the files (the mappings stay valid)."""
    parts = []
    for p in files:
        with pa.memory_map(p) as src:
            parts.append(pa.ipc.open_stream(src).read_all())
        os.unlink(p)
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _fix_comm_kernels(parts: list[pa.Table], context_kernels: pa.Table) -> pa.Table:
    """Comm kernels' op, group and step as the whole file links them (the context parse has them all, in order)."""
    kernels = pa.concat_tables(parts) if parts else context_kernels.schema.empty_table()
    if kernels.num_rows == 0:
        return kernels
    kind = kernels.column("kind").cast(pa.string())
    comm = pc.fill_null(pc.equal(kind, "comm"), False).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(comm)
    ck = context_kernels.filter(pc.fill_null(pc.equal(context_kernels.column("kind").cast(pa.string()), "comm"), False))
    if len(rows) != ck.num_rows:
        raise ValueError(f"chunked parse found {len(rows)} comm kernels but the context has {ck.num_rows}")
    if len(rows) == 0:
        return kernels
    for col in ("collective_op", "pg_name"):
        values = kernels.column(col).combine_chunks()
        vals = values.to_pylist() if not pa.types.is_dictionary(values.type) else values.cast(pa.string()).to_pylist()
        ctx_vals = ck.column(col).to_pylist()
        for r, v in zip(rows.tolist(), ctx_vals):
            vals[r] = v
        typ = kernels.schema.field(col).type
        arr = pa.array(vals, pa.string()).dictionary_encode().cast(typ) if pa.types.is_dictionary(typ) else pa.array(vals, typ)
        kernels = kernels.set_column(kernels.column_names.index(col), col, arr)
    return kernels


def _merge_warnings(counts: dict[str, int], context_warnings: list[str], lenient: bool) -> list[str]:
    """The parser's order: lenient note, per-event counts (summed over chunks), then the rest."""
    out = [w for w in context_warnings if w.startswith(_LENIENT_WARNING)] if lenient else []
    out += [f"{n} {text}" for text, n in counts.items()]
    out += [w for w in context_warnings if not _COUNT_WARNING.match(w) and not w.startswith(_LENIENT_WARNING)]
    return out
