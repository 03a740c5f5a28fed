"""One large plain-JSON trace decoded by several processes at once.

The `traceEvents` array is cut at event boundaries into byte ranges (`decode.plan_event_parts`); this
process decodes the first range while forked children decode the others into `kineto.Columns`, and
the parts are merged in order (`kineto.merge_columns`): the same columns one process would decode.
Each child hands its columns back pickled, in an anonymous memory file (memfd) this process created
for it: the bytes are our own fork's, never a file's content, so nothing read from a trace is
unpickled. Anything unusual (a cut inside a string, a layout the planner does not know, a child that
dies, gzip input, no `fork`) makes `decode_columns_split` return None and the caller decodes the file
in one process, so results never depend on the split; only the time does.
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import sys
from tracekit.parse import decode as D
from tracekit.parse.gz import GZIP_MAGIC
from tracekit.parse.kineto import CHUNK_BYTES, Columns, decode_columns, gc_paused, merge_columns

MIN_PART_BYTES = 16 << 20
"""No process gets less JSON than this (a fork, pickling the part back and merging cost ~1 ms per MB
less than decoding it; below ~16 MB the split gains too little to be worth the processes)."""


def split_processes(size: int, processes: int) -> int:
    """How many processes decode a plain file of `size` bytes when `processes` are available."""
    return max(1, min(processes, size // MIN_PART_BYTES))


def can_fork() -> bool:
    """Linux only: forking a process that holds other threads is what Linux's multiprocessing did by
    default for decades; elsewhere (macOS frameworks) it is not safe."""
    return sys.platform.startswith("linux") and hasattr(os, "fork") and hasattr(os, "memfd_create")


def decode_columns_split(path: str, processes: int, max_decompressed_bytes: int | None = None) -> Columns | None:
    """The file's columns decoded by up to `processes` processes; None: decode it in one instead."""
    if processes < 2 or not can_fork():
        return None
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if f.read(2) == GZIP_MAGIC or (max_decompressed_bytes is not None and size > max_decompressed_bytes):
                return None
            processes = split_processes(size, processes)
            if processes < 2:
                return None
            plan = D.plan_event_parts(lambda at, n: os.pread(f.fileno(), n, at), size, processes)
    except OSError:
        return None
    if plan is None or len(plan[1]) < 2:
        return None
    top, ranges = plan
    with gc_paused():
        parts = _decode_ranges(path, ranges)
    return None if parts is None else merge_columns(parts, top)


def _decode_ranges(path: str, ranges: list[tuple[int, int]]) -> list[Columns] | None:
    """Columns of each range, the first decoded here and the others in forked children."""
    pending: list[tuple[int, int]] = []
    try:
        for a, b in ranges[1:]:
            pending.append(_fork_decoder(path, a, b))
        parts = [decode_range(path, *ranges[0])]
        while pending and parts[-1] is not None:
            parts.append(_receive(*pending.pop(0)))
    except OSError:
        return None
    finally:
        for pid, fd in pending:  # after a failure or an interrupt: the rest is not needed
            _kill(pid, fd)
    return None if parts[-1] is None else parts


def decode_range(path: str, a: int, b: int) -> Columns | None:
    """Columns of the whole events in bytes [a, b) of `path` (None: they are not a run of whole events)."""
    return decode_columns(D.squeeze_whitespace(_range_blocks(path, a, b)), exact_close=True)


def _range_blocks(path: str, a: int, b: int):
    yield b'{"traceEvents":['
    with open(path, "rb") as f:
        f.seek(a)
        while a < b:
            block = f.read(min(CHUNK_BYTES, b - a))
            if not block:
                break
            a += len(block)
            yield block
    yield b"]}"


def _fork_decoder(path: str, a: int, b: int) -> tuple[int, int]:
    """(pid, memory file) of a child that decodes bytes [a, b) and writes the pickled columns into the
    memory file (a pipe would block the child until this process reads it)."""
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
                pickle.dump(decode_range(path, a, b), out, protocol=pickle.HIGHEST_PROTOCOL)
            status = 0
        finally:
            os._exit(status)
    return pid, fd


def _receive(pid: int, fd: int) -> Columns | None:
    """A child's columns, once it has exited (None when it failed or found no run of whole events)."""
    try:
        _, status = os.waitpid(pid, 0)
        size = os.fstat(fd).st_size
        if status != 0 or size == 0:
            return None
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as data:
            return pickle.loads(data)  # noqa: S301 - our own fork's output in our own memory file, no trace file
    finally:
        os.close(fd)


def _kill(pid: int, fd: int) -> None:
    os.close(fd)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
