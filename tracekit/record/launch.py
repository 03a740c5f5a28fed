"""The parent side of `tracekit record`: run COMMAND with the recorder injected, then write the manifest.

COMMAND's exit status is returned unchanged (a signal death becomes 128 + signal number, as a
shell reports it). SIGTERM and SIGHUP sent to `tracekit record` are forwarded to COMMAND; SIGINT
is left to COMMAND (the terminal delivers Ctrl-C to the whole foreground process group).
"""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tracekit.errors import TracekitError
from tracekit.process_env import user_environ
from tracekit.record.bootstrap import PKG_ROOT_ENV, SiteDir, package_root
from tracekit.record.config import CONFIG_ENV, RecordConfig
from tracekit.record.manifest import write_manifest
from tracekit.record.trace_files import MANIFEST, PARTS_DIR, nccl_dump_prefix

_OUR_PATTERNS = ("rank*.pt.trace.json.gz", "comms.rank*.jsonl", "record.rank*.json",
                 "flight_recorder.*", MANIFEST, "hang", ".hang", "hang-analysis")


class RecordError(TracekitError):
    """`tracekit record` could not start (bad options, unusable output directory, no command)."""


@dataclass
class RecordResult:
    exit_code: int
    manifest: dict[str, Any]
    out_dir: Path
    hang: dict[str, Any] | None = None
    """What the hang watch found (None: off, or the job ended well): detected, dead/exited ranks, the
    top `hang` finding of the dumps' analysis and where it was written."""


def existing_recording(out_dir: Path) -> list[Path]:
    found: list[Path] = []
    for pat in _OUR_PATTERNS:
        found.extend(out_dir.glob(pat))
    if (out_dir / PARTS_DIR).exists():
        found.append(out_dir / PARTS_DIR)
    return sorted(found)


def clear_recording(out_dir: Path) -> None:
    import shutil

    for p in existing_recording(out_dir):
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()


