"""The rank side of `tracekit record --hang-timeout`: a heartbeat, and a Flight Recorder dump when the rank waits.

A daemon thread in every process that creates a default process group (torchrun's agent never does, so
it stays idle there) writes `<out>/.hang/rank{R}.json` twice a second: its pid, a progress key
(each group's last enqueued / completed collective from Flight Recorder's `pg_status`, plus our P2P
counters) and whether a collective or send/recv is pending. While the rank waits with no progress for
`DUMP_AFTER_S` it writes `<out>/hang/flight_recorder.rank{R}.json`: Flight Recorder's own dump (torch
records collectives on gloo too, but not send/recv, DESIGN §5) plus the send/recv this module logs,
and the main thread's Python stack on the entry it waits in. The parent (`launch.py`) watches the
heartbeats and asks for a final dump (`<out>/.hang/dump_request`) when no rank progressed for the
timeout. A rank that exits writes a last dump (it may have left the others waiting); the parent removes
every hang file when the job ends well.

Costs: a `pg_status`-only dump (no entries) and a small file write every `BEAT_S`; a Python wrapper
around `send`/`recv`/`isend`/`irecv` (a dict per call).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

BEAT_S = 0.5
DUMP_AFTER_S = 1.0
"""Seconds a rank waits without progress before it writes its dump (then again on every change)."""
P2P_BUFFER = 2000
HANG_DIR = "hang"
BEAT_DIR = ".hang"
DUMP_REQUEST = "dump_request"
HANG_DUMP_KEY = "tracekit_hang_dump"
"""Top-level key marking a dump this module wrote (the parser prefers it over a window dump of the rank)."""


def beat_path(out_dir: str | os.PathLike, rank: int) -> Path:
    return Path(out_dir) / BEAT_DIR / f"rank{rank}.json"


def dump_path(out_dir: str | os.PathLike, rank: int) -> Path:
    return Path(out_dir) / HANG_DIR / f"flight_recorder.rank{rank}.json"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class _P2PLog:
    """Send/recv calls in Flight Recorder's entry schema (gloo's Flight Recorder records none)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: deque[tuple[dict[str, Any], Any]] = deque(maxlen=P2P_BUFFER)
        self.seq: dict[str, int] = {}
        self.issued = 0
        self.done = 0

    def begin(self, op: str, tensor: Any, peer: int, group: Any) -> dict[str, Any]:
        import torch.distributed as dist

        pg = group or dist.group.WORLD
        name = dist.distributed_c10d._get_process_group_name(pg) if pg is not None else "0"
        desc = getattr(pg, "group_desc", None) or ("default_pg" if name == "0" else "")
        with self.lock:
            self.seq[name] = self.seq.get(name, 0) + 1
            self.issued += 1
            me = dist.get_rank()
            entry = {"record_id": None, "pg_id": None, "process_group": [name, desc], "collective_seq_id": 0,
                     "p2p_seq_id": self.seq[name], "profiling_name": f"gloo:{op} {me}{'->' if op == 'send' else '<-'}{peer}",
                     "time_created_ns": time.time_ns(), "input_sizes": [list(tensor.shape)],
                     "input_dtypes": [_dtype(tensor)], "output_sizes": [list(tensor.shape)],
                     "output_dtypes": [_dtype(tensor)], "state": "scheduled", "retired": False, "is_p2p": True,
                     "peer": int(peer), "source": "tracekit_p2p"}
            self.entries.append((entry, None))
        return entry

    def attach(self, entry: dict[str, Any], work: Any) -> None:
        with self.lock:
            for i in range(len(self.entries) - 1, -1, -1):
                if self.entries[i][0] is entry:
                    self.entries[i] = (entry, work)
                    break

    def finish(self, entry: dict[str, Any]) -> None:
        with self.lock:
            if entry["state"] != "completed":
                entry["state"], entry["retired"] = "completed", True
                entry["time_discovered_completed_ns"] = time.time_ns()
                self.done += 1

    def snapshot(self) -> list[dict[str, Any]]:
        """Entries with the state of their Work where the caller kept one (isend/irecv)."""
        with self.lock:
            items = list(self.entries)
        for entry, work in items:
            if work is not None and entry["state"] != "completed":
                try:
                    if work.is_completed():
                        self.finish(entry)
                except Exception:
                    pass
        return [dict(e) for e, _ in items]

    def pending(self) -> bool:
        return any(e["state"] != "completed" for e in self.snapshot())


def _dtype(t: Any) -> str:
    from tracekit.record.dispatch_mode import dtype_name

    return dtype_name(t.dtype)


_p2p = _P2PLog()


