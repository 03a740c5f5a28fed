"""Environment defaults for tracekit's own processes, and the user's environment without them.

Two settings make a tracekit command lighter without changing a result: pyarrow's C allocator (its
default, mimalloc, keeps freed pages: a 90 MB parse peaks 24 MB higher, a 45 KB analyze 12 MB) and
single-threaded OpenBLAS (numpy starts a BLAS thread per core that spins ~0.07 s of CPU at import;
tracekit does no large linear algebra). Both are read when numpy / pyarrow load, so `apply_defaults`
runs first thing in the CLI; worker processes inherit them. A variable the user set is left alone,
and `tracekit record` starts the user's job with `user_environ()`: the job never sees ours.
"""

from __future__ import annotations

import os

DEFAULTS = {"ARROW_DEFAULT_MEMORY_POOL": "system", "OPENBLAS_NUM_THREADS": "1"}
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
