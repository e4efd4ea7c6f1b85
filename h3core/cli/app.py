"""The `h3core` Typer application that every command module registers on."""

import inspect
from importlib.metadata import PackageNotFoundError, version

import typer

__all__ = ["app", "reflow_help"]

app = typer.Typer(
    name="h3core",
    help="Run long video-generation jobs so that none is ever stuck, lost or silently half-done.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(asked: bool) -> None:
    if asked:
        try:
            typer.echo(f"h3core {version('h3core')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            typer.echo("h3core (not installed: no version)")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print h3core's version and exit."
    ),
) -> None:
    """Run long video-generation jobs so that none is ever stuck, lost or silently half-done."""


def reflow_help(typer_app: typer.Typer) -> None:
    """Make every command's help (its docstring) one line per paragraph, subcommands included.

    Docstrings are wrapped at the source's width; typer's rich help prints a single line break of
    the commands table and of later paragraphs as it is, so the text broke mid-sentence.
    """
    for command in typer_app.registered_commands:
        text = command.help or inspect.getdoc(command.callback)
        if text:
            command.help = _one_line_paragraphs(text)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            info = group.typer_instance.info
            if isinstance(info.help, str):
                info.help = _one_line_paragraphs(info.help)
            reflow_help(group.typer_instance)


def _one_line_paragraphs(text: str) -> str:
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in paragraph.splitlines()) for paragraph in paragraphs)
