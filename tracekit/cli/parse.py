"""`tracekit parse TRACE_DIR --out STORE`: traces and logs → a run store (Parquet tables + meta.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tracekit.cli import options as O

HELP = """Parse a directory of traces into a run store (one Parquet file per table).

Reads, recursively: Kineto traces (*.json, *.json.gz, *.pt.trace.json.gz), collective logs
(comms.rank*.jsonl), PyTorch Flight Recorder dumps (JSON or pickle; pickles are only read as
plain data) and manifest.json. Hidden files (.name) are never read. Each file's rank comes from its content
(distributedInfo.rank) or its name (rank3, rank-3, rank_3); among several traces a file with neither is
skipped, while the only trace of a run that states neither is read as rank 0 with a warning (--rank gives
another). Skipped files are listed with their reasons.

The collectives table keeps the rows of every source (kineto, comms-log, flight-recorder):
filter on `source`. Profiler collectives get their group and sequence number from the log.

Examples:

  tracekit parse traces --out store

  tracekit parse traces --out store --workers 2 --quiet

  tracekit query store "SELECT rank, count(*) FROM events GROUP BY rank"

Exit status: 0 when at least one rank was parsed, 1 when nothing could be parsed.
"""


def register(app: typer.Typer) -> None:
    @app.command("parse", help=HELP, no_args_is_help=True)
    def parse_cmd(
        trace_dir: Path = typer.Argument(..., help="Directory holding the run's traces and logs, or one trace file.",
                                         exists=True, file_okay=True, dir_okay=True, readable=True),
        out: Path = typer.Option(..., "--out", "-o", help="Run store directory to write (created if needed)."),
        workers: int = O.WORKERS,
        engine_name: str = O.ENGINE,
        address: Optional[str] = O.ADDRESS,
        max_memory: Optional[str] = O.MAX_MEMORY,
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary table."),
        rank: Optional[int] = O.RANK,
        rank_from_name: Optional[str] = O.RANK_FROM_NAME,
        max_decompressed_mb: Optional[int] = O.MAX_DECOMPRESSED_MB,
        comm_kernel: list[str] = O.COMM_KERNEL,
        comm_kernels: Optional[Path] = O.COMM_KERNELS_FILE,
    ) -> None:
        from tracekit.engines.options import engine_from_options
        from tracekit.errors import TracekitError
        from tracekit.parse.run import parse_run

        err = O.LazyConsole(stderr=True)
        O.use_comm_kernel_patterns(comm_kernel, comm_kernels)
        limit = max_decompressed_mb * (1 << 20) if max_decompressed_mb else None
        try:
            engine, budget = engine_from_options(engine_name, workers=workers, address=address, max_memory=max_memory)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        except TracekitError as exc:
            err.print(f"[red]tracekit parse:[/red] {O.esc(exc)}", soft_wrap=True)
            raise typer.Exit(1) from None
        try:
            result = parse_run(trace_dir, out, workers=engine.workers, progress=not quiet, max_decompressed_bytes=limit,
                               max_memory_bytes=budget, engine=engine, assume_rank=rank,
                               rank_from_name=rank_from_name)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--rank-from-name") from None
        except TracekitError as exc:
            err.print(f"[red]tracekit parse:[/red] {O.esc(exc)}", soft_wrap=True)
            raise typer.Exit(1) from None
        finally:
            engine.close()
        store = result.store
        ranks = store.ranks()
        if not quiet:
            _print_summary(store, err)
        for s in result.skipped:
            err.print(f"[yellow]skipped[/yellow] {O.esc(s['file'])}: {O.esc(s['reason'])}", soft_wrap=True)
        if not ranks:
            err.print(f"[red]tracekit parse:[/red] nothing under {O.esc(trace_dir)} could be parsed")
            raise typer.Exit(1)
        if not quiet:
            err.print(f"parsed {len(ranks)} rank(s) into {store.path}")


def _print_summary(store, err) -> None:
    """The store's ranks with their row counts, then the parse warnings."""
    from rich.console import Console
    from rich.table import Table

    counts = store.sql(
        "SELECT r.rank, "
        "(SELECT count(*) FROM events e WHERE e.rank = r.rank) AS events, "
        "(SELECT count(*) FROM kernels k WHERE k.rank = r.rank) AS kernels, "
        "(SELECT count(*) FROM collectives c WHERE c.rank = r.rank) AS collectives, "
        "r.rank_source, r.source_file FROM ranks r ORDER BY r.rank").to_pylist()
    table = Table(title=f"run store {store.path}", title_justify="left")
    for col in ("rank", "events", "kernels", "collectives", "rank from", "file"):
        table.add_column(col, justify="right" if col in ("rank", "events", "kernels", "collectives") else "left")
    for c in counts:
        table.add_row(str(c["rank"]), f"{c['events']:,}", f"{c['kernels']:,}", f"{c['collectives']:,}",
                      O.esc(c["rank_source"]), O.esc(Path(str(c["source_file"])).name))
    Console().print(table)
    for w in store.meta.get("warnings", []):
        err.print(f"[yellow]warning:[/yellow] {O.esc(w)}", soft_wrap=True)
