"""The README's command table is the CLI's commands, and docs/operations.md's settings table is the
settings with their `serve` flags: each checked both ways, so neither drifts from the code."""

from __future__ import annotations

import re
from typing import Any

import typer.main

from h3core.cli import app
from h3core.runtime.settings import NoFlag, Settings
from tests.readme import README, command_table, settings_table


def cli_commands() -> dict[str, Any]:
    """Every command the `h3core` CLI runs, by its words: `replay`, `capacity show`, …"""
    root = typer.main.get_command(app)
    out = {}
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        if hasattr(command, "commands"):  # a group: its commands (typer's own click, not click's classes)
            out.update({f"{name} {sub}": c for sub, c in command.commands.items()})
        else:
            out[name] = command
    return out


def named(invocation: str, commands: set[str]) -> str:
    """The command an `h3core …` line of the table runs: one word, or a group's two."""
    words = invocation.split()[1:3]
    return " ".join(words) if " ".join(words) in commands else words[0]


def test_the_readme_lists_every_command_and_no_other():
    commands = set(cli_commands())
    listed = {named(invocation, commands) for invocation in command_table()}
    assert commands - listed == set(), "commands the README's table leaves out"
    assert listed - commands == set(), "rows of the README's table that are no command"


def test_the_settings_table_lists_every_setting_with_its_serve_flag():
    table = settings_table()
    variables = {f"H3_{name.upper()}": name for name in Settings.model_fields}
    assert set(variables) - set(table) == set(), "settings docs/operations.md leaves out"
    assert set(table) - set(variables) == set(), "rows of docs/operations.md's table that are no setting"
    flags = {p.name: p.opts[0] for p in cli_commands()["serve"].params}
    expected = {variable: flags.get(name) for variable, name in variables.items()}  # H3_API_TOKENS: no flag
    wrong = {variable: (flag, expected[variable]) for variable, flag in table.items() if flag != expected[variable]}
    assert wrong == {}, "rows whose flag is missing or not serve's (table, serve)"


def test_the_readme_names_the_settings_without_a_flag():
    """The README's `serve` row says every setting has a flag but the secrets, and names them."""
    serve = next(line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith("| `h3core serve`"))
    said = re.search(r"except the (\w+) secrets, which have no flag on purpose[^:]*: ((?:`H3_\w+`(?:, | and )?)+)", serve)
    assert said is not None, serve
    named = set(re.findall(r"`(H3_\w+)`", said.group(2)))
    flagless = {f"H3_{name.upper()}" for name, field in Settings.model_fields.items() if NoFlag in field.metadata}
    assert named == flagless
    numbers = {"one": 1, "two": 2, "three": 3, "four": 4}
    assert numbers.get(said.group(1)) == len(flagless), said.group(0)
    serve_flags = {p.name for p in cli_commands()["serve"].params}
    assert {name for name in Settings.model_fields if f"H3_{name.upper()}" not in flagless} <= serve_flags
