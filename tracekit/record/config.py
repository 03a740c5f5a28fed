"""What `tracekit record` asks each rank process to do, and how that request travels (one env var).

The parent (`tracekit record`) serialises a `RecordConfig` into `TRACEKIT_RECORD_CONFIG`; the
bootstrap in every rank process reads it back. Everything here is plain Python (no torch) so the
CLI can validate options without importing torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

CONFIG_ENV = "TRACEKIT_RECORD_CONFIG"
"""Env var holding the JSON-encoded `RecordConfig` for the rank processes."""

STEP_ON_CHOICES = ("auto", "optimizer", "manual")


@dataclass(kw_only=True)
class ProfileSchedule:
    """torch.profiler's schedule in steps: `wait` idle, `warmup` tracing-but-discarded, `active` kept."""

    wait: int = 1
    """Steps to skip before each cycle (the first cycle starts after `skip_first` + `wait`)."""
    warmup: int = 1
    """Steps traced but discarded, so the profiler's own start-up cost stays out of the kept steps."""
    active: int = 3
    """Steps kept in the trace per cycle."""
    repeat: int = 1
    """Number of cycles (0 = keep cycling until the program ends)."""
    skip_first: int = 0
    """Steps to skip once, before the first cycle."""
    min_window_ms: int = 0
    """When > 0, `active` is a minimum: at the end of the warmup the recorder lengthens the window to hold
    at least this much time at its fastest warmup step's duration (capped at `max_active`), the same on
    every rank. 0 = exactly `active` steps."""
    max_active: int = 100
    """Cap on the steps a time-based window may hold."""

    def __post_init__(self) -> None:
        for name in ("wait", "warmup", "skip_first", "repeat"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.active < 1:
            raise ValueError(f"--active must be >= 1, got {self.active}")
        if self.min_window_ms < 0 or self.max_active < self.active:
            raise ValueError(f"--min-window-ms must be >= 0 and --max-active >= --active "
                             f"(got {self.min_window_ms}, {self.max_active}, {self.active})")

    def active_for(self, step_ns: int) -> int:
        """Active steps for a measured step time: `active`, or enough for `min_window_ms` (capped)."""
        if self.min_window_ms <= 0 or step_ns <= 0:
            return self.active
        need = -(-self.min_window_ms * 1_000_000 // step_ns)  # ceil
        return int(min(self.max_active, max(self.active, need)))

    @property
    def cycle_steps(self) -> int:
        return self.wait + self.warmup + self.active

    def phase(self, step: int) -> str:
        """'none' | 'warmup' | 'active' | 'active_last' for step number `step` (torch's numbering)."""
        if step < self.skip_first:
            return "none"
        k = step - self.skip_first
        if self.repeat and k >= self.repeat * self.cycle_steps:
            return "none"
        m = k % self.cycle_steps
        if m < self.wait:
            return "none"
        if m < self.wait + self.warmup:
            return "warmup"
        return "active_last" if m == self.cycle_steps - 1 else "active"

    def active_steps(self, limit: int = 10_000) -> list[int]:
        """Step numbers that end up in the trace (`ProfilerStep#N`), up to `limit` for repeat=0."""
        out: list[int] = []
        cycles = self.repeat if self.repeat else max(1, limit // self.cycle_steps)
        for c in range(cycles):
            first = self.skip_first + c * self.cycle_steps + self.wait + self.warmup
            out.extend(range(first, first + self.active))
        return out


@dataclass(kw_only=True)
class RecordConfig:
    """The request `tracekit record` sends to every rank process."""

    out_dir: str
    """Absolute path of the output directory (DESIGN §7 layout)."""
    schedule: ProfileSchedule = field(default_factory=ProfileSchedule)
    ranks: list[int] | None = None
    """Global ranks to profile; None = all (see also `ranks_per_group`)."""
    ranks_per_group: int | None = None
    """Profile only the first N local ranks of each launcher group (torchrun's GROUP_RANK, one per node)."""
    step_on: str = "auto"
    """'optimizer': advance on every optimizer step; 'manual': only on `tracekit.step()`;
    'auto': optimizer steps until the program first calls `tracekit.step()`."""
    log_collectives: bool = True
    """Log every c10d collective inside the profiled window (TorchDispatchMode) into comms.rank{R}.jsonl."""
    clock_barrier: bool = True
    """Take barrier-synchronised clock samples once a default process group exists (one-off, at the
    first warmup boundary), so ranks on different hosts can be aligned."""
    record_shapes: bool = True
    with_flops: bool = True
    with_stack: bool = False
    profile_memory: bool = True
    """torch.profiler profile_memory: every allocation/free in the window as a `[memory]` event (the
    memory table and analysis); see benchmarks/record_overhead.py for its cost."""
    memory_history: bool = False
    """CUDA only: record the allocator history in the window and write memory_snapshot.rank{R}.pickle."""
    flight_recorder: bool = True
    """Dump PyTorch's Flight Recorder buffer (gloo and NCCL) per rank at exit."""
    hang_timeout: float = 600.0
    """Seconds without progress on any rank (while one waits in a collective or send/recv) after which
    the job is called hung: every rank dumps its Flight Recorder buffer into out/hang/ (0: off)."""
    hang_action: str = "stop"
    """On a hang: 'stop' the job after the dumps, or 'report' and leave it running."""

    def __post_init__(self) -> None:
        if isinstance(self.schedule, dict):
            self.schedule = ProfileSchedule(**self.schedule)
        if self.step_on not in STEP_ON_CHOICES:
            raise ValueError(f"--step-on must be one of {STEP_ON_CHOICES}, got {self.step_on!r}")
        if self.ranks is not None and self.ranks_per_group is not None:
            raise ValueError("give either --ranks or --ranks-per-group, not both")
        if self.ranks_per_group is not None and self.ranks_per_group < 1:
            raise ValueError(f"--ranks-per-group must be >= 1, got {self.ranks_per_group}")
        if self.hang_timeout < 0:
            raise ValueError(f"--hang-timeout must be >= 0 seconds (0: off), got {self.hang_timeout}")
        if self.hang_action not in ("stop", "report"):
            raise ValueError(f"--hang-action must be 'stop' or 'report', got {self.hang_action!r}")
        if self.ranks is not None and any(r < 0 for r in self.ranks):
            raise ValueError(f"--ranks must be non-negative, got {self.ranks}")

    @property
    def out_path(self) -> Path:
        return Path(self.out_dir)

    def is_profiled(self, rank: int, local_rank: int | None) -> bool:
        """Whether this rank runs the profiler (every rank logs collectives either way)."""
        if self.ranks is not None:
            return rank in self.ranks
        if self.ranks_per_group is not None:
            if local_rank is None:
                return rank < self.ranks_per_group
            return local_rank < self.ranks_per_group
        return True

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RecordConfig":
        data = json.loads(text)
        data["schedule"] = ProfileSchedule(**data["schedule"])
        return cls(**data)


def config_from_env(environ: dict[str, str] | None = None) -> RecordConfig | None:
    """The `RecordConfig` passed by a parent `tracekit record`, or None when not running under it."""
    text = (environ if environ is not None else os.environ).get(CONFIG_ENV)
    if not text:
        return None
    return RecordConfig.from_json(text)


def parse_rank_list(text: str, flag: str = "--ranks") -> list[int]:
    """'0,8,16' or '0-3,8' -> sorted unique ints; raises ValueError naming the bad part (and `flag`)."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, _, hi = part.partition("-")
            try:
                a, b = int(lo), int(hi)
            except ValueError:
                raise ValueError(f"bad rank range {part!r} in {flag} {text!r}") from None
            if b < a:
                raise ValueError(f"empty rank range {part!r} in {flag} {text!r}")
            out.update(range(a, b + 1))
        else:
            try:
                out.add(int(part))
            except ValueError:
                raise ValueError(f"bad rank {part!r} in {flag} {text!r}") from None
    if not out:
        raise ValueError(f"{flag} {text!r} names no rank")
    return sorted(out)
