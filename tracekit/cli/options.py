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
                          help="Memory budget (e.g. 2GB). parse: each trace's parse (larger traces are parsed in "
                               "chunks). analyze: the whole command, this process and its local workers (fewer "
                               "workers, parses in chunks within their share; the peak is watched and said when the "
                               "cross-rank analysis needs more).")
RANK = typer.Option(None, "--rank", min=0,
                    help="Rank of a lone trace that names none (in distributedInfo or its file name); without it "
                         "such a trace is analysed as rank 0, with a warning.")
RANK_FROM_NAME = typer.Option(
    None, "--rank-from-name", metavar="REGEX",
    help="Regex giving the rank of files whose name has no rank<N> (its group `rank`, else its first group), "
         "e.g. 'dump_(\\d+)'. Without it such files are ranked by the <prefix><rank> rule (_dump_3, "
         "nccl_trace_rank_3) where every such file in a folder shares the prefix.")
MAX_DECOMPRESSED_MB = typer.Option(
    None, "--max-decompressed-mb", min=1,
    help="Skip any input that decompresses to more than this many MiB "
         "(default: 200x its compressed size, at least 256 MiB, which refuses decompression bombs).")
COMM_KERNEL = typer.Option(
    [], "--comm-kernel",
    help="Count kernels whose name matches REGEX as communication, implementing OP when given "
         "(REGEX[=OP], e.g. 'my_a2a_kernel=all_to_all'; repeatable). Added to the declared table "
         "(NCCL/RCCL, DeepEP, NVSHMEM, TE userbuffers, vLLM/SGLang/TensorRT-LLM custom all-reduce, MSCCL++, oneCCL).")
COMM_KERNELS_FILE = typer.Option(
    None, "--comm-kernels",
    help="JSON or TOML file of communication kernel patterns: a list (or `patterns`) of {regex, op, library}.")


def use_comm_kernel_patterns(patterns: list[str], path) -> None:
    """Hand the user's communication kernel patterns to the parsers (this process and its workers, through
    the environment). A bad pattern or file is a usage error naming the option."""
    import os

    from tracekit.parse.comm_kernels import ENV_VAR, load_pattern_file, parse_user_pattern, user_patterns_env

    try:
        found = [parse_user_pattern(p) for p in patterns]
    except Exception as exc:  # re.error
        raise typer.BadParameter(str(exc), param_hint="--comm-kernel") from None
    if path is not None:
        try:
            found += load_pattern_file(path)
        except (OSError, ValueError, Exception) as exc:
            raise typer.BadParameter(f"{path}: {exc}", param_hint="--comm-kernels") from None
    if found:
        os.environ[ENV_VAR] = user_patterns_env(found)


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
