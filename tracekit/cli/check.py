"""`tracekit check TRACE_DIR --max-...`: a CI gate; exit 1 when a threshold is breached."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

HELP = """Check a run against limits, for CI: prints each check, exits 1 when any limit is breached.

TRACE_DIR is a trace directory, a run store, an analyze output directory or an analysis.json file.
Fractions are of the step time (0.2 = 20%). A limit the run has no number for (e.g. --max-bubble
without pipeline parallelism) is printed as "not measured" and does not fail.

--expect FILE checks the run against expectations: an advice.json (`tracekit advise`: the top-ranked layout's
predicted step time, exposed communication and peak memory, or --expect-candidate N) or a previous run's
analysis.json (its step time, exposed communication, bubble and peak memory); a number misses when the run
is worse than expected by more than --tolerance (a step's parts also by more than that share of the step).

Example:  tracekit check traces --max-exposed-comm 0.2 --max-bubble 0.3 --fail-on critical
          tracekit check traces --expect last-week/analysis.json --tolerance 0.1

Exit status: 0 all limits and expectations met; 1 a limit breached or an expectation missed; 2 usage error,
no limit or expectation given, an unreadable expectations file, or nothing analysable.
"""


def register(app: typer.Typer) -> None:
    @app.command("check", help=HELP, no_args_is_help=True)
    def check_cmd(
        trace_dir: Path = typer.Argument(..., help="Trace dir, run store, analyze output dir or analysis.json.",
                                         exists=True, readable=True),
        max_exposed_comm: Optional[float] = typer.Option(None, min=0, help="Exposed communication / step, worst rank."),
        max_bubble: Optional[float] = typer.Option(None, min=0, help="Measured pipeline bubble (fraction)."),
        max_idle: Optional[float] = typer.Option(None, min=0, help="Idle / step, worst rank."),
        max_step_ms: Optional[float] = typer.Option(None, min=0, help="Step time in ms, slowest rank."),
        max_skew: Optional[float] = typer.Option(None, min=0, help="Straggler delay / step (how long groups wait for a rank), worst rank."),
        max_routing_skew: Optional[float] = typer.Option(None, min=0, help="MoE routing skew (max/mean tokens per expert), worst layer."),
        fail_on: Optional[str] = typer.Option(None, help="Fail on any finding of this severity or worse: warning | critical (unstable_verdict, which says the recorded steps vary too much to judge, never fails the gate)."),
        json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the check results as JSON here."),
        expect: Optional[Path] = typer.Option(None, "--expect", help="Expectations: an advice.json (tracekit advise) or a previous run's analysis.json (or its analyze output dir).", exists=True, readable=True),
        tolerance: float = typer.Option(0.1, "--tolerance", min=0, help="How much worse than expected a number may be (0.1 = 10%), with --expect."),
        expect_candidate: Optional[int] = typer.Option(None, "--expect-candidate", min=0, help="With an advice.json: which ranked layout to expect (default: the one with the run's parallel degrees, else the top-ranked, 0)."),
    ) -> None:
        from rich.console import Console

        from tracekit.findings.finding import Severity
        from tracekit.compare.check import Thresholds, evaluate
        from tracekit.compare.diff import load_analysis
        from tracekit.errors import TracekitError

        err = Console(stderr=True)
        if fail_on is not None and fail_on not in ("info", "warning", "critical"):
            raise typer.BadParameter(f"expected warning or critical, got {fail_on!r}", param_hint="--fail-on")
        thresholds = Thresholds(max_exposed_comm=max_exposed_comm, max_bubble=max_bubble, max_idle=max_idle,
                                max_step_ms=max_step_ms, max_skew=max_skew, max_routing_skew=max_routing_skew,
                                fail_on=Severity(fail_on) if fail_on else None)
        if not thresholds.any() and expect is None:
            err.print("[red]tracekit check:[/red] give at least one limit (e.g. --max-exposed-comm 0.2) or --expect FILE; see --help")
            raise typer.Exit(2)
        try:
            analysis, _ = load_analysis(trace_dir)
        except TracekitError as exc:
            from rich.markup import escape

            err.print(f"[red]tracekit check:[/red] {escape(str(exc))}", highlight=False)
            raise typer.Exit(2) from None
        expected = None
        if expect is not None:
            from tracekit.compare.expect import load_expectations

            try:
                expected = load_expectations(expect, expect_candidate, analysis)
            except (TracekitError, ValueError) as exc:
                from rich.markup import escape

                err.print(f"[red]tracekit check:[/red] --expect {escape(str(exc))}", highlight=False)
                raise typer.Exit(2) from None
        results = evaluate(analysis, thresholds)
        if expected is not None:
            from tracekit.compare.expect import check_expectations

            results += check_expectations(analysis, expected[0], tolerance, expected[1])
        for r in results:
            opt = "--" + r.name.replace("_", "-")
            if r.name.startswith("expect_"):
                q = r.name.removeprefix("expect_")
                line = (f"n/a  expect {q}: {r.detail}" if not r.measured
                        else f"{'FAIL' if r.breached else 'ok  '} expect {q}: {r.detail}")
            elif r.name == "fail_on":
                line = (f"FAIL {opt} {r.limit}: {int(r.value or 0)} finding(s): {r.detail}" if r.breached
                        else f"ok   {opt} {r.limit}: no such finding" + r.detail.removeprefix("none"))
            elif not r.measured:
                line = f"n/a  {opt} {r.limit}: not measured ({r.detail})"
            else:
                op = ">" if r.breached else "<="
                line = f"{'FAIL' if r.breached else 'ok  '} {opt} {r.limit}: {r.value:.4g} {op} {r.limit} ({r.detail})"
            typer.echo(line)
        if json_out is not None:
            json_out.write_text(json.dumps([r.to_json() for r in results], indent=1), encoding="utf-8")
        breached = [r for r in results if r.breached]
        if breached:
            err.print(f"tracekit check: {len(breached)} limit(s) breached or expectation(s) missed", highlight=False)
            raise typer.Exit(1)
