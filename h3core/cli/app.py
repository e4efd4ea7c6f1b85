"""The `h3core` Typer application that every command module registers on."""

from importlib.metadata import PackageNotFoundError, version

import typer

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
