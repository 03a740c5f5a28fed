"""Parse many Kineto files over a process pool; tables come back through Arrow IPC files, not pickles.

Each worker parses one file (the chunked, bounded-memory path when the file is over the memory
budget, see `chunked`), writes its tables as Arrow IPC streams into a spill folder (/dev/shm when
available) and returns only the small rest of the parse. The parent memory-maps the tables (no copy,
no unpickling of table data; DESIGN §9 measured pickling back ~25% slower), hands them on, and
deletes the files. At most two files per worker are in flight, so memory does not grow with ranks.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from tracekit.errors import TraceFormatError, TracekitError
from tracekit.parse.gz import json_size_bytes
from tracekit.parse.ops import derived_tables
from tracekit.parse.spilled import SpilledTable
from tracekit.tables.arrow_env import pandas_deferred

NORMAL_PATH_MEMORY_FACTOR = 1.5
"""Peak memory of the one-shot parser above the interpreter ÷ JSON size (measured 1.44x at 255 MB, parser of 2026-11-21)."""

ParseResult = tuple[str, Any, "str | None"]
"""(path, KinetoParse or None, reason it was skipped or None)."""


@dataclass(frozen=True, slots=True)
class ParseJob:
    path: str
    max_decompressed_bytes: int | None
    max_memory_bytes: int | None
    spill_dir: str | None
    """Where to write the tables as Arrow IPC (None: keep them in the returned object)."""
    lazy_events: bool = False
    """A chunked parse hands its events over as the chunks' files (`SpilledTable`), read one part at a
    time by the store writer; only for a consumer on this machine (not Ray)."""
    processes: int = 1
    """Processes that may decode this one file (parse/split.py: 32 MB of JSON or more, plain or gzip)."""
    chunk_dir: str | None = None
    """Where a chunked parse spills its chunks: the submitting process's temp dir (a pool's fork server
    keeps the environment it started with, so the worker's own would be a different, older choice)."""


def needs_chunking(path: str | Path, max_memory_bytes: int | None) -> bool:
    """True when the one-shot parser would exceed the budget on this file."""
    if max_memory_bytes is None:
        return False
    size = json_size_bytes(path)
    return size is None or size * NORMAL_PATH_MEMORY_FACTOR > max_memory_bytes


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


WORKER_MEMORY_SHARE = 0.6
"""Share of the free memory that parse workers may plan on."""


