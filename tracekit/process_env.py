"""Environment defaults for tracekit's own processes, and the user's environment without them.

Three settings make a tracekit command lighter without changing a result: no transparent huge pages for
numpy's arrays (below, at DEFAULTS), pyarrow's jemalloc pool (its
default, mimalloc, keeps more freed pages: a 45 KB analyze peaks 10 MB higher, the 1,024-rank scale
benchmark's analyze 5% higher; the C allocator is 2 MB lower on the small run but 9% higher on the large
one) and single-threaded OpenBLAS (numpy starts a BLAS thread per core that spins ~0.07 s of CPU at import;
tracekit does no large linear algebra). Both are read when numpy / pyarrow load, so `apply_defaults`
runs first thing in the CLI; worker processes inherit them. A variable the user set is left alone,
and `tracekit record` starts the user's job with `user_environ()`: the job never sees ours.
The C allocator's handles for a process's large phases: freed memory given back (`release_memory`), and large
blocks served from the heap, or mapped so that freeing unmaps them under a memory budget (`large_blocks`).
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DEFAULTS = {"OPENBLAS_NUM_THREADS": "1"}
if sys.platform == "linux":  # pyarrow's Linux wheels carry jemalloc; elsewhere its default stays
    DEFAULTS["ARROW_DEFAULT_MEMORY_POOL"] = "jemalloc"
    # numpy asks for transparent huge pages on every array of 4 MB or more (madvise): each first touch of such
    # an array then has the kernel zero a 2 MB page, and a large analysis allocates and frees node- and row-
    # sized temporaries (tens of MB) by the thousand. Measured on this project's 2-core VM, 10,000-rank
    # matching alone: 19.7 user + 22.5 kernel CPU-s with them (the kernel's time in clear_page), 16.9 + 4.5
    # without; the same tables. numpy documents the switch (NUMPY_MADVISE_HUGEPAGE, read when it loads).
    DEFAULTS["NUMPY_MADVISE_HUGEPAGE"] = "0"
_SET: set[str] = set()
"""The DEFAULTS keys this process set (absent from the environment it was started with)."""


def apply_defaults() -> None:
    """Set each of DEFAULTS the environment does not already have."""
    for key, value in DEFAULTS.items():
        if key not in os.environ:
            os.environ[key] = value
            _SET.add(key)


def user_environ() -> dict[str, str]:
    """The environment as the user started tracekit with it (without what apply_defaults set)."""
    return {k: v for k, v in os.environ.items() if k not in _SET}


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off meanwhile (and back on after, if it was): building millions of small
    objects that form no reference cycles (decoded events, simulated ops, exported event dicts), each full
    collection walks every live one again; the parser's decode ran at half speed, and a 256-rank simulation
    spent 30% of its CPU there (DESIGN §9)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _libc() -> Any:
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


LIBC = _libc() if os.name == "posix" else None
"""glibc (None elsewhere): `release_memory`, parse/chunked.py's `bound_allocator`."""


def release_memory() -> None:
    """Give freed memory back to the OS: Arrow's pool keeps its freed blocks, and glibc its freed heap. Many
    small freed blocks (a chunk's decode: ~40 MB at a 64 MB budget), and numpy arrays below glibc's mmap
    threshold, which it raises to the size of the largest block freed so far (up to 32 MiB: a 1,024-rank
    graph's 4 M-node arrays then come from the heap, and a what-if's temporaries stay resident once freed).
    Called between the analyzers and the assessment's steps: at a 1,024-rank partial recording the main process
    held 680 MB before the critical path, 449 MB with it."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    if LIBC is not None:
        LIBC.malloc_trim(0)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
"""glibc's mallopt parameters."""
DEFAULT_MMAP_MAX = 65536
"""glibc's default M_MMAP_MAX."""
_MEMORY_FIRST: list[bool] = [False]
"""Inside `memory_first()`: large phases keep their peak low rather than their CPU time (`large_blocks`)."""


@contextmanager
def memory_first(on: bool = True) -> Iterator[None]:
    """While inside (with `on`), `large_blocks` maps large blocks so that freeing unmaps them: `tracekit analyze
    --max-memory` (a budget to keep) runs its analysis so."""
    before = _MEMORY_FIRST[0]
    _MEMORY_FIRST[0] = on
    try:
        yield
    finally:
        _MEMORY_FIRST[0] = before


@contextmanager
def large_blocks(nbytes: int) -> Iterator[None]:
    """A large phase's allocations (the critical path's graph and each what-if's node-sized temporaries, tens of
    MB each on a large run). Inside `memory_first()`: every block over `nbytes` mmapped from now on, so a freed
    temporary leaves the process (`fixed_mmap_threshold`). Otherwise: no block mmapped while inside, so a freed
    temporary's pages serve the next one from the heap instead of fresh pages the kernel zeroes on first touch.
    Measured on the critical path alone (same inputs, same output): 10,000 ranks 162 -> 139 CPU-s (kernel time
    75 -> 53 s), peak 7,604 -> 8,272 MB; 1,024 simulated ranks 62-64 -> 50 CPU-s, peak 1,590 -> 1,726 MB."""
    if LIBC is None or not hasattr(LIBC, "mallopt"):
        yield
        return
    if _MEMORY_FIRST[0]:
        fixed_mmap_threshold(nbytes)
        yield
        return
    LIBC.mallopt(M_MMAP_MAX, 0)
    try:
        yield
    finally:
        LIBC.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)


def fixed_mmap_threshold(nbytes: int) -> None:
    """glibc: every block over `nbytes` mmapped, so unmapped when freed, from now on in this process. Its
    default raises the threshold to the largest block freed so far (up to 32 MiB), after which a large
    run's node arrays come from the heap and their freed space stays resident (`release_memory`)."""
    if LIBC is not None and hasattr(LIBC, "mallopt"):
        LIBC.mallopt(M_MMAP_THRESHOLD, nbytes)
