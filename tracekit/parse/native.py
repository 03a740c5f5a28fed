"""The native column builder (`kscan.c`): one C pass over a piece of the `traceEvents` array gives its
complete events' columns, where msgspec's typed decode builds an object per event and field.

`scan(piece)` is a `NativeChunk` or None. The C scanner accepts only pieces it reads exactly as msgspec's
typed row decoder and `kineto._add_rows` would (the C file's comment lists what it refuses); None sends the
piece to msgspec, which then decodes it or raises as before. The metadata (`M`) and instant (`i`) events
are decoded here by msgspec from their texts, as the same structs the typed decoder gives.

Built by `pip install` where a C compiler exists (setup.py); without it, or with TRACEKIT_NATIVE=0 in the
environment, every piece takes the msgspec path (the same columns, about 1.5 CPU-s more per 100 MB).
"""

from __future__ import annotations

import os
from typing import Union

import msgspec
import numpy as np

from tracekit.parse import decode as D

try:
    from tracekit.parse import kscan
except ImportError:  # no compiler at install time: msgspec alone
    kscan = None

_OTHERS = msgspec.json.Decoder(list[Union[D.M, D.I]])
N_INTS = 5
"""Integer args per complete event, in order: External id, external id, correlation, stream, device."""


def available() -> bool:
    """Whether pieces are scanned natively in this process (built, and not turned off by TRACEKIT_NATIVE=0)."""
    return kscan is not None and os.environ.get("TRACEKIT_NATIVE", "1") != "0"


class NativeChunk:
    """One piece's complete-event columns (row order = the piece's order of `X` events), its `M` and `i`
    events as decoded structs, and the count of each phase in order of first occurrence."""

    __slots__ = ("n", "names", "name_idx", "cats", "cat_idx", "ts", "ts_ok", "dur", "dur_ok", "pid", "tid", "ids",
                 "ints", "ints_ok", "int_texts", "flops", "flops_ok", "coll", "launch", "shapes", "shape_texts",
                 "spans", "rank", "rank_ok", "ms", "instants", "counts")

    def __init__(self, d: dict, others: list) -> None:
        n = self.n = d["n"]
        self.names, self.cats = d["names"], d["cats"]
        self.name_idx = np.frombuffer(d["name_idx"], np.int32)
        self.cat_idx = np.frombuffer(d["cat_idx"], np.int32)
        self.ts, self.dur = np.frombuffer(d["ts"], np.int64), np.frombuffer(d["dur"], np.int64)
        self.ts_ok, self.dur_ok = np.frombuffer(d["ts_ok"], np.bool_), np.frombuffer(d["dur_ok"], np.bool_)
        self.pid, self.tid = np.frombuffer(d["pid"], np.int64), np.frombuffer(d["tid"], np.int64)
        self.ids = d["ids"]
        """(row, 0 pid / 1 tid, value) for every id that is not an integer (text or missing)."""
        self.ints = np.frombuffer(d["ints"], np.int64).reshape(n, N_INTS)
        self.ints_ok = np.frombuffer(d["ints_ok"], np.bool_).reshape(n, N_INTS)
        self.int_texts = d["int_texts"]
        """(row, column, text) of each integer arg given as text ("0x0"): `ints` holds 0 and not ok there."""
        self.flops, self.flops_ok = np.frombuffer(d["flops"], np.float64), np.frombuffer(d["flops_ok"], np.bool_)
        self.coll, self.launch = d["coll"], d["launch"]
        """(row, text) of each `Collective name` / `kernel` arg."""
        self.shapes = np.frombuffer(d["shapes"], np.int32).reshape(n, len(D.SHAPE_FIELDS))
        """Per row and shape field (decode.SHAPE_FIELDS): the index of its JSON text in `shape_texts` (0: none; rows
        without `Input Dims` have 0 in every field)."""
        self.shape_texts = d["shape_texts"]
        """Per shape field: its distinct texts (bytes) in order of first occurrence, b"" first."""
        self.rank, self.rank_ok = np.frombuffer(d["rank"], np.int64), np.frombuffer(d["rank_ok"], np.bool_)
        """Per row: its `rank` arg where that is an integer (merged multi-rank files, parse/merged.event_rank)."""
        self.spans = np.frombuffer(d["spans"], np.int64).reshape(n, 2)
        """Per row: the event's text (start, end) in the piece."""
        self.ms = [e for e in others if e.__class__ is D.M]
        self.instants = [e for e in others if e.__class__ is D.I]
        self.counts = d["counts"]


def scan(piece: bytes) -> NativeChunk | None:
    """The piece (a JSON array of events) scanned natively, or None: decode it with msgspec."""
    d = kscan.scan(piece)
    if d is None:
        return None
    others = []
    spans = np.frombuffer(d["others"], np.int64).reshape(-1, 3)
    if len(spans):
        view = memoryview(piece)
        text = b"".join((b"[", b",".join(view[s:e] for s, e in spans[:, :2].tolist()), b"]"))
        try:
            others = _OTHERS.decode(text)
        except (msgspec.DecodeError, UnicodeDecodeError):
            return None  # msgspec's decode of the whole piece raises the same
    return NativeChunk(d, others)
