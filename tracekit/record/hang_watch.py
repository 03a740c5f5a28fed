"""The parent side of `tracekit record --hang-timeout`: notice that no rank progresses, collect the dumps.

Each rank's monitor (hang_monitor.py) beats into `<out>/.hang/rank{R}.json`. The job is hung when some
live rank waits in a collective or send/recv and no rank's progress key changed for `timeout_s`
(a rank that cannot beat, e.g. one holding the GIL, makes no progress either). Then every live rank is
asked for a final dump; a rank whose process is gone without saying it exited is dead, and its dump
(the last it wrote while waiting, or a stub) is marked `dead`. A job that ends cleanly with no hang
leaves no hang files behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracekit.record.hang_monitor import BEAT_DIR, DUMP_REQUEST, HANG_DIR, HANG_DUMP_KEY, dump_path

DEFAULT_HANG_TIMEOUT_S = 600.0
"""NCCL's default collective timeout (10 minutes): a step that takes longer is rare, and a hang is
reported before NCCL's own watchdog kills the job."""
HANG_ACTIONS = ("stop", "report")
DUMP_WAIT_S = 10.0
STOP_GRACE_S = 5.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child not yet reaped by its launcher is a zombie: dead
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@dataclass
class HangWatch:
    out_dir: Path
    timeout_s: float
    last_change: dict[int, tuple[str, float]] = field(default_factory=dict)
    hung_at: float | None = None
    died_at: dict[int, float] = field(default_factory=dict)
    """When each rank was first seen gone without exiting (the launcher stops the others after one dies)."""

    def beats(self) -> dict[int, dict[str, Any]]:
        out = {}
        for p in (self.out_dir / BEAT_DIR).glob("rank*.json"):
            try:
                b = json.loads(p.read_text())
                out[int(b["rank"])] = b
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    def poll(self) -> bool:
        """True (once) when the job is hung by the definition above."""
        now = time.monotonic()
        beats = self.beats()
        for r, b in beats.items():
            if r not in self.died_at and not b.get("exited") and not _alive(int(b.get("pid", -1))):
                self.died_at[r] = now
        if self.hung_at is not None:
            return False
        live = {r: b for r, b in beats.items() if not b.get("exited") and _alive(int(b.get("pid", -1)))}
        for r, b in live.items():
            prev = self.last_change.get(r)
            if prev is None or prev[0] != b.get("progress"):
                self.last_change[r] = (b.get("progress"), now)
        if not live or not any(b.get("pending") for b in live.values()):
            return False
        stalled = now - max(self.last_change[r][1] for r in live)
        if stalled >= self.timeout_s:
            self.hung_at = now
            return True
        return False

    def request_dumps(self) -> None:
        """Ask every live rank for a dump now and wait (bounded) until each wrote one after the request."""
        req = self.out_dir / BEAT_DIR / DUMP_REQUEST
        req.parent.mkdir(parents=True, exist_ok=True)
        req.write_text(str(time.time_ns()))
        asked = req.stat().st_mtime
        deadline = time.monotonic() + DUMP_WAIT_S
        while time.monotonic() < deadline:
            live = [r for r, b in self.beats().items() if not b.get("exited") and _alive(int(b.get("pid", -1)))]
            done = [r for r in live if _mtime(dump_path(self.out_dir, r)) >= asked]
            if len(done) == len(live):
                return
            time.sleep(0.2)

    def dead_ranks(self) -> list[int]:
        return sorted(r for r, b in self.beats().items() if not b.get("exited") and not _alive(int(b.get("pid", -1))))

    def first_dead(self) -> tuple[list[int], list[int]]:
        """(ranks that died first, ranks gone later: stopped by the launcher after those died). Deaths seen
        at the same poll count as one; unseen ones (the job ended between polls) count as first."""
        dead = self.dead_ranks()
        seen = [self.died_at[r] for r in dead if r in self.died_at]
        if not seen:
            return dead, []
        first = min(seen)
        later = [r for r in dead if r in self.died_at and self.died_at[r] > first + 0.2]
        return [r for r in dead if r not in later], later

    def exited_ranks(self) -> list[int]:
        return sorted(r for r, b in self.beats().items() if b.get("exited"))

    def mark_dead(self, ranks: list[int], how: str, dead: bool = True) -> None:
        """Say in each rank's dump (a stub when it wrote none) that its process had ended."""
        for r in ranks:
            p = dump_path(self.out_dir, r)
            try:
                doc = json.loads(p.read_text())
            except (OSError, ValueError):
                doc = {"version": "2.x", "rank": r, "pg_config": {}, "pg_status": {}, "entries": [],
                       HANG_DUMP_KEY: {"reason": "no dump: written by tracekit record"}}
            doc["dead"] = dead
            doc.setdefault(HANG_DUMP_KEY, {})["process"] = how
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(doc))

    def stop_job(self, proc: Any) -> None:
        """SIGTERM the command (torchrun passes it to its workers), then SIGKILL what is left."""
        pids = [int(b["pid"]) for b in self.beats().values() if not b.get("exited") and b.get("pid")]
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and (proc.poll() is None or any(_alive(p) for p in pids)):
            time.sleep(0.1)
        for pid in pids:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if proc.poll() is None:
            proc.kill()

    def clean(self) -> None:
        """A job that ended well: no hang files left (they would read as a post-mortem)."""
        shutil.rmtree(self.out_dir / HANG_DIR, ignore_errors=True)
        shutil.rmtree(self.out_dir / BEAT_DIR, ignore_errors=True)

    def fill_from_call_logs(self) -> list[int]:
        """Ranks whose last Python-level calls (hang/calls.rank{R}.jsonl) are newer than their dump, or that
        wrote none (killed, aborted): their dump is rebuilt from those calls. Returns those ranks."""
        rebuilt = []
        for p in sorted((self.out_dir / HANG_DIR).glob("calls.rank*.jsonl")):
            try:
                rank = int(p.name[len("calls.rank"):-len(".jsonl")])
                entries, last = _read_calls(p)
            except (OSError, ValueError):
                continue
            dump = dump_path(self.out_dir, rank)
            try:
                meta = json.loads(dump.read_text()).get(HANG_DUMP_KEY) or {}
            except (OSError, ValueError):
                meta = None
            reason = str(meta.get("reason") or "") if meta is not None else ""
            # a dump taken while waiting may predate later calls; one written on the way out of an exception
            # shows the failed call retired like a finished one (gloo's recorder does not tell them apart)
            stale = meta is None or reason.startswith("exited on") or (
                reason == "waiting" and int(meta.get("time_ns") or 0) < last)
            if entries and stale:
                dump.write_text(json.dumps(_dump_from_calls(rank, entries)))
                rebuilt.append(rank)
        return rebuilt

    def has_dumps(self) -> bool:
        return any((self.out_dir / HANG_DIR).glob("flight_recorder.rank*.json"))


