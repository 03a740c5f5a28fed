"""manifest.json: what a recording directory holds, merged from the per-rank `record.rank{R}.json`.

Written by the parent `tracekit record` after the command exits (and by each `Recorder` on exit).
A rank whose record still says "running" stopped without finalizing (killed): its leftover trace
parts are merged into a trace marked partial, and its status becomes "killed".
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tracekit.record.commlog import comms_log_path
from tracekit.record.config import RecordConfig
from tracekit.record.step_timing import recording_overhead
from tracekit.record.trace_files import (
    MANIFEST,
    list_parts,
    merge_trace_parts,
    read_trace_meta,
    rank_record_path,
    trace_path,
    write_json_atomic,
)

MANIFEST_SCHEMA = "tracekit.record/1"
_RECORD_RE = re.compile(r"^record\.rank(\d+)\.json$")
_MESH_RE = re.compile(r"^mesh_(\w+)$")


def load_rank_records(out_dir: Path) -> dict[int, dict[str, Any]]:
    """rank -> record dict, for every readable `record.rank{R}.json` in `out_dir`."""
    out: dict[int, dict[str, Any]] = {}
    for p in sorted(out_dir.glob("record.rank*.json")):
        m = _RECORD_RE.match(p.name)
        if not m:
            continue
        try:
            out[int(m.group(1))] = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            out[int(m.group(1))] = {"rank": int(m.group(1)), "status": "unreadable", "reason": str(exc)}
    return out


def comms_log_complete(path: Path) -> bool:
    """True when the comm log ends with its footer line (closed cleanly)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 4096))
            tail = fh.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
        return json.loads(tail).get("type") == "footer"
    except (OSError, ValueError):
        return False


def _salvage_killed_rank(out_dir: Path, rank: int, rec: dict[str, Any]) -> None:
    """A rank that never finalized: merge its exported parts (if any) into a partial trace."""
    rec["status"] = "killed"
    rec.setdefault("notes", []).append("rank stopped without finalizing (killed or os._exit)")
    parts = list_parts(out_dir, rank)
    if parts:
        meta = {"rank": rank, "partial": True, "status": "killed", "cycles": len(parts),
                "steps": rec.get("profiled_steps", []), "written_by": "tracekit record (parent salvage)"}
        merge_trace_parts(parts, trace_path(out_dir, rank), meta)
        for p in parts:
            p.unlink(missing_ok=True)
    rec["trace_partial"] = trace_path(out_dir, rank).exists() and rec.get("profiled", False)


def parallel_layout(groups: list[dict[str, Any]]) -> dict[str, int] | None:
    """{axis: size} from DeviceMesh-named groups (`mesh_<axis>`), None when none are named so."""
    layout: dict[str, int] = {}
    for g in groups:
        m = _MESH_RE.match(g.get("desc") or "")
        if m:
            layout[m.group(1)] = len(g.get("ranks") or [])
    return layout or None


