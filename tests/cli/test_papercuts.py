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
