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


@model_app.command("attention")
def attention_cmd(
    model_dir: Annotated[Path, typer.Argument(help="The model folder (its transformer/config.json gives the geometry).")],
    device: Annotated[str, typer.Option(help="Torch device.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    attention: Annotated[str, typer.Option(help="auto, or a kernel to check.")] = "auto",
    tolerance: Annotated[float, typer.Option(help="Relative L1 error a kernel may show.")] = 0.05,
    math_max_tokens: Annotated[int, typer.Option(help="Longest sequence MATH may take.")] = 4096,
) -> None:
    """Probe the attention kernels as `serve` does at start, and print the table and the decision."""
    try:
        from h3core.executors.pipeline.attention import AttentionError
        from h3core.executors.pipeline.kernel_probe import at_start, table
    except ImportError as exc:
        fail(f"needs the pipeline extra: pip install 'h3core[pipeline]' ({exc})")
    try:
        decision = at_start(model_dir, device, dtype, attention, tolerance=tolerance, math_max_tokens=math_max_tokens)
    except AttentionError as exc:
        fail(str(exc))
    typer.echo("\n".join(table(decision)))
