"""msgspec decoding of Kineto JSON into light structs, and exact µs-text → int64 ns conversion.

Fast path (DESIGN §9): a tagged union on `ph`, one Struct per phase, so flow/instant events cost
almost nothing and `X` events keep only the fields the tables need. Timestamps stay `msgspec.Raw`
(the number's text) so they convert to nanoseconds exactly. An unknown `ph` or an unexpected field
type makes the typed decode fail; `LENIENT_DECODER` then accepts anything and the caller coerces.
`decode_event_stream`/`decode_event_chunks` decode the events array piece by piece, and
`row_capture` gives a decoder whose complete events emit their fields as rows while being built.
"""

from __future__ import annotations

import re
import threading
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, Union

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Raw = msgspec.Raw
_f = msgspec.field
NO_RAW = Raw()  # default for absent Raw fields: an empty text (len 0), treated as missing


# The `args` keys of complete events that the tables use, once for both decoders:
# (attribute, key in the trace or None for the attribute's own name, type for the typed decoder).
# The lenient decoder takes every value as Any, except the Raw ones (kept as the number's text).
# Listed in the order Kineto writes them (kernels: External id, device, stream, correlation; record_shapes
# ops: Concrete Inputs, Input type, Input Strides, Input Dims): msgspec looks a key up from the field after
# the last one found, so keys in field order are found at the first compare (a 15.7 MB trace's decode: 539 -> 522
# M instructions, callgrind).
ARG_FIELDS: tuple[tuple[str, str | None, Any], ...] = (
    ("external_id", "External id", Union[int, str, None]),
    ("launch_kernel", "kernel", Union[str, None]),
    ("device", None, Union[int, str, None]),
    ("stream", None, Union[int, str, None]),
    ("correlation", None, Union[int, str, None]),
    ("external_id_old", "external id", Union[int, str, None]),
    ("concrete_inputs", "Concrete Inputs", Raw),
    ("input_type", "Input type", Raw),
    ("input_strides", "Input Strides", Raw),
    ("input_dims", "Input Dims", Raw),
    ("flops", None, Union[int, float, None]),
    ("coll_name", "Collective name", Union[str, None]),
    ("in_nelems", "In msg nelems", Union[int, str, None]),
    ("out_nelems", "Out msg nelems", Union[int, str, None]),
    ("group_size", "Group size", Union[int, str, None]),
    ("dtype", None, Union[str, None]),
    ("in_split", "In split size", Any),
    ("out_split", "Out split size", Any),
    ("pg_name", "Process Group Name", Any),
    ("pg_desc", "Process Group Description", Any),
    ("pg_ranks", "Process Group Ranks", Any),
    ("seq", "Seq", Any),
    ("seq_num", None, Any),
    ("comm_rank", "Rank", Any),
    ("src_rank", "Src Rank", Any),
    ("dst_rank", "Dst Rank", Any),
    ("rank", None, Any),  # TraceFusion's merged multi-rank files (parse/merged_ranks.py)
)


FULL_ONLY_ARGS = ("in_split", "out_split", "pg_name", "pg_desc", "pg_ranks", "seq", "seq_num", "comm_rank", "src_rank",
                  "dst_rank")
"""`args` keys read only from the full args of collective candidates (`EventColumns.args_keep`), all typed Any (so
they never fail a typed decode): the row-capturing decoder leaves them out (27 -> 17 fields per event: decode and
free of a 103 MB trace's events 0.405 -> 0.33 CPU s) and `full_args` reads them for the candidates."""


def _args_struct(name: str, doc: str, *, lenient: bool, extra: tuple = (), leave_out: tuple = ()) -> type:
    fields = []
    for attr, key, typ in ARG_FIELDS:
        if attr in leave_out:
            continue
        default = NO_RAW if typ is Raw else None
        fields.append((attr, typ if typ is Raw or not lenient else Any, _f(default=default, name=key)))
    cls = msgspec.defstruct(name, fields + list(extra), frozen=True, gc=False, module=__name__)
    cls.__doc__ = doc
    return cls


XArgs = _args_struct("XArgs", "The `args` keys of complete events that the tables use (typed).", lenient=False)


