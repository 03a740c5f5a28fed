"""Entry point: builds the typer app from one module per command."""

from __future__ import annotations

import importlib

import typer

COMMANDS = ("record", "parse", "analyze", "query", "diff", "check", "simulate", "whatif", "advise", "export")

HELP = (
    "Profile and analyse distributed PyTorch training.\n\n"
    "Typical use:  tracekit record --out traces -- torchrun --nproc-per-node 4 train.py\n"
    "then:         tracekit analyze traces --out tracekit-out   (open tracekit-out/report.html)"
)


def build_app(commands: tuple[str, ...] = COMMANDS) -> typer.Typer:
    """The typer app with the given commands registered (each from its module's `register`)."""
    app = typer.Typer(name="tracekit", help=HELP, no_args_is_help=True, add_completion=False, rich_markup_mode="rich")
    app.callback(invoke_without_command=True)(_root)  # else `tracekit --version` fails with "Missing command"
    for name in commands:
        importlib.import_module(f"tracekit.cli.{name}").register(app)
    return app


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


def commands_for(argv: list[str]) -> tuple[str, ...]:
    """The commands a command line needs: only the one it names first (registering and building the other
    nine costs ~0.03 CPU s per run: issue 28's whole-process parse), all of them for anything else (the
    root's help, `--version`, a mistyped command's message)."""
    return (argv[1],) if len(argv) > 1 and argv[1] in COMMANDS else COMMANDS


def __getattr__(name: str):  # `app`, with every command, built when first asked for (tests, CliRunner)
    if name == "app":
        globals()["app"] = full = build_app()
        return full
    raise AttributeError(name)


def main() -> None:
    """The `tracekit` command, with only the command it runs registered (`commands_for`). Exits without the interpreter's teardown (freeing every object and module
    one by one costs ~0.15 s of CPU after a 90 MB parse): at exit, after every atexit handler registered
    since this point (process pools, logging) has run and non-daemon threads are joined, the standard
    streams are flushed and the process ends with the command's status."""
    import atexit
    import sys

    from tracekit.process_env import apply_defaults

    apply_defaults()  # before numpy / pyarrow load: their allocator and BLAS threads (process_env.py)
    status: list[int] = []
    atexit.register(_end_process, status)
    try:
        build_app(commands_for(sys.argv))()
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
