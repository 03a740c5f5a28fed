"""`tracekit query` (placeholder until its issue lands)."""

import typer


def register(app: typer.Typer) -> None:
    @app.command("query", help="(not implemented yet)")
    def _cmd() -> None:
        typer.echo("tracekit query: not implemented yet", err=True)
        raise typer.Exit(2)
