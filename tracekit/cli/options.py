"""Options `tracekit parse` and `tracekit analyze` share: declared once so their flags and help agree."""

from __future__ import annotations

import typer

WORKERS = typer.Option(
    0, "--workers", "-j", min=0, show_default=True,
    help="Processes (or local Ray CPUs) for per-rank parsing and analysis; 0: one per core, fewer when there "
         "is too little free memory. With fewer trace files than processes, a large file (32 MB of JSON or more) "
         "is decoded by several.")
ENGINE = typer.Option("local", "--engine", help="Where per-rank work runs: local (process pool) or ray.")
ADDRESS = typer.Option(None, "--address",
                       help="Ray cluster address for --engine ray (default: start a local Ray with --workers CPUs).")
MAX_MEMORY = typer.Option(None, "--max-memory",
                          help="Memory budget per parse worker (e.g. 2GB); larger traces are parsed in chunks.")
RANK = typer.Option(None, "--rank", min=0,
                    help="Rank of a lone trace that names none (in distributedInfo or its file name); without it "
                         "such a trace is analysed as rank 0, with a warning.")
MAX_DECOMPRESSED_MB = typer.Option(
    None, "--max-decompressed-mb", min=1,
    help="Skip any input that decompresses to more than this many MiB "
         "(default: 200x its compressed size, at least 256 MiB, which refuses decompression bombs).")


def esc(value: object) -> str:
    """Text from traces and file names printed through rich: `[...]` must not be read as markup."""
    from rich.markup import escape

    return escape(str(value))


class LazyConsole:
    """A rich Console made on its first print: importing rich costs ~15 ms and ~2 MB, and a quiet run
    that meets nothing to report prints nothing."""

    def __init__(self, **kwargs) -> None:
        self._kwargs = kwargs
        self._console = None

    def print(self, *args, **kwargs) -> None:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kwargs)
        self._console.print(*args, **kwargs)
