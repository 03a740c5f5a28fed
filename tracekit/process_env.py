"""Environment defaults for tracekit's own processes, and the user's environment without them.

Two settings make a tracekit command lighter without changing a result: pyarrow's jemalloc pool (its
default, mimalloc, keeps more freed pages: a 45 KB analyze peaks 10 MB higher, the 1,024-rank scale
benchmark's analyze 5% higher; the C allocator is 2 MB lower on the small run but 9% higher on the large
one) and single-threaded OpenBLAS (numpy starts a BLAS thread per core that spins ~0.07 s of CPU at import;
tracekit does no large linear algebra). Both are read when numpy / pyarrow load, so `apply_defaults`
runs first thing in the CLI; worker processes inherit them. A variable the user set is left alone,
and `tracekit record` starts the user's job with `user_environ()`: the job never sees ours.
`release_memory` hands freed memory back to the OS between the steps of a large run.
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
"""glibc (malloc_trim, mallopt), None where there is none."""


def release_memory() -> None:
    """Give freed memory back to the OS: glibc keeps the many small blocks a step freed (the chunked parse's
    decode: ~40 MB at a 64 MB budget; each analyzer of a 1,024-rank partial recording: the main process held
    680 MB before the critical path, 449 MB with this after each analyzer); Arrow's pool keeps its own."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    if LIBC is not None:
        LIBC.malloc_trim(0)
