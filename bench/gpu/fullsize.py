"""Step 7: at full size through the product. The released MiniMax-H3 geometry (diffusers' default
configs: the 33 B-parameter transformer, the video and audio VAEs) built with random bf16 weights
on the device (`probe.Bench`, as `h3core capacity probe` builds it: no download), the attention
kernel `auto` picks there, then:

1. a job of 1344x768x124 (about 38k tokens) with a few steps through the product's own
   `Generator` (random prompt embeddings in its prompt cache stand in for the text encoder): the
   product's step time, and the VAE decode of that job;
2. the same transformer forward bare: the transformer called directly with the inputs the
   product's last step gave it (captured), under the same kernel, timed the same way;
3. the mux of that job's frames and audio (PyAV, the artifact the service writes);
4. the non-denoise share of a warm 50-step job, from those figures;
5. one denoising checkpoint of that job (taken after its warm-up step, through the product's
   writer into a local artifact store): its size, how long the loop waited for it (the copy off
   the device), and the whole write, against a step.

The bar: the product's step within 5 % of the bare forward. `H3GPU_DRY=cpu` runs the same code
at h3core's tiny geometry on the CPU (that is its test: tests/unit/test_gpu_check.py).
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.gpu.common import DEVICE, DRY, DTYPE, free, md, one_line, trace, versions
from h3core.adapters.artifacts import LocalArtifactStore
from h3core.domain.request import GenerationRequest
from h3core.executors.base import CheckpointSaved, JobSpec
from h3core.executors.pipeline.driver import CheckpointWriter, save_video
from h3core.executors.pipeline.generate import Control, Media
from h3core.executors.pipeline.probe import Bench, ProbeSpec

WIDTH, HEIGHT, FRAMES = (64, 64, 22) if DRY else (1344, 768, 124)
# The first is a warm-up (a checkpoint follows it, its pause counted in step 2): the median of the
# others stands whatever one step pays.
STEPS = int(os.environ.get("H3GPU_FULLSIZE_STEPS", "4"))
BARE_CALLS = 2
TEXT_TOKENS = 256  # a prompt's worth of random embeddings (the released text width)
JOB_STEPS = 50  # the warm job the share is computed for


def sync() -> None:
    if not DRY:
        import torch

        torch.cuda.synchronize()


def gib() -> str:
    if DRY:
        return "-"
    import torch

    return f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB"


def say(text: str) -> None:
    print(text, flush=True)


def main() -> int:
    import torch

    t0 = time.perf_counter()
    geometry = "tiny" if DRY else "released"
    say(f"## At full size through the product ({'dry run: tiny geometry, CPU' if DRY else 'released geometry'}, {DTYPE})\n")
    say(f"{versions()}\n")
    bench = Bench(ProbeSpec(geometry=geometry, device=DEVICE, dtype=DTYPE, attention="auto", text_tokens=TEXT_TOKENS))
    transformer = bench.generator.model.components["transformer"]
    params = sum(p.numel() for p in transformer.parameters())
    say(
        f"built: transformer {params / 1e9:.2f} B parameters and both VAEs, random weights, in {bench.build_seconds:.1f} s "
        f"({gib()} resident); attention {bench.plan.describe()} (auto, measured at {geometry} geometry)\n"
    )

    # 1. The product: a job of a few steps through the Generator, the transformer's inputs captured at each call.
    captured: dict = {}
    guarded = transformer.forward

    @functools.wraps(guarded)  # diffusers' denoiser reads the signature to pick its keyword arguments
    def capture(*args, **kwargs):
        captured["args"], captured["kwargs"] = args, kwargs
        return guarded(*args, **kwargs)

    transformer.forward = capture
    request = GenerationRequest(prompt="capacity probe", width=WIDTH, height=HEIGHT, frames=FRAMES, steps=STEPS, seed=0)
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MINIMAX_H3_TEXT_TAG

    embeds = torch.randn(1, TEXT_TOKENS, bench.text_dim, device=bench.device, dtype=bench.dtype)
    tags = torch.full((TEXT_TOKENS,), MINIMAX_H3_TEXT_TAG, dtype=torch.long)
    bench.generator.remember_encoding(request, {"prompt_embeds": embeds, "text_token_tags": tags})
    marks: dict[str, float] = {}

    def on_stage(stage: str) -> None:
        sync()
        marks[stage] = time.perf_counter()

    class AfterWarmUp:  # the checkpoint policy of this run: one, after step 1
        def due(self, step: int, total: int, last_step: int, seconds: float) -> bool:
            return step == 1

    saved: list[CheckpointSaved] = []
    checkpoints = tempfile.TemporaryDirectory(prefix="h3gpu-ckpt-")
    writer = CheckpointWriter(LocalArtifactStore(Path(checkpoints.name)), JobSpec("f" * 32, 1, request), saved.append)
    control = Control(on_stage=on_stage, checkpoints=AfterWarmUp(), on_checkpoint=writer.hand)  # type: ignore[arg-type]
    try:
        with torch.no_grad():
            out = bench.generator.run(request, Media(), control)
        writer.drain()
    finally:
        transformer.forward = guarded
        checkpoints.cleanup()
    sync()
    tokens = bench.generator.last_tokens
    steps = out.step_seconds[1:] or out.step_seconds  # the first step warms the kernels up
    product = statistics.median(steps)
    each = ", ".join(f"{s:.2f}" for s in out.step_seconds)
    say(f"job {WIDTH}x{HEIGHT}x{FRAMES}, {STEPS} steps, {tokens} tokens: step times {each} s")
    say(f"stages: {', '.join(f'{k} {v:.2f} s' for k, v in out.seconds.items())}\n")

    # 2. Bare: the transformer called directly, same inputs, same kernel (the plan's guard is the kernel's choice).
    times = []
    with torch.no_grad():
        for _ in range(BARE_CALLS):
            sync()
            t = time.perf_counter()
            transformer(*captured["args"], **captured["kwargs"])
            sync()
            times.append(time.perf_counter() - t)
    captured.clear()
    free()
    bare = statistics.median(times)
    ratio = product / bare
    verdict = "within 5 %: the bar holds" if ratio <= 1.05 else "over 5 %: the bar is NOT met"
    if DRY:
        verdict = "dry run: toy size on a CPU, no bar"
    rows = [[f"{tokens}", bench.plan.kernel, f"{product:.3f} s", f"{bare:.3f} s", f"{ratio:.3f}", verdict]]
    say(
        md(
            [
                "tokens",
                "kernel",
                "product step (median of steps 2+)",
                f"bare forward (median of {BARE_CALLS})",
                "product / bare",
                "bar",
            ],
            rows,
        )
    )
    say("")

    # 3. The mux of that job's frames (the artifact the service writes).
    with tempfile.TemporaryDirectory(prefix="h3gpu-mux-") as tmp:
        t = time.perf_counter()
        artifact = save_video(
            LocalArtifactStore(Path(tmp)), JobSpec("fullsize", 1, request), out.frames, out.audio, out.sample_rate, Control()
        )
        mux = time.perf_counter() - t
    shape = out.frames.shape
    say(f"mux: {shape[0]} frames {shape[2]}x{shape[1]} + audio (H.264 + AAC) in {mux:.2f} s, {artifact.bytes / 2**20:.1f} MiB")

    # 4. A warm 50-step job: everything but the denoising steps, over the whole (text encoder excluded: cached).
    other = {k: v for k, v in out.seconds.items() if k not in ("denoise", "text_encoder")}
    other["mux"] = mux
    rest = sum(other.values())
    total = rest + JOB_STEPS * product
    say(
        f"\nwarm {JOB_STEPS}-step job at {WIDTH}x{HEIGHT}x{FRAMES}: {JOB_STEPS} x {product:.2f} s denoising + {rest:.2f} s else "
        f"({', '.join(f'{k} {v:.2f}' for k, v in other.items())}) = {total:.1f} s; non-denoise share {rest / total:.1%} "
        f"(the text encoder not counted: the prompt was cached)"
    )
    # 5. The checkpoint taken after step 1.
    if saved:
        c = saved[0]
        say(
            f"\ncheckpoint after step {c.checkpoint.step}: {c.checkpoint.bytes / 2**20:.1f} MiB; the loop waited "
            f"{c.paused_s:.3f} s (the copy off the device), the write took {c.write_s:.2f} s in all, off the loop's thread; "
            f"a step is {product:.2f} s (pause / step {c.paused_s / product:.1%})"
        )
    else:
        say("\ncheckpoint: none was stored (FAILED to measure)")
    say(f"\n(step 7: {time.perf_counter() - t0:.0f} s in all)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # noqa: BLE001 - one line in the table, the traceback in run.log
        trace(exc)
        print(f"FAILED: {one_line(exc)}")
        sys.exit(1)