def write_manifest(out_dir: Path, *, command: list[str], config: RecordConfig | None,
                   exit_code: int | None, started_ns: int | None = None,
                   salvage: bool = False) -> dict[str, Any]:
    """Merge per-rank records into `out_dir/manifest.json` and return it.

    `salvage`: the program has exited, so ranks still "running" were killed (parent only).
    """
    out_dir = Path(out_dir)
    records = load_rank_records(out_dir)
    import tracekit

    for rank, rec in records.items():
        if salvage and rec.get("status") == "running":
            _salvage_killed_rank(out_dir, rank, rec)
            write_json_atomic(rank_record_path(out_dir, rank), rec)
        tp = trace_path(out_dir, rank)
        if tp.exists():
            try:
                meta = read_trace_meta(tp) or {}
                rec["trace_partial"] = bool(meta.get("partial"))
                rec["trace_steps"] = meta.get("steps")
                rec.setdefault("files", {})["trace"] = tp.name
            except Exception as exc:  # an unreadable trace is reported, never hidden
                rec["trace_partial"] = True
                rec.setdefault("notes", []).append(f"trace unreadable: {exc}")
        cp = comms_log_path(out_dir, rank)
        if cp.exists():
            rec.setdefault("files", {})["comms"] = cp.name
            rec["comms_complete"] = comms_log_complete(cp)

    world_sizes = {r.get("world_size") for r in records.values() if r.get("world_size")}
    world_size = max(world_sizes) if world_sizes else None
    missing = sorted(set(range(world_size)) - set(records)) if world_size else []
    groups: dict[str, dict[str, Any]] = {}
    for rec in records.values():
        for name, g in (rec.get("process_groups") or {}).items():
            known = groups.setdefault(name, dict(g))
            if len(g.get("ranks") or []) > len(known.get("ranks") or []):
                groups[name] = dict(g)
    statuses = [r.get("status") for r in records.values()]
    window = window_summary(config, records)
    if not records:
        overall = "nothing_recorded"
    elif not window["reached"]:
        overall = "window_not_reached"
    elif missing or any(s != "ok" for s in statuses) or (exit_code not in (None, 0)):
        overall = "incomplete"
    else:
        overall = "ok"
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "tracekit_version": tracekit.__version__,
        "command": list(command),
        "cwd": os.getcwd(),
        "exit_code": exit_code,
        "status": overall,
        "started_ns": started_ns,
        "ended_ns": time.time_ns(),
        "world_size": world_size,
        "hosts": sorted({r["host"] for r in records.values() if r.get("host")}),
        "host_cpus": host_cpus(records),
        "torch_version": next((r["torch_version"] for r in records.values() if r.get("torch_version")), None),
        "backend": next((r["backend"] for r in records.values() if r.get("backend")), None),
        "config": asdict(config) if config is not None else None,
        "requested_steps": config.schedule.active_steps() if config is not None and config.schedule.repeat else None,
        "window": window,
        "ranks": [_rank_summary(records[r]) for r in sorted(records)],
        "missing_ranks": missing,
        # partial tracing (--profile-ranks): who has a trace, who only a collective log
        "traced_ranks": sorted(r for r, rec in records.items() if trace_path(out_dir, r).exists()),
        "log_only_ranks": sorted(r for r in records if not trace_path(out_dir, r).exists()
                                 and comms_log_path(out_dir, r).exists()),
        "process_groups": sorted(groups.values(), key=lambda g: g.get("name", "")),
        "parallel_layout": parallel_layout(list(groups.values())),
        "clock_anchors": {str(r): records[r].get("clock") for r in sorted(records)},
        "recording_overhead": recording_overhead(records),
    }
    manifest["files_by_rank"] = files_by_rank(out_dir)
    program = _program_manifest(out_dir)
    if program is not None:
        # The program recorded itself (e.g. instrumented_runtime): keep its manifest, add ours inside.
        manifest["recorded_by"] = program.get("producer") or "program"
        manifest["world_size"] = manifest["world_size"] or program.get("world_size")
        manifest["hosts"] = manifest["hosts"] or program.get("hosts") or []
        manifest["torch_version"] = manifest["torch_version"] or program.get("torch_version")
        manifest["missing_ranks"] = (sorted(set(range(manifest["world_size"])) - set(manifest["files_by_rank"]))
                                     if manifest["world_size"] else [])
        if not records:
            manifest["status"] = "ok" if exit_code in (None, 0) and not manifest["missing_ranks"] else "incomplete"
        program["tracekit_record"] = manifest
        write_json_atomic(out_dir / MANIFEST, program)
        return manifest
    manifest["recorded_by"] = "tracekit record"
    write_json_atomic(out_dir / MANIFEST, manifest)
    return manifest


