#!/usr/bin/env bash
# The pipeline benchmark on a GPU, as one script for the `device` tool (one H200 holds the
# 1-rank figures and the kernel comparison). It uses the python that already has a CUDA torch,
# diffusers and transformers (the device machine cannot reach a registry); the tiny model is
# written on the spot, so no weights are needed. Results go to $OUT (or ./bench-gpu-out).
#   run: bash bench/gpu_pipeline.sh
. "$(dirname "$0")/_gpu_setup.sh"
# Stage times on the tiny model (a GPU makes them launch-bound; the point is the split), then
# a larger canvas to see denoising dominate.
"$PY" bench/bench_pipeline.py --device cuda --dtype bfloat16 --steps 8 --seq 4096,8192,16384,32768 \
    | tee "$OUT/pipeline-tiny.md"
"$PY" bench/bench_pipeline.py --device cuda --dtype bfloat16 --size 768x1344 --frames 124 --steps 8 \
    --attention-only --seq 8192,16384,32768,65536 | tee "$OUT/attention.md"
# One rank of a group on the GPU (Ray, NCCL process group of one), when ray imports.
if "$PY" -c 'import ray' 2>/dev/null; then
    "$PY" bench/bench_groups.py --device cuda --dtype bfloat16 --configs 1 --steps 8 | tee "$OUT/groups-1rank.md"
fi
# Parts placed apart: the text encoder in host memory, the rest on the GPU; one tiny job must run.
"$PY" - <<'PY' | tee "$OUT/placement.txt"
import tempfile, time
from pathlib import Path
from h3core.domain.request import GenerationRequest
from h3core.executors.pipeline.attention import resolve
from h3core.executors.pipeline.generate import Control, Generator, Media
from h3core.executors.pipeline.model import load_model
from h3core.executors.pipeline.tiny import make_tiny
root = make_tiny(Path(tempfile.mkdtemp()) / "tiny")
for placement in ({}, {"text_encoder": "cpu"}, {"text_encoder": "cpu", "vae": "cpu"}):
    model = load_model(root, device="cuda", dtype="bfloat16", placement=placement)
    t0 = time.perf_counter()
    out = Generator(model, resolve("auto", "cuda")).run(
        GenerationRequest(prompt="a red fox", width=64, height=64, frames=22, steps=4, seed=1), Media(), Control())
    print(f"placement {placement or 'all on cuda'}: {out.frames.shape} in {time.perf_counter() - t0:.2f} s, stages {out.seconds}")
PY
