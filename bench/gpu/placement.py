"""Step 5: the placement matrix: one tiny job with the parts where `--text-encoder-device` and
`--vae-device` put them (all on one GPU; text encoder on the host; text encoder and VAEs on the
host; two GPUs where there are two), through the executor's own Generator and the plan serve
decides. Each video is compared with the all-on-one-GPU one.

In a dry run the GPUs are simulated (tests/fakes/devices.py: CPU tensors tagged with a device,
torch's placement rules checked on every call), so the same matrix runs on a CPU."""

from __future__ import annotations

import contextlib

import numpy as np

from bench.gpu.common import DEVICE, DRY, DTYPE, free, md, now, one_line, tiny_model, trace
from h3core.domain.request import GenerationRequest
from h3core.executors.pipeline.generate import Control, Generator, Media
from h3core.executors.pipeline.kernel_probe import at_start
from h3core.executors.pipeline.model import load_model

print(f"## Placement matrix (tiny model, 64x64, 22 frames, 4 steps, {DTYPE}{', simulated GPUs' if DRY else ''})\n")
root = tiny_model()
plan = at_start(root, DEVICE, DTYPE, "auto").plan
request = GenerationRequest(prompt="a red fox running through snow", width=64, height=64, frames=22, steps=4, seed=1)
if DRY:
    from tests.fakes.devices import place_model

    gpus = 2
else:
    import torch

    gpus = torch.cuda.device_count()
PLACEMENTS = [
    ("all on one GPU", {"transformer": "cuda:0", "text_encoder": "cuda:0", "vae": "cuda:0"}),
    ("text encoder on the host", {"transformer": "cuda:0", "text_encoder": "cpu", "vae": "cuda:0"}),
    ("text encoder and VAEs on the host", {"transformer": "cuda:0", "text_encoder": "cpu", "vae": "cpu"}),
    ("two GPUs: text encoder and VAEs on the second", {"transformer": "cuda:0", "text_encoder": "cuda:1", "vae": "cuda:1"}),
]


def load(where: dict[str, str]):
    """The model with its parts placed, and the context a job runs in (the simulator in a dry run)."""
    if not DRY:
        placement = {p: d for p, d in where.items() if p != "transformer"}
        return load_model(root, device=where["transformer"], dtype=DTYPE, placement=placement), contextlib.nullcontext()
    model = load_model(root, device="cpu", dtype=DTYPE)
    return model, place_model(model, where)


rows, first = [], None
for label, where in PLACEMENTS:
    if any(d == "cuda:1" for d in where.values()) and gpus < 2:
        rows.append([label, "-", "-", "-", "not run: this machine has one GPU", "-"])
        continue
    t0 = now()
    try:
        model, context = load(where)
        loaded = now() - t0
        generator = Generator(model, plan)
        t1 = now()
        with context:
            out = generator.run(request, Media(), Control(keep_raw=True))
        finite = bool(np.isfinite(out.raw).all() and np.isfinite(out.audio).all())
        diff = "-" if first is None else f"{float(np.abs(out.raw - first).max()):.4f}"
        first = out.raw if first is None else first
        stages = ", ".join(f"{k} {v:.2f}" for k, v in out.seconds.items())
        rows.append([label, f"{loaded:.2f}", f"{now() - t1:.2f}", stages, f"done: {out.frames.shape}, finite {finite}", diff])
        del model, generator, out
    except Exception as exc:  # noqa: BLE001 - the row says how it failed
        trace(exc)
        rows.append([label, "-", "-", "-", f"FAILED: {one_line(exc, 220)}", "-"])
    free()
print(f"plan: {plan.describe()}\n")
print(md(["placement", "load s", "job s", "stages s", "result", "max abs diff vs all on one GPU (video in [0,1])"], rows))
