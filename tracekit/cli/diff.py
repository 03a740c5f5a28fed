"""`tracekit diff BASE NEW [--out DIR]`: a before/after report (HTML + Markdown + JSON) of two runs."""

from __future__ import annotations

import json
from pathlib import Path

import typer

HELP = """Compare two runs: step time, breakdown, each finding appeared/resolved/changed, per-collective
exposed time, and where the step-time change came from: the base run's dependency graph replayed with the
new run's durations, one cause at a time (compute by op family, each dim's communication, host, the
schedule), so the parts add up to the change (needs both runs' traces or run stores, not analysis.json
alone).

BASE and NEW are each a trace directory, a run store (directory with meta.json), an analyze output
directory (with analysis.json) or an analysis.json file.

Writes DIR/diff.html, DIR/diff.md and DIR/diff.json (trace dirs are parsed into DIR/base/tables and
DIR/new/tables), and prints the Markdown summary.

Example:  tracekit diff runs/before runs/after --out diff-out

Exit status: 0 when both runs could be analysed (whatever changed); 2 when one could not.
"""


def register(app: typer.Typer) -> None:
    @app.command("diff", help=HELP, no_args_is_help=True)
    def diff_cmd(
        base: Path = typer.Argument(..., help="The run before (trace dir, run store, analyze output, analysis.json).",
                                    exists=True, readable=True),
        new: Path = typer.Argument(..., help="The run after.", exists=True, readable=True),
        out: Path = typer.Option(Path("tracekit-diff"), "--out", "-o", help="Output directory (created if needed)."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not print the Markdown summary."),
    ) -> None:
        from rich.console import Console

        from tracekit.compare.diff import diff_analyses, load_analysis
        from tracekit.errors import TracekitError

        err = Console(stderr=True)
        out.mkdir(parents=True, exist_ok=True)
        docs, stores = [], []
        for label, path in (("base", base), ("new", new)):
            try:
                analysis, store = load_analysis(path, out / label / "tables", progress=not quiet)
            except TracekitError as exc:
                from rich.markup import escape

                err.print(f"[red]tracekit diff:[/red] {label} {escape(str(path))}: {escape(str(exc))}", highlight=False)
                raise typer.Exit(2) from None
            docs.append(analysis)
            stores.append(store)
        attribution = None
        if stores[0] is not None and stores[1] is not None:
            from tracekit.compare.attribution import attribute_stores

            try:
                attribution = attribute_stores(stores[0], stores[1])
            except Exception as exc:  # noqa: BLE001 - the rest of the diff stands without it
                err.print(f"tracekit diff: the explained change could not be computed ({type(exc).__name__}: {exc})",
                          highlight=False, markup=False)
        doc = diff_analyses(docs[0], docs[1], base_label=str(base), new_label=str(new), attribution=attribution)
        from reports import render_diff_html, render_diff_markdown

        (out / "diff.json").write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
        (out / "diff.html").write_text(render_diff_html(doc), encoding="utf-8")
        summary = render_diff_markdown(doc, "diff.html")
        (out / "diff.md").write_text(summary, encoding="utf-8")
        if not quiet:
            typer.echo(summary)
            err.print(f"diff: {out / 'diff.html'}", highlight=False, markup=False)
