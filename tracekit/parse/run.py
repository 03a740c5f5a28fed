"""Assembles a run store from a directory of traces and logs: `parse_run(trace_dir, store_dir)`.

Steps: discover inputs; read the small ones (manifest, ground truth, comms logs, Flight Recorder
dumps, side logs) and give each a rank; parse Kineto traces one at a time (or over a process pool),
settle each file's rank (distributedInfo, else file name, else skipped: never a default), join its
collectives with that rank's log, derive pipeline rows from `pp:` labels, and append every table
through RunStoreWriter (one row group per rank, bounded memory). Ranks known only from logs still
get their collectives and a `ranks` row. Everything not used is listed in meta inputs.skipped.

Collectives keep both sources: Kineto rows (source "kineto", seq filled from the log where
matched) and log rows (source "comms-log" / "flight-recorder"); analyzers select by `source`.
Log times are put on the Kineto trace's clock of the same rank (see `_trace_epoch_ns`), and
`ranks.clock_offset_ns` is filled where host and manifest allow (see `_clock_offsets`).
"""

from __future__ import annotations

import json
import re
import tempfile
from contextlib import nullcontext
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.errors import RankIdentityError, TraceFormatError, TracekitError
from tracekit.parse import discover as disc
from tracekit.parse.classify import group_dim
from tracekit.parse.comms_log import CommsLogParse, parse_comms_log, parse_comms_logs_task, read_comms_log_header
from tracekit.parse.cuda_graphs import captured_graphs, has_capture, load_captured_graphs
from tracekit.parse.flight_recorder import FlightRecorderParse, parse_flight_recorder
from tracekit.parse.join import join_collectives
from tracekit.parse.memory import parse_memory_snapshot
from tracekit.parse.ops import DERIVED, OpCollector
from tracekit.parse.merged_ranks import decode_merged, rank_document_path
from tracekit.parse.spilled import table_parts
from tracekit.tables.arrow_env import pandas_deferred
from tracekit.tables.schema import PIPELINE, ROUTING, conform
from tracekit.tables.store import RunStore, RunStoreWriter

# `record_function` labels of pipeline phases, e.g. "pp:stage1:mb3:fwd" (stage = virtual stage).
PIPELINE_LABEL = re.compile(
    r"^pp[:/]stage[_-]?(\d+)[:/](?:mb|microbatch)[_-]?(\d+)[:/](fwd|bwd|bwd_input|bwd_weight|send|recv|forward|backward)$")
_PHASE_ALIASES = {"forward": "fwd", "backward": "bwd"}
_MISSING_RANKS_SHOWN = 32


@dataclass
class ParseRunResult:
    store: RunStore
    skipped: list[dict[str, str]]


@dataclass
class _RankLogs:
    """The per-rank inputs found before the Kineto traces (comms logs are read in full only when written)."""

    comms_path: str | None = None
    comms_rank_source: str | None = None
    comms: CommsLogParse | None = None
    comms_error: str | None = None
    """why an engine task could not parse the comms log (`_comms_logs_parsed`)"""
    comms_taken: bool = False
    """the comms log was parsed (or skipped) and its rank source, warnings and partial flag taken"""
    fr: FlightRecorderParse | None = None
    routing: list[pa.Table] = field(default_factory=list)
    pipeline: list[pa.Table] = field(default_factory=list)
    memory_segments: list[pa.Table] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)


def _set_rank(table: pa.Table, rank: int) -> pa.Table:
    col = pa.array(np.full(table.num_rows, rank, dtype=np.int32))
    if "rank" in table.column_names:
        return table.set_column(table.column_names.index("rank"), "rank", col)
    return table.append_column("rank", col)


def _claim(claims: dict[int, str], rank: int, path: str, what: str, skipped: list[dict[str, str]]) -> bool:
    """Register `path` as rank `rank`'s `what`; on a conflict skip it with both file names."""
    first = claims.get(rank)
    if first is None:
        claims[rank] = path
        return True
    err = RankIdentityError(path, f"rank {rank} is claimed by two {what} files: {first} and {path}; kept {first}")
    skipped.append({"file": path, "reason": err.reason})
    return False


def lone_trace_rank(path: str, assume_rank: int | None) -> tuple[int, str, str]:
    """Rank, its source and the warning for the only Kineto trace of a run when it states no rank (a
    single-GPU profile): the user's --rank, else 0."""
    if assume_rank is not None:
        return assume_rank, "user (--rank)", (f"{Path(path).name}: no rank in the file or its name; rank "
                                              f"{assume_rank} as given by --rank")
    return 0, "assumed (lone trace)", (f"{Path(path).name}: no rank in the file or its name; analysed as rank 0 "
                                       "(the only trace here; pass --rank R if it is another rank)")


def _identify(parsed_rank: int | None, parsed_source: str | None, name_rank: int | None, path: str,
              warnings: list[str]) -> tuple[int, str]:
    """Rank and where it came from: the file's own content, else its name; else RankIdentityError."""
    if parsed_rank is not None:
        if name_rank is not None and name_rank != parsed_rank:
            warnings.append(f"{Path(path).name}: content says rank {parsed_rank}, file name says "
                            f"{name_rank}; using {parsed_rank}")
        return parsed_rank, parsed_source or "content"
    if name_rank is not None:
        return name_rank, "filename"
    raise RankIdentityError(path, "no rank in the file (distributedInfo/header/dump) nor in its name "
                                  "(e.g. rank3.pt.trace.json.gz, or <prefix><rank> shared by a folder's "
                                  "dumps such as _dump_3); not assuming one (--rank-from-name REGEX gives it)")


# ---- side logs (routing / pipeline) -----------------------------------------------------------------

