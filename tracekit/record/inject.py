"""The part of `tracekit record` that runs inside the program, installed without code changes.

`tracekit record` puts a `sitecustomize.py` on PYTHONPATH that calls `install()` in every Python
process it starts. `install()` does nothing unless `TRACEKIT_RECORD_CONFIG` is set, and otherwise
only watches for `import torch`; when torch is imported it registers a global optimizer-step hook,
an exit handler and an exception hook. A process becomes a recorded rank only when it steps an
optimizer (or calls `tracekit.step()`), so torchrun's launcher, data-loader workers and helper
processes, which import torch but never step, record nothing.

Step boundaries are the steps of the first optimizer that steps in the process (other optimizers
are ignored), or `tracekit.step()` calls. The boundary is taken just after `optimizer.step()`
returns (not inside its `Optimizer.step#...` profiler range), so no event straddles two steps.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import Any

from tracekit.record.config import CONFIG_ENV, RecordConfig, config_from_env

_HANDLED_SIGNALS = (signal.SIGTERM,)


class _State:
    def __init__(self) -> None:
        self.config: RecordConfig | None = None
        self.installed_torch_hooks = False
        self.recorder = None  # RankRecorder of this pid, created at the first step boundary
        self.driving_optimizer: int | None = None
        self.manual = False
        self.opted_out: str | None = None
        self.exc: BaseException | None = None
        self.prev_handlers: dict[int, Any] = {}
        self.prev_excepthook = None


_state = _State()


def install(environ: dict[str, str] | None = None) -> bool:
    """Arm the recorder in this process if a parent `tracekit record` asked for it."""
    config = config_from_env(environ)
    if config is None:
        return False
    _state.config = config
    if "torch" in sys.modules:
        _on_torch_imported()
    else:
        sys.meta_path.insert(0, _TorchImportWatcher())
    return True


def active_config() -> RecordConfig | None:
    """The config from a parent `tracekit record`, or None (lets programs that profile themselves,
    like the reference runtime, follow the requested out dir and schedule)."""
    return _state.config or config_from_env()


def opt_out(reason: str) -> None:
    """Called by a program that records itself: the injected recorder then stays out of its way."""
    _state.opted_out = reason


class _TorchImportWatcher:
    """Meta-path finder that runs `_on_torch_imported` right after `torch` finishes importing."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            return None
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module, _original=original, _loader=loader):
            _original(module)
            try:
                del _loader.exec_module  # back to the class's method
            except AttributeError:
                pass
            _on_torch_imported()

        loader.exec_module = exec_module
        return spec


def _on_torch_imported() -> None:
    if _state.installed_torch_hooks:
        return
    _state.installed_torch_hooks = True
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(_optimizer_post_hook)
    except Exception as exc:  # pragma: no cover - torch too old
        print(f"tracekit record: cannot hook optimizer steps ({exc}); use tracekit.step()", file=sys.stderr)
    atexit.register(_at_exit)
    if _state.config is not None and _state.config.hang_timeout > 0:
        try:
            from tracekit.record import hang_monitor

            hang_monitor.start(_state.config.out_dir)
        except Exception as exc:  # never stop the program; say the hang watch is off
            print(f"tracekit record: hang monitor not started in pid {os.getpid()}: {exc!r}", file=sys.stderr)
    _state.prev_excepthook = sys.excepthook
    sys.excepthook = _excepthook


def _excepthook(exc_type, exc, tb) -> None:
    _state.exc = exc
    (_state.prev_excepthook or sys.__excepthook__)(exc_type, exc, tb)


def _recorder_for_this_process(first_step: int):
    rec = _state.recorder
    if rec is not None and rec.pid == os.getpid():
        return rec
    if rec is not None:  # inherited through fork: not ours
        _state.recorder = None
        _state.driving_optimizer = None
        _state.manual = False
    return None


