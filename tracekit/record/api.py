"""Explicit recording from Python, for users who prefer it to `tracekit record`.

    import tracekit
    with tracekit.Recorder(out="traces", wait=1, warmup=1, active=3) as rec:
        for batch in data:
            train_step(batch)
            rec.step()            # or tracekit.step()

Each rank writes the same files as `tracekit record` (DESIGN §7); every rank refreshes
manifest.json from the per-rank records present when it exits. Under `tracekit record`,
`tracekit.step()` switches the injected recorder to explicit steps, and a `Recorder` takes over
from it (the injected one stays out of the way).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tracekit.record.config import ProfileSchedule, RecordConfig

_active: "Recorder | None" = None


class Recorder:
    """Context manager recording this process: profiler schedule, collective log, manifest."""

    def __init__(self, out: str | os.PathLike = "traces", *, wait: int = 1, warmup: int = 1,
                 active: int = 3, repeat: int = 1, skip_first: int = 0,
                 ranks: list[int] | None = None, log_collectives: bool = True,
                 clock_barrier: bool = True, record_shapes: bool = True, with_flops: bool = True,
                 with_stack: bool = False) -> None:
        self.config = RecordConfig(
            out_dir=str(Path(out).resolve()),
            schedule=ProfileSchedule(wait=wait, warmup=warmup, active=active, repeat=repeat,
                                     skip_first=skip_first),
            ranks=ranks, log_collectives=log_collectives, clock_barrier=clock_barrier,
            record_shapes=record_shapes, with_flops=with_flops, with_stack=with_stack,
        )
        self._rec = None

    def __enter__(self) -> "Recorder":
        global _active
        from tracekit.record import inject
        from tracekit.record.recorder import RankRecorder

        inject.opt_out("tracekit.Recorder in use")
        self._rec = RankRecorder(self.config, first_step=0, mode="api")
        _active = self
        return self

    def step(self) -> None:
        """Mark a step boundary (call once per training iteration)."""
        if self._rec is None:
            raise RuntimeError("Recorder.step() called outside `with Recorder(...)`")
        self._rec.on_step()

    @property
    def step_num(self) -> int:
        return self._rec.step_num if self._rec is not None else 0

    def __exit__(self, exc_type, exc, tb) -> None:
        global _active
        from tracekit.record.manifest import write_manifest

        if self._rec is None:
            return
        if exc is None:
            self._rec.finalize("ok")
        elif isinstance(exc, KeyboardInterrupt):
            self._rec.finalize("interrupted", "KeyboardInterrupt")
        else:
            self._rec.finalize("exception", f"{type(exc).__name__}: {exc}")
        _active = None
        write_manifest(self.config.out_path, command=[sys.executable, *sys.argv], config=self.config,
                       exit_code=None)


def step() -> None:
    """Step boundary for the active `Recorder`, or for `tracekit record`'s injected recorder."""
    if _active is not None:
        _active.step()
        return
    from tracekit.record import inject

    inject.manual_step()