def _read_calls(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Entries of a call log with their completion applied, and the time of its last line (ns)."""
    entries: dict[int, dict[str, Any]] = {}
    last = 0
    older = path.with_name(path.name + ".1")  # the part before the last rotation
    data = (older.read_bytes() if older.is_file() else b"") + path.read_bytes()
    for raw in data.splitlines():
        try:
            obj = json.loads(raw)
        except ValueError:  # a line cut by the rank's death
            continue
        if "done" in obj and obj["done"] in entries:
            e = entries[obj["done"]]
            e["state"], e["retired"], e["time_discovered_completed_ns"] = "completed", True, obj.get("t")
            last = max(last, int(obj.get("t") or 0))
        elif "record_id" in obj:
            entries[obj["record_id"]] = obj
            last = max(last, int(obj.get("time_created_ns") or 0))
    return list(entries.values()), last


def _dump_from_calls(rank: int, entries: list[dict[str, Any]]) -> dict[str, Any]:
    groups = {}
    for e in entries:
        name, desc = (e.get("process_group") or ["", ""])[:2]
        groups[name] = {"name": name, "desc": desc, "ranks": str(e.get("group_ranks") or [])}
    return {"version": "2.x", "rank": rank, "pg_config": groups, "pg_status": {}, "entries": entries,
            HANG_DUMP_KEY: {"reason": "built from the rank's call log (no dump after its last call)"}}


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return -1.0
