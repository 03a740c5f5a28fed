"""Entry point: builds the typer app from one module per command."""

from __future__ import annotations

import importlib

import typer

COMMANDS = ("record", "parse", "analyze", "query", "diff", "check", "simulate", "whatif", "advise")

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


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the tracekit version and exit.", is_eager=True),
) -> None:
    if version:
        from tracekit import __version__

        typer.echo(__version__)
        raise typer.Exit(0)


for _name in COMMANDS:
    importlib.import_module(f"tracekit.cli.{_name}").register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
