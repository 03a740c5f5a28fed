"""One rank process's recording: profiler schedule, collective log, clock anchors, status file.

`RankRecorder.on_step()` is called at every step boundary (by the optimizer hook, `tracekit.step()`
or `Recorder.step()`). Outside the profiled window it only counts; at the window it starts
torch.profiler (profiled ranks), puts `C10dOpHook` kernels on the c10d ops (every rank, so unprofiled
ranks still log their collectives), and emits clock anchors. `finalize()` runs once — at exit, on an
exception, or on SIGTERM — and leaves every file complete, a cut-short trace marked partial.

Step numbering follows torch.profiler: step N is the time between the N-th and N+1-th boundary
(step 0 from the start of recording), and the trace's `ProfilerStep#N` events carry those numbers.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from tracekit.record import clock, cpu_share
from tracekit.record.commlog import CommLog, comms_log_path
from tracekit.record.config import RecordConfig
from tracekit.record.notices import NoticeFilter, notices_held
from tracekit.record.step_timing import StepTimer
from tracekit.record.trace_files import (
    PARTS_DIR,
    RANK_RECORD_SCHEMA,
    flight_recorder_path,
    list_parts,
    merge_trace_parts,
    part_path,
    rank_record_path,
    trace_path,
    write_json_atomic,
)


FLUSH_RANGE = "tracekit::flush_collective_log"
"""Profiler range around the step-boundary flush of the collective log (tracekit's own overhead)."""


class RankIdentity:
    """Rank, world size and where they came from; resolved as late as possible."""

    def __init__(self) -> None:
        self.rank: int | None = None
        self.world_size: int | None = None
        self.source: str | None = None
        self.backend: str | None = None

    def resolve(self, final: bool = False) -> int | None:
        """Rank from the process group, else RANK env, else (only when `final`) single-process 0."""
        if self.source == "process_group":
            return self.rank
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                rank, world = dist.get_rank(), dist.get_world_size()
                if self.rank is not None and rank != self.rank:
                    raise RuntimeError(f"rank changed from {self.rank} ({self.source}) to {rank} (process group)")
                self.rank, self.world_size, self.source = rank, world, "process_group"
                try:
                    self.backend = str(dist.get_backend())
                except Exception:
                    self.backend = None
                return rank
        except ImportError:
            pass
        if self.rank is not None:
            return self.rank
        env_rank = os.environ.get("RANK")
        if env_rank is not None:
            self.rank = int(env_rank)
            ws = os.environ.get("WORLD_SIZE")
            self.world_size = int(ws) if ws is not None else None
            self.source = "env"
            return self.rank
        if final:
            # No process group and no RANK: a single-process program. This is a fact, not a guess;
            # the status file says so (rank_source "single_process").
            self.rank, self.world_size, self.source = 0, 1, "single_process"
            return 0
        return None


class RankRecorder:
    """Recording state of one process. Create with the step number that is about to begin."""

    def __init__(self, config: RecordConfig, *, first_step: int, mode: str) -> None:
        self.config = config
        self.out_dir = Path(config.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.mode = mode  # "injected" | "api"
        self.pid = os.getpid()
        self.identity = RankIdentity()
        self.step_num = first_step
        self.first_step = first_step
        self.profiled: bool | None = None
        self.prof = None
        self.log_mode = None
        self._c10d_hook = None
        self._warmup_started_ns: int | None = None
        self._warmup_steps_ns: list[int] = []
        self.window_choice: dict[str, Any] | None = None
        self.step_timer = StepTimer()
        self.notices = NoticeFilter()
        """PyTorch's notices printed by our own profiler calls (start/step/stop), held back and counted."""
        self.comm_log: CommLog | None = None
        self.cycle = 0
        self.cycle_steps: list[list[int]] = []
        self.logged_steps: list[int] = []
        self.status = "running"
        self.reason: str | None = None
        self.notes: list[str] = []
        self.trace_partial = False
        self.trace_written = False
        self.finalized = False
        self.in_step = False
        self.finalizing = False
        self.pending_signal: tuple[int, Any] | None = None
        """True while a step boundary is being processed (a signal handler then defers to its end)."""
        self._lock = threading.RLock()
        self.clock: dict[str, Any] = {"start": clock.sample(), "barrier_samples": [], "trace_anchors": []}
        self._barrier_done = False
        self._dispatch_errors = 0
        self._last_dispatch_error: str | None = None
        self._collectives_logged = 0
        self._groups_seen: dict[str, dict[str, Any]] = {}
        self.host_cpus = cpu_share.host_cpus()
        self.cpu_window: dict[str, Any] | None = None
        """Run-queue wait of this process's threads over the profiled steps (`cpu_share`)."""
        self._cpu_begin: dict[str, int] | None = None
        self.started_ns = time.time_ns()
        local = os.environ.get("LOCAL_RANK")
        group = os.environ.get("GROUP_RANK")
        self.local_rank = int(local) if local is not None else None
        self.group_rank = int(group) if group is not None else None
        if self.identity.resolve() is not None:
            self._write_record()
        self._enter_step(self.step_num)

    # -- step boundaries --------------------------------------------------------------------
    def on_step(self) -> None:
        """Step boundary: close step `step_num`, open `step_num + 1`."""
        if os.getpid() != self.pid or self.finalized:
            return
        with self._lock:
            self.in_step = True
            try:
                self._advance()
            finally:
                self.in_step = False

    def quiet_boundary(self) -> bool:
        """Advance the step count alone when both sides of the boundary are outside the window
        (no profiler object, no logging): the whole cost of recording outside the window."""
        step = self.step_num
        if self.prof is None and self.log_mode is None and not self.finalized and self.pid == os.getpid():
            phase = self.config.schedule.phase
            if phase(step + 1) == "none" and phase(step) == "none":
                if self.step_timer.wants():
                    self.step_timer.boundary(self._step_kind(step))
                self.step_num = step + 1
                return True
        return False

    def _step_kind(self, step: int) -> str:
        """profiled | unprofiled | other, for step_timing (see there)."""
        phase = self.config.schedule.phase
        if phase(step) in ("active", "active_last"):
            return "profiled" if self.profiled and self.prof is not None else "other"
        if step >= 1 and phase(step) == "none" and phase(step - 1) == "none":
            return "unprofiled"
        return "other"

    def _held(self):
        """Our own profiler calls, with PyTorch's notices about them held back (tracekit.record.notices)."""
        rank = self.identity.rank
        return notices_held(self.notices, self.out_dir / f".stderr-held.rank{rank if rank is not None else self.pid}")

    def _advance(self) -> None:
        if True:
            if self.step_timer.wants():
                self.step_timer.boundary(self._step_kind(self.step_num))
            if self.log_mode is not None:
                self._flush_log()
            if self._warmup_started_ns is not None:
                self._warmup_steps_ns.append(time.perf_counter_ns() - self._warmup_started_ns)
                self._warmup_started_ns = None
                if self.config.schedule.phase(self.step_num + 1) in ("active", "active_last"):
                    self._choose_window()
            if self.config.schedule.phase(self.step_num) == "active_last":
                self._cpu_span(False)  # the window's last step ends here, before the profiler exports it
            if self.prof is not None:
                with self._held():
                    self.prof.step()  # may export a cycle (calls _on_trace_ready)
            self.step_num += 1
            if self.prof is not None and self._schedule_done(self.step_num):
                with self._held():
                    self.prof.stop()  # no cycle left: drop the profiler so later steps cost nothing
                self.prof = None
            self._enter_step(self.step_num)

    def _cpu_span(self, profiled: bool) -> None:
        """Open the run-queue wait span at a profiled step; close it where the window's last step ends, before
        `prof.step()` exports the cycle (the export's CPU time, often longer than the steps, and its threads are
        not the training's: counted in, they diluted the wait share and inflated the runnable time per step)."""
        if profiled and self._cpu_begin is None:
            self._cpu_begin = cpu_share.sample()
        elif not profiled and self._cpu_begin is not None:
            self.cpu_window = cpu_share.add_span(self.cpu_window, self._cpu_begin, cpu_share.sample())
            self._cpu_begin = None

    def _schedule_done(self, step: int) -> bool:
        s = self.config.schedule
        return bool(s.repeat) and step >= s.skip_first + s.repeat * s.cycle_steps

    def _enter_step(self, step: int) -> None:
        phase = self.config.schedule.phase(step)
        self._cpu_span(phase in ("active", "active_last"))
        if phase == "none":
            if self.log_mode is not None:  # a window just ended
                self._stop_logging()
                if self.config.flight_recorder:
                    self._dump_flight_recorder(self.identity.resolve(final=True))
                self._write_record()
            return
        rank = self.identity.resolve(final=True)
        if self.profiled is None:
            self.profiled = self.config.is_profiled(rank, self.local_rank)
            self._write_record()
        if self.config.clock_barrier and not self._barrier_done:
            self._take_barrier_samples()
        if self.profiled and self.prof is None:
            self._start_profiler(step)
        if self.config.log_collectives and phase == "warmup":
            from tracekit.record.c10d_hook import c10d_ops

            c10d_ops()  # the hook's one-off op lookups in the warmup step, not the first profiled one
        if phase == "warmup" and self.window_choice is None and self.config.schedule.min_window_ms > 0:
            self._warmup_started_ns = time.perf_counter_ns()  # after our own start-up work above
        if phase in ("active", "active_last"):
            self._start_logging(step)
            if self.prof is not None and self.config.record_shapes:
                self.clock["trace_anchors"].append(clock.trace_anchor(step))
        else:
            self._stop_logging()

    def _choose_window(self) -> None:
        """Time-based window: active steps from the fastest warmup step, the largest any rank asks for."""
        step_ns = min(self._warmup_steps_ns)
        s = self.config.schedule
        want = s.active_for(step_ns)
        agreed = _agree_max(want)
        if agreed != want:
            self.notes.append(f"window: {agreed} active steps (this rank alone would take {want})")
        s.active = max(s.active, agreed)
        self.window_choice = {"warmup_step_ns": int(step_ns), "warmup_steps_ns": self._warmup_steps_ns,
                              "min_window_ms": s.min_window_ms,
                              "max_active": s.max_active, "active": s.active, "this_rank_wanted": want}

    def _take_barrier_samples(self) -> None:
        self._barrier_done = True
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                self.clock["barrier_samples"] = clock.barrier_samples()
        except Exception as exc:  # clock samples are best effort; say why they are missing
            self.notes.append(f"clock barrier failed: {type(exc).__name__}: {exc}")

    def _start_profiler(self, step: int) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        s = self.config.schedule
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        prof = profile(
            activities=activities,
            schedule=self._profiler_action,
            on_trace_ready=self._on_trace_ready,
            record_shapes=self.config.record_shapes,
            with_flops=self.config.with_flops,
            with_stack=self.config.with_stack,
            profile_memory=self.config.profile_memory,
        )
        # Join the schedule at the current step so ProfilerStep#N numbers are the program's steps.
        prof.step_num = step
        prof.current_action = prof.schedule(step)
        if torch.autograd.profiler._is_profiler_enabled:
            self.notes.append("another profiler was already running: this rank was not profiled")
            self.profiled = False
            return
        with self._held():
            prof.start()
        self.prof = prof
        if self.config.memory_history:
            from tracekit.record.memory_history import start_memory_history

            start_memory_history()

    def _profiler_action(self, step: int):
        """torch.profiler's schedule, read from our (possibly lengthened) `ProfileSchedule`."""
        from torch.profiler import ProfilerAction

        return {"none": ProfilerAction.NONE, "warmup": ProfilerAction.WARMUP, "active": ProfilerAction.RECORD,
                "active_last": ProfilerAction.RECORD_AND_SAVE}[self.config.schedule.phase(step)]

    def _start_logging(self, step: int) -> None:
        if not self.config.log_collectives:
            return
        if self.log_mode is None:
            from tracekit.record.c10d_hook import C10dOpHook
            from tracekit.record.dispatch_mode import CollectiveLogger

            rank = self.identity.resolve(final=True)
            if self.comm_log is None:
                self.comm_log = CommLog(comms_log_path(self.out_dir, rank), rank,
                                        self.identity.world_size, _known_groups())
            logger = CollectiveLogger(self.comm_log, rank)
            logger.source = "c10d_dispatcher"
            logger.completion_times = False
            try:
                self._c10d_hook = C10dOpHook(logger).__enter__()
            except Exception as exc:  # e.g. a torch without these ops: say so, record without the log
                self.notes.append(f"collective logging unavailable: {type(exc).__name__}: {exc}")
                self.config.log_collectives = False
                return
            self.log_mode = logger
        self.log_mode.step = step
        self.logged_steps.append(step)

    def _flush_log(self) -> None:
        """Write the finished step's collectives, inside a `tracekit::` range (our overhead, not the user's)."""
        import torch

        with torch._C._profiler._RecordFunctionFast(FLUSH_RANGE):
            self.log_mode.flush()

    def _stop_logging(self) -> None:
        if self.log_mode is None:
            return
        mode, self.log_mode = self.log_mode, None
        hook, self._c10d_hook = self._c10d_hook, None
        try:
            if hook is not None:
                hook.__exit__(None, None, None)
        except Exception as exc:
            self.notes.append(f"could not remove the collective logging kernels cleanly: {exc}")
        mode.flush(final=True)
        self._accumulate_mode(mode)

    def _accumulate_mode(self, mode) -> None:
        self._dispatch_errors += mode.errors
        if mode.last_error:
            self._last_dispatch_error = mode.last_error
        self._collectives_logged += mode.logged
        self._groups_seen.update({k: {"name": g.name, "desc": g.desc, "ranks": g.ranks, "backend": g.backend}
                                  for k, g in mode.groups.items()})

    # -- traces -----------------------------------------------------------------------------
    def _on_trace_ready(self, prof) -> None:
        rank = self.identity.resolve(final=True)
        s = self.config.schedule
        first_active = s.skip_first + self.cycle * s.cycle_steps + s.wait + s.warmup
        last = min(self.step_num, first_active + s.active - 1)
        steps = list(range(first_active, last + 1))
        path = part_path(self.out_dir, rank, self.cycle)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        if self.config.memory_history:
            from tracekit.record.memory_history import dump_memory_snapshot

            try:
                dump_memory_snapshot(self.out_dir, rank)
            except Exception as exc:  # the trace matters more than the snapshot
                self.notes.append(f"memory snapshot failed: {type(exc).__name__}: {exc}")
        self.cycle_steps.append(steps)
        self.cycle += 1
        self._write_trace(rank)

    def _write_trace(self, rank: int) -> None:
        meta = {"rank": rank, "world_size": self.identity.world_size, "steps": [s for c in self.cycle_steps for s in c],
                "cycles": len(self.cycle_steps), "partial": self.trace_partial,
                "status": self.status if self.trace_partial else "complete",
                "written_by": "tracekit record"}
        merge_trace_parts(list_parts(self.out_dir, rank), trace_path(self.out_dir, rank), meta)
        self.trace_written = True

    # -- the end ----------------------------------------------------------------------------
    def finalize(self, status: str, reason: str | None = None) -> None:
        """Close everything once; `status` is ok | exception | signal. Safe to call repeatedly."""
        if os.getpid() != self.pid:
            return
        with self._lock:
            if self.finalized:
                return
            self.finalized = True
            self.finalizing = True
            self.status, self.reason = status, reason
            rank = self.identity.resolve(final=True)
            self._stop_logging()
            self._cpu_span(False)
            if self.prof is not None:
                in_window = self.config.schedule.phase(self.step_num) in ("active", "active_last")
                self.trace_partial = in_window and status != "ok"
                if in_window and status == "ok":
                    # The program ended inside the window: what was traced is kept, but fewer steps.
                    self.notes.append(f"program ended inside the profiled window at step {self.step_num}")
                    self.trace_partial = True
                try:
                    with self._held():
                        self.prof.stop()  # exports the open cycle if it was recording
                except Exception as exc:
                    self.notes.append(f"profiler stop failed: {type(exc).__name__}: {exc}")
                self.prof = None
            if self.config.flight_recorder:
                self._dump_flight_recorder(rank)
            if self.comm_log is not None:
                self.comm_log.close("ok" if status == "ok" else status)
                self._prefer_flight_recorder(rank)
            self.clock["end"] = clock.sample()
            self._write_record()
            if self.trace_written:
                for part in list_parts(self.out_dir, rank):
                    part.unlink(missing_ok=True)
            _remove_empty_parts_dir(self.out_dir)
            self.finalizing = False

    def _prefer_flight_recorder(self, rank: int) -> None:
        """On NCCL, the comms log takes PyTorch's Flight Recorder entry for each collective it holds."""
        fr_path = flight_recorder_path(self.out_dir, rank)
        if "nccl" not in str(self.identity.backend or "").lower() or not fr_path.exists():
            return
        try:
            import json

            from tracekit.record.commlog import prefer_flight_recorder

            n = prefer_flight_recorder(self.comm_log.path, json.loads(fr_path.read_text()).get("entries") or [])
            self.notes.append(f"comms log: {n} entries taken from the Flight Recorder")
        except Exception as exc:  # the log as we wrote it stays valid
            self.notes.append(f"comms log kept as logged (Flight Recorder merge failed: {type(exc).__name__}: {exc})")

    def _dump_flight_recorder(self, rank: int) -> None:
        try:
            import torch
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return
            text = None
            c10d = torch._C._distributed_c10d
            for fn in ("_dump_nccl_trace_json", "_dump_fr_trace_json"):
                if hasattr(c10d, fn):
                    try:
                        text = getattr(c10d, fn)()
                        break
                    except Exception:
                        continue
            if text:
                p = flight_recorder_path(self.out_dir, rank)
                tmp = p.with_name(f".{p.name}.tmp")
                tmp.write_text(text if isinstance(text, str) else text.decode())
                os.replace(tmp, p)
        except Exception as exc:
            self.notes.append(f"flight recorder dump failed: {type(exc).__name__}: {exc}")

    def record_dict(self) -> dict[str, Any]:
        import torch

        rank = self.identity.rank
        self.identity.resolve()
        backend = self.identity.backend
        files = {}
        if rank is not None:
            for key, path in (("trace", trace_path(self.out_dir, rank)),
                              ("comms", comms_log_path(self.out_dir, rank)),
                              ("flight_recorder", flight_recorder_path(self.out_dir, rank))):
                if path.exists():
                    files[key] = path.name
        groups = dict(self._groups_seen)
        for name, g in _known_groups().items():
            groups.setdefault(name, g)
        return {
            "schema": RANK_RECORD_SCHEMA,
            "rank": rank, "world_size": self.identity.world_size, "rank_source": self.identity.source,
            "local_rank": self.local_rank, "group_rank": self.group_rank,
            "host": socket.gethostname(), "pid": self.pid, "mode": self.mode,
            "host_cpus": self.host_cpus, "cpu_window": self.cpu_window,
            "torch_version": torch.__version__, "backend": backend,
            "cuda_available": torch.cuda.is_available(),
            "profiled": bool(self.profiled), "status": self.status, "reason": self.reason,
            "first_step": self.first_step, "last_step": self.step_num,
            "profiled_steps": [s for c in self.cycle_steps for s in c],
            "logged_steps": list(self.logged_steps),
            "trace_partial": self.trace_partial, "files": files, "window_choice": self.window_choice,
            "step_timing": self.step_timer.summary(), "notices_held": dict(self.notices.counts),
            "collectives_logged": self._collectives_logged,
            "dispatch_errors": self._dispatch_errors,
            "last_dispatch_error": self._last_dispatch_error,
            "process_groups": groups, "clock": self.clock, "notes": self.notes,
            "started_ns": self.started_ns, "updated_ns": time.time_ns(),
        }

    def _write_record(self) -> None:
        rank = self.identity.rank
        if rank is None:
            return
        try:
            write_json_atomic(rank_record_path(self.out_dir, rank), self.record_dict())
        except Exception:
            traceback.print_exc()


def _agree_max(value: int) -> int:
    """The largest `value` over the default process group (this rank's own without one)."""
    try:
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return value
        device = "cpu"
        if "nccl" in str(dist.get_backend()).lower() and torch.cuda.is_available():
            device = f"cuda:{torch.cuda.current_device()}"
        t = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())
    except Exception:
        return value


def _known_groups() -> dict[str, dict[str, Any]]:
    """Process groups this rank belongs to: name -> {name, desc, ranks, backend} (best effort)."""
    try:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        if not (dist.is_available() and dist.is_initialized()):
            return {}
        out = {}
        for pg, name in list(c10d._world.pg_names.items()):
            ranks_map = c10d._world.pg_group_ranks.get(pg, {})
            try:
                backend = str(dist.get_backend(pg))
            except Exception:
                backend = "unknown"
            out[name] = {"name": name, "desc": getattr(pg, "group_desc", "") or "",
                         "ranks": sorted(ranks_map, key=ranks_map.__getitem__), "backend": backend}
        return out
    except Exception:
        return {}


def _remove_empty_parts_dir(out_dir: Path) -> None:
    try:
        (out_dir / PARTS_DIR).rmdir()
    except OSError:
        pass