def _create_recorder(first_step: int):
    from tracekit.record.recorder import RankRecorder

    rec = RankRecorder(_state.config, first_step=first_step, mode="injected")
    _state.recorder = rec
    if threading.current_thread() is threading.main_thread():
        for sig in _HANDLED_SIGNALS:
            _state.prev_handlers[sig] = signal.signal(sig, _on_signal)
    else:
        rec.notes.append("recorder started off the main thread: SIGTERM is not intercepted")
    return rec


SELF_RECORDING_MODULES = ("instrumented_runtime",)
"""Programs that run their own profiler and comm log into the same layout: the injected recorder
stays out of their processes (two profilers cannot run at once)."""


def _optimizer_post_hook(optimizer, args, kwargs) -> None:
    config = _state.config
    if config is None or _state.opted_out or config.step_on == "manual" or _state.manual:
        return
    if _state.recorder is None:
        for mod in SELF_RECORDING_MODULES:
            if mod in sys.modules:
                opt_out(f"{mod} records itself")
                return
    rec = _recorder_for_this_process(1)
    if _state.driving_optimizer is None:
        _state.driving_optimizer = id(optimizer)
    elif _state.driving_optimizer != id(optimizer):
        return
    if rec is not None and rec.quiet_boundary():
        return  # outside the window: nothing else to do
    _defer_until_step_returns(rec)


def _boundary(rec) -> None:
    if rec is None:
        # The first boundary: step 0 (start-up + first iteration) has just ended.
        _create_recorder(first_step=1)
    else:
        rec.on_step()
        _handle_pending_signal(rec)


def _defer_until_step_returns(rec) -> None:
    """Run the step boundary when `Optimizer.step`'s profiling wrapper returns (see module doc)."""
    frame = sys._getframe(2)  # 0: here, 1: _optimizer_post_hook, 2: optimizer's step wrapper
    if sys.getprofile() is not None or frame.f_code.co_name != "wrapper":
        _boundary(rec)  # someone else profiles Python calls: take the boundary here
        return

    def _on_event(f, event, arg, _target=frame, _rec=rec):
        if f is _target and event == "return":
            sys.setprofile(None)
            _boundary(_rec)

    sys.setprofile(_on_event)


def manual_step() -> None:
    """`tracekit.step()` under `tracekit record`: from now on only explicit calls advance steps."""
    if _state.config is None or _state.opted_out or _state.config.step_on == "optimizer":
        return  # --step-on optimizer: explicit calls are ignored
    _state.manual = True
    rec = _recorder_for_this_process(1)
    _boundary(rec)


def _handle_pending_signal(rec) -> None:
    pending = getattr(rec, "pending_signal", None)
    if pending is not None:
        rec.pending_signal = None
        _on_signal(*pending)


def _on_signal(signum, frame) -> None:
    rec = _state.recorder
    if rec is not None and rec.pid == os.getpid():
        if rec.in_step or rec.finalizing:
            rec.pending_signal = (signum, frame)  # finish the boundary / the files first, then stop
            return
        rec.finalize("signal", signal.Signals(signum).name)
    prev = _state.prev_handlers.get(signum, signal.SIG_DFL)
    if callable(prev):
        prev(signum, frame)
        return
    if prev == signal.SIG_IGN:
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _at_exit() -> None:
    rec = _state.recorder
    if rec is None or rec.pid != os.getpid():
        return
    exc = _state.exc
    if exc is None:
        rec.finalize("ok")
    elif isinstance(exc, KeyboardInterrupt):
        rec.finalize("interrupted", "KeyboardInterrupt")
    else:
        rec.finalize("exception", f"{type(exc).__name__}: {exc}")
    _handle_pending_signal(rec)


def current_recorder():
    """This process's injected recorder, if it has started."""
    return _recorder_for_this_process(0)


__all__ = ["CONFIG_ENV", "install", "active_config", "opt_out", "manual_step", "current_recorder"]
