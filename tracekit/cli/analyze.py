"""`tracekit analyze TRACE_DIR [--out DIR]`: parse, run the analyzers, write analysis.json and the reports."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tracekit.cli import options as O

HELP = """Analyze a distributed training run: where each rank's step time goes, exposed communication,
stragglers, and more, with findings sorted by estimated saving.

TRACE_DIR is a directory of traces and logs (as `tracekit record` or the reference runtime leave
them), one trace file, or an existing run store (a directory with meta.json, from `tracekit parse`).
A trace's rank comes from the trace (distributedInfo) or its name (rank3...). Among several traces, one
that states neither is skipped; the only trace of a run that states neither is analysed as rank 0 with a
warning (give its rank with --rank when it is another).

Writes DIR/tables/ (the run store), DIR/analysis.json, DIR/report.html and DIR/summary.md; with --model,
DIR/advice.json too (the layout advice section, as `tracekit advise` writes it).

Examples:

  tracekit analyze traces --out tracekit-out

  tracekit analyze traces --out out --workers 2 --peak-gbps tp=150 --peak-gbps dp=25

  tracekit analyze out/tables --out out2      (re-analyze a parsed store)

  tracekit analyze worker0.pt.trace.json.gz --rank 0 --out out

  tracekit analyze traces --model llama-8b-like --out out   (with a layout advice section)

Flight Recorder dumps (pickle or JSON, named as torch names them: `_dump_3`, `nccl_trace_rank_3`, or
rank3.pkl) are read as a hang post-mortem: the `hang` section names, per process group, the collective
the group is stuck at and the ranks that never entered it, and the root cause across groups.