EMPTY_ARGS = XArgs()


class MArgs(msgspec.Struct, gc=False):
    name: Any = None
    labels: Any = None
    rank: Any = None  # TraceFusion's merged multi-rank files (parse/merged_ranks.py)


class X(msgspec.Struct, tag="X", tag_field="ph", gc=False):  # fields in Kineto's order (see ARG_FIELDS)
    cat: Union[str, None] = None
    name: str = ""
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    ts: Raw = NO_RAW
    dur: Raw = NO_RAW
    args: XArgs = EMPTY_ARGS  # shared frozen instance: no per-event allocation when absent


class M(msgspec.Struct, tag="M", tag_field="ph", gc=False):
    name: str = ""
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    args: Union[MArgs, None] = None


class MemArgs(msgspec.Struct, gc=False, frozen=True):
    """The `args` of an instant event that the memory table reads (`[memory]` events; others: all None)."""

    device_type: Any = _f(default=None, name="Device Type")
    device_id: Any = _f(default=None, name="Device Id")
    addr: Any = _f(default=None, name="Addr")
    bytes: Any = _f(default=None, name="Bytes")
    total_allocated: Any = _f(default=None, name="Total Allocated")
    total_reserved: Any = _f(default=None, name="Total Reserved")


class I(msgspec.Struct, tag="i", tag_field="ph", gc=False):
    """An instant event; the profiler's `[memory]` events become the memory table (parse/memory.py)."""

    name: Any = ""
    ts: Raw = NO_RAW
    args: Union[MemArgs, None] = None


def _phase(ph: str) -> type:
    return msgspec.defstruct(f"Ph_{ord(ph)}", [], tag=ph, tag_field="ph", gc=False)


# Phases that no table needs yet: decoded to empty structs (cheap), counted.
OTHER_PHASES = ("I", "s", "t", "f", "C", "b", "e", "n", "B", "E", "P", "O", "N", "D", "R", "(", ")", "S", "T", "p", "F", "c", "G")
_OTHER = tuple(_phase(p) for p in OTHER_PHASES)
Event = Union[(X, M, I) + _OTHER]


TOP_LEVEL_KEYS = ("distributedInfo", "deviceProperties", "schemaVersion", "baseTimeNanoseconds", "host_name",
                  "hostname")
"""Top-level trace fields the tables read, besides `traceEvents`."""


def _trace_struct(name: str, events_type: Any, doc: str) -> type:
    fields = [("traceEvents", Union[events_type, None], None)] + [(k, Any, None) for k in TOP_LEVEL_KEYS]
    cls = msgspec.defstruct(name, fields, gc=False, module=__name__)
    cls.__doc__ = doc
    return cls


TypedTrace = _trace_struct("TypedTrace", list[Event], "A trace decoded with the typed events.")


# Lenient variant: every field typed Any except the timestamps, which must stay text.
LXArgs = _args_struct("LXArgs", "The same keys as XArgs, any value types, plus metadata events' args.", lenient=True,
                      extra=(("name", Any, None), ("labels", Any, None))  # M events: thread/process name
                      + tuple((f, Any, _f(default=None, name=MemArgs.__struct_encode_fields__[i]))
                              for i, f in enumerate(MemArgs.__struct_fields__)))  # i events: [memory]


EMPTY_LARGS = LXArgs()


