"""`tracekit analyze` (placeholder until its issue lands)."""

import typer


def register(app: typer.Typer) -> None:
    @app.command("analyze", help="(not implemented yet)")
    def _cmd() -> None:
        typer.echo("tracekit analyze: not implemented yet", err=True)
        raise typer.Exit(2)
