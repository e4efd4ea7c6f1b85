"""Step 4: bench.throughput.pipeline's stage table (cold / warm new prompt / warm same prompt) on the
tiny model, attention `auto` as serve decides it, then a larger canvas where denoising dominates."""

from __future__ import annotations

import argparse

from bench.gpu.common import DEVICE, DRY, DTYPE, free, now, one_line, tiny_model, trace
from bench.throughput import pipeline as bench_pipeline  # the project's bench: its jobs() is the stage table

print(f"## Stage table (bench.throughput.pipeline, tiny model, {DEVICE} {DTYPE}, attention auto)\n")
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