def child_environment(config: RecordConfig, site: SiteDir, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env["PYTHONPATH"] = site.pythonpath(base.get("PYTHONPATH"))
    env[CONFIG_ENV] = config.to_json()
    env[PKG_ROOT_ENV] = package_root()
    if config.flight_recorder:
        # NCCL's Flight Recorder (harmless for gloo): keep a buffer, dump it into DIR on a timeout.
        # (torch >= 2.7 names; the older TORCH_NCCL_TRACE_BUFFER_SIZE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE
        # still work there but warn, so they are only set when the user already uses them.)
        if "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env:
            env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
        env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        if "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env:
            env.setdefault("TORCH_FR_DUMP_TEMP_FILE", nccl_dump_prefix(config.out_dir))
    return env


def self_recording_program(command: list[str]) -> str | None:
    """The module name when COMMAND runs a program that records itself (`python -m instrumented_runtime`)."""
    for i, arg in enumerate(command[:-1]):
        if arg == "-m" and command[i + 1] == "instrumented_runtime":
            return "instrumented_runtime"
    return None


def route_program_output(command: list[str], out_dir: Path) -> list[str]:
    """For a self-recording program, make its own `--out` the recording directory.

    Appends `--out DIR` when COMMAND has none; a different `--out` is an error (the files would
    land somewhere `tracekit record` does not report on).
    """
    if self_recording_program(command) is None:
        return command
    for i, arg in enumerate(command):
        value = None
        if arg == "--out" and i + 1 < len(command):
            value = command[i + 1]
        elif arg.startswith("--out="):
            value = arg.split("=", 1)[1]
        if value is not None:
            if Path(value).resolve() != out_dir.resolve():
                raise RecordError(f"COMMAND writes to --out {value} but tracekit record to {out_dir}: "
                                  "drop one of them or make them the same")
            return command
    return [*command, "--out", str(out_dir)]


def run_record(config: RecordConfig, command: list[str], *, overwrite: bool = False,
               diagnose_hang: Callable[[Path], tuple[dict[str, Any] | None, Path]] | None = None) -> RecordResult:
    """Run `command` under the recorder and return its exit code and the manifest.

    `diagnose_hang(out_dir)`: analyses the hang dumps the watch collected into (top hang finding or None,
    where the analysis went) — `tracekit.analysis.analyze_hang_dumps`, passed in by the CLI (recording sits
    below analysis); without it the dumps are kept for `tracekit analyze OUT/hang`."""
    if not command:
        raise RecordError("no COMMAND given: put it after `--`, e.g. `tracekit record -- python train.py`")
    out_dir = config.out_path
    command = route_program_output(command, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    old = existing_recording(out_dir)
    if old:
        if not overwrite:
            raise RecordError(f"{out_dir} already holds a recording ({old[0].name}, ...): "
                              "pass --overwrite or choose another --out")
        clear_recording(out_dir)
    site = SiteDir()
    started_ns = time.time_ns()
    forwarded: dict[int, Any] = {}
    try:
        env = child_environment(config, site, user_environ())  # without tracekit's own settings
        try:
            proc = subprocess.Popen(command, env=env)
        except OSError as exc:
            raise RecordError(f"cannot start {command[0]!r}: {exc}") from None

        def _forward(signum, _frame):
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass

        for sig in (signal.SIGTERM, signal.SIGHUP):
            forwarded[sig] = signal.signal(sig, _forward)
        forwarded[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
        if config.hang_timeout > 0:
            rc, hang = _wait_watching(proc, config, diagnose_hang)
        else:
            rc, hang = proc.wait(), None
    finally:
        for sig, prev in forwarded.items():
            signal.signal(sig, prev)
        site.cleanup()
    exit_code = 128 - rc if rc < 0 else rc
    if hang is not None and hang["detected"] and config.hang_action == "stop":
        from tracekit.errors import HANG_EXIT_CODE

        exit_code = HANG_EXIT_CODE  # we stopped the job: its own status (a signal) would mislead
    manifest = write_manifest(out_dir, command=command, config=config, exit_code=exit_code,
                              started_ns=started_ns, salvage=True)
    return RecordResult(exit_code=exit_code, manifest=manifest, out_dir=out_dir, hang=hang)


def _wait_watching(proc: Any, config: RecordConfig, diagnose: Callable[[Path], Any] | None
                   ) -> tuple[int, dict[str, Any] | None]:
    """Wait for the job while the hang watch polls; on a hang: dumps, analysis, then stop (or report)."""
    import sys

    from tracekit.record.hang_watch import HangWatch

    watch = HangWatch(out_dir=config.out_path, timeout_s=config.hang_timeout)
    detected = False
    while True:
        try:
            rc = proc.wait(timeout=0.25)
            break
        except subprocess.TimeoutExpired:
            pass
        if not detected and watch.poll():
            detected = True
            print(f"tracekit record: no rank progressed for {config.hang_timeout:g} s: the job is hung; "
                  f"collecting every rank's Flight Recorder dump", file=sys.stderr, flush=True)
            watch.request_dumps()
            report = _hang_report(watch, True, diagnose)
            print(f"tracekit record: {report.get('summary') or 'no stuck collective found in the dumps'}",
                  file=sys.stderr, flush=True)
            if config.hang_action == "stop":
                print("tracekit record: stopping the job (--hang-action report leaves it running)",
                      file=sys.stderr, flush=True)
                watch.stop_job(proc)
                rc = proc.wait()
                return rc, report
    if detected:
        return rc, _hang_report(watch, True, diagnose)
    if rc == 0 and not watch.dead_ranks():
        watch.clean()
        return rc, None
    return rc, (_hang_report(watch, False, diagnose) if watch.has_dumps() or watch.dead_ranks() else None)


def _hang_report(watch: Any, detected: bool, diagnose: Callable[[Path], Any] | None) -> dict[str, Any]:
    """Mark dead ranks in their dumps, analyse the dumps (with `diagnose`), and say what was found."""
    watch.fill_from_call_logs()
    dead, later = watch.first_dead()
    watch.mark_dead(dead, "died")
    watch.mark_dead(later, f"stopped after ranks {dead} died", dead=False)
    report: dict[str, Any] = {"detected": detected, "dead_ranks": dead, "stopped_ranks": later,
                              "exited_ranks": watch.exited_ranks(),
                              "dumps": str(watch.out_dir / "hang"), "summary": None, "analysis": None}
    if diagnose is None:
        report["summary"] = f"(dumps kept; analyse them with `tracekit analyze {watch.out_dir / 'hang'}`)"
        return report
    try:
        top, where = diagnose(watch.out_dir)
        report["analysis"] = str(where)
        if top is not None:
            report["summary"] = top["summary"]
            report["finding"] = top
    except Exception as exc:  # the dumps stay; `tracekit analyze DIR` reads them later
        report["summary"] = f"(the dumps could not be analysed here: {type(exc).__name__}: {exc})"
    return report
