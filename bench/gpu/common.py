"""Shared by the GPU check's steps (bench/gpu_check.sh runs each as `python -m bench.gpu.<step>`, the
repository on PYTHONPATH): where they run, the tiny models, tables.

H3GPU_DRY=cpu runs every step on the CPU at toy sizes in float32 (the wiring, imports and
tables, on a machine without a GPU); otherwise everything measures on CUDA in bfloat16.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DRY = os.environ.get("H3GPU_DRY", "") == "cpu"
DEVICE = "cpu" if DRY else "cuda"
DTYPE = "float32" if DRY else "bfloat16"
WORK = Path(os.environ.get("H3GPU_WORK") or Path(os.environ.get("TMPDIR", "/tmp")) / "h3gpu")
OUT = Path(os.environ.get("OUT") or ROOT / "gpu-out")
REAL_GEOMETRY = (56, 128)  # MiniMax-H3's heads x head dim (docs/design.md §4; diffusers' defaults)


def now() -> float:
    return time.perf_counter()


def one_line(exc: BaseException, n: int = 300) -> str:
    """The exception in one line (type, message; newlines joined), cut at n characters."""
    text = " | ".join(ln.strip() for ln in f"{type(exc).__name__}: {exc}".splitlines() if ln.strip())
    return text if len(text) <= n else text[: n - 3] + "..."


def trace(exc: BaseException) -> None:
    """The whole traceback to stderr (run.log); the tables get the one-line form."""
    traceback.print_exception(exc, file=sys.stderr)


def free() -> None:
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def tiny_model(head_dim: int | None = None) -> Path:
    """The project's tiny random model (head dim 32), or the same with another head dim; written once."""
    from h3core.executors.pipeline import tiny

    out = WORK / f"tiny-hd{head_dim or tiny.TRANSFORMER['attention_head_dim']}"
    if (out / "h3core-model.json").exists():
        return out
    if out.exists():
        import shutil

        shutil.rmtree(out)
    t0 = now()
    tiny.make_tiny(out, transformer={"attention_head_dim": head_dim} if head_dim else None)
    print(f"(wrote the tiny model with head dim {head_dim or 'as made'} to {out} in {now() - t0:.1f} s)", file=sys.stderr)
    return out


def geometry_folder(heads: int, head_dim: int) -> Path:
    """A model folder holding only transformer/config.json: enough for the attention probe's geometry."""
    import json

    out = WORK / f"geometry-{heads}x{head_dim}"
    (out / "transformer").mkdir(parents=True, exist_ok=True)
    (out / "transformer" / "config.json").write_text(json.dumps({"num_attention_heads": heads, "attention_head_dim": head_dim}))
    return out


def versions() -> str:
    from importlib import metadata

    out = []
    for dist in ("torch", "triton", "diffusers", "transformers", "sageattention", "pydantic", "av"):
        try:
            out.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            out.append(f"{dist} -")
    return ", ".join(out)


def md(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
