"""`tracekit parse` (placeholder until its issue lands)."""

import typer


def register(app: typer.Typer) -> None:
    @app.command("parse", help="(not implemented yet)")
    def _cmd() -> None:
        typer.echo("tracekit parse: not implemented yet", err=True)
        raise typer.Exit(2)
