"""Every command's --help ends with one example (issue 27), and the example parses: its options and arguments are the
command's own (click builds the command's context from it without running it)."""

from __future__ import annotations

import re
import shlex

import pytest
import typer
from typer.testing import CliRunner

from collapse_doctor.cli.app import COMMANDS, app

NAMES = [command.__name__ for command in COMMANDS]


@pytest.mark.parametrize("name", NAMES)
def test_every_command_shows_an_example_that_parses(name: str) -> None:
    result = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    found = re.search(rf"Example: (collapse-doctor {name} [^\n]+)", result.stdout)
    assert found, result.stdout
    words = shlex.split(found.group(1).split(" > ")[0])[2:]  # without the shell's redirection
    group = typer.main.get_command(app)
    command = group.commands[name]  # type: ignore[attr-defined]
    with command.make_context(name, words, resilient_parsing=False) as ctx:  # raises on an unknown option
        assert ctx.params is not None