def memory_workers(paths: list[str], max_memory_bytes: int | None) -> int:
    """How many files can be parsed at once in the free memory: each worker needs its parse's peak
    (NORMAL_PATH_MEMORY_FACTOR x the largest JSON, or the budget when it chunks) and the result it
    hands over (about that file's JSON size again, spilled to /dev/shm) at once."""
    free = available_memory_bytes()
    if free is None or not paths:
        return len(paths) or 1
    sizes = [json_size_bytes(p) or 4 * os.path.getsize(p) for p in paths]
    largest = max(sizes)
    parse_peak = min(largest * NORMAL_PATH_MEMORY_FACTOR, max_memory_bytes or float("inf"))
    return max(1, int(free * WORKER_MEMORY_SHARE // max(parse_peak + largest, 1)))


def parse_file(path: str, *, max_decompressed_bytes: int | None = None, max_memory_bytes: int | None = None,
               lazy_events: bool = False, processes: int = 1, chunk_dir: str | None = None) -> Any:
    """One Kineto file → KinetoParse, by the chunked path when the file is over the memory budget
    (pyarrow does not import pandas for it: tables/arrow_env.py), else decoded by up to `processes`."""
    with pandas_deferred():
        if needs_chunking(path, max_memory_bytes):
            from tracekit.parse.chunked import parse_kineto_chunked

            return parse_kineto_chunked(path, max_memory_bytes=max_memory_bytes,
                                        max_decompressed_bytes=max_decompressed_bytes, lazy_events=lazy_events,
                                        spill_dir=chunk_dir)
        from tracekit.parse.kineto import parse_kineto
        from tracekit.parse.split import decode_columns_split

        cols = decode_columns_split(path, processes, max_decompressed_bytes)
        return parse_kineto(path, max_decompressed_bytes=max_decompressed_bytes, columns=cols)


def run_job(job: ParseJob) -> tuple[str, Any, str | None, dict[str, str]]:
    """Worker body: (path, KinetoParse without tables or None, error, {table: IPC file}). Never raises for bad input."""
    try:
        kp = parse_file(job.path, max_decompressed_bytes=job.max_decompressed_bytes,
                        max_memory_bytes=job.max_memory_bytes, lazy_events=job.lazy_events, processes=job.processes,
                        chunk_dir=job.chunk_dir)
    except TraceFormatError as exc:
        return job.path, None, exc.reason, {}
    except TracekitError as exc:
        return job.path, None, str(exc), {}
    except Exception as exc:  # a parser bug on one file must not lose the whole run; it is reported
        return job.path, None, f"could not be parsed ({type(exc).__name__}: {exc})", {}
    try:  # the per-rank derived tables here, in the worker (the parent's writer finishes what this leaves)
        kp = replace(kp, tables={**kp.tables, **derived_tables(kp.tables)})
    except Exception:  # noqa: BLE001 - left to the writer, which reports a bad trace as it always has
        pass
    if job.spill_dir is None:
        return job.path, kp, None, {}
    files = spill_tables(kp.tables, job.spill_dir)
    return job.path, replace(kp, tables={}), None, files


def spill_tables(tables: dict[str, Any], spill_dir: str) -> dict[str, Any]:
    """Write tables as Arrow IPC streams (streams allow a new dictionary per batch); a table already on
    disk (`SpilledTable`) is handed over as it is."""
    fd, base = tempfile.mkstemp(prefix="tk-", dir=spill_dir)
    os.close(fd)
    os.unlink(base)
    files: dict[str, Any] = {}
    for name, table in tables.items():
        if isinstance(table, SpilledTable):
            files[name] = table
            continue
        p = f"{base}.{name}.arrows"
        with pa.OSFile(p, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        files[name] = p
    return files


def load_spilled(files: dict[str, Any]) -> dict[str, Any]:
    """Memory-map spilled tables (zero copy) and unlink the files (the mapping stays valid)."""
    out: dict[str, Any] = {}
    for name, p in files.items():
        if isinstance(p, SpilledTable):
            out[name] = p
            continue
        with pa.memory_map(p) as src:
            out[name] = pa.ipc.open_stream(src).read_all()
        os.unlink(p)
    return out


def default_spill_dir() -> str:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return str(shm)
    return tempfile.gettempdir()


FORKSERVER_PRELOAD = ["tracekit.parse.kineto", "tracekit.parse.pool", "tracekit.engines.rank_tasks"]
"""Imported once by the fork server: workers share these pages (the parser's and the analysis tasks'
modules; neither imports pandas)."""


def pool_context():
    """The multiprocessing context of tracekit's worker pools (fork server preloaded with the parser)."""
    import multiprocessing as mp

    if "forkserver" in mp.get_all_start_methods():
        # fork from a clean server that imported the parser once (this process may hold threads)
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        return ctx
    return mp.get_context("spawn")


def start_pool_server() -> None:
    """Start the fork server now, so its imports (~0.7 s) overlap the caller's own work (discovery,
    collective logs) instead of delaying the first parse."""
    import multiprocessing as mp
    from multiprocessing import forkserver

    if "forkserver" in mp.get_all_start_methods():
        pool_context()
        forkserver.ensure_running()


def parse_kineto_files(paths: list[str], *, workers: int = 1, max_decompressed_bytes: int | None = None,
                       max_memory_bytes: int | None = None, spill_dir: str | None = None,
                       processes: int | None = None) -> Iterator[ParseResult]:
    """Parse `paths` in order of completion-bounded submission; yields (path, KinetoParse|None, error).
    `workers` files at a time; `processes` (default: `workers`) in all, so with fewer files than
    processes one large file is decoded by several (parse/split.py)."""
    split = max(1, (processes or workers) // max(1, min(workers, len(paths))))
    chunk_dir = tempfile.gettempdir()
    if workers <= 1 or len(paths) <= 1:
        for p in paths:
            path, kp, err, _ = run_job(ParseJob(p, max_decompressed_bytes, max_memory_bytes, None, lazy_events=True,
                                                processes=split, chunk_dir=chunk_dir))
            yield path, kp, err
        return
    from concurrent.futures import ProcessPoolExecutor  # here: a one-file parse never loads it (~15 ms)

    own_dir = tempfile.mkdtemp(prefix="tracekit-spill-", dir=spill_dir or default_spill_dir())
    jobs = iter(ParseJob(p, max_decompressed_bytes, max_memory_bytes, own_dir, lazy_events=True, processes=split,
                         chunk_dir=chunk_dir) for p in paths)
    try:
        with ProcessPoolExecutor(max_workers=min(workers, len(paths)), mp_context=pool_context()) as pool:
            pending: deque = deque()
            for job in jobs:
                pending.append(pool.submit(run_job, job))
                if len(pending) >= 2 * workers:
                    break
            while pending:
                path, kp, err, files = pending.popleft().result()
                nxt = next(jobs, None)
                if nxt is not None:
                    pending.append(pool.submit(run_job, nxt))
                if kp is not None and files:
                    kp = replace(kp, tables=load_spilled(files))
                yield path, kp, err
    finally:
        shutil.rmtree(own_dir, ignore_errors=True)


class PoolParser:
    """parse_run's engine when none is given: Kineto files on a local process pool of `workers`
    (tracekit.engines.LocalEngine adds automatic sizing and per-rank analysis tasks)."""

    parses_locally = True
    """Its processes run on this machine (parse_run may decode a merged file here with as many)."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers

    def warm_up(self) -> None:
        if self.workers > 1:
            start_pool_server()

    def parse_kineto_files(self, paths: list[str], *, max_decompressed_bytes: int | None = None,
                           max_memory_bytes: int | None = None) -> Iterator[ParseResult]:
        return parse_kineto_files(paths, workers=self.workers, max_decompressed_bytes=max_decompressed_bytes,
                                  max_memory_bytes=max_memory_bytes)
