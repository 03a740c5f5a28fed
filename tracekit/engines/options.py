"""Parsing of the scale options shared by `tracekit parse` and `tracekit analyze`."""

from __future__ import annotations

import os
import re

_UNITS = {"": 1 << 20, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40}


def parse_memory_size(text: str) -> int:
    """'512MB', '4GiB', '2g' → bytes; a bare number is MiB. Raises ValueError naming the text."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text or "")
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a memory size (e.g. 512MB, 4GiB, or MiB as a number)")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"{text!r}: memory size must be positive")
    return value


AUTO_WORKERS = 0
"""`--workers 0` (the default): one worker per core this process may run on; the local engine then
also caps them by the files to parse and the free memory (`tracekit.parse.pool.memory_workers`)."""


def available_cores() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)


def engine_from_options(engine: str, *, workers: int, address: str | None, max_memory: str | None,
                        whole_command: bool = False):
    """(Engine, max_memory_bytes) from CLI options; ValueError with a user-facing message when invalid.
    `whole_command` (tracekit analyze): the budget is the whole command's, this process and its workers
    (the engine gets a MemoryBudget that plans and watches it, engines/budget.py); otherwise it is each
    parse's (tracekit parse: a file whose parse would exceed it is parsed in chunks)."""
    from tracekit.engines import ENGINES, make_engine

    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if workers < 0:
        raise ValueError(f"--workers must be 0 (one per core) or more, got {workers}")
    budget = parse_memory_size(max_memory) if max_memory is not None else None
    auto = workers == AUTO_WORKERS
    made = make_engine(engine, workers=available_cores() if auto else workers, address=address, auto=auto)
    if budget is not None and whole_command:
        from tracekit.engines.budget import MemoryBudget

        made.budget = MemoryBudget(budget)
    return made, budget
