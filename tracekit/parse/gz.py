"""Read a trace file's bytes, plain or gzip, whole or block by block, with a bound on the decompressed size.

gzip goes through isal (about 1.5x stdlib zlib). The output buffer is sized from the gzip trailer
(ISIZE, the size mod 2**32) so decompression does not hold two full copies at once.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from isal import isal_zlib

from tracekit.errors import InputTooLargeError, TraceFormatError

GZIP_MAGIC = b"\x1f\x8b"
_READ_CHUNK = 4 << 20
MAX_COMPRESSION_RATIO = 200
"""Without an explicit budget, gzip input may expand at most this much (real Kineto traces: 7-30x;
a decompression bomb of repeated bytes: ~1000x)."""
MIN_RATIO_CHECKED_BYTES = 256 << 20
"""Files that decompress to less than this are never refused by the ratio rule."""


def decompressed_budget(compressed_size: int, max_decompressed_bytes: int | None) -> tuple[int, str]:
    """Bytes a gzip file may decompress to, and the rule's wording for errors.

    An explicit budget wins; otherwise max(MIN_RATIO_CHECKED_BYTES, MAX_COMPRESSION_RATIO x compressed size).
    """
    if max_decompressed_bytes is not None:
        return max_decompressed_bytes, f"the {max_decompressed_bytes}-byte budget"
    limit = max(MIN_RATIO_CHECKED_BYTES, MAX_COMPRESSION_RATIO * compressed_size)
    return limit, (f"{limit} bytes ({MAX_COMPRESSION_RATIO}x its {compressed_size} compressed bytes): "
                   "a likely decompression bomb; set an explicit budget to read it")


def is_gzip(path: str | Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def gzip_size_hint(path: str | Path) -> int:
    """Uncompressed size from the gzip trailer (exact below 4 GiB for single-member files)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size < 18:
            return 0
        f.seek(size - 4)
        return struct.unpack("<I", f.read(4))[0]


def json_size_bytes(path: str | Path) -> int | None:
    """Decompressed size of a trace file (gzip trailer; None when the trailer cannot be trusted)."""
    size = os.path.getsize(path)
    if not is_gzip(path):
        return size
    hint = gzip_size_hint(path)
    return hint if hint >= size else None


def read_trace_bytes(path: str | Path, max_decompressed_bytes: int | None = None) -> bytes | bytearray:
    """Whole (decompressed) contents of `path`; raises TraceFormatError for unreadable input."""
    path = str(path)
    try:
        gz = is_gzip(path)
    except OSError as exc:
        raise TraceFormatError(path, f"cannot open: {exc.strerror or exc}") from None
    if not gz:
        size = os.path.getsize(path)
        if max_decompressed_bytes is not None and size > max_decompressed_bytes:
            raise InputTooLargeError(path, f"file is {size} bytes, over the {max_decompressed_bytes}-byte budget")
        with open(path, "rb") as f:
            return f.read()
    return _gunzip(path, max_decompressed_bytes)


def gzip_pieces(f, path: str, max_decompressed_bytes: int | None, read_bytes: int = _READ_CHUNK,
                piece_bytes: int = _READ_CHUNK):
    """Decompressed pieces (at most `piece_bytes` each) of the gzip file open as `f`, every member in
    turn (zero padding between members allowed). Raises InputTooLargeError past `decompressed_budget`,
    TraceFormatError for corrupt, truncated or empty data and trailing garbage."""
    limit, budget_text = decompressed_budget(os.fstat(f.fileno()).st_size, max_decompressed_bytes)
    total = 0
    dec = isal_zlib.decompressobj(31)
    in_member = False

    def counted(piece: bytes) -> bytes:
        nonlocal total
        total += len(piece)
        if total > limit:
            raise InputTooLargeError(path, f"decompresses to more than {budget_text}")
        return piece

    try:
        while chunk := f.read(read_bytes):
            while chunk:
                in_member = True
                piece = dec.decompress(chunk, piece_bytes)
                if piece:
                    yield counted(piece)
                if dec.eof:
                    in_member = False
                    rest = dec.unused_data
                    dec = isal_zlib.decompressobj(31)
                    chunk = rest.lstrip(b"\x00") if rest else b""
                    if chunk and not chunk.startswith(GZIP_MAGIC):
                        raise TraceFormatError(path, "trailing garbage after gzip stream")
                    continue
                chunk = dec.unconsumed_tail
        # what the decompressor still holds back
        while in_member and not dec.eof and (piece := dec.decompress(b"", piece_bytes)):
            yield counted(piece)
        if dec.eof:
            in_member = False
    except isal_zlib.error as exc:
        raise TraceFormatError(path, f"corrupt gzip data: {exc}") from None
    if in_member:
        raise TraceFormatError(path, "truncated gzip stream (file ends before the gzip trailer)")
    if total == 0:
        raise TraceFormatError(path, "empty or truncated gzip stream")


def _gunzip(path: str, max_decompressed_bytes: int | None) -> bytearray:
    """Every gzip member decompressed into one buffer preallocated from the trailer's size hint."""
    hint = gzip_size_hint(path)
    compressed_size = os.path.getsize(path)
    limit, _ = decompressed_budget(compressed_size, max_decompressed_bytes)
    # ISIZE is mod 2**32 (and forgeable): never trust a hint smaller than the compressed size.
    if hint < compressed_size or hint > 64 * compressed_size:  # real traces expand 7-30x
        hint = compressed_size * 4
    out = bytearray(min(hint, limit + 1))
    view = memoryview(out)
    n = 0
    with open(path, "rb") as f:
        for piece in gzip_pieces(f, path, max_decompressed_bytes):
            end = n + len(piece)
            if end > len(out):
                view.release()
                out.extend(bytes(max(end - len(out), len(out) // 2)))
                view = memoryview(out)
            view[n:end] = piece
            n = end
    view.release()
    del out[n:]
    return out


class StreamProblem(Exception):
    """The streamed read met something `read_trace_bytes` reports too (size budget, corrupt or truncated
    gzip, trailing bytes); `error` is that report, raised as it is (reading the file again to the same
    budget would only repeat the work: a decompression bomb is refused once, as soon as it is seen)."""

    def __init__(self, error: TraceFormatError) -> None:
        super().__init__(str(error))
        self.error = error


def iter_trace_blocks(path: str | Path, max_decompressed_bytes: int | None = None,
                      block_bytes: int = _READ_CHUNK, start: int = 0):
    """The (decompressed) contents of `path` as successive blocks of about block_bytes, so a caller can
    work through a file without holding all of it (a plain file from byte `start` on; gzip is always
    inflated from its start). Raises OSError, or StreamProblem where `read_trace_bytes` would raise a
    TraceFormatError."""
    path = str(path)
    with open(path, "rb") as f:
        gz = f.read(2) == GZIP_MAGIC
        f.seek(0)
        if not gz:
            size = os.fstat(f.fileno()).st_size
            if max_decompressed_bytes is not None and size > max_decompressed_bytes:
                raise StreamProblem(InputTooLargeError(
                    path, f"file is {size} bytes, over the {max_decompressed_bytes}-byte budget"))
            f.seek(start)
            while block := f.read(block_bytes):
                yield block
            return
        if start:
            raise ValueError("a gzip stream is read from its start")
        try:
            yield from gzip_pieces(f, path, max_decompressed_bytes, block_bytes // 4, block_bytes)
        except (TraceFormatError, InputTooLargeError) as exc:
            raise StreamProblem(exc) from None
