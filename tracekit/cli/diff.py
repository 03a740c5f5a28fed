"""`tracekit diff` (placeholder until its issue lands)."""

import typer


def register(app: typer.Typer) -> None:
    @app.command("diff", help="(not implemented yet)")
    def _cmd() -> None:
        typer.echo("tracekit diff: not implemented yet", err=True)
        raise typer.Exit(2)