class LEvent(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = ""
    cat: Any = None
    ts: Raw = NO_RAW
    dur: Raw = NO_RAW
    pid: Any = None
    tid: Any = None
    args: Union[LXArgs, None] = EMPTY_LARGS


LenientTrace = _trace_struct("LenientTrace", list[LEvent], "A trace decoded with the lenient events.")


TYPED_DECODER = msgspec.json.Decoder(TypedTrace)
LENIENT_DECODER = msgspec.json.Decoder(LenientTrace)
_POW = np.array([1000, 100, 10, 1], dtype=np.int64)
_NS_LIMIT = (2**63 - 1) // _POW  # largest digit value that still fits int64 ns after scaling


def decimal_text_to_ns(text: str | bytes) -> int | None:
    """Exact µs text → int ns, rounding sub-ns digits half away from zero; None if not a number."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("ascii", "replace")
    text = text.strip().strip('"').strip()
    try:
        d = Decimal(text)
    except (InvalidOperation, ValueError):
        return None
    if not d.is_finite():
        return None
    try:
        return int((d * 1000).to_integral_value(rounding=ROUND_HALF_UP))
    except ArithmeticError:  # decimal.Overflow: an exponent beyond the context's (1e999999999), no time
        return None


_DECIMAL_NS = pa.decimal128(20, 3)  # µs with 3 fraction digits: the unscaled integer is the ns value


def _texts(raws, lens: np.ndarray) -> pa.LargeStringArray:
    """The texts as one Arrow string array over their concatenation (no per-text objects)."""
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    return pa.LargeStringArray.from_buffers(len(lens), pa.py_buffer(offsets), pa.py_buffer(b"".join(raws)))


def _plain_decimals_to_ns(raws) -> np.ndarray | None:
    """ns values when Arrow parses every text as a decimal with at most 3 fraction digits that fits
    int64 ns (one vectorised cast; the decimal's unscaled integer is the ns count); None otherwise
    (the general path then decides text by text)."""
    n = len(raws)
    lens = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    if not lens.all():
        return None  # missing (empty) texts
    texts = _texts(raws, lens)
    try:
        dec = pc.cast(texts, _DECIMAL_NS)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # sub-ns digits, quotes, non-numbers...
    words = np.frombuffer(dec.buffers()[1], dtype=np.int64, count=2 * n, offset=16 * dec.offset)
    low, high = words[0::2], words[1::2]
    if not (high == (low >> 63)).all():
        return None  # beyond int64 nanoseconds
    return np.ascontiguousarray(low)


def raws_to_ns(raws: list) -> tuple[np.ndarray, np.ndarray]:
    """Convert JSON number texts (msgspec.Raw or None) to exact int64 ns.

    Returns (values, valid): invalid/missing entries have valid False and value 0. Vectorised with
    pyarrow: one decimal128(20, 3) cast when every text is a plain number; otherwise drop the '.',
    parse as an integer, scale by 10**(3 - fraction digits), and send entries with more than 3
    fraction digits, exponents, quotes or int64 overflow to the exact Decimal path.
    """
    n = len(raws)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    try:
        fast = _plain_decimals_to_ns(raws)
    except TypeError:  # None entries (missing values from a caller's lenient decoding)
        raws = [b"" if r is None else r for r in raws]
        fast = None
    if fast is not None:
        return fast, np.ones(n, dtype=bool)
    lens = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    arr = _texts(raws, lens)
    dot = pc.find_substring(arr, ".").to_numpy(zero_copy_only=False).astype(np.int64)
    frac = np.where(dot >= 0, lens - dot - 1, 0)
    digits_len = lens - (dot >= 0)
    slow = (frac > 3) | (digits_len > 18) | (lens == 0)
    digits = pc.replace_substring(arr, ".", "", max_replacements=1)
    if slow.any():
        digits = pc.if_else(pa.array(slow), "0", digits)
    try:
        vals = pc.cast(digits, pa.int64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        ok = pc.match_substring_regex(digits, r"^[-+]?[0-9]+$").to_numpy(zero_copy_only=False)
        slow |= ~ok
        digits = pc.if_else(pa.array(slow), "0", digits)
        vals = pc.cast(digits, pa.int64()).to_numpy(zero_copy_only=False)
    too_big = np.abs(vals) > _NS_LIMIT[np.minimum(frac, 3)]
    if too_big.any():  # would overflow int64 ns: the exact path rejects them
        slow |= too_big
        vals = np.where(too_big, 0, vals)
    vals = vals * _POW[np.minimum(frac, 3)]
    valid = np.ones(n, dtype=bool)
    if slow.any():
        vals = vals.copy()
        for i in np.flatnonzero(slow):
            v = decimal_text_to_ns(bytes(raws[i])) if lens[i] else None
            if v is None or not (-(2**63) <= v < 2**63):
                valid[i] = False
                vals[i] = 0
            else:
                vals[i] = v
    return vals, valid


# ----------------------------------------------------------------------------------------------
# Chunked decoding: the `traceEvents` array is cut at event boundaries and each piece decoded on
# its own, so only one piece's structs are alive at a time (memory) and they stay in cache (speed).
# Every cut is checked by the decode itself: a cut that is not between two top-level events leaves
# an unterminated string or object in its piece, which fails to decode; the caller then falls back
# to decoding the whole document at once.

_TRACE_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_EVENT_CUT = re.compile(rb"\}\s*,\s*\{")
_WS = b" \t\r\n"
_MAX_END_TRIES = 64
_MAX_CUT_TRIES = 8
_MAX_TAIL_BYTES = 16 << 20  # text after the events array (Kineto: a few hundred bytes)
_CUT_OVERLAP = 1 << 16
"""A boundary (`}`, whitespace, `,`, whitespace, `{`) may straddle the end of what was searched before; a
missed one only makes that chunk longer."""


TopLevel = _trace_struct("TopLevel", list[Any], "The document without its events (the array replaced by `[]`).")


TOP_DECODER = msgspec.json.Decoder(TopLevel)
EVENTS_DECODER = msgspec.json.Decoder(list[Event])


def _closing_candidates(buf, start: int, prefix: bytes):
    """Possible positions of the `]` that closes the events array, from the end of the document,
    each with the top-level fields decoded from the document with the array emptied."""
    close = len(buf)
    tries = 0
    while tries < _MAX_END_TRIES:
        close = buf.rfind(b"]", start, close)
        if close < 0 or len(buf) - close > _MAX_TAIL_BYTES:
            return
        j = close - 1
        while j >= start and buf[j] in _WS:
            j -= 1
        if j >= start and buf[j] != 0x7D:  # the last event ends with '}' (or the array is empty)
            continue
        tries += 1
        doc = b"".join((prefix, b'"traceEvents":[]', memoryview(buf)[close + 1:]))
        try:
            top = TOP_DECODER.decode(doc)
        except (msgspec.DecodeError, UnicodeDecodeError):
            continue
        if top.traceEvents != []:  # our array is not the top-level one
            return
        yield top, close


def decode_event_chunks(buf, chunk_bytes: int, sink, decode=None, exact_close: bool = False) -> TopLevel | None:
    """Decode the top-level `traceEvents` array about chunk_bytes of JSON at a time, handing each
    decoded list of events and its JSON text to `sink(events, text)` (`decode`: the JSON array → events
    function, EVENTS_DECODER's by default); returns the other top-level fields, or None when the layout
    is unusual (the caller then decodes the whole document). Decode errors propagate. `exact_close`:
    the array must close at the last `]` that leaves a valid document (no earlier one is tried)."""
    m = _TRACE_EVENTS_KEY.search(buf)
    if m is None:
        return None
    start = m.end()
    closes = _closing_candidates(buf, start, bytes(memoryview(buf)[: m.start()]))
    found = next(closes, None)
    if found is None:
        return None
    top, close = found
    view = memoryview(buf)
    decode = decode or EVENTS_DECODER.decode
    pos = start
    while pos < close and buf[pos] in _WS:
        pos += 1
    while True:
        stop = close
        while stop > pos and buf[stop - 1] in _WS:
            stop -= 1
        if pos >= stop:
            return top
        cut = _EVENT_CUT.search(buf, pos + chunk_bytes, stop) if stop - pos > chunk_bytes + chunk_bytes // 2 else None
        if cut is not None:
            for _ in range(_MAX_CUT_TRIES):
                try:
                    piece = b"".join((b"[", view[pos:cut.start() + 1], b"]"))
                    events = decode(piece)
                    break
                except msgspec.ValidationError:
                    raise
                except msgspec.DecodeError:  # the cut fell inside a string or args: try the next one
                    cut = _EVENT_CUT.search(buf, cut.start() + 1, stop)
                    if cut is None:
                        raise
            else:
                raise msgspec.DecodeError("no event boundary found")
            sink(events, piece)
            del events, piece
            pos = cut.end() - 1
            continue
        try:
            piece = b"".join((b"[", view[pos:stop], b"]"))
            events = decode(piece)
        except msgspec.ValidationError:
            raise
        except msgspec.DecodeError:
            # The array may close earlier (a later `]` belonged to other top-level data).
            found = None if exact_close else next(closes, None)
            if found is None or found[1] < pos:
                raise
            top, close = found
            continue
        sink(events, piece)
        return top


_LONG_WS_RUN = 4096
_LONG_WS = re.compile(rb"[ \t\r\n]{%d,}" % _LONG_WS_RUN)


def squeeze_whitespace(blocks):
    """The blocks with every run of at least 4096 whitespace bytes cut to one space, so megabytes of
    whitespace cost what their bytes cost to read and nothing to hold (DESIGN: cost per byte
    independent of content). A run inside a string only shortens that string's whitespace (names are
    clipped at 4096 characters anyway); runs split across blocks shrink to at most one run per edge."""
    for block in blocks:
        if _may_hold_long_ws(block):
            block = _LONG_WS.sub(b" ", block)
        yield block


_SAMPLE = _LONG_WS_RUN // 8
_RUN_SAMPLES = _LONG_WS_RUN // _SAMPLE
_WS_BYTE = np.zeros(256, bool)
_WS_BYTE[list(b" \t\r\n")] = True


def _may_hold_long_ws(block) -> bool:
    """Whether `block` may hold a run of _LONG_WS_RUN whitespace bytes, looking at one byte in _SAMPLE:
    such a run covers _RUN_SAMPLES consecutive samples, and the whole stretch between the first and the
    last of them is whitespace, which is checked where the samples allow it (never false when a run is
    there). Eight samples in a row on whitespace are rare in an indented trace (three were not: taking
    them for a long run sent 32 of 56 blocks of a real 54 MB trace through the regex, ~0.3 s of CPU)."""
    ws = _WS_BYTE[np.frombuffer(block, np.uint8)[::_SAMPLE]]
    if len(ws) < _RUN_SAMPLES:
        return False
    in_ws = np.concatenate(([0], np.cumsum(ws, dtype=np.int64)))
    starts = np.flatnonzero(in_ws[_RUN_SAMPLES:] - in_ws[:-_RUN_SAMPLES] == _RUN_SAMPLES)
    for i in starts.tolist():
        lo, hi = i * _SAMPLE, (i + _RUN_SAMPLES - 1) * _SAMPLE + 1
        if not bytes(block[lo:hi]).translate(None, b" \t\r\n"):
            return True
    return False


def _decode_up_to_cut(buf: bytearray, pos: int, cut: Any, decode) -> tuple[Any, bytes | None, Any]:
    """(events, their JSON text, the cut) for buf[pos:cut]; a cut that falls inside a string or args is
    moved to the next boundary (a few tries). Events None: no decodable cut (cut None: none left)."""
    for _ in range(_MAX_CUT_TRIES):
        with memoryview(buf) as view:
            piece = b"".join((b"[", view[pos:cut.start() + 1], b"]"))
        try:
            return decode(piece), piece, cut
        except msgspec.ValidationError:
            raise
        except msgspec.DecodeError:  # the cut fell inside a string or args: try the next one
            cut = _EVENT_CUT.search(buf, cut.start() + 1)
            if cut is None:
                break
    return None, None, cut


def decode_event_stream(blocks, chunk_bytes: int, sink, decode=None, exact_close: bool = False) -> TopLevel | None:
    """`decode_event_chunks` over an iterable of byte blocks (a file read or decompressed piece by
    piece): only the text before the events and about two chunks are held at a time."""
    it = iter(blocks)
    buf = bytearray()
    m = None
    for block in it:
        if not buf and not bytes(block[:64]).lstrip()[:1] in (b"{", b""):
            return None  # not a JSON object: the whole-document path names the problem
        start = max(0, len(buf) - 64)  # the key may straddle two blocks
        buf += block
        m = _TRACE_EVENTS_KEY.search(buf, start)
        if m is not None:
            break
    if m is None:
        return None
    head = bytes(buf[: m.end()])  # up to and including the events array's '['
    del buf[: m.end()]
    decode = decode or EVENTS_DECODER.decode
    pos = 0
    searched = 0  # bytes after `pos` already searched for a boundary (each byte is searched about once)
    eof = False
    want = chunk_bytes + chunk_bytes // 2
    while True:
        while not eof and len(buf) - pos < want:
            block = next(it, None)
            if block is None:
                eof = True
                break
            if pos:
                del buf[:pos]
                pos = 0
            buf += block
        if len(buf) - pos < want:
            break  # end of input: the rest (last events and the closing text) is decoded below
        cut = _EVENT_CUT.search(buf, pos + max(chunk_bytes, searched - _CUT_OVERLAP))
        if cut is None:
            if eof:
                break
            searched = len(buf) - pos
            want = len(buf) - pos + chunk_bytes  # no boundary yet: read further
            continue
        searched = 0
        events, piece, cut = _decode_up_to_cut(buf, pos, cut, decode)
        if events is None:
            if cut is None:
                if eof:
                    break
                want = len(buf) - pos + chunk_bytes
                continue
            raise msgspec.DecodeError("no event boundary found")
        sink(events, piece)
        del events, piece
        pos = cut.end() - 1
        want = chunk_bytes + chunk_bytes // 2
    rest = b"".join((head, memoryview(buf)[pos:]))
    del buf
    return decode_event_chunks(rest, chunk_bytes, sink, decode, exact_close)


# ----------------------------------------------------------------------------------------------
# Parts: a document cut near planned offsets into runs of whole events that separate processes
# decode (parse/split.py). Each run but the last is decoded with exact_close, so a cut that is not
# between two events of the top-level array fails the decode of the run before it, and the caller
# decodes the file in one piece instead.

CUT_WINDOW = 1 << 20
"""Bytes looked at, from a planned offset on, for the boundary between two parts (`event_cut`)."""


def event_cut(window) -> tuple[int, int] | None:
    """(end of one event, start of the next) in `window` (bytes read from a planned offset on): the first
    boundary where the next event decodes on its own (a boundary inside a string or args rarely does;
    one that does still fails the decode of its part). The same bytes always give the same cut."""
    cuts = _EVENT_CUT.finditer(window)
    cut = next(cuts, None)
    for _ in range(_MAX_CUT_TRIES):
        nxt = next(cuts, None)
        if cut is None or nxt is None:
            return None
        try:
            EVENTS_DECODER.decode(b"".join((b"[", window[cut.end() - 1: nxt.start() + 1], b"]")))
        except msgspec.DecodeError:  # ValidationError included
            cut = nxt
            continue
        return cut.start() + 1, cut.end() - 1
    return None


# ----------------------------------------------------------------------------------------------
# Row capture: complete events hand their fields to a list as msgspec builds them (__post_init__),
# while the struct is still in cache; reading the same fields back later, one attribute pass per
# field over cold structs, costs about twice as much. The fields go into one flat list, ROW_WIDTH
# values per event, so each field's column is one strided slice (`rows[k::ROW_WIDTH]`, in C) instead
# of a per-event tuple transposed by zip (decode plus transposition of a 103 MB trace: 0.52 -> 0.47 CPU s).

ROW_FIELDS = ("name", "cat", "ts", "dur", "pid", "tid", "args", "external_id", "external_id_old", "correlation",
              "stream", "device", "flops", "coll_name", "launch_kernel", "input_dims", "input_type", "input_strides", "concrete_inputs")
"""Order of the values in each captured row (the last twelve are `args` fields; the last four the op's
shapes as JSON texts, `SHAPE_FIELDS`)."""

ROW_WIDTH = len(ROW_FIELDS)

SHAPE_FIELDS = ("input_dims", "input_type", "input_strides", "concrete_inputs")
"""The `args` of CPU ops recorded with record_shapes, kept as their JSON text (Raw) in ROW_FIELDS order."""


class _RowCapture(threading.local):
    """Per thread: a decoder for JSON arrays of events whose `X` events append their ROW_WIDTH values
    (a row) to the flat list `rows`."""

    def __init__(self) -> None:
        rows: list = []
        extend = rows.extend

        class XRow(X):  # X's fields and tag, the args without FULL_ONLY_ARGS; each decoded event appends its row
            args: XRowArgs = EMPTY_ROW_ARGS

            def __post_init__(self) -> None:
                a = self.args
                extend((self.name, self.cat, self.ts, self.dur, self.pid, self.tid, a, a.external_id,
                        a.external_id_old, a.correlation, a.stream, a.device, a.flops, a.coll_name, a.launch_kernel, a.input_dims,
                        a.input_type, a.input_strides, a.concrete_inputs))

        self.rows = rows
        self.row_class = XRow
        self.decoder = msgspec.json.Decoder(list[Union[(XRow, M, I) + _OTHER]])


XRowArgs = _args_struct("XRowArgs", "XArgs without FULL_ONLY_ARGS (the row-capturing decoder's).", lenient=False,
                        leave_out=FULL_ONLY_ARGS)
EMPTY_ROW_ARGS = XRowArgs()
_ROW_CAPTURE = _RowCapture()


def row_capture() -> _RowCapture:
    """This thread's row-capturing decoder: `.decoder`, `.rows` (flat; clear it before each decode), `.row_class`."""
    return _ROW_CAPTURE


def row_columns(rows: list) -> list[list]:
    """The captured rows as one list per ROW_FIELDS field."""
    return [rows[k::ROW_WIDTH] for k in range(ROW_WIDTH)]


# ----------------------------------------------------------------------------------------------
# Full args of a few captured events: a decoded Raw is a view into the text it was decoded from, so an
# event's `ts` text tells where the event lies in its piece; the event's text, between the event boundaries
# around that place, is decoded on its own and checked to be the event (its `ts` text at the same place,
# the same name).

X_DECODER = msgspec.json.Decoder(X)


def _address(buf) -> int:
    return np.frombuffer(buf, np.uint8).__array_interface__["data"][0]


def full_args(piece: bytes, ts: list, names: list, rows: list[int]) -> list | None:
    """The XArgs of complete events `rows` (their places among the piece's captured rows; `ts`, `names`: the
    rows' columns) of a piece decoded by the row-capturing decoder; None when one of them cannot be found
    (no `ts` text, or no text around it that decodes to the event): the caller then decodes the piece again."""
    base = _address(piece)
    out = []
    for r in rows:
        raw = ts[r]
        at = _address(raw) - base if len(raw) else -1
        args = _args_around(piece, at, names[r]) if 0 <= at < len(piece) else None
        if args is None:
            return None
        out.append(args)
    return out


def _args_around(piece: bytes, at: int, name: str) -> XArgs | None:
    """The XArgs of the complete event whose `ts` text starts at `at` in `piece` (a JSON array of events)."""
    start = at
    for _ in range(_MAX_CUT_TRIES):
        start = piece.rfind(b"{", 0, start)
        if start < 0:
            return None
        if not _opens_event(piece, start):
            continue
        end = at
        for _ in range(_MAX_CUT_TRIES):
            cut = _EVENT_CUT.search(piece, end)
            stop = cut.start() + 1 if cut is not None else piece.rfind(b"}") + 1
            text = piece[start:stop]
            try:
                event = X_DECODER.decode(text)
            except msgspec.DecodeError:  # a boundary inside a string or args: try the next one
                if cut is None:
                    break
                end = cut.end()
                continue
            if event.name == name and len(event.ts) and _address(event.ts) - _address(text) == at - start:
                return event.args
            break  # another object: try an earlier start
    return None


def _opens_event(piece: bytes, brace: int) -> bool:
    """Whether the `{` at `brace` follows the array's `[` or another event's `}` and a comma (whitespace aside)."""
    j = brace - 1
    while j >= 0 and piece[j] in _WS:
        j -= 1
    if j >= 0 and piece[j] == 0x5B:  # '['
        return j == 0
    if j < 0 or piece[j] != 0x2C:  # ','
        return False
    j -= 1
    while j >= 0 and piece[j] in _WS:
        j -= 1
    return j >= 0 and piece[j] == 0x7D  # '}'
