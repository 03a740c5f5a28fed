"""Entry point: builds the typer app from one module per command."""

from __future__ import annotations

import importlib

import typer

COMMANDS = ("record", "parse", "analyze", "query", "diff", "check", "simulate", "whatif", "advise", "export")

app = typer.Typer(
    name="tracekit",
    help=(
        "Profile and analyse distributed PyTorch training.\n\n"
        "Typical use:  tracekit record --out traces -- torchrun --nproc-per-node 4 train.py\n"
        "then:         tracekit analyze traces --out tracekit-out   (open tracekit-out/report.html)"
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)


@app.callback(invoke_without_command=True)  # else `tracekit --version` fails with "Missing command"
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", help="Print the tracekit version and exit.", is_eager=True),
) -> None:
    if version:
        from tracekit import __version__

        typer.echo(__version__)
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(2)


for _name in COMMANDS:
    importlib.import_module(f"tracekit.cli.{_name}").register(app)


def main() -> None:
    """The `tracekit` command. Exits without the interpreter's teardown (freeing every object and module
    one by one costs ~0.15 s of CPU after a 90 MB parse): at exit, after every atexit handler registered
    since this point (process pools, logging) has run and non-daemon threads are joined, the standard
    streams are flushed and the process ends with the command's status."""
    import atexit

    from tracekit.process_env import apply_defaults

    apply_defaults()  # before numpy / pyarrow load: their allocator and BLAS threads (process_env.py)
    status: list[int] = []
    atexit.register(_end_process, status)
    try:
        app()
    except SystemExit as exc:
        code = exc.code
        status.append(0 if code is None else code if isinstance(code, int) else 1)
        raise
    except BaseException:  # a crash or Ctrl-C: the normal exit path reports it
        atexit.unregister(_end_process)
        raise
    status.append(0)


def _end_process(status: list[int]) -> None:
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed pipe: as the normal exit would, report failure
            status = [status[-1] if status and status[-1] else 120]
    os._exit(status[-1] if status else 0)


if __name__ == "__main__":
    main()
