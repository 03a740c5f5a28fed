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
        if self.hung_at is not None:
            return False
        now = time.monotonic()
        beats = self.beats()
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

    def exited_ranks(self) -> list[int]:
        return sorted(r for r, b in self.beats().items() if b.get("exited"))

    def mark_dead(self, ranks: list[int], how: str) -> None:
        """Say in each rank's dump (a stub when it wrote none) that its process had ended."""
        for r in ranks:
            p = dump_path(self.out_dir, r)
            try:
                doc = json.loads(p.read_text())
            except (OSError, ValueError):
                doc = {"version": "2.x", "rank": r, "pg_config": {}, "pg_status": {}, "entries": [],
                       HANG_DUMP_KEY: {"reason": "no dump: written by tracekit record"}}
            doc["dead"] = True
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

    def has_dumps(self) -> bool:
        return any((self.out_dir / HANG_DIR).glob("flight_recorder.rank*.json"))


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return -1.0


def analyze_hang_dumps(out_dir: Path) -> tuple[dict[str, Any] | None, Path]:
    """Analyse `<out>/hang` (the dumps) into `<out>/hang-analysis`; (the top hang finding or None, out path)."""
    from tracekit.analysis import analyze_run

    dest = out_dir / "hang-analysis"
    run = analyze_run(out_dir / HANG_DIR, dest)
    top = next((f for f in run.analysis["findings"] if f["kind"] == "hang"), None)
    return top, dest
