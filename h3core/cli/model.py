"""`h3core model`: model folders for the pipeline executor."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from h3core.cli.app import app
from h3core.cli.common import console_err, fail

model_app = typer.Typer(help="MiniMax-H3 model folders for the pipeline executor.")
app.add_typer(model_app, name="model")


@model_app.command("make-tiny")
def make_tiny_cmd(
    out: Annotated[Path, typer.Argument(help="Folder to write (absent or empty).")],
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
) -> None:
    """Write a tiny random-weight MiniMax-H3 in the diffusers layout (runs on a CPU in about a second)."""
    try:
        from h3core.executors.pipeline.tiny import make_tiny
    except ImportError as exc:
        fail(f"needs the pipeline extra: pip install 'h3core[pipeline]' ({exc})")
    try:
        make_tiny(out, seed=seed)
    except FileExistsError as exc:
        fail(f"{exc}: choose an empty or new folder")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    console_err().print(f"wrote a tiny MiniMax-H3 to {out} ({size / 1e6:.1f} MB): serve it with --model-dir {out}")
