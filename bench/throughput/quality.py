"""Quality levels, in one run: per level, the transformer steps computed and served from the step
cache, the denoising time and its speed-up over `exact`, and the video's PSNR and SSIM against
`exact`'s (same request, same seed).

    python -m bench.throughput.quality                      # tiny random model, 8 blocks deep, on the CPU
    python -m bench.throughput.quality --released --device cuda --dtype bfloat16 --size 768x1344 --frames 22 --steps 6

The model has random weights either way: the figures show the mechanism (how many steps the cache
serves at each threshold, what serving them saves, how far the video moves), not what a level
does to a real model's video; with real weights the thresholds are to be checked again
(docs/operations.md, "Quality levels"). Every job runs through `generate.Generator`, the code the
executors run, on one warm model: an `exact` warm-up first (not counted: it encodes the prompt
and warms the kernels), then each level in turn. `--released` builds the released geometry with
random bf16 weights on the device (as the GPU check does: no text encoder, random prompt
embeddings in the prompt cache); the tiny model is written first (`--layers` blocks: the tiny
default has 2, too few for skipping the rest to show), not timed.

PSNR: over every frame and channel of the 8-bit video. SSIM: Wang et al.'s, on luma (BT.601), an
11x11 Gaussian window (sigma 1.5), the mean over frames.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench.common import median, parse, print_machine, show, table

LEVELS = ("exact", "balanced", "fast")


def psnr(a, b) -> float:
    """Of two uint8 videos [T, H, W, 3]."""
    import numpy as np

    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def ssim(a, b) -> float:
    """Of two uint8 videos [T, H, W, 3]: the mean over frames of each frame's luma SSIM."""
    import torch
    import torch.nn.functional as F

    def luma(v) -> torch.Tensor:
        x = torch.from_numpy(v).double()
        return (0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2]).unsqueeze(1)  # [T, 1, H, W]

    x, y = luma(a), luma(b)
    size = min(11, x.shape[-1], x.shape[-2])
    g = torch.exp(-((torch.arange(size, dtype=torch.float64) - (size - 1) / 2) ** 2) / (2 * 1.5**2))
    window = (g[:, None] * g[None, :] / g.sum() ** 2)[None, None]

    def blur(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, window)

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mx, my = blur(x), blur(y)
    vx, vy, cov = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    s = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return float(s.mean(dim=(1, 2, 3)).mean())


def build(args):
    """The generator and a request template: the tiny model (written now), or the released geometry."""
    from h3core.domain.request import GenerationRequest

    height, width = (int(v) for v in args.size.split("x"))
    request = GenerationRequest(prompt="a red fox runs through deep snow", width=width, height=height, frames=args.frames,
                                steps=args.steps, seed=args.seed)  # fmt: skip
    if args.released:
        import torch
        from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MINIMAX_H3_TEXT_TAG

        from h3core.executors.pipeline.probe import Bench, ProbeSpec

        bench = Bench(ProbeSpec(geometry="released", device=args.device, dtype=args.dtype, attention=args.attention))
        tokens = 256  # a prompt's worth of random embeddings, as the GPU check's full-size step
        embeds = torch.randn(1, tokens, bench.text_dim, device=bench.device, dtype=bench.dtype)
        tags = torch.full((tokens,), MINIMAX_H3_TEXT_TAG, dtype=torch.long)
        bench.generator.remember_encoding(request, {"prompt_embeds": embeds, "text_token_tags": tags})
        return bench.generator, request, "released geometry, random weights"
    from h3core.executors.pipeline.generate import Generator
    from h3core.executors.pipeline.kernel_probe import at_start
    from h3core.executors.pipeline.model import load_model
    from h3core.executors.pipeline.tiny import make_tiny

    if args.model_dir is not None:
        folder, what = args.model_dir, f"the model in {args.model_dir}"
    else:
        work = Path(tempfile.mkdtemp(prefix="h3-bench-quality-", dir=args.workdir))
        folder = make_tiny(work / "tiny", transformer={"num_layers": args.layers})
        what = f"tiny model, {args.layers} blocks, random weights"
    plan = at_start(folder, args.device, args.dtype, args.attention).plan
    model = load_model(folder, device=args.device, dtype=args.dtype)
    return Generator(model, plan, cache_size=4), request, what


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--released", action="store_true", help="the released geometry with random weights (a GPU's job)")
    p.add_argument("--model-dir", type=Path, default=None, help="a model folder (default: the tiny model, written first)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--attention", default="auto")
    p.add_argument("--size", default="64x64", help="HEIGHTxWIDTH")
    p.add_argument("--frames", type=int, default=22)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--layers", type=int, default=8, help="the tiny model's blocks")
    p.add_argument("--levels", default=",".join(LEVELS))
    p.add_argument("--workdir", type=Path, default=None, help="where the tiny model goes (default: a new temp dir)")
    p.add_argument("--rounds", type=int, default=1, help="run every level this many times, interleaved; medians")
    args = parse(p, argv, __spec__.name)
    print_machine(tempfile.gettempdir(), "Machine")
    import torch

    from h3core.executors.pipeline.generate import Control, Media

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    generator, request, what = build(args)
    levels = [level.strip() for level in args.levels.split(",") if level.strip()]
    with torch.no_grad():
        generator.run(request, Media(), Control())  # the warm-up: not counted
        # Rounds interleave the levels, so a load that comes and goes falls on each alike.
        outs, walls, denoise = {}, defaultdict(list), defaultdict(list)
        for _ in range(args.rounds):
            for level in dict.fromkeys(["exact", *levels]):
                sync()
                t0 = time.perf_counter()
                outs[level] = generator.run(request.model_copy(update={"quality": level}), Media(), Control())
                sync()
                walls[level].append(time.perf_counter() - t0)
                denoise[level].append(outs[level].seconds["denoise"])
    exact = outs["exact"]
    t = table(
        f"Quality levels: {request.width}x{request.height}x{request.frames}, {request.steps} steps ({what})",
        ["level", "computed", "cached", "denoise s", "speed-up", "job s", "PSNR dB", "SSIM"],
        caption="computed / cached: transformer steps run in full / served from the step cache (the `done` event's "
        f"counts); denoise: the step loop; speed-up: exact's denoise over the level's; job: the whole run (encode, "
        f"denoise, decode); medians of {args.rounds} round(s). PSNR and SSIM against exact's video. Random weights: "
        "the figures show the mechanism, not the quality of a real model.",
    )
    for level in dict.fromkeys(["exact", *levels]):
        out = outs[level]
        counts = out.cache
        exact_s, level_s = median(denoise["exact"]), median(denoise[level])
        quality = ("inf", "1.0000")
        if level != "exact":
            quality = (f"{psnr(out.frames, exact.frames):.2f}", f"{ssim(out.frames, exact.frames):.4f}")
        t.add_row(
            level,
            str(counts.computed if counts else out.steps),
            str(counts.cached if counts else 0),
            f"{level_s:.2f}",
            f"{exact_s / level_s:.2f}x",
            f"{median(walls[level]):.2f}",
            *quality,
        )
    show(t)


if __name__ == "__main__":
    main()
