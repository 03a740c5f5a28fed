"""Papercuts a new user met (issue 33): --version, options without a description."""

from __future__ import annotations

import click
import typer
from typer.testing import CliRunner

import tracekit
from tracekit.cli.main import COMMANDS, app


def test_version():
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == tracekit.__version__


def test_no_command_still_shows_help():
    res = CliRunner().invoke(app, [])
    assert "Usage" in res.output and "analyze" in res.output


def test_every_option_has_a_description():
    root = typer.main.get_command(app)
    missing = []
    for name in COMMANDS:
        cmd = root.commands[name]
        for p in cmd.params:
            if isinstance(p, click.Option) and not (p.help or "").strip():
                missing.append(f"{name} {p.opts[0]}")
    assert not missing, missing


def test_terminal_table_says_which_ranks_it_leaves_out():
    import io

    from rich.console import Console

    from tracekit.cli.analyze import _print_summary

    row = {"steps": 2, "step_ns": 2_000_000, "compute_ns": 1_000_000, "exposed_comm_ns": 0, "sync_wait_ns": 0,
           "other_ns": 0, "idle_ns": 1_000_000, "overlap_ratio": None, "bound": "compute"}
    ranks = list(range(64)) + [70]
    buf = io.StringIO()
    _print_summary({"ranks": [dict(row, rank=r) for r in ranks], "findings": []}, Console(file=buf, width=100))
    text = buf.getvalue()
    table = [line for line in text.splitlines() if "not shown" not in line]
    shown = [r for r in ranks if any(line.split()[:1] == [str(r)] for line in table)]
    assert shown == ranks[:16] + ranks[-16:]
    assert "33 ranks not shown (ranks 16–48)" in text


def test_fail_on_warning_ignores_unstable_verdict(tmp_path):
    """A clean run whose steps vary (unstable_verdict, a warning about noise) passes `--fail-on warning`;
    any other warning still fails it."""
    import json

    from tracekit.compare.check import Thresholds, evaluate

    noise = {"kind": "unstable_verdict", "severity": "warning", "ranks": [0], "dim": None,
             "summary": "verdict of rank 0 changes between steps", "evidence": {}, "recommendation": "",
             "est_saving_ns": 0}
    real = dict(noise, kind="straggler", summary="rank 1 arrives last")
    doc = {"schema": "tracekit.analysis/1", "inputs": {"ranks": [0], "skipped": []}, "ranks": [], "findings": [noise]}
    res = evaluate(doc, Thresholds(fail_on="warning"))[0]
    assert not res.breached and "unstable_verdict not gated" in res.detail
    assert evaluate(dict(doc, findings=[noise, real]), Thresholds(fail_on="warning"))[0].breached
    path = tmp_path / "analysis.json"
    path.write_text(json.dumps(doc))
    out = CliRunner().invoke(app, ["check", str(path), "--fail-on", "warning"])
    assert out.exit_code == 0 and "unstable_verdict not gated" in out.output
    path.write_text(json.dumps(dict(doc, findings=[noise, real])))
    assert CliRunner().invoke(app, ["check", str(path), "--fail-on", "warning"]).exit_code == 1


def test_record_summary_prints_the_jobs_own_text_verbatim(tmp_path):
    """`tracekit record` quotes the job's errors (a rank's reason, the hang summary, paths): PyTorch's gloo
    writes "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]", which rich read as a
    closing markup tag: the summary raised MarkupError and the recorded job's exit turned into a traceback
    (a CI run of tests/record/test_user_scripts.py). Every such text is printed as it is."""
    import io

    from rich.console import Console

    from tracekit.cli.record import print_hang, print_summary

    gloo = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer"
    out = tmp_path / "rec[/x]"
    manifest = {"status": "partial [/bold]", "world_size": 2, "hosts": ["h"], "torch_version": "2.13.0",
                "ranks": [{"rank": 0, "status": "ok", "profiled": True, "trace_steps": 2, "files": {"t": "rank0.json"},
                           "collectives_logged": 3},
                          {"rank": 1, "status": "error", "profiled": True, "trace_steps": 1, "files": {},
                           "collectives_logged": 1, "reason": gloo}],
                "missing_ranks": [], "parallel_layout": "[/dp2]"}
    buf = io.StringIO()
    console = Console(file=buf, width=400)
    print_summary(console, manifest, out, 1)
    print_hang(console, {"detected": False, "summary": gloo, "dumps": str(out), "analysis": None})
    text = buf.getvalue()
    assert text.count(gloo) == 2
    assert "partial [/bold]" in text and str(out) in text and "[/dp2]" in text
