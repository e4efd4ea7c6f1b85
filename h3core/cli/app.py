"""The `h3core` Typer application that every command module registers on."""

import typer

app = typer.Typer(
    name="h3core",
    help="Run long video-generation jobs so that none is ever stuck, lost or silently half-done.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
