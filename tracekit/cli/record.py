"""`tracekit record` (placeholder until its issue lands)."""

import typer


def register(app: typer.Typer) -> None:
    @app.command("record", help="(not implemented yet)")
    def _cmd() -> None:
        typer.echo("tracekit record: not implemented yet", err=True)
        raise typer.Exit(2)
