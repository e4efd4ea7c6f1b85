"""Denoising checkpoints: what one costs against one step, and the work an interruption throws away
with and without them.

Method. Part 1 runs the tiny random MiniMax-H3 on this machine's CPU in-process, checkpointing
after every step through the real writer (`CheckpointWriter`, the artifact store's crash-safe
`put_checkpoint`): the loop's pause is the copy off the device it waits for, the write is the
serialisation and the synced file, done off the loop's thread. Part 2 runs real `h3core worker`
processes (the pipeline executor on the tiny model), interrupts each job once past its middle step
with SIGTERM (a deploy) or SIGKILL (a crash), starts a worker again and lets the job finish: the
steps redone are the progress events logged beyond the job's step count, their seconds the median
step time times that count; the attempts spent are what the retry policy counted. Full-size
numbers come from the GPU check (bench/gpu_check.sh), on a device.

    python -m bench.crash.checkpoints [--steps 24] [--every 4] [--runs SIGTERM:0,SIGKILL:every,...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import median, ms, parse, print_machine, show, table, wait_for

MODEL: Path | None = None  # --model-dir: a tiny model folder already made


def _tiny(work: Path) -> Path:
    from h3core.executors.pipeline.tiny import make_tiny

    if MODEL is not None:
        return MODEL
    folder = work / "tiny-model"
    if not folder.exists():
        make_tiny(folder)
    return folder


def cost_of_one(work: Path, steps: int, size: int, frames: int) -> list[str]:
    """One checkpoint after every step: its size, the loop's pause, the write, beside a step."""
    from h3core.adapters.artifacts import LocalArtifactStore
    from h3core.domain.checkpoints import CheckpointPolicy
    from h3core.domain.request import GenerationRequest
    from h3core.executors.base import CheckpointSaved, JobSpec
    from h3core.executors.pipeline.attention import Target, plan_for
    from h3core.executors.pipeline.driver import CheckpointWriter
    from h3core.executors.pipeline.generate import Control, Generator, Media
    from h3core.executors.pipeline.model import load_model

    plan = plan_for("flash", Target.detect("cpu", "float32", 2, 32))
    generator = Generator(load_model(_tiny(work)), plan, cache_size=0)
    request = GenerationRequest(prompt="a fox in snow", width=size, height=size, frames=frames, steps=steps, seed=1)
    job = JobSpec("0" * 32, 1, request)
    saved: list[CheckpointSaved] = []
    writer = CheckpointWriter(LocalArtifactStore(work / "artifacts"), job, saved.append)
    control = Control(checkpoints=CheckpointPolicy(every_steps=1), on_checkpoint=writer.hand)
    out = generator.run(request, Media(), control)
    writer.drain()
    step = median(out.step_seconds[1:])  # the first step pays one-off warm-up
    pause, write = median([s.paused_s for s in saved]), median([s.write_s for s in saved])
    size_b = saved[0].checkpoint.bytes
    request_cell = f"{size}x{size}, {frames} frames"
    return [request_cell, str(len(saved)), f"{size_b / 1e6:.2f} MB", ms(step), ms(pause), ms(write), f"{pause / step:.0%}"]


def _env(every: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("H3_")}
    return {**env, "H3_CHECKPOINT_EVERY_STEPS": str(every), "H3_CHECKPOINT_EVERY_S": "0"}


def _job(db: Path, steps: int, size: int, frames: int) -> str:
    args = ["enqueue", "--db", db, "--prompt", "a fox in snow", "--steps", steps, "--frames", frames]
    args += ["--width", size, "--height", size]
    cmd = [sys.executable, "-m", "h3core.cli", *map(str, args)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=_env(0))
    return out.stdout.split()[-1]


def _worker(db: Path, artifacts: Path, model: Path, every: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "h3core.cli", "worker", "--db", str(db), "--artifacts", str(artifacts)]
    cmd += ["--executor", "pipeline", "--model-dir", str(model), "--max-attempts", "2"]
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**_env(every), "H3_ATTENTION": "flash"})


def interrupted_once(work: Path, sig: int, every: int, steps: int, size: int, frames: int) -> list[str]:
    """One job interrupted by `sig` once past its middle step, then finished by a new worker."""
    from h3core.adapters.store.sqlite import SQLiteEventStore

    run = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    db, artifacts, log = run / "h3.db", run / "artifacts", run / "worker.log"
    job = _job(db, steps, size, frames)
    store = SQLiteEventStore(db, durable=False)
    try:
        first = _worker(db, artifacts, _tiny(work), every, log)
        at = steps // 2 + 1
        if not wait_for(lambda: (store.get(job).step or 0) >= at, 600):
            raise RuntimeError(f"no step {at} within 600 s:\n{log.read_text()[-3000:]}")
        killed_at = store.get(job).step
        first.send_signal(sig)
        first.wait(60)
        second = _worker(db, artifacts, _tiny(work), every, log)
        if not wait_for(lambda: store.get(job).terminal, 600):
            raise RuntimeError(f"the job did not end within 600 s:\n{log.read_text()[-3000:]}")
        second.send_signal(signal.SIGTERM)
        second.wait(60)
        state, events = store.get(job), store.events(job)
    finally:
        store.close()
    progress = [e for e in events if e.type == "progress"]
    restored = [e.body.checkpoint.step for e in events if e.type == "restored"]
    gaps = [(b.at - a.at).total_seconds() for a, b in zip(progress, progress[1:], strict=False) if b.body.step == a.body.step + 1]
    redone = len(progress) - steps
    name = {signal.SIGTERM: "SIGTERM (a deploy)", signal.SIGKILL: "SIGKILL (a crash)"}[sig]
    return [
        name,
        f"every {every} steps" if every else "off",
        str(killed_at),
        str(restored[-1]) if restored else "0",
        str(redone),
        f"{redone * statistics.median(gaps):.2f} s" if gaps else "-",
        f"{state.spent} of 2" if state.status == "done" else state.status,
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=24, help="denoising steps per job")
    p.add_argument("--every", type=int, default=4, help="checkpoint interval compared with none")
    p.add_argument("--size", type=int, default=64, help="width and height")
    p.add_argument("--frames", type=int, default=22)
    p.add_argument("--runs", default="SIGTERM:0,SIGTERM:every,SIGKILL:0,SIGKILL:every", help="interruption:checkpoints rows")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--model-dir", type=Path, default=None, help="a tiny model folder (default: made in the workdir)")
    a = parse(p, argv, __spec__.name)
    global MODEL
    MODEL = a.model_dir
    work = a.workdir or Path(tempfile.mkdtemp(prefix="h3ckpt-"))
    print_machine(work, "Denoising checkpoints")
    columns = ["request", "checkpoints", "size", "step ms", "loop pause ms", "write ms", "pause / step"]
    t = table("One checkpoint against one step (CPU, tiny model, every step)", columns)
    t.add_row(*cost_of_one(work, a.steps, a.size, a.frames))
    show(t)
    t = table(
        f"Work redone by one interruption ({a.steps}-step jobs, interrupted past step {a.steps // 2})",
        [
            "interruption",
            "checkpoints",
            "signalled at step",
            "continued after",
            "steps redone",
            "seconds redone",
            "attempts spent",
        ],
    )
    for run in a.runs.split(","):
        name, _, every = run.partition(":")
        sig = {"SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}[name]
        t.add_row(*interrupted_once(work, sig, a.every if every == "every" else 0, a.steps, a.size, a.frames))
    show(t)
    print(json.dumps({"workdir": str(work)}))


if __name__ == "__main__":
    main()
