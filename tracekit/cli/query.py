"""`tracekit query STORE "SQL"`: DuckDB SQL over a run store's Parquet tables."""

from __future__ import annotations

import csv
import io
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

HELP = """Run DuckDB SQL over a run store written by `tracekit parse` (or `tracekit analyze`).

Every table is a view named after it: ranks, process_groups, events, kernels, collectives,
steps, routing, pipeline, memory, memory_segments, ops (one row per CPU op that launched kernels:
device time, FLOPs, bytes, GEMM M/N/K) and kernel_summary (per kernel name and stream). The derived
facts the analyzers read are tables too, built when a query names them: rank_coords, group_dims,
matched_collectives (each member's arrival and wait for the last arrival), clock_offsets, activity
(compute / comm / other intervals) and step_windows. Times are int64 nanoseconds. `--schema` lists
the columns.

Examples:

  tracekit query store --schema

  tracekit query store "SELECT rank, count(*) AS n FROM events GROUP BY rank ORDER BY rank"

  tracekit query store "SELECT name, gemm_m, gemm_n, gemm_k, sum(flops)/sum(kernel_ns)/1e3 AS tflops
      FROM ops WHERE category = 'gemm' GROUP BY ALL ORDER BY sum(kernel_ns) DESC"

  tracekit query store "SELECT pg_name, op, avg(dur)/1e6 AS ms FROM collectives
      WHERE source = 'kineto' GROUP BY ALL ORDER BY ms DESC" --format csv

  tracekit query store "SELECT c.rank AS late_rank, sum(w.wait_ns)/1e6 AS others_waited_ms
      FROM matched_collectives c JOIN matched_collectives w USING (pg_name, seq)
      WHERE c.is_last AND w.rank <> c.rank GROUP BY ALL ORDER BY 2 DESC"
"""


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def _cell(v: object) -> str:
    if v is None:
        return ""
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def register(app: typer.Typer) -> None:
    @app.command("query", help=HELP, no_args_is_help=True)
    def query_cmd(
        store_dir: Path = typer.Argument(..., help="Run store directory (has meta.json and <table>.parquet).",
                                         exists=True, file_okay=False, dir_okay=True),
        sql: Optional[str] = typer.Argument(None, help="SQL query; tables are views named after them."),
        fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help="Output format."),
        schema: bool = typer.Option(False, "--schema", help="Print every table's columns, types and docs."),
        limit: int = typer.Option(200, "--max-rows", min=0,
                                  help="Rows shown in table format (0 = all); csv and json print all rows."),
    ) -> None:
        from rich.console import Console
        from rich.markup import escape

        from tracekit.derive.tables import DERIVED, derived_tables, describe_derived
        from tracekit.errors import TracekitError
        from tracekit.tables.schema import TABLES, describe
        from tracekit.tables.store import RunStore

        err = Console(stderr=True)
        try:
            store = RunStore(store_dir)
        except TracekitError as exc:
            err.print(f"[red]tracekit query:[/red] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(1) from None
        if schema:
            typer.echo("\n\n".join([*(describe(name) for name in TABLES), *(describe_derived(n) for n in DERIVED)]))
            if sql is None:
                return
        if sql is None:
            err.print("[red]tracekit query:[/red] give a SQL query or --schema")
            raise typer.Exit(2)
        import duckdb

        try:
            result = store.sql(sql, extra=derived_tables(store, sql))
        except duckdb.Error as exc:
            err.print(f"[red]tracekit query:[/red] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(1) from None
        rows = result.to_pylist()
        names = result.column_names
        if fmt is OutputFormat.json:
            typer.echo(json.dumps(rows, default=str))
        elif fmt is OutputFormat.csv:
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            w.writerow(names)
            for r in rows:
                w.writerow([_cell(r[n]) for n in names])
            sys.stdout.write(buf.getvalue())
        else:
            from rich.table import Table

            table = Table(show_lines=False)
            for n in names:
                table.add_column(n)
            shown = rows if limit == 0 else rows[:limit]
            for r in shown:
                table.add_row(*[escape(_cell(r[n])) for n in names])
            Console(width=max(120, Console().width)).print(table)
            if len(shown) < len(rows):
                err.print(f"({len(rows)} rows, {len(shown)} shown; --max-rows 0 or --format csv for all)")
