"""`tracekit check` (placeholder until its issue lands)."""

import typer


def register(app: typer.Typer) -> None:
    @app.command("check", help="(not implemented yet)")
    def _cmd() -> None:
        typer.echo("tracekit check: not implemented yet", err=True)
        raise typer.Exit(2)
