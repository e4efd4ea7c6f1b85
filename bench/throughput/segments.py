"""What making a long video as segments costs beyond its calls, with the fake executor on this machine.

    python -m bench.throughput.segments                       # 20 s at 256x160, 5 s window, 10 steps, 3 repeats
    python -m bench.throughput.segments --seconds 60 --window 15 --steps 4 --repeats 1
    python -m bench.throughput.segments --assembly --size 1344x768 --seconds 15 --window 5   # the GPU check's step 7c

Three ways to the same frames, each through a real `Runner` (SQLite store, local artifact and upload
stores, the fake writing real H.264 + sound at its preview size, `--step-seconds` a step):

1. **segments**: one job of `--seconds` on a fake whose window is `--window` s: admission plans it,
   the runner makes each segment (a call), hands each one after the first the last frame of the
   one before (decoded from its file, stored as a PNG upload), and joins them (video packets
   remuxed, sound crossfaded at each joint and AAC-encoded once).
2. **one call**: the same request on a fake with no window: one call, one video.
3. **separate jobs**: one job per segment of the plan (each as long as that segment's call), on the
   windowed fake: what a client stitching its own segments would run, without any joining.

Figures per way (the median of `--repeats` runs): wall s from submit to the last job's `done`;
calls s (each call from its start, `running` or the previous `segment_done`, to its own end,
summed: steps and the segment file's encode); between s (from a `segment_done` to the next call's
first step: the continuation frame decoded and stored, the next call started); join s (from the
last `segment_done` to `done`: reading the segments back, the remux, the sound's AAC encode, the
commit). The overhead of segments is wall(segments) - wall(one call); with `--step-seconds 0` the
calls are the executor's own encode and bookkeeping only.

`--assembly`: the same overhead at a real size without a model (the fake draws at most 128 pixels a
side): synthetic frames at `--size` written as segment files, each continuation frame read back, the
join, timed apiece. The GPU check runs it at the released size (its step 7c), where the model's calls
are measured by its other steps.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import anyio

from bench.common import parse, print_load_at_end, print_machine, show, table
from h3core import (
    FakeExecutor,
    FakeLimits,
    FakePlan,
    GenerationRequest,
    LocalArtifactStore,
    Runner,
    RunnerConfig,
    SQLiteEventStore,
)
from h3core.adapters.uploads import LocalUploadStore


async def run_jobs(workdir: Path, requests: list[GenerationRequest], *, window: float | None, step_s: float) -> dict:
    """Submit `requests` to a fresh runner; the phases of their logs once all are done."""
    store = SQLiteEventStore(workdir / "h3.db", durable=False)
    artifacts = LocalArtifactStore(workdir / "artifacts")
    uploads = LocalUploadStore(workdir / "uploads")
    executor = FakeExecutor(
        artifacts,
        default=FakePlan(step_seconds=step_s),
        limits=FakeLimits(max_seconds=window, continues_segments=True),
        upload_path=lambda upload_id: uploads.path(uploads.get(upload_id)),
    )
    runner = Runner(store, executor, RunnerConfig(slots=1, poll_interval_s=0.02), artifacts=artifacts, uploads=uploads)
    async with anyio.create_task_group() as tg:
        await tg.start(runner.run)
        start = anyio.current_time()
        jobs = [await runner.submit(r) for r in requests]
        while not all(store.get(j.job_id).terminal for j in jobs):
            await anyio.sleep(0.01)
        wall = anyio.current_time() - start
        tg.cancel_scope.cancel()
    calls = between = join = 0.0
    segments = 0
    for j in jobs:
        state = store.get(j.job_id)
        assert state.status == "done", state.error
        began = made = None  # where the call now running began; the last segment's end
        for e in store.events(j.job_id):
            if e.type == "running":
                began = e.at
            elif e.type == "progress" and made is not None and began is None:
                between += (e.at - made).total_seconds()  # the next call's first step, after its continuation
                began = e.at
            elif e.type == "segment_done":
                assert began is not None
                segments += 1
                calls += (e.at - began).total_seconds()
                began, made = None, e.at
            elif e.type == "done" and made is not None:
                join += (e.at - made).total_seconds()
            elif e.type == "done":
                assert began is not None
                calls += (e.at - began).total_seconds()
    store.close()
    return {"wall": wall, "calls": calls, "between": between, "join": join, "jobs": len(jobs), "segments": segments}


def plan_of(request: GenerationRequest, window: float):
    """The plan admission makes of `request` on the windowed fake."""
    from h3core.domain.admission import AdmissionRules

    caps = FakeExecutor(
        LocalArtifactStore(tempfile.mkdtemp()), limits=FakeLimits(max_seconds=window, continues_segments=True), encoding="mp4"
    )
    decision = AdmissionRules(caps._capabilities(), None).decide(request)
    assert decision.admitted and decision.plan is not None, decision
    return decision.plan


def assembly(width: int, height: int, seconds: float, window: float, workdir: Path) -> None:
    """What joining costs beyond the calls at a real size, without a model: each segment's frames
    (a moving gradient, so the encoder has work) written as its segment file, the continuation
    frame read back from it, and the join, timed apiece."""
    import time

    import numpy as np

    from h3core.adapters.segment_files import audio_samples, join_segments, last_frame_png, write_segment
    from h3core.domain.capabilities import FrameWindow
    from h3core.domain.segments import plan_segments

    most = FrameWindow(max_seconds=window).max_frames
    assert most is not None
    plan = plan_segments(round(seconds * 24), most)
    rate, parts, written, continued = 32_000, [], 0.0, 0.0
    y, x = np.mgrid[0:height, 0:width]
    for s in plan.segments:
        first = s.start - s.skip
        frames = np.empty((s.frames, height, width, 3), dtype=np.uint8)
        for i in range(s.frames):
            t = first + i
            frames[i, ..., 0], frames[i, ..., 1], frames[i, ..., 2] = (x + 3 * t) % 256, (y + t) % 256, (x + y) % 256
        n = audio_samples(first + s.frames, 24, rate) - audio_samples(first, 24, rate)
        tone = 0.1 * np.sin(
            2 * np.pi * 220 * np.arange(audio_samples(first, 24, rate), audio_samples(first, 24, rate) + n) / rate
        )
        path = workdir / f"segment-{s.index}.mp4"
        t0 = time.perf_counter()
        write_segment(path, frames, np.stack([tone, tone]).astype(np.float32), skip=s.skip, sample_rate=rate)
        written += time.perf_counter() - t0
        if s.index < len(plan.segments) - 1:
            t0 = time.perf_counter()
            last_frame_png(path)
            continued += time.perf_counter() - t0
        parts.append(path)
    t0 = time.perf_counter()
    joined = join_segments(parts, plan, workdir / "joined.mp4")
    join_s = time.perf_counter() - t0
    t = table(
        f"Assembly at {width}x{height}: {seconds:g} s in a {window:g} s window; plan: {plan.describe()}",
        ["part", "seconds", "per segment"],
        caption="Segment files: H.264 (veryfast) + ALAC of each segment's frames; continuation: its last frame decoded "
        f"and written as a PNG; join: {'a remux' if joined.remuxed else 'encoded again'} of the video, AAC of the sound "
        f"({joined.frames} frames, {joined.samples} samples, {(workdir / 'joined.mp4').stat().st_size / 1e6:.1f} MB).",
    )
    n = len(plan.segments)
    t.add_row("segment files", f"{written:.2f}", f"{written / n:.2f}")
    t.add_row("continuation frames", f"{continued:.2f}", f"{continued / max(1, n - 1):.2f}")
    t.add_row("join", f"{join_s:.2f}", f"{join_s / n:.2f}")
    show(t)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="the video's length")
    p.add_argument("--window", type=float, default=5.0, help="the fake's window: its longest call, in seconds")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--step-seconds", type=float, default=0.0, help="the fake's time per step")
    p.add_argument("--size", default="256x160", help="the request's WxH (the fake draws at most 128 a side)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--assembly", action="store_true", help="only what joining costs at --size (no runner, no fake)")
    args = parse(p, argv, "bench.throughput.segments")
    width, height = (int(x) for x in args.size.split("x"))
    if args.assembly:
        with tempfile.TemporaryDirectory() as tmp:
            print_machine(tmp, "Long videos as segments: assembly at a real size")
            assembly(width, height, args.seconds, args.window, Path(tmp))
        print_load_at_end()
        return
    frames = round(args.seconds * 24)
    request = GenerationRequest(prompt="bench: a long walk", width=width, height=height, frames=frames, steps=args.steps, seed=3)
    plan = plan_of(request, args.window)
    parts = [
        request.model_copy(update={"frames": s.frames, "seed": request.seed + s.index, "prompt": f"bench part {s.index}"})
        for s in plan.segments
    ]
    ways = [("segments", [request], args.window), ("one call", [request], None), ("separate jobs", parts, args.window)]
    with tempfile.TemporaryDirectory() as tmp:
        print_machine(tmp, "Long videos as segments: the fake executor")
        rows = {}
        for name, requests, window in ways:
            runs = []
            for i in range(args.repeats):
                workdir = Path(tmp) / f"{name.replace(' ', '-')}-{i}"
                workdir.mkdir()
                runs.append(
                    anyio.run(lambda w=workdir, r=requests, win=window: run_jobs(w, r, window=win, step_s=args.step_seconds))
                )
            rows[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    t = table(
        f"{args.seconds:g} s ({frames} frames) at {args.size}, {args.steps} steps of {args.step_seconds:g} s; "
        f"plan: {plan.describe()}",
        ["way", "jobs", "segments", "wall s", "calls s", "between s", "join s", "vs one call"],
        caption=f"The median of {args.repeats} runs each; one runner slot. `between`: a segment's end to the next one's "
        "first step (its first frame decoded and stored as an upload); `join`: the last segment's end to `done`.",
    )
    base = rows["one call"]["wall"]
    for name, r in rows.items():
        t.add_row(
            name,
            str(r["jobs"]),
            str(int(r["segments"])),
            f"{r['wall']:.2f}",
            f"{r['calls']:.2f}",
            f"{r['between']:.2f}",
            f"{r['join']:.2f}",
            f"{r['wall'] / base:.2f}x",
        )
    show(t)
    print_load_at_end()


if __name__ == "__main__":
    main()
