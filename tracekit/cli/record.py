"""`tracekit record [options] -- COMMAND ...`: profile an unmodified training command."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape as esc

HELP = """\
Run COMMAND unmodified with the profiler injected into every rank process, and leave in --out:
rank{R}.pt.trace.json.gz per profiled rank, comms.rank{R}.jsonl (every rank's collectives inside the
profiled window, Flight Recorder entry schema), flight_recorder.rank{R}.json, record.rank{R}.json
(per-rank status and clock anchors) and manifest.json.

Steps are counted at each optimizer.step() (the first optimizer that steps), or at tracekit.step()
calls if the program makes them. Step 0 is start-up plus the first iteration, so --wait + --skip-first
must be at least 1. With the defaults the trace starts at step 3 (ProfilerStep#3) and holds
max(8, ceil(--min-window-ms / fastest warmup step)) steps, at most --max-active (100): 8 steps of
200-800 ms steps, 1 s of 10 ms steps (100 steps); every rank keeps the same steps. --active N keeps
exactly N. The recorder also times a few unprofiled steps (after the window, else before it) against the
profiled ones and writes the ratio to manifest.json (`recording_overhead`); `tracekit advise` calibrates
on the steps without it.

Examples:

  tracekit record --out traces -- torchrun --nproc-per-node 8 train.py --lr 3e-4

  tracekit record --out traces --wait 10 --warmup 2 --active 3 --profile-ranks 0-3,12 -- torchrun ... train.py

  tracekit record --out traces -- python train.py

Hangs: while COMMAND runs, every rank beats into --out/.hang/. When some rank waits in a collective or
send/recv and no rank has progressed for --hang-timeout seconds (default 600, 0: off), every rank dumps
its Flight Recorder buffer (plus the send/recv tracekit logs, which gloo's recorder leaves out) into
--out/hang/, the dumps are analysed into --out/hang-analysis/ (the collective each group is stuck at,
the ranks that never entered it, dead ranks), and the job is stopped (--hang-action report: left
running). A job that fails on its own (e.g. a rank dies) leaves its dumps analysed the same way.

The exit code is COMMAND's, or 3 when tracekit record stopped a hung job. Then run:
tracekit analyze traces --out tracekit-out
"""


DEFAULT_ACTIVE = 8
"""The fewest steps a default window keeps, whatever their length. `analyze` calls a verdict stable when the
mean per-step margin clears 2 standard errors (analyze/recording.py), i.e. with n steps when the margin's
spread (sd / mean) is below sqrt(n) / 2: 0.87 with 3 steps, 1.41 with 8. A 3-step floor kept 3-6 steps of a
user's 200-800 ms steps (issue 33), too few for that; 8 steps of 800 ms is 6.4 s of trace."""
DEFAULT_MIN_WINDOW_MS = 1000
"""A 3-step window of a few-ms steps (the DDP tutorial loop) gave the same verdict in 1 of 5 recordings;
300 ms (from the first profiled step's time, which runs slow) in 4 of 5 on a loaded 2-core box
(benchmarks/record_window_stability.py), the odd one out having kept only 10 steps: hence 1 s."""
DEFAULT_MAX_ACTIVE = 100
DEFAULT_WARMUP = 2
"""The window's length is chosen from the fastest warmup step. One warmup step was one sample of the step
time taken where it runs slowest (the first step the profiler is on; on the loaded 2-core box 1.3-2x the
next ones, and once 50 ms against 2.5 ms steps: a 20-step window instead of 100, an unstable verdict);
the fastest of two is that far off only when both are (benchmarks/record_window_stability.py)."""


def register(app: typer.Typer) -> None:
    @app.command(
        "record",
        help=HELP,
        context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
    )
    def record_cmd(
        command: Optional[list[str]] = typer.Argument(
            None, metavar="-- COMMAND [ARGS]...", help="The training command, after `--`.", show_default=False),
        out: Path = typer.Option(Path("traces"), "--out", "-o", help="Output directory (created if missing)."),
        wait: int = typer.Option(1, help="Steps to skip before each profiled cycle (e.g. --wait 10)."),
        warmup: int = typer.Option(DEFAULT_WARMUP, help="Steps traced then discarded before the kept ones "
                                                        "(e.g. --warmup 1)."),
        active: Optional[int] = typer.Option(
            None, help="Steps kept in the trace per cycle, exactly (e.g. --active 3). Default: at least 8, "
                       "and as many as --min-window-ms needs at the measured step time."),
        min_window_ms: int = typer.Option(
            DEFAULT_MIN_WINDOW_MS, help="Without --active: make the window hold at least this much time, from "
                                        "the fastest warmup step's duration (short steps vary; a few of them give an "
                                        "unstable verdict). E.g. --min-window-ms 1000."),
        max_active: int = typer.Option(DEFAULT_MAX_ACTIVE, help="Without --active: at most this many steps."),
        repeat: int = typer.Option(1, help="Number of cycles; 0 repeats until the program ends (e.g. --repeat 2)."),
        skip_first: int = typer.Option(0, help="Steps skipped once before the first cycle (e.g. --skip-first 20)."),
        ranks: Optional[str] = typer.Option(
            None, "--profile-ranks", "--ranks",
            help="Partial tracing: run the profiler only on these global ranks, e.g. --profile-ranks 0-3,12 "
                 "(--ranks is the same option). The others still log their collectives (comms.rank{R}.jsonl), "
                 "so analyze covers them from the logs (log-only ranks) and nobody waits on them."),
        ranks_per_group: Optional[int] = typer.Option(
            None, help="Profile only the first N local ranks of each launcher group (one torchrun agent = one "
                       "node), e.g. --ranks-per-group 1."),
        step_on: str = typer.Option(
            "auto", help="What marks a step: 'optimizer' (optimizer.step()), 'manual' (tracekit.step()), or "
                         "'auto' (optimizer steps until the program calls tracekit.step()). E.g. --step-on manual."),
        log_collectives: bool = typer.Option(
            True, "--log-collectives/--no-log-collectives",
            help="Log each collective inside the profiled window (kernels on the c10d ops; 4-9% of the step there on small CPU/gloo loops, measured in benchmarks/record_overhead.py --in-window)."),
        clock_barrier: bool = typer.Option(
            True, "--clock-barrier/--no-clock-barrier",
            help="Take 3 barrier-synchronised clock samples at the first profiled cycle to align hosts."),
        record_shapes: bool = typer.Option(True, "--record-shapes/--no-record-shapes",
                                           help="torch.profiler record_shapes (collective sizes need it)."),
        with_flops: bool = typer.Option(True, "--with-flops/--no-with-flops", help="torch.profiler with_flops."),
        with_stack: bool = typer.Option(False, "--with-stack/--no-with-stack",
                                        help="torch.profiler with_stack (Python stacks; slower, bigger)."),
        profile_memory: bool = typer.Option(
            True, "--profile-memory/--no-profile-memory",
            help="torch.profiler profile_memory: allocations and frees in the window (memory analysis)."),
        memory_history: bool = typer.Option(
            False, "--memory-history/--no-memory-history",
            help="CUDA only: record the allocator history and write memory_snapshot.rank{R}.pickle per rank."),
        flight_recorder: bool = typer.Option(
            True, "--flight-recorder/--no-flight-recorder",
            help="Enable NCCL's Flight Recorder dump-on-timeout into --out and dump its buffer per rank at exit."),
        hang_timeout: float = typer.Option(
            600.0, "--hang-timeout", metavar="SECONDS",
            help="Call the job hung after this long with no rank progressing while one waits in a collective "
                 "or send/recv; dump and analyse every rank's Flight Recorder buffer (0: off). E.g. --hang-timeout 300."),
        hang_action: str = typer.Option(
            "stop", "--hang-action", help="On a hang: 'stop' the job after the dumps (exit 3), or 'report' and leave it running."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace a previous recording in --out."),
    ) -> None:
        from rich.console import Console

        from tracekit.record.config import ProfileSchedule, RecordConfig, parse_rank_list
        from tracekit.analysis import analyze_hang_dumps
        from tracekit.record.launch import RecordError, run_record

        err = Console(stderr=True)
        try:
            schedule = ProfileSchedule(wait=wait, warmup=warmup, active=DEFAULT_ACTIVE if active is None else active,
                                       repeat=repeat, skip_first=skip_first,
                                       min_window_ms=min_window_ms if active is None else 0,
                                       max_active=max(max_active, DEFAULT_ACTIVE) if active is None else active)
            if schedule.wait + schedule.skip_first < 1:
                raise ValueError("--wait + --skip-first must be >= 1: step 0 (start-up and the first "
                                 "iteration) ends before the recorder starts")
            config = RecordConfig(
                out_dir=str(out.resolve()), schedule=schedule,
                ranks=parse_rank_list(ranks) if ranks is not None else None,
                ranks_per_group=ranks_per_group, step_on=step_on, log_collectives=log_collectives,
                clock_barrier=clock_barrier, record_shapes=record_shapes, with_flops=with_flops,
                with_stack=with_stack, flight_recorder=flight_recorder, profile_memory=profile_memory,
                memory_history=memory_history, hang_timeout=hang_timeout, hang_action=hang_action)
            result = run_record(config, list(command or []), overwrite=overwrite, diagnose_hang=analyze_hang_dumps)
        except (ValueError, RecordError) as exc:
            err.print(f"[red]tracekit record:[/red] {esc(str(exc))}")
            raise typer.Exit(2) from None
        print_summary(err, result.manifest, out, result.exit_code)
        print_hang(err, result.hang)
        raise typer.Exit(result.exit_code)


def print_hang(console: Any, hang: dict[str, Any] | None) -> None:
    """What the hang watch found: the verdict, dead ranks, where the dumps and their analysis are."""
    if not hang:
        return
    head = "[red]hang[/red]: the job was hung" if hang.get("detected") else "[yellow]job failed[/yellow]: post-mortem"
    console.print(f"\n{head}: {esc(str(hang.get('summary') or 'no stuck collective found in the dumps'))}")
    if hang.get("dead_ranks"):
        console.print(f"  ranks that died: {hang['dead_ranks']}"
                      + (f" (then {hang['stopped_ranks']} were stopped)" if hang.get("stopped_ranks") else ""))
    console.print(f"  dumps: {esc(str(hang.get('dumps')))}   analysis: {esc(str(hang.get('analysis')))}")


def print_summary(console: Any, manifest: dict[str, Any], out: Path, exit_code: int) -> None:
    """What was collected, what is missing, and the next command."""
    from tracekit.record.manifest import window_problem

    ranks = manifest["ranks"]
    console.soft_wrap = True
    console.print(f"\n[bold]tracekit record[/bold]: command exited with {exit_code}; recording "
                  f"{esc(str(manifest['status']))} in {esc(str(out))}")
    problem = window_problem(manifest)
    if problem:
        console.print(f"  [red]nothing recorded[/red]: {esc(str(problem))}")
    if not ranks and manifest.get("recorded_by") not in (None, "tracekit record"):
        console.print(f"  the program recorded itself ({esc(str(manifest['recorded_by']))}); world size "
                      f"{manifest.get('world_size')}; files per rank:")
        for rank, names in (manifest.get("files_by_rank") or {}).items():
            console.print(f"  rank {rank}: {', '.join(names)}", markup=False, highlight=False)
        if manifest.get("missing_ranks"):
            console.print(f"  [yellow]missing ranks[/yellow]: {manifest['missing_ranks']}")
        console.print(f"\nnext:  tracekit analyze {out} --out tracekit-out", markup=False)
        return
    if not ranks:
        console.print("  no rank recorded anything: did the program step an optimizer or call tracekit.step()?")
        return
    ws = manifest.get("world_size")
    console.print(f"  ranks recorded: {len(ranks)}" + (f" of {ws}" if ws else "")
                  + f" on {len(manifest.get('hosts') or [])} host(s); torch {manifest.get('torch_version')}")
    for r in ranks:
        files = r.get("files") or {}
        steps = r.get("trace_steps") if r.get("trace_steps") is not None else r.get("profiled_steps")
        bits = [f"rank {r['rank']}: {r.get('status')}"]
        if r.get("profiled"):
            bits.append(f"steps {steps}" + (" (partial)" if r.get("trace_partial") else ""))
        else:
            bits.append("not profiled (log only)")
        bits.append(f"{r.get('collectives_logged', 0)} collectives logged")
        bits.append(", ".join(sorted(files.values())))
        if r.get("reason"):
            bits.append(f"reason: {r['reason']}")
        console.print("  " + "; ".join(bits), markup=False, highlight=False)  # a reason quotes the job's errors
    if manifest.get("missing_ranks"):
        console.print(f"  [yellow]missing ranks[/yellow] (no record at all): {manifest['missing_ranks']}")
    if manifest.get("parallel_layout"):
        console.print(f"  parallel layout: {manifest['parallel_layout']}", markup=False)
    over = manifest.get("recording_overhead")
    if over:
        console.print(f"  recording overhead in the window: steps x{over['ratio']:.3f} "
                      f"({over['profiled_steps']} profiled vs {over['unprofiled_steps']} unprofiled steps, median "
                      "over ranks; `tracekit advise` calibrates on the steps without it)")
    elif any(r.get("profiled") for r in ranks):
        console.print("  recording overhead: not measured (no unprofiled step besides step 0 before or after the "
                      "window; run a few more steps after it)")
    from tracekit.record.notices import NoticeFilter

    held = NoticeFilter()
    for r in ranks:
        held.counts.update(r.get("notices_held") or {})
    if held.summary():
        console.print("  " + held.summary(), markup=False, highlight=False)
    console.print(f"  manifest: {out / 'manifest.json'}", markup=False)
    if not problem:
        console.print(f"\nnext:  tracekit analyze {out} --out tracekit-out", markup=False)
