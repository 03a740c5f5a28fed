"""One large trace (plain or gzip) decoded by several processes at once.

The document is cut near evenly spaced offsets at event boundaries (`decode.event_cut`, a rule that
gives the same cut from the same bytes, so neighbouring parts agree on it without talking); this
process decodes the first part (the document's head and its first events) while forked children
decode the others, the last one running to the document's end. The parts are merged in order
(`kineto.merge_columns`): the same columns one process would decode. Every part but the last is
decoded with an exact close, so a cut that is not between two events of the top-level array fails
the part before it. A gzip file is inflated by every process from its start (isal, ~1 GB/s), each
keeping only its own part, so memory stays what one streamed decode holds.

Each child hands its columns back pickled, in an anonymous memory file (memfd) this process created
for it: the bytes are our own fork's, never a file's content, so nothing read from a trace is
unpickled. Anything unusual (a part without a boundary, a child that dies, a gzip trailer that cannot
be trusted, no `fork`) makes `decode_columns_split` return None and the caller decodes the file in
one process, so results never depend on the split; only the time does.
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import sys
import time
from functools import partial
from typing import Callable

import msgspec

from tracekit.parse import decode as D
from tracekit.parse.gz import StreamProblem, decompressed_budget, is_gzip, iter_trace_blocks, json_size_bytes
from tracekit.parse.kineto import CHUNK_BYTES, EventColumns, decode_columns, gc_paused, merge_columns

CHILD_PATIENCE = 10
CHILD_GRACE_S = 10.0
"""A child still decoding CHILD_PATIENCE times as long as this process took for its own part, plus
CHILD_GRACE_S, is stopped and the file decoded in one process."""
MAX_GZIP_PROCESSES = 8
"""Every process inflates a gzip file from its start up to its own part, so n processes inflate about
(n + 1) / 2 times the file; past 8 that costs more CPU than the decode it spreads."""
MIN_PART_BYTES = 16 << 20
"""No process gets less JSON than this (a fork, handing the part back and merging cost far less than
decoding it, but below ~16 MB the gain is too small to be worth a process)."""


def split_processes(size: int, processes: int) -> int:
    """How many processes decode a document of `size` bytes when `processes` are available."""
    return max(1, min(processes, size // MIN_PART_BYTES))


def can_fork() -> bool:
    """Linux only: forking a process that may hold other threads is what Linux's multiprocessing did
    by default for decades; elsewhere (macOS frameworks) it is not safe."""
    return sys.platform.startswith("linux") and hasattr(os, "fork") and hasattr(os, "memfd_create")


def decode_columns_split(path: str, processes: int, max_decompressed_bytes: int | None = None,
                         event_ranks: bool = False) -> EventColumns | None:
    """The file's columns decoded by up to `processes` processes; None: decode it in one instead.
    `event_ranks`: see `kineto.decode_columns`."""
    if processes < 2 or not can_fork():
        return None
    try:
        parts = plan_parts(path, processes, max_decompressed_bytes, event_ranks)
    except OSError:
        return None
    if len(parts) < 2:
        return None
    with gc_paused():
        cols = _decode_parts(parts)
    if cols is None:
        return None
    head, tail = cols[0].top, cols[-1].top
    top = msgspec.structs.replace(head, **{k: v for k in D.TOP_LEVEL_KEYS if (v := getattr(tail, k)) is not None})
    return merge_columns(cols, top)


def plan_parts(path: str, processes: int, max_decompressed_bytes: int | None,
               event_ranks: bool = False) -> list[Callable[[], EventColumns | None]]:
    """One decoder per part, cut near evenly spaced offsets of the (inflated) document."""
    gz = is_gzip(path)
    json_size = json_size_bytes(path)  # gzip: the trailer's size, None when it cannot be trusted
    limit = decompressed_budget(os.path.getsize(path), max_decompressed_bytes)[0] if gz else max_decompressed_bytes
    if json_size is None or (limit is not None and json_size > limit):
        return []  # the one-process decode reports a file over its budget
    n = split_processes(json_size, min(processes, MAX_GZIP_PROCESSES) if gz else processes)
    bounds = [None] + [json_size * i // n for i in range(1, n)] + [None]
    if not gz and not _has_cuts(path, bounds[1:-1]):
        return []  # e.g. megabytes of whitespace: known before any process starts
    return [partial(decode_part, path, lo, hi, gz, max_decompressed_bytes, event_ranks)
            for lo, hi in zip(bounds, bounds[1:])]


def _has_cuts(path: str, offsets: list[int]) -> bool:
    """Whether the plain file has the boundaries its parts will cut at `offsets` (the same rule on the
    same bytes)."""
    with open(path, "rb") as f:
        return all(D.event_cut(os.pread(f.fileno(), D.CUT_WINDOW, at)) is not None for at in offsets)


def decode_part(path: str, lo: int | None, hi: int | None, gz: bool, max_bytes: int | None,
                event_ranks: bool = False) -> EventColumns | None:
    """Columns of the events from the boundary at offset `lo` (None: the document's start) to the
    boundary at `hi` (None: its end); None when that is not a run of whole events."""
    blocks = _part_blocks(_Stream(path, 0 if gz or lo is None else lo, max_bytes), lo, hi)
    return decode_columns(D.squeeze_whitespace(blocks), exact_close=hi is not None, event_ranks=event_ranks)


def _part_blocks(s: "_Stream", lo: int | None, hi: int | None):
    """The part's text as a document: `{"traceEvents":[` before a part that does not start the file,
    `]}` after one that does not end it."""
    if lo is not None:
        s.skip_to(lo)
        start = lo + _cut(s)[1]
        if hi is not None and start >= hi:
            raise ValueError("no event boundary inside the part")
        s.skip_to(start)
        yield b'{"traceEvents":['
    if hi is None:
        yield from s.take_to(None)
        return
    yield from s.take_to(hi)
    yield from s.take_to(hi + _cut(s)[0])
    yield b"]}"


def _cut(s: "_Stream") -> tuple[int, int]:
    cut = D.event_cut(s.peek(D.CUT_WINDOW))
    if cut is None:
        raise ValueError(f"no event boundary within {D.CUT_WINDOW} bytes of offset {s.at}")
    return cut


class _Stream:
    """The file's (inflated) bytes read forward by offset: skip, peek, take (blocks pass through
    uncopied; only a part's edges are sliced)."""

    def __init__(self, path: str, start: int, max_bytes: int | None) -> None:
        self._blocks = iter_trace_blocks(path, max_bytes, CHUNK_BYTES, start=start)
        self._buf = b""
        self.at = start  # offset of _buf[0]

    def _more(self) -> bool:
        block = next(self._blocks, None)
        if block is not None:
            self._buf = self._buf + block if self._buf else block
        return block is not None

    def skip_to(self, offset: int) -> None:
        while self.at + len(self._buf) < offset:
            self.at += len(self._buf)
            self._buf = b""
            if not self._more():
                raise ValueError(f"the document ends before offset {offset}")
        self._buf = self._buf[offset - self.at:]
        self.at = offset

    def peek(self, n: int) -> bytes:
        while len(self._buf) < n and self._more():
            pass
        return self._buf[:n]

    def take_to(self, offset: int | None):
        """The bytes up to `offset` (None: to the end), block by block."""
        while offset is None or self.at < offset:
            if not self._buf and not self._more():
                return
            n = len(self._buf) if offset is None else min(len(self._buf), offset - self.at)
            block, self._buf = (self._buf, b"") if n == len(self._buf) else (self._buf[:n], self._buf[n:])
            self.at += n
            yield block


def _decode_parts(parts: list[Callable[[], EventColumns | None]]) -> list[EventColumns] | None:
    """Each part's columns, the first decoded here and the others in forked children."""
    pending: list[tuple[int, int]] = []
    try:
        for part in parts[1:]:
            pending.append(_fork(part))
        t0 = time.monotonic()
        cols = [parts[0]()]
        patience = CHILD_PATIENCE * (time.monotonic() - t0) + CHILD_GRACE_S  # from now on, for all of them
        while pending and cols[-1] is not None:
            cols.append(_receive(*pending.pop(0), deadline=time.monotonic() + patience))
    except (OSError, StreamProblem):  # the sequential decode reports a bad file
        return None
    finally:
        for pid, fd in pending:  # after a failure or an interrupt: the rest is not needed
            _kill(pid, fd)
    return None if cols[-1] is None else cols


def _fork(part: Callable[[], EventColumns | None]) -> tuple[int, int]:
    """(pid, memory file) of a child that runs `part` and writes the pickled columns into the memory
    file (a pipe would block the child until this process reads it)."""
    fd = os.memfd_create("tracekit-part", os.MFD_CLOEXEC)
    try:
        pid = os.fork()
    except OSError:
        os.close(fd)
        raise
    if pid == 0:  # the child: never returns into the caller's frames
        status = 1
        try:
            with open(fd, "wb", closefd=False) as out:
                pickle.dump(part(), out, protocol=pickle.HIGHEST_PROTOCOL)
            status = 0
        finally:
            os._exit(status)
    return pid, fd


def _receive(pid: int, fd: int, deadline: float) -> EventColumns | None:
    """A child's columns once it has exited (None when it failed, found no run of whole events, or is
    still running at `deadline`: then it is stopped)."""
    status = _wait(pid, deadline)
    if status is None:
        _kill(pid, fd)
        return None
    try:
        size = os.fstat(fd).st_size
        if status != 0 or size == 0:
            return None
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as data:
            return pickle.loads(data)  # noqa: S301 - our own fork's output in our own memory file, no trace file
    finally:
        os.close(fd)


def _wait(pid: int, deadline: float) -> int | None:
    """The child's exit status, or None if it has not exited by `deadline` (a fork that met a lock
    another thread held must not hang the parse)."""
    delay = 0.0005
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= deadline:
            return None
        time.sleep(delay)
        delay = min(2 * delay, 0.05)


def _kill(pid: int, fd: int) -> None:
    os.close(fd)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
