"""`tracekit whatif TRACES [fixes...]`: the step time if a fix were applied, replayed on the measured step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

HELP = """Predict the step time with fixes applied, by replaying each profiled step's cross-rank dependency
graph (critical path) with the fixed durations; prints predicted vs measured step time.

TRACES is a directory of traces/logs, or a run store (from `tracekit parse` / `tracekit analyze`).

Examples:

  tracekit whatif traces --rank-compute 5=median

  tracekit whatif traces --dim-bandwidth tp=150GB/s --overlap dp

  tracekit whatif traces --launches-ahead   (what CUDA graphs could save at most)

  tracekit whatif out/tables --microbatches 8 --export-step 3 --export step3.json   (open in ui.perfetto.dev)
"""


def register(app: typer.Typer) -> None:
    @app.command("whatif", help=HELP, no_args_is_help=True)
    def whatif_cmd(
        traces: Path = typer.Argument(..., exists=True, file_okay=True, dir_okay=True, readable=True,
                                      help="Directory of traces/logs, or a run store."),
        rank_compute: list[str] = typer.Option([], "--rank-compute", help="RANK=median (its peers' median compute) or RANK=FACTOR (repeatable)."),
        dim_bandwidth: list[str] = typer.Option([], "--dim-bandwidth", help="DIM=BANDWIDTH, e.g. tp=150GB/s: the dim's collectives at that bus bandwidth (repeatable)."),
        overlap: list[str] = typer.Option([], "--overlap", help="DIM whose collectives overlap compute: gradient buckets (dp, fsdp) start when backward has produced their share of the gradients, other collectives are hidden (repeatable)."),
        slow_link: list[str] = typer.Option([], "--slow-link", help="DIM whose slowest links run at their peers' speed (repeatable)."),
        stage_resplit: bool = typer.Option(False, "--stage-resplit", help="Pipeline stages re-split to equal compute."),
        expert_even: bool = typer.Option(False, "--expert-even", help="Expert load even across expert-parallel ranks."),
        microbatches: Optional[int] = typer.Option(None, "--microbatches", min=1, help="Pipeline micro-batches per step."),
        no_host_stalls: bool = typer.Option(False, "--no-host-stalls", help="Host stalls (data loading, long host gaps) removed."),
        launches_ahead: bool = typer.Option(False, "--launches-ahead", help="GPU ranks' launches cost the host nothing (the upper bound of CUDA graphs / torch.compile)."),
        export_step: Optional[int] = typer.Option(None, "--export-step", help="Step to export with --export (default: the last analyzed)."),
        export: Optional[Path] = typer.Option(None, "--export", help="Write the step as Chrome-trace/Perfetto JSON, critical path marked."),
        store_dir: Optional[Path] = typer.Option(None, "--store", help="Where to parse TRACES (default: a temporary folder)."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        from rich.console import Console

        from tracekit.assess.whatif import parse_fixes

        err = Console(stderr=True)
        try:
            fixes = parse_fixes(rank_compute=rank_compute, dim_bandwidth=dim_bandwidth, overlap=overlap,
                                slow_link=slow_link, stage_resplit=stage_resplit, expert_even=expert_even,
                                microbatches=microbatches, no_host_stalls=no_host_stalls,
                                launches_ahead=launches_ahead)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        store = _open_store(traces, store_dir, err)
        _run(store, fixes, export, export_step, as_json, err)


def _open_store(traces: Path, store_dir: Path | None, err):
    import tempfile

    from tracekit.errors import TracekitError
    from tracekit.tables.store import RunStore

    if (traces / "meta.json").is_file():
        return RunStore(traces)
    from tracekit.parse.run import parse_run

    try:
        return parse_run(traces, store_dir or Path(tempfile.mkdtemp(prefix="tracekit-whatif-")), progress=False).store
    except TracekitError as exc:
        err.print(f"[red]tracekit whatif:[/red] {exc}")
        raise typer.Exit(1) from None


def _run(store, fixes, export: Path | None, export_step: int | None, as_json: bool, err) -> None:
    from tracekit.assess.critical_path import NO_STEP
    from tracekit.assess.whatif import run_whatif
    from tracekit.whatif.build import reported_step
    from tracekit.whatif.export import export_step as export_doc
    from tracekit.whatif.replay import path_of

    out = run_whatif(store, fixes)
    results = out.pop("results")
    if not results:
        err.print(f"[red]tracekit whatif:[/red] {NO_STEP}")
        raise typer.Exit(1)
    if export is not None:
        pick = [r for r in results if export_step is None or reported_step(r.step) == export_step]
        if not pick:
            raise typer.BadParameter(f"--export-step {export_step}: analyzed steps are "
                                     f"{[reported_step(r.step) for r in results]}")
        path, _ = path_of(pick[-1])
        export.write_text(json.dumps(export_doc(pick[-1], path)))
        step = reported_step(pick[-1].step)
        err.print(f"{'the device span' if step is None else f'step {step}'} with its critical path: {export}")
    if as_json:
        typer.echo(json.dumps(out, indent=1))
        return
    typer.echo(format_table(out))


def format_table(out: dict) -> str:
    """Predicted vs measured per step, within 80 columns."""
    ms = lambda ns: f"{ns / 1e6:10.2f}"  # noqa: E731
    lines = ["fixes: " + ("; ".join(out["fixes"]) or "none (unchanged replay)"),
             f"{'step':>6} {'measured ms':>12} {'replayed ms':>12} {'predicted ms':>13} {'change':>8}"]
    for s in out["steps"]:
        change = (s["predicted_ns"] - s["measured_ns"]) / s["measured_ns"] if s["measured_ns"] else 0.0
        step = "span" if s["step"] is None else s["step"]  # the device span (no step number)
        lines.append(f"{step:>6} {ms(s['measured_ns']):>12} {ms(s['replayed_ns']):>12} "
                     f"{ms(s['predicted_ns']):>13} {change:>+8.1%}")
    m = out["measured_ns"]
    change = (out["predicted_ns"] - m) / m if m else 0.0
    lines.append(f"{'mean':>6} {ms(m):>12} {ms(out['replayed_ns']):>12} {ms(out['predicted_ns']):>13} {change:>+8.1%}")
    return "\n".join(lines)