def _wrap_p2p() -> None:
    """Log send/recv/isend/irecv (torch.distributed's Python functions; batch_isend_irecv calls isend/irecv)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    def blocking(fn, op):
        def wrapper(tensor, *args, **kwargs):
            peer = args[0] if args else kwargs.get("dst", kwargs.get("src", kwargs.get("group_dst", kwargs.get("group_src", -1))))
            entry = _p2p.begin(op, tensor, -1 if peer is None else peer, kwargs.get("group", args[1] if len(args) > 1 else None))
            out = fn(tensor, *args, **kwargs)
            _p2p.finish(entry)
            return out
        wrapper.__wrapped__ = fn
        return wrapper

    def nonblocking(fn, op):
        def wrapper(tensor, *args, **kwargs):
            peer = args[0] if args else kwargs.get("dst", kwargs.get("src", kwargs.get("group_dst", kwargs.get("group_src", -1))))
            entry = _p2p.begin(op, tensor, -1 if peer is None else peer, kwargs.get("group", args[1] if len(args) > 1 else None))
            work = fn(tensor, *args, **kwargs)
            _p2p.attach(entry, work)
            return work
        wrapper.__wrapped__ = fn
        return wrapper

    for name, make, op in (("send", blocking, "send"), ("recv", blocking, "recv"),
                           ("isend", nonblocking, "send"), ("irecv", nonblocking, "recv")):
        original = getattr(c10d, name, None)
        if original is None or hasattr(original, "__wrapped__"):
            continue
        wrapped = make(original, op)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)


def _fr_json(include_collectives: bool) -> dict[str, Any] | None:
    import torch

    fn = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json", None)
    if fn is None:
        return None
    try:
        return json.loads(fn(includeCollectives=include_collectives))
    except Exception:
        return None


def _num(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return -1


def _progress() -> tuple[tuple[Any, ...], bool]:
    """(progress key, pending): pg_status counters and P2P counters; pending when a group enqueued
    more than it completed or a send/recv is not complete."""
    doc = _fr_json(False) or {}
    status = doc.get("pg_status") or {}
    key = tuple(sorted((k, _num(v.get("last_enqueued_collective")), _num(v.get("last_completed_collective")))
                       for k, v in status.items() if isinstance(v, dict)))
    pending = any(e > c for _, e, c in key) or _p2p.pending()
    return key + (("p2p", _p2p.issued, _p2p.done),), pending


def _main_stack() -> list[dict[str, Any]]:
    frame = sys._current_frames().get(threading.main_thread().ident)
    out = []
    while frame is not None and len(out) < 32:
        out.append({"name": frame.f_code.co_name, "filename": frame.f_code.co_filename, "line": frame.f_lineno})
        frame = frame.f_back
    return out


def build_dump(rank: int, reason: str) -> dict[str, Any]:
    """Flight Recorder's dump with our send/recv entries, the rank, and the main thread's stack on the
    entry it waits in (its last pending one)."""
    doc = _fr_json(True) or {"version": "2.x", "pg_config": {}, "pg_status": {}, "entries": []}
    entries = list(doc.get("entries") or []) + _p2p.snapshot()
    entries.sort(key=lambda e: e.get("time_created_ns") or 0)
    for i, e in enumerate(entries, 1):
        e["record_id"] = i
    waiting = [e for e in entries if e.get("state") != "completed" and not e.get("retired")]
    if waiting:
        waiting[-1]["frames"] = _main_stack()
    doc["entries"] = entries
    doc["rank"] = rank
    doc[HANG_DUMP_KEY] = {"reason": reason, "time_ns": time.time_ns(), "pid": os.getpid()}
    return doc


class HangMonitor(threading.Thread):
    def __init__(self, out_dir: str) -> None:
        super().__init__(name="tracekit-hang-monitor", daemon=True)
        self.out_dir = Path(out_dir)
        self.rank: int | None = None
        self.exited = False
        self.dumped_key: Any = None
        self.handled_request: float | None = None

    def run(self) -> None:
        import torch.distributed as dist

        while not (dist.is_available() and dist.is_initialized()):
            time.sleep(BEAT_S / 2)
        self.rank = dist.get_rank()
        atexit.register(self.at_exit)
        last_key, since = None, time.monotonic()
        while not self.exited:
            try:
                key, pending = _progress()
                if key != last_key:
                    last_key, since = key, time.monotonic()
                waited = time.monotonic() - since
                self.beat(key, pending, waited)
                if pending and waited >= DUMP_AFTER_S and self.dumped_key != key:
                    self.dump("waiting")
                    self.dumped_key = key
                self.answer_request()
            except Exception as exc:  # the monitor must never disturb the job
                print(f"tracekit record: hang monitor on rank {self.rank}: {exc!r}", file=sys.stderr)
            time.sleep(BEAT_S)

    def beat(self, key: Any, pending: bool, waited: float) -> None:
        _write_atomic(beat_path(self.out_dir, self.rank), json.dumps({
            "rank": self.rank, "pid": os.getpid(), "progress": repr(key), "pending": pending,
            "waited_s": waited, "time_ns": time.time_ns(), "exited": False}))

    def dump(self, reason: str) -> None:
        _write_atomic(dump_path(self.out_dir, self.rank), json.dumps(build_dump(self.rank, reason), default=str))

    def answer_request(self) -> None:
        req = self.out_dir / BEAT_DIR / DUMP_REQUEST
        try:
            stamp = req.stat().st_mtime
        except OSError:
            return
        if stamp != self.handled_request:
            self.dump("requested")
            self.handled_request = stamp

    def at_exit(self) -> None:
        """The last dump (what this rank did before it left) and a heartbeat saying it exited."""
        self.exited = True
        if self.rank is None:
            return
        try:
            failed = getattr(sys, "last_value", None)
            self.dump("exited" if failed is None else f"exited on {type(failed).__name__}: {failed}")
        except Exception:
            pass
        try:
            _write_atomic(beat_path(self.out_dir, self.rank), json.dumps(
                {"rank": self.rank, "pid": os.getpid(), "exited": True, "time_ns": time.time_ns()}))
        except OSError:
            pass


_monitor: HangMonitor | None = None


def start(out_dir: str) -> None:
    """Start the monitor in this process (once); wraps send/recv now, waits for a process group in its thread."""
    global _monitor
    if _monitor is not None and _monitor.is_alive():
        return
    _wrap_p2p()
    _monitor = HangMonitor(out_dir)
    _monitor.start()
