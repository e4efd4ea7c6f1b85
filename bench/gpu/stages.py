"""Step 4: bench/bench_pipeline.py's stage table (cold / warm new prompt / warm same prompt) on the
tiny model, attention `auto` as serve decides it, then a larger canvas where denoising dominates."""

from __future__ import annotations

import argparse

from common import DEVICE, DRY, DTYPE, free, now, one_line, tiny_model, trace  # first: it puts bench/ on the path

# isort: split
import bench_pipeline  # the project's bench: its jobs() is the stage table

print(f"## Stage table (bench/bench_pipeline.py, tiny model, {DEVICE} {DTYPE}, attention auto)\n")
model = tiny_model()
for size, frames in [("64x64", 22)] + ([] if DRY else [("384x640", 46)]):
    args = argparse.Namespace(
        model_dir=str(model), device=DEVICE, dtype=DTYPE, attention="auto", size=size, frames=frames, steps=8
    )
    t0 = now()
    try:
        bench_pipeline.jobs(args)
        print(f"({size} x {frames} frames: {now() - t0:.1f} s in all)\n")
    except Exception as exc:  # noqa: BLE001 - the table says it failed and why; the run goes on
        trace(exc)
        print(f"{size} x {frames} frames: FAILED after {now() - t0:.1f} s: {one_line(exc)}\n")
    free()
