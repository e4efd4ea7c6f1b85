"""Step 6: one job per attention choice (auto and every named kernel), end to end through the
product: `PipelineExecutor` (which decides and checks the kernel at start, as serve does) driven by
the `Runner` on an in-memory store, on the tiny model with head dim 64 (which every kernel
takes). A choice the machine cannot run is refused at start, with the reason; for the others
the table says how the job ended and what its Running event recorded."""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio

from bench.gpu.common import DEVICE, DTYPE, WORK, free, md, now, one_line, tiny_model, trace
from h3core import LocalArtifactStore, MemoryEventStore, Runner, RunnerConfig
from h3core.domain.request import GenerationRequest
from h3core.executors.pipeline.attention import CHOICES, AttentionError
from h3core.executors.pipeline.executor import PipelineExecutor, PipelineSettings

REQUEST = GenerationRequest(prompt="a heron standing in a misty river", width=64, height=64, frames=22, steps=8, seed=1)


async def one(choice: str, root: Path, out: Path) -> list[object]:
    t0 = now()
    try:
        executor = PipelineExecutor(
            PipelineSettings(
                model_dir=root, device=DEVICE, dtype=DTYPE, attention=choice, attention_cache=WORK / "attention-cache.json"
            ),
            LocalArtifactStore(out / choice),
            lambda upload_id: out / upload_id,
        )
    except AttentionError as exc:
        return [choice, "refused at start", "-", "-", "-", one_line(exc, 260)]
    start = now() - t0
    runner = Runner(MemoryEventStore(), executor, RunnerConfig(stall_timeout_s=120, poll_interval_s=0.05))
    async with anyio.create_task_group() as tg:
        await tg.start(runner.run)
        with anyio.fail_after(150):
            job = await runner.submit(REQUEST)
            t1 = now()
            while not runner.store.get(job.job_id).terminal:
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    state = runner.store.get(job.job_id)
    running = next((e.body for e in runner.store.events(job.job_id) if e.type == "running"), None)
    recorded = running.info.get("attention", "-") if running else "-"
    ended = state.status if state.status == "done" else f"{state.status}: {state.error.kind}: {state.error.message[:200]}"
    frames = state.artifact.frames if state.artifact else "-"
    return [choice, ended, recorded, f"{start:.1f}", f"{now() - t1:.1f}", f"frames {frames}"]


async def main() -> None:
    root = tiny_model(64)
    rows = []
    with tempfile.TemporaryDirectory(prefix="h3gpu-jobs-") as tmp:
        for choice in CHOICES:
            try:
                rows.append(await one(choice, root, Path(tmp)))
            except Exception as exc:  # noqa: BLE001 - a row that says what broke
                trace(exc)
                rows.append([choice, f"ERROR: {one_line(exc, 220)}", "-", "-", "-", "-"])
            free()
    print(f"## One job per attention choice (tiny model, head dim 64, 64x64, 22 frames, 8 steps, {DEVICE} {DTYPE})\n")
    print(md(["--attention", "job", "Running event: attention", "start s (probe)", "job s (load + run)", "video"], rows))


anyio.run(main)