Exit status: 0 when analysis ran (findings or not); 1 when nothing could be analyzed; 3 when the run
is diagnosed as hung (the `hang` finding: stuck collective and the ranks that never entered it).
"""


def _peaks(values: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for v in values:
        key, sep, num = v.partition("=")
        try:
            if not sep or not key:
                raise ValueError
            out[key.strip()] = float(num)
        except ValueError:
            raise typer.BadParameter(f"--peak-gbps expects GROUP=GBPS (e.g. tp=150), got {v!r}") from None
    return out


def _model(name: str | None):
    if name is None:
        return None
    from tracekit.simulate.model_file import model_spec

    try:
        return model_spec(name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None


def _explain_plan(value: bool) -> None:
    if value:
        from tracekit.flow import explain_plan

        typer.echo(explain_plan())
        raise typer.Exit(0)


def register(app: typer.Typer) -> None:
    @app.command("analyze", help=HELP, no_args_is_help=True)
    def analyze_cmd(
        trace_dir: Path = typer.Argument(..., help="Directory of traces/logs, one trace file, or a run store.",
                                         exists=True, file_okay=True, dir_okay=True, readable=True),
        out: Path = typer.Option(Path("tracekit-out"), "--out", "-o", help="Output directory (created if needed)."),
        workers: int = O.WORKERS,
        engine_name: str = O.ENGINE,
        address: Optional[str] = O.ADDRESS,
        max_memory: Optional[str] = O.MAX_MEMORY,
        peak_gbps: list[str] = typer.Option([], "--peak-gbps", help="Bus-bandwidth peak per group name or dim: GROUP=GBPS (repeatable)."),
        peak_tflops: Optional[float] = typer.Option(None, "--peak-tflops", min=0.001,
                                                    help="Peak dense TFLOP/s of one device for MFU and the roofline "
                                                    "(default: the device table, matched on deviceProperties)."),
        peak_bandwidth: Optional[float] = typer.Option(None, "--peak-bandwidth", min=0.001,
                                                       help="Peak memory bandwidth of one device in TB/s for the "
                                                       "roofline (default: the device table)."),
        capture: Optional[Path] = typer.Option(None, "--capture", exists=True, file_okay=True, dir_okay=True,
                                               help="CUDA/HIP-graph capture trace (file or folder): names the "
                                               "kernels the traces' graph launches ran by the ops that captured them."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary."),
        rank: Optional[int] = O.RANK,
        rank_from_name: Optional[str] = O.RANK_FROM_NAME,
        max_decompressed_mb: Optional[int] = O.MAX_DECOMPRESSED_MB,
        model: Optional[str] = typer.Option(None, "--model", help="Model preset or model file (JSON/TOML; a HuggingFace config.json) for the layout advice section "
                                            "(as `tracekit advise --model`); without it there is no advice."),
        no_advice: bool = typer.Option(False, "--no-advice", help="Skip the layout advice section."),
        csv: Optional[Path] = typer.Option(None, "--csv", help="Also write the tables users read as CSV files "
                                           "into this directory: breakdown, findings, collectives, stragglers, "
                                           "memory, kernels and ops when present (tracekit/export/sheets.py)."),
        explain: bool = typer.Option(False, "--explain-plan", is_eager=True, callback=_explain_plan,
                                     help="Print the analyzers' dependency graph (run order, what each consumes) and exit."),
        comm_kernel: list[str] = O.COMM_KERNEL,
        comm_kernels: Optional[Path] = O.COMM_KERNELS_FILE,
        timeline_ranks: Optional[str] = typer.Option(
            None, "--timeline-ranks", metavar="RANKS",
            help="Ranks the step timeline draws, a lane per kind each, e.g. --timeline-ranks 0-7,12. Default: "
                 "every rank; beyond 8 ranks one row each, with the busiest ranks' lanes in full."),
    ) -> None:
        from tracekit.config import AnalysisConfig
        from tracekit.record.config import parse_rank_list
        from tracekit.engines.options import engine_from_options
        from tracekit.errors import TracekitError

        err = O.LazyConsole(stderr=True)
        O.use_comm_kernel_patterns(comm_kernel, comm_kernels)
        try:
            chosen = tuple(parse_rank_list(timeline_ranks, "--timeline-ranks")) if timeline_ranks is not None else None
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--timeline-ranks") from None
        config = AnalysisConfig(peak_gbps=_peaks(peak_gbps), advice=not no_advice, advice_model=_model(model),
                                peak_tflops=peak_tflops, peak_bandwidth_tbps=peak_bandwidth, timeline_ranks=chosen)
        from tracekit.parse.discover import compile_rank_pattern

        try:
            compile_rank_pattern(rank_from_name)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--rank-from-name") from None
        out.mkdir(parents=True, exist_ok=True)
        try:
            engine, budget = engine_from_options(engine_name, workers=workers, address=address, max_memory=max_memory,
                                                 whole_command=True)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        except TracekitError as exc:
            err.print(f"[red]tracekit analyze:[/red] {O.esc(exc)}")
            raise typer.Exit(1) from None
        try:
            _analyze(trace_dir, out, engine, budget, config, quiet, err,
                     max_decompressed_bytes=max_decompressed_mb * (1 << 20) if max_decompressed_mb else None,
                     assume_rank=rank, capture=capture, rank_from_name=rank_from_name, csv_dir=csv)
        finally:
            engine.close()


def _analyze(trace_dir: Path, out: Path, engine, budget: int | None, config, quiet: bool, err,
             max_decompressed_bytes: int | None = None, assume_rank: int | None = None,
             capture: Path | None = None, rank_from_name: str | None = None,
             csv_dir: Path | None = None) -> None:
    """tracekit.analyze_run on `engine`, then the console: skipped inputs, failures, the summary."""
    import shlex
    import sys

    from tracekit.analysis import analyze_run
    from tracekit.errors import NothingToAnalyzeError, TracekitError

    command = shlex.join(["tracekit", *sys.argv[1:]]) if sys.argv else None
    watch = getattr(engine, "budget", None)  # --max-memory: the process tree's peak, sampled
    if watch is not None:
        watch.start()
    try:
        run = analyze_run(trace_dir, out, config, engine=engine, max_memory_bytes=budget, progress=not quiet,
                          max_decompressed_bytes=max_decompressed_bytes, assume_rank=assume_rank, command=command,
                          capture=capture, rank_from_name=rank_from_name)
    except NothingToAnalyzeError as exc:
        _print_skipped(getattr(exc, "skipped", []), err)
        if getattr(exc, "problem", None):  # the recording says why (e.g. the profiled window was never reached)
            err.print(f"[red]tracekit analyze:[/red] {O.esc(trace_dir)}: {O.esc(exc.problem)}")
        else:
            err.print(f"[red]tracekit analyze:[/red] nothing under {O.esc(trace_dir)} could be analyzed")
        raise typer.Exit(1) from None
    except TracekitError as exc:
        err.print(f"[red]tracekit analyze:[/red] {O.esc(exc)}")
        raise typer.Exit(1) from None
    finally:
        if watch is not None:
            watch.stop()
    if watch is not None and watch.exceeded:
        err.print(f"[yellow]warning[/yellow] {O.esc(watch.report())}", soft_wrap=True)
    elif watch is not None and not quiet:
        err.print(O.esc(watch.report()), soft_wrap=True)
    analysis = run.analysis
    _print_skipped(run.store.skipped, err)
    if run.store.meta.get("rank_assumed"):
        err.print(f"[yellow]warning[/yellow] {O.esc(run.store.meta['rank_assumed'])}")
    for e in analysis.get("analyzer_errors", []):
        err.print(f"[yellow]analyzer {O.esc(e['analyzer'])} failed (its section is left out):[/yellow] {O.esc(e['error'])}")
    hang = (analysis.get("sections") or {}).get("hang") or {}
    if not analysis["ranks"] and not hang:
        err.print(f"[red]tracekit analyze:[/red] no rank of {O.esc(trace_dir)} had events to analyze")
        raise typer.Exit(1)
    if hang.get("hung"):
        _print_hang(analysis, out, err)
        from tracekit.errors import HANG_EXIT_CODE

        raise typer.Exit(HANG_EXIT_CODE)
    for p in run.problems:
        err.print(f"[yellow]{O.esc(p)}[/yellow]")
    if csv_dir is not None:
        _write_csvs(run, csv_dir, quiet, err)
    if not quiet:
        from rich.console import Console

        _print_summary(analysis, Console())
        # paths never wrapped: they are copied from the terminal
        err.print(f"analysis: {O.esc(out / 'analysis.json')}" + (f"   report: {O.esc(run.report)}" if run.report else ""),
                  soft_wrap=True)
        where = getattr(engine, "describe", lambda: None)()  # e.g. the Ray nodes that ran the tasks
        if where:
            err.print(O.esc(where), soft_wrap=True, highlight=False)


def _print_hang(analysis: dict, out: Path, err) -> None:
    top = next((f for f in analysis["findings"] if f["kind"] == "hang"), None)
    if top is not None:
        err.print(f"[red]critical[/red] hang: {O.esc(top['summary'])}", highlight=False)
    err.print(f"analysis: {O.esc(out / 'analysis.json')}   report: {O.esc(out / 'report.html')}", soft_wrap=True)
def _write_csvs(run, csv_dir: Path, quiet: bool, err) -> None:
    from tracekit.export.sheets import write_csvs
    from tracekit.notebook import Run

    try:
        paths = write_csvs(Run(run.analysis, run.store, run.out), csv_dir)
    except OSError as exc:
        err.print(f"[red]tracekit analyze:[/red] --csv {O.esc(csv_dir)}: {O.esc(exc)}")
        raise typer.Exit(1) from None
    if not quiet:
        err.print(f"sheets: {O.esc(csv_dir)} ({', '.join(p.name for p in paths)})", soft_wrap=True)


def _print_skipped(skipped: list[dict[str, str]], err) -> None:
    for s in skipped:
        err.print(f"[yellow]skipped[/yellow] {O.esc(s['file'])}: {O.esc(s['reason'])}")


def _ranges(ranks: list[int]) -> str:
    """[16, 17, ..., 47, 50] -> "16–47, 50"."""
    parts: list[str] = []
    start = prev = None
    for r in sorted(ranks) + [None]:
        if start is not None and r is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}–{prev}")
        start = prev = r
    return ", ".join(parts)


def _print_summary(analysis: dict, console) -> None:
    from rich.table import Table

    from rich import box

    # fits 80 columns without cutting the verdict ("bound") column: short headers, collapsed padding
    t = Table(title="per-rank breakdown (totals over analyzed steps)", title_justify="left",
              box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False)
    for c in ("rank", "steps", "step ms", "compute", "exposed", "wait", "other", "idle", "overlap", "bound"):
        t.add_column(c, justify="left" if c == "bound" else "right", no_wrap=c == "bound",
                     min_width=13 if c == "bound" else len(c))
    rows = analysis["ranks"]
    shown = rows if len(rows) <= 32 else rows[:16] + rows[-16:]
    for r in shown:
        span = max(r["step_ns"], 1)
        pct = lambda k: "-" if r.get(k) is None else f"{100 * r[k] / span:.1f}%"  # noqa: E731
        ov = "-" if r["overlap_ratio"] is None else f"{100 * r['overlap_ratio']:.0f}%"
        t.add_row(str(r["rank"]), str(r["steps"]), f"{r['step_ns'] / max(r['steps'], 1) / 1e6:.2f}",
                  pct("compute_ns"), pct("exposed_comm_ns"), pct("sync_wait_ns"), pct("other_ns"), pct("idle_ns"),
                  ov, r["bound"])
    console.print(t)
    if len(shown) < len(rows):
        hidden = [r["rank"] for r in rows[16:-16]]
        console.print(f"{len(hidden)} ranks not shown (ranks {_ranges(hidden)}); every rank is in "
                      "analysis.json and report.html", highlight=False)
    findings = analysis["findings"]
    if not findings:
        console.print("no findings")
        return
    console.print(f"top findings ({len(findings)} in all):")
    colour = {"critical": "red", "warning": "yellow", "info": "cyan"}
    for f in findings[:5]:
        sev = f["severity"]
        saving = f["est_saving_ns"] / 1e6 if f.get("est_saving_ns") else 0.0
        how = "replayed" if "replayed_saving_ns" in (f.get("evidence") or {}) else "bound"
        tail = f" (saves ~{saving:.1f} ms/step, {how})" if saving else ""
        console.print(f"  [{colour[sev]}]{sev:<8}[/{colour[sev]}] {O.esc(f['kind'])}: {O.esc(f['summary'])}{tail}",
                      highlight=False)
