"""PyTorch's own notices about a profiler that tracekit turned on, told apart from everything else a rank prints.

Each profiled rank prints, to its stderr, lines that say nothing about the user's program:
- Kineto's `USDT:... SyncActivityProfilerHandler.cpp:NN] profiler_start` / `profiler_stop`, once per
  profiler start and stop. Printed at a level no setting turns off (`KINETO_LOG_LEVEL` leaves it on).
- c10's `CPUAllocator.cpp:NNN] Memory block of unknown size was allocated before the profiling started,
  ...`: a tensor allocated before the window was freed inside it with `profile_memory` on (every 1000th
  such free is logged). Expected: the window opens in the middle of training.

`NoticeFilter` takes a process's stderr line by line, keeps every other line as it came (errors, warnings
and tracebacks of the program pass through untouched), counts the notices and says in one line what it
left out. Only whole lines that match a notice exactly as PyTorch words it are held back.
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

NOTICES: dict[str, re.Pattern[bytes]] = {
    "Kineto profiler_start/profiler_stop": re.compile(
        rb"^USDT:\S+ \S+ \d+:\d+ SyncActivityProfilerHandler\.cpp:\d+\] profiler_(?:start|stop)\s*$"),
    "CPUAllocator 'memory block of unknown size was allocated before the profiling started'": re.compile(
        rb"^(?:\[rank\d+\]:)?\[W\S* \S+ CPUAllocator\.cpp:\d+\] Memory block of unknown size was allocated "
        rb"before the profiling started, profiler results will not include the deallocation event\s*$"),
}
"""Label -> the whole line as PyTorch prints it (c10's logger prefixes `[rankN]:` once a group exists)."""


def notice_of(line: bytes) -> str | None:
    """The notice's label when `line` is one of PyTorch's profiler notices, else None."""
    for label, pattern in NOTICES.items():
        if pattern.match(line):
            return label
    return None


@dataclass
class NoticeFilter:
    """Counts PyTorch's profiler notices in a stream of lines; passes every other line on."""

    counts: Counter = field(default_factory=Counter)

    def keep(self, line: bytes) -> bool:
        label = notice_of(line)
        if label is None:
            return True
        self.counts[label] += 1
        return False

    def summary(self, who: str | None = None) -> str | None:
        """One line saying what was left out (prefixed `[who] `), or None when nothing was."""
        if not self.counts:
            return None
        total = sum(self.counts.values())
        parts = ", ".join(f"{n} {label}" for label, n in self.counts.most_common())
        return (f"[{who}] " if who else "") + (f"{total} lines of PyTorch profiler notices not shown ({parts}): printed because the "
                f"profiler is on; they do not concern the program")


@contextmanager
def notices_held(notices: NoticeFilter, spool: Path):
    """While the block runs (tracekit's own profiler calls: start, step, stop), this process's stderr goes to
    `spool`; afterwards every line that is not a profiler notice is written to stderr as it came, and the
    spool is removed. A process that dies inside the block leaves its lines in `spool`, not lost."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        fd = os.open(spool, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError:  # no spool: run the block with stderr as it is
        yield
        return
    os.dup2(fd, 2)
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.lseek(fd, 0, os.SEEK_SET)
            with os.fdopen(fd, "rb") as held:
                for line in held:
                    if notices.keep(line):
                        os.write(2, line)
            Path(spool).unlink(missing_ok=True)
