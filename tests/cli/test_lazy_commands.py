"""`tracekit CMD ...` registers only CMD (issue 28: the other nine cost ~0.03 CPU s per run); what the user sees
is the same as with every command registered."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from tracekit.cli.main import COMMANDS, build_app, commands_for


@pytest.mark.parametrize("name", COMMANDS)
def test_a_named_command_alone_behaves_as_in_the_full_app(name):
    argv = ["tracekit", name, "--help"]
    alone = build_app(commands_for(argv))
    assert [c.name for c in alone.registered_commands] == [name]
    full = build_app(COMMANDS)
    runner = CliRunner()
    for args in ([name, "--help"], [name, "--no-such-option"]):
        got, want = runner.invoke(alone, args), runner.invoke(full, args)
        assert (got.exit_code, got.output) == (want.exit_code, want.output)


@pytest.mark.parametrize("argv", [["tracekit"], ["tracekit", "--help"], ["tracekit", "--version"],
                                  ["tracekit", "parsee"], ["tracekit", "--version", "parse"]])
def test_anything_else_gets_every_command(argv):
    assert commands_for(argv) == COMMANDS
    names = [c.name for c in build_app(commands_for(argv)).registered_commands]
    assert names == list(COMMANDS)
    assert set(typer.main.get_command(build_app(commands_for(argv))).commands) == set(COMMANDS)
