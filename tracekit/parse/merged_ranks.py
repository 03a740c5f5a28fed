"""A merged multi-rank Kineto file (TraceLens TraceFusion, see `merged`) parsed from one decode.

`merged.split_merged` writes one document per rank and each is decoded again; here the file is decoded
once (`kineto.decode_columns`, keeping each complete event's rank, `merged.event_rank`) and its columns
are cut per rank into exactly the columns a decode of that rank's document would give: the rank's
events in file order followed by the events of no rank (`event_rank` -1, which split_merged gives every
rank), names, categories and shape texts coded in first-occurrence order, and the document's top-level
fields with `distributedInfo` stating the rank and the world size as split_merged writes them. Each
rank's tables then come from `kineto.tables_from_columns`, so they equal the split path's.

Not for every file: a file the typed decoder refuses, one with `[memory]` events (instant events carry
no pid in the fast decoder) or one whose complete and metadata events name fewer than two ranks gives
None, and the caller splits it as before. Phase counts other than X and M are not kept per rank (flow
events are not decoded); no table holds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from tracekit.errors import TraceFormatError, TracekitError
from tracekit.parse import decode as D
from tracekit.parse.gz import StreamProblem, iter_trace_blocks
from tracekit.parse.kineto import (
    CHUNK_BYTES, EventColumns, KinetoParse, CodeBook, IdCodes, decode_columns, gc_paused, tables_from_columns,
)
from tracekit.parse.merged import event_rank
from tracekit.parse.split import decode_columns_split


@dataclass
class MergedRanks:
    """One decode of a merged file, with each event's rank."""

    path: str
    cols: EventColumns
    row_rank: np.ndarray
    """Per complete event: its rank (-1: none, so every rank's)."""
    m_rank: list[int]
    """Per metadata event (`cols.ms`): its rank."""
    ranks: list[int]
    world_size: Any
    base_info: dict

    def parse(self, rank: int, path: str) -> KinetoParse:
        """Rank `rank`'s parse, as `kineto.parse_kineto` gives it for that rank's split document at `path`."""
        top = msgspec.structs.replace(self.cols.top, distributedInfo={**self.base_info, "rank": rank,
                                                                       "world_size": self.world_size})
        with gc_paused():
            try:
                return tables_from_columns(path, _rank_columns(self, rank, top), None)
            except TraceFormatError:
                raise
            except (ValueError, TypeError, KeyError, IndexError, OverflowError, pa.ArrowException) as exc:
                raise TraceFormatError(path, f"malformed Kineto content: {type(exc).__name__}: {exc}") from exc


def decode_merged(path: str, max_decompressed_bytes: int | None = None, processes: int = 1) -> MergedRanks | None:
    """The merged file decoded once with its events' ranks; None: split it instead (see the module doc)."""
    with gc_paused():
        try:
            cols = decode_columns_split(path, processes, max_decompressed_bytes, event_ranks=True)
            if cols is None:
                cols = decode_columns(D.squeeze_whitespace(iter_trace_blocks(path, max_decompressed_bytes, CHUNK_BYTES)),
                                      event_ranks=True)
        except (StreamProblem, OSError, TracekitError):
            return None
    if cols is None or cols.memory or cols.event_ranks is None:
        return None
    row_rank = _joined(cols.event_ranks, np.int64)
    _join_chunks(cols)
    m_rank = [event_rank(m.args.rank if m.args is not None else None, m.pid) for m in cols.ms]
    ranks = sorted((set(np.unique(row_rank).tolist()) | set(m_rank)) - {-1})
    if len(ranks) < 2:
        return None
    info = cols.top.distributedInfo
    base = info if isinstance(info, dict) else {}
    world = base.get("world_size") if isinstance(base.get("world_size"), int) else max(ranks) + 1
    return MergedRanks(path, cols, row_rank, m_rank, ranks, world, base)


def _first_occurrence(codes: np.ndarray, size: int, keep_zero: bool = False) -> tuple[np.ndarray, list[int]]:
    """(old code → new code, old codes in new-code order): codes renumbered by first occurrence in `codes`
    (`keep_zero`: code 0 stays 0, as the shape books' absent text)."""
    uniq, first = np.unique(codes, return_index=True)
    order = uniq[np.argsort(first, kind="stable")]
    if keep_zero:
        order = np.concatenate([np.zeros(1, order.dtype), order[order != 0]])
    remap = np.zeros(max(size, 1), np.int32)
    remap[order] = np.arange(len(order), dtype=np.int32)
    return remap, order.tolist()


