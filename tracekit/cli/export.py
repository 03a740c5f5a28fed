"""`tracekit export RUN --perfetto FILE`: the analysed run where users already work."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tracekit.cli import options as O

HELP = """Export an analysed run for other tools.

RUN is an `analyze --out` folder (analysis.json + tables/, nothing recomputed), a run store (from
`tracekit parse`), or a directory of traces (parsed and analysed first, in a temporary folder).

--perfetto FILE writes one Chrome trace-event JSON document (open it in ui.perfetto.dev or
chrome://tracing): every rank as a process on one clock-aligned timeline (the clock offsets the
analysis applied), its host threads and device streams, each collective instance linked to its
members on every rank by flow arrows, the critical path of each replayed step, and the findings over
the time they cover.

Examples:

  tracekit export tracekit-out --perfetto run.perfetto.json

  tracekit export traces --perfetto run.perfetto.json

Exit status: 0 when the file was written; 1 when nothing could be analyzed or read.
"""


def register(app: typer.Typer) -> None:
    @app.command("export", help=HELP, no_args_is_help=True)
    def export_cmd(
        run_dir: Path = typer.Argument(..., help="Analysis folder, run store, or traces.", exists=True,
                                       file_okay=True, dir_okay=True, readable=True),
        perfetto: Optional[Path] = typer.Option(None, "--perfetto", help="Write the Chrome trace-event JSON "
                                                "(Perfetto / chrome://tracing) document to this file."),
        rank: Optional[int] = O.RANK,
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing but errors."),
    ) -> None:
        from tracekit.errors import TracekitError
        from tracekit.notebook import open_run

        err = O.LazyConsole(stderr=True)
        if perfetto is None:
            raise typer.BadParameter("say what to export: --perfetto FILE")
        try:
            run = open_run(run_dir, assume_rank=rank)
            out = run.export_perfetto(perfetto)
        except TracekitError as exc:
            err.print(f"[red]tracekit export:[/red] {O.esc(exc)}")
            raise typer.Exit(1) from None
        if not quiet:
            err.print(f"wrote {O.esc(out.path)}: {len(out.ranks)} rank(s), {out.events:,} events, "
                      f"{out.instances:,} collective instances linked to their members by {out.flows:,} flows"
                      + (f" ({out.unplaced_members} members not placed: their log is not on the trace clock)"
                         if out.unplaced_members else "")
                      + f", {out.path_slices} critical-path slices, {out.finding_slices} finding annotations",
                      soft_wrap=True, highlight=False)
