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

Every Python-level `torch.distributed` collective and send/recv is also appended, before it runs, to
`<out>/hang/calls.rank{R}.jsonl` (`_CallLog`): the parent rebuilds a dump from it for a rank that was
killed or aborted before it could write one.

Costs: a `pg_status`-only dump (no entries) and a small file write every `BEAT_S`; per wrapped call a
dict, a JSON line and one `write` (collectives that C++ issues, e.g. DDP's buckets, are not wrapped:
Flight Recorder records them).
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

try:  # ~10x faster than json.dumps: one line per collective call
    from msgspec.json import encode as _encode
except ImportError:  # pragma: no cover - msgspec is a dependency
    def _encode(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

BEAT_S = 0.5
DUMP_AFTER_S = 1.0
"""Seconds a rank waits without progress before it writes its dump (then again on every change)."""
P2P_BUFFER = 2000
CALL_LOG_BYTES = 8 << 20
"""A rank's call log is rotated past this size (the previous part kept as `.1`): 16 MB at most per rank."""
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


class _CallLog:
    """torch.distributed calls made from Python, in Flight Recorder's entry schema.

    Send/recv are kept in memory for the dumps (gloo's Flight Recorder records none). Every call is also
    appended to `<out>/hang/calls.rank{R}.jsonl` before it runs, and a `{"done": id}` line after a
    blocking one returns: one `write` each, so the lines survive a rank that is killed or aborts inside
    the call (gloo aborts a rank on a size mismatch), when no dump could be written.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: deque[tuple[dict[str, Any], Any]] = deque(maxlen=P2P_BUFFER)
        self.seq: dict[tuple[str, bool], int] = {}
        self.issued = 0
        self.done = 0
        self.fd: int | None = None
        self.path: Path | None = None
        self.written = 0
        self.out_dir: str | None = None
        self.record_id = 0
        self.groups: dict[int, tuple[str, str, list[int], str]] = {}

    def _group(self, group: Any) -> tuple[str, str, list[int], str]:
        import torch.distributed as dist

        pg = group or dist.group.WORLD
        got = self.groups.get(id(pg))
        if got is None:
            c10d = dist.distributed_c10d
            name = c10d._get_process_group_name(pg) if pg is not None else "0"
            desc = getattr(pg, "group_desc", None) or ("default_pg" if name == "0" else "")
            try:
                backend = str(dist.get_backend(pg))
            except Exception:
                backend = "c10d"
            got = self.groups[id(pg)] = (name, desc, list(dist.get_process_group_ranks(pg)), backend)
        return got

    def _write(self, obj: dict[str, Any]) -> None:
        if self.fd is None and self.out_dir is not None:
            import torch.distributed as dist

            self.path = Path(self.out_dir) / HANG_DIR / f"calls.rank{dist.get_rank()}.jsonl"
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self.written = 0
        if self.fd is not None:
            line = _encode(obj) + b"\n"
            os.write(self.fd, line)
            self.written += len(line)
            if self.written > CALL_LOG_BYTES:  # keep the latest calls only: this file and the one before
                os.close(self.fd)
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                self.written = 0

    def begin(self, op: str, group: Any, inputs: list[Any], outputs: list[Any], peer: int | None = None,
              **extra: Any) -> dict[str, Any]:
        import torch.distributed as dist

        name, desc, ranks, backend = self._group(group)
        p2p = op in ("send", "recv")
        with self.lock:
            key = (name, p2p)
            self.seq[key] = self.seq.get(key, 0) + 1
            self.record_id += 1
            self.issued += p2p
            label = f"{backend}:{op}" + (f" {dist.get_rank()}{'->' if op == 'send' else '<-'}{peer}" if p2p else "")
            entry = {"record_id": self.record_id, "pg_id": None, "process_group": [name, desc],
                     "collective_seq_id": 0 if p2p else self.seq[key], "p2p_seq_id": self.seq[key] if p2p else 0,
                     "profiling_name": label, "time_created_ns": time.time_ns(),
                     "input_sizes": [list(t.shape) for t in inputs], "input_dtypes": [_dtype(t) for t in inputs],
                     "output_sizes": [list(t.shape) for t in outputs], "output_dtypes": [_dtype(t) for t in outputs],
                     "state": "scheduled", "retired": False, "is_p2p": p2p, "peer": peer, "group_ranks": ranks,
                     "source": "tracekit_calls", **extra}
            if p2p:
                self.entries.append((entry, None))
            self._write(entry)
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
                self.done += entry["is_p2p"]
                self._write({"done": entry["record_id"], "t": entry["time_discovered_completed_ns"]})

    def snapshot(self) -> list[dict[str, Any]]:
        """Send/recv entries with the state of their Work where the caller kept one (isend/irecv)."""
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


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype(t: Any) -> str:
    name = _DTYPE_NAMES.get(t.dtype)
    if name is None:
        from tracekit.record.dispatch_mode import dtype_name

        name = _DTYPE_NAMES[t.dtype] = dtype_name(t.dtype)
    return name


_calls = _CallLog()

# torch.distributed function -> (op, where the inputs / outputs / peer / group are among its arguments)
_WRAPPED: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], str | None]] = {
    "all_reduce": ("all_reduce", ("tensor",), ("tensor",), None),
    "broadcast": ("broadcast", ("tensor",), ("tensor",), None),
    "reduce": ("reduce", ("tensor",), ("tensor",), None),
    "barrier": ("barrier", (), (), None),
    "all_gather_into_tensor": ("all_gather", ("input_tensor",), ("output_tensor",), None),
    "reduce_scatter_tensor": ("reduce_scatter", ("input",), ("output",), None),
    "all_to_all_single": ("all_to_all", ("input",), ("output",), None),
    "all_gather": ("all_gather", ("tensor",), (), None),
    "send": ("send", ("tensor",), ("tensor",), "dst"),
    "recv": ("recv", ("tensor",), ("tensor",), "src"),
    "isend": ("send", ("tensor",), ("tensor",), "dst"),
    "irecv": ("recv", ("tensor",), ("tensor",), "src"),
}


def _binder(fn: Any):
    """args, kwargs -> {parameter: value}, without inspect.signature's cost per call."""
    import inspect

    names = list(inspect.signature(fn).parameters)

    def bind(args: tuple, kwargs: dict) -> dict[str, Any]:
        out = dict(zip(names, args))
        out.update(kwargs)
        return out

    return bind


_inside = threading.local()
"""Set while a wrapped call runs: torch's `send` calls `isend` (a wrapped name), logged once."""


def _wrap(fn: Any, op: str, ins: tuple[str, ...], outs: tuple[str, ...], peer_arg: str | None) -> Any:
    bind = _binder(fn)

    def wrapper(*args, **kwargs):
        if getattr(_inside, "on", False):
            return fn(*args, **kwargs)
        _inside.on = True
        try:
            return logged(*args, **kwargs)
        finally:
            _inside.on = False

    def logged(*args, **kwargs):
        try:
            a = bind(args, kwargs)
            peer = a.get(peer_arg) if peer_arg else None
            entry = _calls.begin(op, a.get("group"), [a[k] for k in ins if a.get(k) is not None],
                                 [a[k] for k in outs if a.get(k) is not None],
                                 peer=None if peer is None else int(peer))
        except Exception:  # logging must never change the call
            return fn(*args, **kwargs)
        out = fn(*args, **kwargs)
        if fn.__name__ in ("isend", "irecv"):
            _calls.attach(entry, out)
        elif out is None or not a.get("async_op"):
            _calls.finish(entry)
        return out

    wrapper.__wrapped__ = fn
    wrapper.__name__ = fn.__name__
    wrapper._tracekit_hang_log = True
    return wrapper


def _wrap_calls(out_dir: str) -> None:
    """Wrap torch.distributed's Python collectives and send/recv (batch_isend_irecv calls isend/irecv)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    _calls.out_dir = out_dir
    for name, (op, ins, outs, peer) in _WRAPPED.items():
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "_tracekit_hang_log", False):
            continue
        wrapped = _wrap(original, op, ins, outs, peer)
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
    pending = any(e > c for _, e, c in key) or _calls.pending()
    return key + (("p2p", _calls.issued, _calls.done),), pending


def _main_stack() -> list[dict[str, Any]]:
    frame = sys._current_frames().get(threading.main_thread().ident)
    out = []
    while frame is not None and len(out) < 32:
        out.append({"name": frame.f_code.co_name, "filename": frame.f_code.co_filename, "line": frame.f_lineno})
        frame = frame.f_back
    return out


def build_dump(rank: int, reason: str) -> dict[str, Any]:
    """Flight Recorder's dump with our send/recv entries, the rank, and the main thread's Python stack now
    (innermost first) on the entry it waits in (its last pending one), else on its last entry: a rank
    that never reached the collective shows where it is instead."""
    doc = _fr_json(True) or {"version": "2.x", "pg_config": {}, "pg_status": {}, "entries": []}
    entries = list(doc.get("entries") or [])
    if not any(e.get("is_p2p") for e in entries):  # NCCL's recorder has the send/recv itself; gloo's has none
        entries += _calls.snapshot()
    entries.sort(key=lambda e: e.get("time_created_ns") or 0)
    for i, e in enumerate(entries, 1):
        e["record_id"] = i
    waiting = [e for e in entries if e.get("state") != "completed" and not e.get("retired")]
    target = waiting[-1] if waiting else (entries[-1] if entries else None)
    if target is not None:  # where the rank is now: in the call it waits in, or wherever it went after its last
        target["frames"] = _main_stack()
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
    first = _monitor is None
    _wrap_calls(out_dir)
    _monitor = HangMonitor(out_dir)
    _monitor.start()
    if first and hasattr(os, "register_at_fork"):  # ranks forked after torch was imported (the runtime)
        os.register_at_fork(after_in_child=lambda: _restart_in_child(out_dir))


def _restart_in_child(out_dir: str) -> None:
    """A forked process has no thread of its parent's and shares its log's state: start both afresh when
    the parent had no process group (a launcher forking its ranks). A rank's own helper processes
    (DataLoader workers) inherit its process group but are not ranks: they log and beat nothing."""
    global _calls, _monitor
    fresh = _CallLog()
    _calls = fresh
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return
    except Exception:
        return
    fresh.out_dir = out_dir
    _monitor = HangMonitor(out_dir)
    _monitor.start()
