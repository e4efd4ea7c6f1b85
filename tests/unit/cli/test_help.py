"""Every command's `--help` reads as sentences: no line broken where its next word would have fit,
and every command's and option's text ends its sentence."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import typer
import typer.rich_utils
from typer.testing import CliRunner

from h3core.cli import app

WIDTHS = (80, 120)


def _commands() -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = [()]

    def walk(group: Any, path: tuple[str, ...]) -> None:
        for name, command in group.commands.items():
            paths.append((*path, name))
            if hasattr(command, "commands"):  # a group of subcommands
                walk(command, (*path, name))

    walk(typer.main.get_command(app), ())
    return paths


COMMANDS = _commands()


def _help(path: tuple[str, ...], width: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    # typer reads TERMINAL_WIDTH once, at import: the width is set where it keeps it
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", width)
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def _cells(lines: list[str], width: int) -> list[tuple[int, list[str]]]:
    """The prose blocks of a help page, each with the width its text was wrapped to: the paragraphs
    under the usage line, and each command's text in a Commands table."""
    cells: list[tuple[int, list[str]]] = []
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    paragraph: list[str] = []
    i = start
    while i < len(lines) and not lines[i].lstrip().startswith("╭"):
        if lines[i].strip():
            paragraph.append(lines[i].strip())
        elif paragraph:
            cells.append((width - 2, paragraph))
            paragraph = []
        i += 1
    if paragraph:
        cells.append((width - 2, paragraph))
    in_commands = False
    column = 0
    table: list[list[str]] = []
    for line in lines[i:]:
        if line.startswith("╭─ Commands"):
            in_commands = True
            continue
        if line.startswith("╰"):
            in_commands = False
            continue
        if not in_commands:
            continue
        inner = line[2 : line.rindex("│")]
        if inner[0] != " ":  # a command's first line: name, then its text
            name = inner.split(" ", 1)[0]
            column = len(inner) - len(inner[len(name) :].lstrip())
            table.append([])
        table[-1].append(inner[column:].rstrip())
    # the text column is at least as wide as its longest line
    room = max((len(line) for rows in table for line in rows), default=0)
    return cells + [(room, rows) for rows in table]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(path) or "h3core")
def test_help_lines_break_only_where_the_next_word_would_not_fit(
    path: tuple[str, ...], width: int, monkeypatch: pytest.MonkeyPatch
):
    broken = [
        (line, following)
        for room, lines in _cells(_help(path, width, monkeypatch), width)
        for line, following in itertools.pairwise(lines)
        if len(line) + 1 + len(following.split(" ", 1)[0]) <= room
    ]
    assert not broken, broken


def _params(command: Any) -> list[Any]:
    return [param for param in command.params if getattr(param, "help", None)]


def test_every_command_and_option_text_ends_its_sentence():
    unfinished: list[str] = []
    for path in COMMANDS:
        command: Any = typer.main.get_command(app)
        for name in path:
            command = command.commands[name]
        texts = [(" ".join(path) or "h3core", command.help or "")] + [
            (f"{' '.join(path)} {param.name}", param.help or "") for param in _params(command)
        ]
        unfinished += [f"{where}: {text!r}" for where, text in texts if not text.rstrip().endswith((".", ".)"))]
    assert not unfinished, "\n".join(unfinished)