def _read_jsonl(path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    out = []
    lines = path.read_bytes().split(b"\n")
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            warnings.append(f"{path.name}: line {i + 1} is not valid JSON ({'cut off' if i == len(lines) - 1 else 'skipped'})")
            continue
        if isinstance(obj, dict) and obj.get("type") not in ("header", "footer"):
            out.append(obj)
    return out


def parse_routing_log(path: Path, rank: int, warnings: list[str]) -> pa.Table:
    """`routing.rank{R}.jsonl`: one object per (step, layer) with per-expert lists
    {step, layer, tokens: [..], dropped: [..], capacity}, or one per (step, layer, expert)."""
    rows = []
    for obj in _read_jsonl(path, warnings):
        tokens = obj.get("tokens")
        if isinstance(tokens, list):
            dropped = obj.get("dropped") or [None] * len(tokens)
            first = int(obj.get("expert_offset", 0))
            for e, t in enumerate(tokens):
                rows.append({"rank": rank, "step": obj.get("step"), "layer": obj.get("layer"), "expert": first + e,
                             "tokens": t, "dropped": dropped[e] if e < len(dropped) else None,
                             "capacity": obj.get("capacity")})
        else:
            rows.append({"rank": rank, "step": obj.get("step"), "layer": obj.get("layer"), "expert": obj.get("expert"),
                         "tokens": tokens, "dropped": obj.get("dropped"), "capacity": obj.get("capacity")})
    rows = [r for r in rows if None not in (r["step"], r["layer"], r["expert"])]
    return pa.Table.from_pylist(rows, schema=ROUTING)


def parse_pipeline_log(path: Path, rank: int, warnings: list[str]) -> pa.Table:
    """`pipeline.rank{R}.jsonl`: {step, stage, microbatch, phase, ts_ns, dur_ns} (or start_ns/end_ns), wall clock ns."""
    rows = []
    for obj in _read_jsonl(path, warnings):
        ts = obj.get("ts_ns", obj.get("start_ns", obj.get("ts")))
        dur = obj.get("dur_ns", obj.get("dur"))
        if dur is None and obj.get("end_ns") is not None and ts is not None:
            dur = int(obj["end_ns"]) - int(ts)
        if ts is None:
            continue
        rows.append({"rank": rank, "step": obj.get("step"), "stage": obj.get("stage"),
                     "microbatch": obj.get("microbatch"), "phase": _PHASE_ALIASES.get(obj.get("phase"), obj.get("phase")),
                     "ts": int(ts), "dur": None if dur is None else int(dur)})
    return conform("pipeline", pa.Table.from_pylist(
        rows, schema=pa.schema([f if f.name != "phase" else pa.field("phase", pa.string()) for f in PIPELINE])))


def pipeline_from_events(events: pa.Table) -> pa.Table:
    """`pipeline` rows from `pp:stage{S}:mb{M}:{phase}` labels in the events table."""
    if events.num_rows == 0 or "name" not in events.column_names:
        return PIPELINE.empty_table()
    masks = []
    for chunk in events.column("name").chunks:
        if pa.types.is_dictionary(chunk.type):
            dmask = pc.match_substring_regex(chunk.dictionary, PIPELINE_LABEL.pattern)
            masks.append(pc.fill_null(pc.take(dmask, chunk.indices), False))
        else:
            masks.append(pc.fill_null(pc.match_substring_regex(chunk, PIPELINE_LABEL.pattern), False))
    mask = pa.chunked_array(masks, type=pa.bool_())
    hits = events.filter(mask)
    if hits.num_rows == 0:
        return PIPELINE.empty_table()
    cols = {c: hits.column(c).to_pylist() for c in ("rank", "name", "ts", "dur", "step") if c in hits.column_names}
    rows = []
    for i, name in enumerate(cols["name"]):
        m = PIPELINE_LABEL.match(name)
        rows.append({"rank": cols["rank"][i], "step": cols.get("step", [None] * len(cols["name"]))[i],
                     "stage": int(m.group(1)), "microbatch": int(m.group(2)),
                     "phase": _PHASE_ALIASES.get(m.group(3), m.group(3)), "ts": cols["ts"][i], "dur": cols["dur"][i]})
    return conform("pipeline", pa.Table.from_pylist(
        rows, schema=pa.schema([f if f.name != "phase" else pa.field("phase", pa.string()) for f in PIPELINE])))


# ---- Kineto ---------------------------------------------------------------------------------------

# Parsing the Kineto files themselves (process pool / Ray, chunked when over budget) lives in
# tracekit/parse/pool.py and tracekit/engines/.


def _trace_epoch_ns(info: dict[str, Any]) -> int:
    """What to subtract from wall-clock ns to land on this rank's Kineto clock (0: the trace is wall clock).

    Kineto writes `ts` relative to `baseTimeNanoseconds` when that field is present (base + ts is the
    wall clock); older traces carry absolute epoch times. Relative times are far below the base.
    """
    base = info.get("base_time_ns")
    first = info.get("first_ts")
    if not base or first is None:
        return 0
    return int(base) if 0 <= first < int(base) // 2 else 0


def _clock_offsets(rows: list[dict[str, Any]], manifest: Any, warnings: list[str]) -> None:
    """Fill `clock_offset_ns` (this rank's stored times minus the reference rank's, for one instant).

    The reference is rank 0 (else the lowest rank). offset = host clock difference + difference of the
    ranks' time epochs (Kineto base times). Ranks on the reference's host share its clock (host part 0);
    ranks on other hosts use the manifest's barrier anchors (`tracekit record`: clock_anchors[r].barrier_samples,
    the runtime: clock_offset_ns); otherwise the offset stays null and analyzers estimate it.
    """
    if not rows:
        return
    by_rank = {r["rank"]: r for r in rows}
    ref = 0 if 0 in by_rank else min(by_rank)
    man = manifest if isinstance(manifest, dict) else {}
    anchors = man.get("clock_anchors") if isinstance(man.get("clock_anchors"), dict) else {}
    runtime_offsets = man.get("clock_offset_ns") if isinstance(man.get("clock_offset_ns"), dict) else {}

    def barrier_diff(r: int) -> int | None:
        a, b = anchors.get(str(r)) or {}, anchors.get(str(ref)) or {}
        sa, sb = a.get("barrier_samples") or [], b.get("barrier_samples") or []
        diffs = sorted(int(x["wall_ns"]) - int(y["wall_ns"]) for x, y in zip(sa, sb)
                       if isinstance(x, dict) and isinstance(y, dict) and "wall_ns" in x and "wall_ns" in y)
        if diffs:
            return diffs[len(diffs) // 2]
        if str(r) in runtime_offsets and str(ref) in runtime_offsets:
            return int(runtime_offsets[str(r)]) - int(runtime_offsets[str(ref)])
        return None

    ref_host = by_rank[ref]["hostname"]
    for r, row in by_rank.items():
        if r == ref:
            host_diff = 0
        elif row["hostname"] is not None and row["hostname"] == ref_host:
            host_diff = 0
        elif row["hostname"] is not None and ref_host is not None:
            host_diff = barrier_diff(r)
        else:
            host_diff = None
        if host_diff is not None:
            row["clock_offset_ns"] = host_diff + by_rank[ref]["_epoch"] - row["_epoch"]
    if any(row["clock_offset_ns"] is None for row in rows) and len(rows) > 1:
        warnings.append("clock offsets between ranks unknown for some ranks (different or unknown hosts "
                        "without manifest anchors); analyzers estimate them from collectives")


def _shift_times(table: pa.Table, shift: int) -> pa.Table:
    if not shift or table.num_rows == 0:
        return table
    for col in ("ts", "enqueue_ts"):
        if col in table.column_names:
            idx = table.column_names.index(col)
            table = table.set_column(idx, col, pc.subtract(table.column(col), pa.scalar(shift, pa.int64())))
    return table


# ---- process groups -------------------------------------------------------------------------------

class _GroupMerger:
    """Merges process-group descriptions from every rank: one row per (pg_name, ranks), with seen_by."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, tuple[int, ...] | None], dict[str, Any]] = {}
        self._ranks_by_name: dict[str, list[tuple[int, ...]]] = {}
        self._seen: dict[int, set[int]] = {}
        """per row (by id): its seen_by as a set (each of 10,000 ranks names the world group: a list scan
        per rank was quadratic)"""

    def add(self, groups: list[dict[str, Any]], rank: int) -> None:
        for g in groups:
            ranks = tuple(g["ranks"]) if g.get("ranks") else None
            if ranks is None:  # a description without ranks joins a same-name one that has them
                ranks = self._pick(g["pg_name"], rank)
            elif ranks not in self._ranks_by_name.setdefault(g["pg_name"], []):
                self._ranks_by_name[g["pg_name"]].append(ranks)
            key = (g["pg_name"], ranks)
            row = self.rows.get(key)
            if row is None:
                row = self.rows[key] = {"pg_name": g["pg_name"], "pg_desc": g.get("pg_desc"),
                                        "ranks": list(ranks) if ranks else None,
                                        "size": g.get("size") or (len(ranks) if ranks else None),
                                        "backend": g.get("backend"), "dim": None, "seen_by": []}
            for col in ("pg_desc", "backend", "size"):
                if row[col] is None and g.get(col) is not None:
                    row[col] = g[col]
            seen = self._seen.setdefault(id(row), set())
            if rank not in seen:
                seen.add(rank)
                row["seen_by"].append(rank)

    def _pick(self, pg_name: str, rank: int) -> tuple[int, ...] | None:
        """Ranks of the group named `pg_name` that `rank` belongs to (names may repeat across subgroups)."""
        options = self._ranks_by_name.get(pg_name) or []
        for ranks in options:
            if rank in ranks:
                return ranks
        return options[0] if len(options) == 1 else None

    def ranks_of(self, pg_name: str, rank: int) -> list[int] | None:
        ranks = self._pick(pg_name, rank)
        return list(ranks) if ranks else None

    def table(self) -> pa.Table:
        # A group first described without ranks, later with them: fold the rank-less row in.
        for (name, ranks), row in list(self.rows.items()):
            if ranks is None:
                target = next((r for (n, rk), r in self.rows.items() if n == name and rk is not None), None)
                if target is not None:
                    target["seen_by"] = sorted(set(target["seen_by"]) | set(row["seen_by"]))
                    for col in ("pg_desc", "backend"):
                        target[col] = target[col] if target[col] is not None else row[col]
                    del self.rows[(name, ranks)]
        rows = sorted(self.rows.values(), key=lambda r: (len(r["pg_name"]), r["pg_name"], r["ranks"] or []))
        for r in rows:
            r["seen_by"] = sorted(r["seen_by"])
            r["dim"] = group_dim(r["pg_desc"], r["pg_name"])
        return conform("process_groups", pa.Table.from_pylist(rows)) if rows else conform(
            "process_groups", pa.table({"pg_name": pa.array([], pa.string())}))


def _fill_group_ranks(table: pa.Table, groups: _GroupMerger) -> pa.Table:
    """Collectives rows without group_ranks get them from the merged process groups."""
    if table.num_rows == 0 or table.column("group_ranks").null_count == 0:
        return table
    names = table.column("pg_name").to_pylist()
    owner = table.column("rank").to_pylist()
    ranks = table.column("group_ranks").to_pylist()
    sizes = table.column("group_size").to_pylist()
    for i, name in enumerate(names):
        if ranks[i] is None and name is not None:
            ranks[i] = groups.ranks_of(name, owner[i])
            if ranks[i] is not None and sizes[i] is None:
                sizes[i] = len(ranks[i])
    table = table.set_column(table.column_names.index("group_ranks"), "group_ranks",
                             pa.array(ranks, pa.list_(pa.int32())))
    return table.set_column(table.column_names.index("group_size"), "group_size", pa.array(sizes, pa.int32()))


# ---- the run --------------------------------------------------------------------------------------

def _read_json_meta(path: Path, skipped: list[dict[str, str]]) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        skipped.append({"file": str(path), "reason": f"unreadable JSON ({exc})"})
        return None


def _progress(enabled: bool, total: int) -> tuple[Callable[[str], None], Callable[[], None]]:
    if not enabled:
        return (lambda _desc: None), (lambda: None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(TextColumn("parsing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.description}"), console=Console(stderr=True), transient=True)
    task = prog.add_task("", total=total)
    prog.start()
    return (lambda desc: prog.update(task, advance=1, description=desc)), prog.stop


@dataclass
class _Run:
    """What parsing a run accumulates: the store being written and everything meta.json will say."""

    writer: RunStoreWriter
    skipped: list[dict[str, str]]
    advance: Callable[[str], None]
    warnings: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    manifest: Any = None
    rank_warnings: dict[int, list[str]] = field(default_factory=dict)
    logs: dict[int, _RankLogs] = field(default_factory=dict)
    claims: dict[str, dict[int, str]] = field(default_factory=lambda: defaultdict(dict))
    world_sizes: dict[int, int] = field(default_factory=dict)
    groups: _GroupMerger = field(default_factory=lambda: _GroupMerger())
    join_stats: dict[int, dict[str, Any]] = field(default_factory=dict)
    partial_logs: list[str] = field(default_factory=list)
    rank_rows: list[dict[str, Any]] = field(default_factory=list)
    kept_events: dict[int, tuple[str, pa.Table]] = field(default_factory=dict)
    """rank -> (file, its events' (name, ts, dur)) for ranks that two Kineto files name: a later file of the
    rank is compared with the kept one (a duplicate whose events are all kept loses nothing)."""
    captured: list = field(default_factory=list)
    """CUDA-graph capture nodes (parse/cuda_graphs.py) naming graph replays' kernels."""
    deferred_ops: list = field(default_factory=list)
    """(rank, OpCollector) of ranks with graph launches: their ops are written at the end, once every capture
    trace of the run is known."""

    def claim(self, kind: str, rank: int, path: str, what: str) -> bool:
        return _claim(self.claims[kind], rank, path, what, self.skipped)


def parse_run(trace_dir: str | Path, store_dir: str | Path, *, workers: int = 1, progress: bool = True,
              max_decompressed_bytes: int | None = None, max_memory_bytes: int | None = None,
              engine: Any = None, assume_rank: int | None = None, capture: str | Path | None = None,
              rank_from_name: str | None = None) -> ParseRunResult:
    """Parse every input under `trace_dir` (a folder, or one file) into a run store at `store_dir`.

    Kineto files are parsed by `engine` (tracekit.engines: local process pool of `workers`, or Ray);
    a file whose one-shot parse would exceed `max_memory_bytes` takes the chunked path (parse/chunked.py).
    `assume_rank`: the user's rank for the one Kineto trace that states none (content or name; without it
    that trace is rank 0, with a warning); with several such traces each is skipped (one rank cannot be
    all of them). `capture`: the CUDA-graph capture trace(s) (file or folder) whose ops name the kernels the
    traces' graph launches ran (parse/cuda_graphs.py).
    all of them). `rank_from_name`: a regex whose group `rank` (else its first group) is the rank of a
    file whose name has no `rank<N>` (ValueError when it is not a regex with a group).
    """
    trace_dir = Path(trace_dir)
    if not (trace_dir.is_dir() or trace_dir.is_file()):
        raise TraceFormatError(str(trace_dir), "no such file or directory")
    if engine is None:
        from tracekit.parse.pool import PoolParser

        engine = PoolParser(workers=workers)
    # nothing here uses pandas, so pyarrow need not import it (tables/arrow_env.py); an engine that runs
    # third-party code here (Ray) may look for pandas itself
    with pandas_deferred() if getattr(engine, "pandas_free", True) else nullcontext():
        return _parse_found(disc.discover_inputs(trace_dir, disc.compile_rank_pattern(rank_from_name)), trace_dir, store_dir, engine, progress=progress,
                            max_decompressed_bytes=max_decompressed_bytes, max_memory_bytes=max_memory_bytes,
                            assume_rank=assume_rank, capture=capture)


def _parse_found(found: Any, trace_dir: Path, store_dir: str | Path, engine: Any, *, progress: bool,
                 max_decompressed_bytes: int | None, max_memory_bytes: int | None,
                 assume_rank: int | None, capture: str | Path | None = None) -> ParseRunResult:
    merged_here = _merged_processes(engine, max_memory_bytes) is not None
    if sum(not (merged_here and disc.is_merged_kineto(f.path)) for f in found.of_kind(disc.KINETO)) > 1:
        getattr(engine, "warm_up", lambda: None)()  # the pool's start-up overlaps reading the logs
    advance, stop = _progress(progress, sum(f.kind != disc.MANIFEST for f in found.inputs))
    run = _Run(writer=RunStoreWriter(Path(store_dir)), skipped=list(found.skipped), advance=advance,
               meta={"trace_dir": str(trace_dir)})
    if capture is not None:
        run.captured, notes = load_captured_graphs(Path(capture), max_decompressed_bytes)
        run.warnings.extend(notes)
        run.meta["capture"] = {"path": str(capture), "graphs": len(run.captured),
                               "nodes": sum(len(g) for g in run.captured)}
    _read_manifest(found, run)
    try:
        for f in found.inputs:  # 1. small per-rank inputs
            if f.kind not in (disc.MANIFEST, disc.KINETO):
                _read_side_input(f, run, max_decompressed_bytes)
        kineto = found.of_kind(disc.KINETO)  # 2. Kineto traces, one rank at a time
        with tempfile.TemporaryDirectory(prefix="tracekit-split-") as tmp:  # merged multi-rank files, split
            paths, name_ranks, shown, decoded = _split_merged_files(kineto, Path(tmp), run, max_decompressed_bytes,
                                                                    _merged_processes(engine, max_memory_bytes))
            rest = [p for p in paths if p not in decoded]
            results = engine.parse_kineto_files(rest, max_decompressed_bytes=max_decompressed_bytes,
                                                max_memory_bytes=max_memory_bytes) if rest else iter(())
            _add_kineto_ranks(((shown.get(p, p), kp, err) for p, kp, err in _in_order(paths, decoded, results)),
                              {shown.get(p, p): r for p, r in name_ranks.items()}, run, assume_rank)
        log_only = [(rank, rl) for rank, rl in sorted(run.logs.items())  # 3. ranks that only have logs
                    if rl.comms_path is not None or rl.fr is not None or rl.routing or rl.pipeline]
        for rank, rl in _comms_logs_parsed(engine, log_only):
            run.rank_rows.append(_write_rank(run, rank, None, None, None, rl, run.rank_warnings.get(rank, [])))
            # written: its tables go now, not when the run ends (10,000 ranks' logs: ~1 GB held till then)
            rl.comms = rl.fr = None
            rl.routing, rl.pipeline, rl.memory_segments = [], [], []
    finally:
        stop()
    return ParseRunResult(store=_close_run(run), skipped=run.skipped)


def _merged_processes(engine: Any, max_memory_bytes: int | None) -> int | None:
    """Processes that decode a merged file in this process's place (parse/merged_ranks.py), or None: split
    merged files into per-rank files for the engine instead (a memory budget, whose chunked parse is per
    file; or an engine other than the local one)."""
    if max_memory_bytes is not None or getattr(engine, "budget", None) is not None:
        return None
    workers = getattr(engine, "workers", None)
    return max(1, workers) if getattr(engine, "parses_locally", False) and isinstance(workers, int) else None


def _in_order(paths: list[str], decoded: dict[str, Callable[[], Any]], results: Any):
    """(path, KinetoParse | None, error) for `paths` in order: a decoded merged file's ranks from here,
    the others from the engine's `results` (in the order they were given)."""
    results = iter(results)
    for p in paths:
        yield decoded.pop(p)() if p in decoded else next(results)


def _split_merged_files(kineto: list, tmp: Path, run: _Run, max_decompressed_bytes: int | None,
                        processes: int | None = None
                        ) -> tuple[list[str], dict[str, int | None], dict[str, str], dict[str, Callable[[], Any]]]:
    """The Kineto paths to parse, with each merged multi-rank file (TraceFusion) replaced by one path per
    rank; each path's rank from its name; the name each rank's path is shown by (`<file>#rank<R>`); and
    the ranks parsed here: with `processes`, a merged file is decoded once (by that many processes) and
    each rank's parse comes from its columns (parse/merged_ranks.py: {path: () -> (path, parse, error)});
    otherwise, or when that decode declines the file, it is split into per-rank files in `tmp` for the
    engine (parse/merged.py)."""
    from tracekit.parse.merged import split_merged

    paths: list[str] = []
    name_ranks: dict[str, int | None] = {}
    shown: dict[str, str] = {}
    decoded: dict[str, Callable[[], Any]] = {}
    for i, f in enumerate(kineto):
        parts: dict[int, Path | str] = {}
        if disc.is_merged_kineto(f.path):
            merged = decode_merged(str(f.path), max_decompressed_bytes, processes) if processes else None
            if merged is not None:
                parts = {r: rank_document_path(tmp / str(i), f.path, r) for r in merged.ranks}
                decoded.update((p, partial(_merged_rank, merged, r, p)) for r, p in parts.items())
            else:
                try:
                    parts = split_merged(f.path, tmp / str(i), max_decompressed_bytes)
                except (TracekitError, ValueError) as exc:
                    run.skipped.append({"file": str(f.path),
                                        "reason": f"merged multi-rank file could not be split: {exc}"})
                    continue
        if not parts:
            paths.append(str(f.path))
            name_ranks[str(f.path)] = f.name_rank
            continue
        run.warnings.append(f"{f.path}: a merged multi-rank file (TraceFusion: pid = rank*1e8 + pid, args.rank); "
                            f"split into ranks {sorted(parts)}")
        for r, p in parts.items():
            paths.append(str(p))
            name_ranks[str(p)] = r
            shown[str(p)] = f"{f.path}#rank{r}"
    return paths, name_ranks, shown, decoded


def _merged_rank(merged: Any, rank: int, path: str) -> tuple[str, Any, str | None]:
    """One rank of a decoded merged file, as the engine reports a parse (errors as the reason)."""
    try:
        return path, merged.parse(rank, path), None
    except TraceFormatError as exc:
        return path, None, exc.reason
    except TracekitError as exc:
        return path, None, str(exc)
    except Exception as exc:  # a parser bug on one rank must not lose the whole run; it is reported
        return path, None, f"could not be parsed ({type(exc).__name__}: {exc})"


def _read_manifest(found: Any, run: _Run) -> None:
    for f in found.of_kind(disc.MANIFEST):
        if run.manifest is None:
            run.manifest = _read_json_meta(f.path, run.skipped)
        else:
            run.skipped.append({"file": str(f.path), "reason": "second manifest.json (kept the first)"})


def _read_side_input(f: Any, run: _Run, max_decompressed_bytes: int | None) -> None:
    """One comms log, Flight Recorder dump, routing/pipeline log or memory snapshot, filed under its rank."""
    run.advance(f.path.name)
    path = str(f.path)
    local: list[str] = []
    readers = {disc.COMMS_LOG: _add_comms_log, disc.FLIGHT_RECORDER: _add_flight_recorder,
               disc.ROUTING: _add_side_log, disc.PIPELINE: _add_side_log, disc.MEMORY_SNAPSHOT: _add_memory_snapshot}
    if f.kind not in readers:
        return
    try:
        rank = readers[f.kind](f, path, run, local, max_decompressed_bytes)
        if rank is None:
            return
        run.logs[rank].files[f.kind] = path
        run.rank_warnings.setdefault(rank, []).extend(local)
    except TraceFormatError as exc:
        run.skipped.append({"file": path, "reason": exc.reason})
    except Exception as exc:  # malformed content in an unexpected place: report, keep going
        run.skipped.append({"file": path, "reason": f"could not be parsed ({type(exc).__name__}: {exc})"})


def _add_comms_log(f: Any, path: str, run: _Run, local: list[str], _max_bytes: int | None) -> int | None:
    head = read_comms_log_header(f.path)
    if head is None:
        raise TraceFormatError(path, "not a tracekit comms log (no header line)")
    header, groups = head
    head_rank = header.get("rank")
    rank, source = _identify(None if head_rank is None else int(head_rank), "comms-log", f.name_rank, path, local)
    if not run.claim("comms_log", rank, path, "comms log"):
        return None
    rl = run.logs.setdefault(rank, _RankLogs())
    rl.comms_path, rl.comms_rank_source = path, source  # parsed when its rank is written
    if header.get("world_size"):
        run.world_sizes[rank] = int(header["world_size"])
    run.groups.add(groups, rank)
    return rank


def _add_flight_recorder(f: Any, path: str, run: _Run, local: list[str], max_bytes: int | None) -> int | None:
    parsed = parse_flight_recorder(f.path, max_bytes=max_bytes)
    rank, _ = _identify(parsed.rank, parsed.rank_source, f.name_rank, path, local)
    earlier = run.logs.get(rank).fr if run.logs.get(rank) is not None else None
    if parsed.hang_dump and earlier is not None and not earlier.hang_dump:
        # the hang watch's dump is the same buffer, later: it replaces the window's dump of the rank
        local.append(f"{f.path.name}: the hang dump replaces {Path(earlier.source_file).name} for rank {rank}")
        run.claims["flight_recorder"][rank] = path
    elif not run.claim("flight_recorder", rank, path, "Flight Recorder"):
        return None
    parsed.collectives = _set_rank(parsed.collectives, rank)
    parsed.entries, parsed.status = _set_rank(parsed.entries, rank), _set_rank(parsed.status, rank)
    run.logs.setdefault(rank, _RankLogs()).fr = parsed
    run.groups.add(parsed.process_groups, rank)
    local += parsed.warnings
    return rank


def _add_side_log(f: Any, path: str, run: _Run, local: list[str], _max_bytes: int | None) -> int | None:
    rank, _ = _identify(None, None, f.name_rank, path, local)
    if not run.claim(f.kind, rank, path, f"{f.kind} log"):
        return None
    reader = parse_routing_log if f.kind == disc.ROUTING else parse_pipeline_log
    getattr(run.logs.setdefault(rank, _RankLogs()), f.kind).append(reader(f.path, rank, local))
    return rank


def _add_memory_snapshot(f: Any, path: str, run: _Run, local: list[str], max_bytes: int | None) -> int | None:
    rank, _ = _identify(None, None, f.name_rank, path, local)
    if not run.claim(f.kind, rank, path, "memory snapshot"):
        return None
    run.logs.setdefault(rank, _RankLogs()).memory_segments.append(
        parse_memory_snapshot(f.path, rank, max_bytes=max_bytes))
    return rank


def _kineto_rank(kp: Any, path: str, name_rank: int | None, num_traces: int, run: _Run,
                 assume_rank: int | None, local: list[str]) -> tuple[int, str] | None:
    """A parsed trace's rank and its source; None (skipped, with the reason) when it cannot be known."""
    try:
        return _identify(kp.rank, "distributedInfo", name_rank, path, local)
    except RankIdentityError as exc:
        if num_traces != 1:  # one rank cannot be all of them: each is named, none assumed
            hint = (f"; --rank applies to a lone trace, not to one of {num_traces}" if assume_rank is not None
                    else f"; {num_traces} traces here, so no rank is assumed")
            run.skipped.append({"file": path, "reason": exc.reason + hint})
            return None
        rank, source, note = lone_trace_rank(path, assume_rank)
        local.append(note)
        run.warnings.append(note)
        run.meta["rank_assumed"] = note
        return rank, source


def _take_capture(kp: Any, path: str, run: _Run) -> bool:
    """Whether the trace is a CUDA-graph capture trace beside other traces (its graphs captured, few of its
    kernels run): then it names the replays' kernels instead of being analysed as a rank."""
    events, kernels = kp.tables.get("events"), kp.tables.get("kernels")
    if events is None or not isinstance(events, pa.Table) or not has_capture(events):
        return False
    graphs = captured_graphs(events)
    launched = sum(len(g) for g in graphs)
    if not launched or (kernels is not None and kernels.num_rows >= launched):
        return False
    run.captured += graphs
    note = (f"{Path(path).name}: a CUDA-graph capture trace ({len(graphs)} graph(s), {launched} kernel launches "
            "captured, few kernels run): used to name the graph replays' kernels, not analysed as a rank")
    run.warnings.append(note)
    run.meta.setdefault("capture_traces", []).append(path)
    return True


_EVENT_KEY = ("name", "ts", "dur")


def _event_keys(kp: Any) -> pa.Table:
    events = kp.tables["events"]
    return pa.table({"name": pc.fill_null(events["name"].cast(pa.string()), ""), "ts": events["ts"],
                     "dur": pc.fill_null(events["dur"], -1)})


def _mark_duplicate(run: _Run, rank: int, path: str, kp: Any) -> None:
    """`path` lost rank `rank` to a file kept before it: when every complete event of `path` is also in the
    kept file (same name, start and duration), say so on its skipped entry: a duplicate loses nothing."""
    kept = run.kept_events.get(rank)
    if kept is None:
        return
    first, kept_keys = kept
    mine = _event_keys(kp)
    missing = mine.join(kept_keys, keys=list(_EVENT_KEY), join_type="left anti").num_rows if mine.num_rows else 0
    if missing:
        return
    entry = run.skipped[-1]
    entry["reason"] += (f"; {first} holds every one of this file's {mine.num_rows} complete events (same name, "
                        "start and duration): a duplicate, nothing lost")
    entry["duplicate_of"] = first


def _add_kineto_ranks(results: Any, name_ranks: dict[str, int | None], run: _Run, assume_rank: int | None) -> None:
    contested = {r for r, n in Counter(r for r in name_ranks.values() if r is not None).items() if n > 1}
    for path, kp, error in results:
        run.advance(Path(path).name)
        if error is not None:
            run.skipped.append({"file": path, "reason": error})
            continue
        if len(name_ranks) > 1 and _take_capture(kp, path, run):
            continue
        local: list[str] = []
        known = _kineto_rank(kp, path, name_ranks[path], len(name_ranks), run, assume_rank, local)
        if known is None:
            continue
        if not run.claim("kineto", known[0], path, "Kineto trace"):
            _mark_duplicate(run, known[0], path, kp)
            continue
        rank, source = known
        if rank in contested:
            run.kept_events[rank] = (path, _event_keys(kp).combine_chunks())
        if kp.world_size:
            run.world_sizes[rank] = kp.world_size
        run.groups.add(kp.process_groups, rank)
        rl = run.logs.pop(rank, _RankLogs())
        run.rank_rows.append(_write_rank(run, rank, source, path, kp, rl, run.rank_warnings.get(rank, []) + local))
        del kp


def _world_size(run: _Run) -> int | None:
    """The run's world size (the largest any input states) and warnings on missing or extra ranks."""
    manifest = run.manifest
    manifest_ws = manifest.get("world_size") if isinstance(manifest, dict) else None
    sizes = set(run.world_sizes.values()) | ({int(manifest_ws)} if manifest_ws else set())
    world_size = max(sizes) if sizes else None
    if len(sizes) > 1:
        run.warnings.append(f"inputs disagree on the world size: {sorted(sizes)}; using {world_size}")
    parsed = sorted(r["rank"] for r in run.rank_rows)
    if world_size is not None and parsed:
        missing = sorted(set(range(world_size)) - set(parsed))
        if missing:
            shown = ", ".join(map(str, missing[:_MISSING_RANKS_SHOWN])) + (" ..." if len(missing) > _MISSING_RANKS_SHOWN else "")
            run.warnings.append(f"world size {world_size} but inputs for {len(parsed)} ranks: "
                                f"missing ranks [{shown}] ({len(missing)} missing)")
        beyond = [r for r in parsed if r >= world_size]
        if beyond:
            run.warnings.append(f"ranks {beyond} are outside world size {world_size}")
    return world_size


def _cpu_window(manifest: Any, rank: int) -> tuple[float | None, int | None]:
    """From `tracekit record`'s `cpu_window` of the rank (record/cpu_share.py), else None each: the share of its
    runnable time its threads waited for a core over the profiled steps (run-queue wait / (wait + CPU time)),
    and its runnable time (CPU + run-queue wait) per profiled step, ns."""
    ranks = manifest.get("ranks") if isinstance(manifest, dict) else None
    for r in ranks if isinstance(ranks, list) else ():
        win = r.get("cpu_window") if isinstance(r, dict) and r.get("rank") == rank else None
        if isinstance(win, dict) and isinstance(win.get("wait_ns"), int) and isinstance(win.get("cpu_ns"), int):
            busy = win["wait_ns"] + win["cpu_ns"]
            steps = r.get("profiled_steps")
            per_step = busy // max(len(steps) if isinstance(steps, list) else 0, 1)
            return (win["wait_ns"] / busy if busy > 0 else None), per_step
    return None, None


def _close_run(run: _Run) -> RunStore:
    """The ranks and process_groups tables and meta.json; the finished store."""
    for rank, collector in run.deferred_ops:
        collector.captured = run.captured
        for name, table in collector.tables(rank).items():
            run.writer.append(name, table)
    world_size = _world_size(run)
    hosts = run.manifest.get("hosts") if isinstance(run.manifest, dict) else None
    cpus = run.manifest.get("host_cpus") if isinstance(run.manifest, dict) else None
    rows = sorted(run.rank_rows, key=lambda r: r["rank"])
    for row in rows:
        if row["world_size"] is None:
            row["world_size"] = world_size
        if row["hostname"] is None and isinstance(hosts, dict) and hosts.get(str(row["rank"])) is not None:
            row["hostname"] = str(hosts[str(row["rank"])])
        if isinstance(cpus, dict) and isinstance(cpus.get(row["hostname"]), int):
            row["host_cpus"] = cpus[row["hostname"]]
        row["cpu_wait_share"], row["cpu_runnable_ns"] = _cpu_window(run.manifest, row["rank"])
    _clock_offsets(rows, run.manifest, run.warnings)
    for r in rows:
        r.pop("_epoch")
    files = {str(r["rank"]): r.pop("_files") for r in rows}
    if rows:
        run.writer.append("ranks", pa.Table.from_pylist(rows))
    run.writer.append("process_groups", run.groups.table())
    run.meta.update({
        "inputs": {"ranks": [r["rank"] for r in rows], "skipped": run.skipped, "files": files,
                   "partial_logs": sorted(run.partial_logs)},
        "manifest": run.manifest, "world_size": world_size,
        "warnings": run.warnings, "join": {str(k): v for k, v in sorted(run.join_stats.items())},
        "collective_sources": "collectives keeps rows of every source; select with `source` "
                              "(kineto | comms-log | flight-recorder)",
    })
    run.writer.meta.update(run.meta)
    return run.writer.close()


COMMS_LOGS_PER_TASK = 16
"""Comms logs parsed per engine task (`_comms_logs_parsed`): a task's overhead spread over several files."""


def _comms_logs_parsed(engine: Any, log_only: list[tuple[int, _RankLogs]]):
    """(rank, rank logs) of the ranks that only have logs, in order, each comms log already parsed on the
    engine's workers (`map_ranks`, COMMS_LOGS_PER_TASK files a task, a few tasks in flight: at 10,000 ranks
    the logs are most of the parse) where it has them; `_load_comms_log` parses the rest here."""
    todo = [(rank, rl) for rank, rl in log_only if rl.comms_path is not None and rl.comms is None]
    map_ranks = getattr(engine, "map_ranks", None)
    if map_ranks is None or getattr(engine, "workers", 1) <= 1 or len(todo) <= COMMS_LOGS_PER_TASK:
        yield from log_only
        return
    batches = [todo[i:i + COMMS_LOGS_PER_TASK] for i in range(0, len(todo), COMMS_LOGS_PER_TASK)]
    results = map_ranks(parse_comms_logs_task, [([(rl.comms_path, rank) for rank, rl in b],) for b in batches])
    parsed: list = []
    for rank, rl in log_only:
        if rl.comms_path is not None and rl.comms is None:
            if not parsed:
                parsed = list(next(results))[::-1]
            rl.comms, rl.comms_error = parsed.pop()
        yield rank, rl


def _load_comms_log(run: _Run, rank: int, rl: _RankLogs, warnings: list[str]) -> None:
    """Parse the rank's comms log now (it was only claimed while reading side inputs), unless an engine
    task did (`_comms_logs_parsed`)."""
    if rl.comms_path is None or rl.comms_taken:
        return
    rl.comms_taken = True
    error = rl.comms_error
    if rl.comms is None and error is None:
        try:
            rl.comms = parse_comms_log(rl.comms_path, rank=rank)
        except Exception as exc:
            error = f"could not be parsed ({type(exc).__name__}: {exc})"
    if error is not None:
        run.skipped.append({"file": rl.comms_path, "reason": error})
        rl.files.pop("comms_log", None)
        return
    rl.comms.rank_source = rl.comms_rank_source
    warnings += rl.comms.warnings
    if rl.comms.partial:
        run.partial_logs.append(rl.comms_path)


def _check_log_clock(info: dict[str, Any], log_table: pa.Table | None, shift: int, warnings: list[str]) -> None:
    if not shift or log_table is None or not log_table.num_rows or info.get("first_ts") is None:
        return
    created = pc.min(log_table.column("enqueue_ts")).as_py()
    hour = 3_600_000_000_000
    if created is not None and not (info["first_ts"] - 48 * hour < created - shift < info["last_ts"] + 48 * hour):
        warnings.append("the collective log's times are days away from the trace's: clocks look unrelated")


def _write_kineto_tables(run: _Run, rank: int, kp: Any, log_table: pa.Table | None, shift: int,
                         warnings: list[str]) -> None:
    """The trace's tables, its collectives joined with the rank's log."""
    writer = run.writer
    events = kp.tables.get("events")
    tables = {k: _set_rank(v, rank) for k, v in kp.tables.items() if k != "events"}
    derived = {k: tables.pop(k) for k in DERIVED if k in tables}  # computed by the parse worker (parse/ops.py)
    pipeline_parts = []
    op_collector = OpCollector(tables["kernels"], run.captured) if "kernels" in tables and not derived else None
    # a chunked parse's events arrive as spilled parts: each is written and let go before the next
    for part in table_parts(events) if events is not None else ():
        part = _set_rank(part, rank)
        writer.append("events", part)
        pipeline_parts.append(pipeline_from_events(part))
        if op_collector is not None:
            op_collector.add(part)
        del part
    for name in ("kernels", "steps", "memory"):
        if name in tables:
            writer.append(name, tables[name])
    if op_collector is not None and op_collector.graph_calls:
        run.deferred_ops.append((rank, op_collector))
    elif op_collector is not None:
        for name, table in op_collector.tables(rank).items():
            writer.append(name, table)
    for name, table in derived.items():
        writer.append(name, table)
    kin_coll = tables.get("collectives")
    if kin_coll is not None and kin_coll.num_rows:
        joined, stats = join_collectives(conform("collectives", kin_coll), log_table, log_shift_ns=shift,
                                         groups=kp.process_groups)
        writer.append("collectives", _fill_group_ranks(joined, run.groups))
        run.join_stats[rank] = dict(stats.to_json(), log_shift_ns=shift)
        warnings += stats.warnings
    for pipeline in pipeline_parts:
        if pipeline.num_rows:
            writer.append("pipeline", pipeline)


def _write_logs(run: _Run, rl: _RankLogs, shift: int, warnings: list[str]) -> None:
    writer = run.writer
    for p in (rl.comms, rl.fr):
        if p is not None and p.collectives.num_rows:
            writer.append("collectives", _fill_group_ranks(_shift_times(p.collectives, shift), run.groups))
    _write_fr_tables(writer, rl, shift)
    for t in rl.routing:
        writer.append("routing", t)
    for t in rl.memory_segments:
        writer.append("memory_segments", t)
    for t in rl.pipeline:
        writer.append("pipeline", _shift_times(t, shift))
    if rl.comms is not None and rl.fr is not None:
        warnings.append("both a comms log and a Flight Recorder dump: both kept; the comms log is joined to the trace")


def _write_fr_tables(writer: RunStoreWriter, rl: _RankLogs, shift: int) -> None:
    """The rank's Flight Recorder dump (torch's, or the one `tracekit record` writes on a hang) as
    fr_entries / fr_status: what the hang analyzer reads. A comms log is not: it holds the profiled window
    only. Times go onto the rank's Kineto clock like its collectives (`shift`; 0 without a trace)."""
    src = rl.fr
    if src is None or src.status is None:
        return
    entries = src.entries
    if shift and entries is not None and entries.num_rows:
        for col in ("enqueue_ts", "start_ts", "end_ts"):
            idx = entries.column_names.index(col)
            entries = entries.set_column(idx, col, pc.subtract(entries.column(col), pa.scalar(shift, pa.int64())))
    for name, table in (("fr_entries", entries), ("fr_status", src.status)):
        if table is not None and table.num_rows:
            writer.append(name, table)


def _write_rank(run: _Run, rank: int, rank_source: str | None, kineto_path: str | None, kp: Any,
                rl: _RankLogs, warnings: list[str]) -> dict[str, Any]:
    """Append one rank's tables and return its `ranks` row (plus `_files` for meta)."""
    warnings = list(warnings)
    _load_comms_log(run, rank, rl, warnings)
    log = rl.comms or rl.fr
    log_table = log.collectives if log is not None else None
    info: dict[str, Any] = dict(kp.info) if kp is not None else {}
    shift = _trace_epoch_ns(info) if kp is not None else 0
    _check_log_clock(info, log_table, shift, warnings)
    if kp is not None:
        _write_kineto_tables(run, rank, kp, log_table, shift, warnings)
    _write_logs(run, rl, shift, warnings)
    return _rank_row(rank, rank_source, kineto_path, kp, rl, info, shift, warnings)


def _rank_row(rank: int, rank_source: str | None, kineto_path: str | None, kp: Any, rl: _RankLogs,
              info: dict[str, Any], shift: int, warnings: list[str]) -> dict[str, Any]:
    files = dict(rl.files)
    if kineto_path:
        files["kineto"] = kineto_path
    if rank_source is None:
        rank_source = (rl.comms.rank_source if rl.comms and rl.comms.rank_source else
                       rl.fr.rank_source if rl.fr and rl.fr.rank_source else "filename")
    return {
        "rank": rank,
        "world_size": (kp.world_size if kp is not None else None) or (rl.comms.world_size if rl.comms else None),
        "hostname": info.get("hostname"), "backend": info.get("backend"),
        "device_names": info.get("device_names"),
        "device_memory_bytes": info.get("device_memory_bytes"),
        "source_file": kineto_path or (rl.comms.source_file if rl.comms else rl.fr.source_file if rl.fr
                                       else next(iter(files.values()), None)),
        "schema_version": None if info.get("schema_version") is None else str(info.get("schema_version")),
        "rank_source": rank_source, "trace_kind": info.get("trace_kind"), "accelerator": info.get("accelerator"),
        "base_time_ns": info.get("base_time_ns"), "first_ts": info.get("first_ts"), "last_ts": info.get("last_ts"),
        "num_events": info.get("num_events", 0), "clock_offset_ns": None,
        "parse_warnings": list(info.get("parse_warnings") or []) + warnings,
        "_files": files,
        "_epoch": shift,
    }