def window_summary(config: RecordConfig | None, records: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Did any rank reach the profiled window? {reached, first_requested_step, requested_steps, last_step}.

    `last_step` is the highest step any rank began (a 10-step job ends in step 10: steps 1-9 after
    start-up step 0); the window is reached when some rank profiled or logged a step of it.
    """
    requested = (config.schedule.active_steps() if config is not None and config.schedule.repeat
                 else config.schedule.active_steps(limit=config.schedule.cycle_steps) if config is not None
                 else None)
    last = max((r["last_step"] for r in records.values() if isinstance(r.get("last_step"), int)), default=None)
    got = any(r.get("profiled_steps") or r.get("logged_steps") for r in records.values())
    reached = got or not records or config is None or not requested or (last is not None and last >= requested[0])
    chosen = [r["window_choice"] for r in records.values() if isinstance(r.get("window_choice"), dict)]
    return {"reached": bool(reached), "requested_steps": requested if config is None or config.schedule.repeat
            else None, "first_requested_step": requested[0] if requested else None, "last_step": last,
            "min_window_ms": config.schedule.min_window_ms if config is not None else None,
            "active_chosen": max((c["active"] for c in chosen), default=None)}


def window_problem(manifest: dict[str, Any] | None) -> str | None:
    """A sentence for the user when the recording's profiled window was never reached, else None."""
    if not isinstance(manifest, dict):
        return None
    inner = manifest.get("tracekit_record") if manifest.get("schema") != MANIFEST_SCHEMA else manifest
    if not isinstance(inner, dict) or inner.get("status") != "window_not_reached":
        return None
    win = inner.get("window") or {}
    req = win.get("requested_steps")
    first = win.get("first_requested_step")
    want = (f"steps {req[0]}-{req[-1]}" if req and len(req) > 1 else f"step {req[0]}" if req
            else f"steps from {first}")
    last = win.get("last_step")
    ran = f"the program stopped in step {last} (steps 0-{last - 1} completed)" if isinstance(last, int) \
        else "the program stopped before its first step boundary"
    return (f"the profiled window ({want}) was never reached: {ran}, so no trace was written; "
            f"record again with a smaller --wait/--skip-first, or run more steps")


_RANK_FILE_RE = re.compile(r"^(?:rank(\d+)\.pt\.trace\.json\.gz|(?:comms|routing|flight_recorder|record)\.rank(\d+)\.jsonl?)$")


def files_by_rank(out_dir: Path) -> dict[int, list[str]]:
    """rank -> names of the per-rank files in `out_dir` (traces, comm/routing logs, FR dumps, records)."""
    out: dict[int, list[str]] = {}
    for p in sorted(out_dir.iterdir()):
        m = _RANK_FILE_RE.match(p.name)
        if m:
            out.setdefault(int(m.group(1) or m.group(2)), []).append(p.name)
    return dict(sorted(out.items()))


def _program_manifest(out_dir: Path) -> dict[str, Any] | None:
    """A manifest.json the program wrote itself (any schema but ours), else None."""
    path = out_dir / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("schema") == MANIFEST_SCHEMA:
        return None
    return data


def host_cpus(records: dict[int, dict[str, Any]]) -> dict[str, int]:
    """Host name → the CPU cores its ranks may run on (the fewest any of its ranks reported), as the
    instrumented runtime's manifest has it; hosts whose ranks reported none are left out."""
    out: dict[str, int] = {}
    for rec in records.values():
        host, n = rec.get("host"), rec.get("host_cpus")
        if host and isinstance(n, int) and n > 0:
            out[str(host)] = min(out.get(str(host), n), n)
    return out


def _rank_summary(rec: dict[str, Any]) -> dict[str, Any]:
    keys = ("rank", "world_size", "rank_source", "local_rank", "group_rank", "host", "pid", "status",
            "reason", "profiled", "profiled_steps", "trace_steps", "logged_steps", "trace_partial",
            "comms_complete", "collectives_logged", "dispatch_errors", "last_dispatch_error", "files",
            "notes", "backend", "first_step", "last_step", "window_choice", "step_timing", "notices_held",
            "host_cpus", "cpu_window")
    return {k: rec.get(k) for k in keys}