def _book(keys: list, order: list[int]) -> CodeBook:
    return CodeBook(zip([keys[c] for c in order], range(len(order))))


def _joined(parts: list, dtype) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


_NUMPY_CHUNKS = {"name_codes": np.int32, "cat_codes": np.int32, "ts": np.int64, "ts_ok": bool, "dur": np.int64,
                 "dur_ok": bool, "pid": np.int64, "tid": np.int64}
_ARROW_CHUNKS = {"ext": pa.int64(), "corr": pa.int64(), "stream": pa.int64(), "device": pa.int64(),
                 "flops": pa.float64()}


def _join_chunks(cols: EventColumns) -> None:
    """Each per-chunk column list made one piece (once, not per rank)."""
    for f, dtype in _NUMPY_CHUNKS.items():
        setattr(cols, f, [_joined(getattr(cols, f), dtype)])
    for f, dtype in _ARROW_CHUNKS.items():
        parts = getattr(cols, f)
        setattr(cols, f, [pa.concat_arrays(parts) if parts else pa.array([], dtype)])
    cols.shape_codes = tuple([_joined(parts, np.int32)] for parts in cols.shape_codes)


def _rows_of(d: dict, pos: np.ndarray) -> dict:
    """`d` (row → value) for the rows `pos` keeps, keyed by their new rows, in row order."""
    items = [(int(pos[r]), v) for r, v in d.items() if pos[r] >= 0]
    items.sort(key=itemgetter(0))
    return dict(items)


def _rank_columns(m: MergedRanks, rank: int, top: Any) -> EventColumns:
    """The columns of rank `rank`'s document: its events, then those of no rank, in file order."""
    c = m.cols
    idx = np.concatenate([np.flatnonzero(m.row_rank == rank), np.flatnonzero(m.row_rank == -1)])
    n = len(idx)
    out = EventColumns(top)
    out.n = n
    out.warnings = list(c.warnings)
    names = list(c.names)
    name_codes = c.name_codes[0][idx]
    remap, order = _first_occurrence(name_codes, len(names))
    out.names = _book(names, order)
    out.keep_name = [c.keep_name[k] for k in order]
    out.name_codes = [remap[name_codes]]
    cats = list(c.cats)
    cat_codes = c.cat_codes[0][idx]
    remap, order = _first_occurrence(cat_codes, len(cats))
    out.cats = _book(cats, order)
    out.cat_codes = [remap[cat_codes]]
    for f in ("ts", "ts_ok", "dur", "dur_ok", "pid", "tid"):
        setattr(out, f, [getattr(c, f)[0][idx]])
    take = pa.array(idx, pa.int64())
    for f in _ARROW_CHUNKS:
        setattr(out, f, [getattr(c, f)[0].take(take)])
    pos = np.full(c.n, -1, np.int64)
    pos[idx] = np.arange(n)
    out.coll_name = _rows_of(c.coll_name, pos)
    out.launch_kernel = _rows_of(c.launch_kernel, pos)
    out.args_keep = _rows_of(c.args_keep, pos)
    books, codes = [], []
    for book, parts in zip(c.shape_books, c.shape_codes):
        keys = list(book)
        rank_codes = parts[0][idx]
        remap, order = _first_occurrence(rank_codes, len(keys), keep_zero=True)
        books.append(_book(keys, order))
        codes.append([remap[rank_codes]])
    out.shape_books, out.shape_codes = tuple(books), tuple(codes)
    out.pid_ids = c.pid_ids
    out.tid_ids = IdCodes()
    if c.tid_ids.text_of or c.tid_ids.stream_ids:
        present = set(np.unique(out.tid[0]).tolist())
        out.tid_ids.text_of = {t: s for t, s in c.tid_ids.text_of.items() if t in present}
        out.tid_ids.stream_ids = c.tid_ids.stream_ids & present
    out.ms = ([e for e, r in zip(c.ms, m.m_rank) if r == rank] + [e for e, r in zip(c.ms, m.m_rank) if r == -1])
    out.phase_counts = {"X": n, "M": len(out.ms)}
    return out


def rank_document_path(folder: Path, path: str | Path, rank: int) -> str:
    """The name split_merged gives rank `rank`'s document (nothing is written here: the name only labels
    the parse, as it did when the document was a file)."""
    return str(folder / f"{Path(path).name}.rank{rank}.json")
