"""A deterministic executor for tests and demos that honours the whole executor contract.

Each job follows a `FakePlan`: time per step, fail at step k with a chosen kind (OOM raised the
way torch raises it), hang, finish without a result, or finish. Plans come from the executor's
constructor (per job id, or a default) or from a directive in the prompt, so a demo or a test in
another process can steer a job: `[fake step=0.2 fail_at=3 kind=oom]`. The artifact is a real
video with the request's frame count, drawn small, so downloads work end to end: an H.264 + AAC
mp4 where PyAV and numpy are installed (the service, pipeline and comfyui extras), else a
YUV4MPEG2 (`.y4m`, no sound) written in pure Python, so the core library runs without codecs.

It runs every quality level, simulated honestly: at `balanced` every third step and at `fast`
every second one is served from its "cache" (one that follows a computed step in the same
attempt: a resumed attempt computes its first step, as the pipeline's cache starts empty),
takes a quarter of a step's time and enters the chain differently, so a faster level makes
another video; `exact` computes every step and makes the video it always made. The result
counts both.

It keeps checkpoints as the pipeline does: its "denoising state" is a hash chain over the steps
(from the seed), stored as a checkpoint where the job's policy says and continued from on resume,
and the video it draws depends on the chain's end, so a resumed job makes the same video as an
uninterrupted one only if it continued from exactly the state it stopped at.

`FakeLimits` gives it limits of its own (modes, a clip window, a token budget, upload slots, whether
it continues a longer video as segments: it then writes each segment as the pipeline does),
which it states in `capabilities()` and enforces in `check()`, and `set_ready` makes modes
unready (as a server that went away), so the contract between admission, dispatch and an
executor can be tested without a model.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields, replace
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal

import anyio

from h3core.adapters.artifacts import ArtifactStore, media_type
from h3core.domain.capabilities import MODES, Capabilities, FrameWindow, GroupBudget, ModeReadiness
from h3core.domain.events import Artifact, Checkpoint, Progress
from h3core.domain.failures import FAILURE_KINDS, FailureKind
from h3core.domain.geometry import FPS, count_tokens, snap_frames
from h3core.domain.quality import QUALITIES, Quality, StepCounts
from h3core.domain.segments import Segment
from h3core.executors.base import (
    CheckpointSaved,
    ExecutorFailure,
    Heartbeat,
    JobSpec,
    NoReports,
    Result,
    StoppedWithCheckpoint,
    Update,
)

_DIRECTIVE = re.compile(r"\[fake\s+([^\]]*)\]")
# The simulated cache: at each level, how many computed steps in a row come before one is served
# from the cache (None: never), and what a served step costs of a computed one's time.
CACHE_RUNS: dict[Quality, int | None] = {"exact": None, "balanced": 2, "fast": 1}
CACHED_STEP_COST = 0.25
_MAX_PREVIEW_SIDE = 128
Encoding = Literal["mp4", "y4m"]
# (file suffix, media type) of each encoding.
_SUFFIXES: dict[str, str] = {"mp4": ".mp4", "y4m": ".y4m"}


def default_encoding() -> Encoding:
    """mp4 where PyAV and numpy are installed, else y4m (the core install has neither)."""
    return "mp4" if find_spec("av") is not None and find_spec("numpy") is not None else "y4m"


class OutOfMemoryError(RuntimeError):
    """Named like torch.cuda.OutOfMemoryError, so it is classified the same way."""


@dataclass(frozen=True)
class FakePlan:
    """What the fake does with one job: how long each step takes, and whether it fails, hangs, ends
    without a result or finishes."""

    step_seconds: float = 0.0
    fail_at: int | None = None  # raise when about to run this step (1-based)
    kind: FailureKind = "executor_error"
    fail_attempts: int = 1_000_000  # fail only on attempts up to this one (then succeed)
    hang_at: int | None = None  # stop reporting and wait forever (cancellable) at this step
    no_result: bool = False  # finish every step but yield no result
    cleanup_seconds: float = 0.0  # shielded cleanup after cancellation (slow executors)
    encode_seconds: float = 0.0  # the final encode, past the last step: a cancel then comes too late

    @classmethod
    def parse(cls, text: str, base: FakePlan | None = None) -> FakePlan:
        """A plan from `key=value` words: step, fail_at, kind, fail_attempts, hang_at, no_result, cleanup, encode."""
        plan = base or cls()
        aliases = {"step": "step_seconds", "cleanup": "cleanup_seconds", "encode": "encode_seconds"}
        types = {f.name: f.type for f in fields(cls)}
        for word in text.split():
            key, _, value = word.partition("=")
            name = aliases.get(key, key)
            if name not in types:
                raise ValueError(f"unknown fake plan key {key!r}")
            if name == "kind":
                if value not in FAILURE_KINDS:
                    raise ValueError(f"unknown failure kind {value!r}")
                parsed: Any = value
            elif name == "no_result":
                parsed = value in ("", "1", "true", "yes")
            elif name in ("step_seconds", "cleanup_seconds", "encode_seconds"):
                parsed = float(value)
            else:
                parsed = int(value)
            plan = replace(plan, **{name: parsed})
        return plan


@dataclass(frozen=True)
class FakeLimits:
    """What the fake executor can run (none of it by default: it runs anything valid)."""

    modes: tuple[str, ...] = MODES
    min_seconds: float = 0.0
    max_seconds: float | None = None  # of the snapped frame count, as a model's window
    budget_tokens: int | None = None
    media: Mapping[str, int] = field(default_factory=dict)  # most uploads per field ("references.videos")
    qualities: tuple[Quality, ...] = QUALITIES  # the quality levels it runs
    continues_segments: bool = False  # makes a video past its window as segments (needs PyAV: mp4)


class FakeExecutor(NoReports):
    """The deterministic executor: runs each job by its `FakePlan` and writes a small real video as
    its artifact."""

    name = "fake"

    def __init__(
        self,
        artifacts: ArtifactStore,
        *,
        default: FakePlan | None = None,
        plans: Mapping[str, FakePlan] | Callable[[JobSpec], FakePlan | None] | None = None,
        limits: FakeLimits | None = None,
        encoding: Encoding | None = None,
        upload_path: Callable[[str], Path] | None = None,
    ) -> None:
        """`encoding`: the artifact's format; None picks mp4 where PyAV is installed, else y4m.
        `upload_path`: an upload's local file (a long video's segment continues the frame before)."""
        self.artifacts = artifacts
        self.upload_path = upload_path
        self.encoding: Encoding = encoding or default_encoding()
        self.default = default or FakePlan()
        self._plans = plans
        self.limits = limits or FakeLimits()
        self._ready = False
        self._unready: dict[str, str] = {}  # mode -> why it cannot start a job now
        self._caps: tuple[object, Capabilities] | None = None
        self._videos: OrderedDict[tuple[int, int, int, int], bytes] = OrderedDict()  # rendered, by (w, h, frames, seed)
        self.runs = 0  # attempts started, for tests
        self.cleanups = 0  # attempts whose cleanup ran
        self.finishing: set[str] = set()  # jobs in their final encode now, for tests
        self.steps_run = 0  # steps computed, in all attempts (what a resume saves)
        self._save_on_stop: set[tuple[str, int]] = set()

    def capabilities(self) -> Capabilities:
        """Its `FakeLimits`, with every mode unready before `running()` is entered or while `set_ready`
        holds it so."""
        # Asked on every submit and claim: built again only when what it says has changed.
        key = (self.limits, self._ready, tuple(sorted(self._unready.items())))
        if self._caps is None or self._caps[0] != key:
            self._caps = (key, self._capabilities())
        return self._caps[1]

    def _capabilities(self) -> Capabilities:
        lim = self.limits
        window = None
        if lim.min_seconds or lim.max_seconds is not None:
            window = FrameWindow(min_seconds=lim.min_seconds, max_seconds=lim.max_seconds, source="fake limits")
        modes = []
        for mode in MODES:
            if mode not in lim.modes:
                modes.append(ModeReadiness(mode=mode, served=False, ready=False, reason="not in the fake's limits"))
            elif not self._ready or mode in self._unready:
                modes.append(ModeReadiness(mode=mode, ready=False, reason=self._unready.get(mode, "not started")))
            else:
                modes.append(ModeReadiness(mode=mode))
        budget = GroupBudget(size=1, tokens=lim.budget_tokens, verified=lim.budget_tokens is not None, source="fake limits")
        return Capabilities(
            executor=self.name,
            hardware="fake",
            modes=tuple(modes),
            window=window,
            groups=(budget,),
            media=dict(lim.media),
            exact_frames=MODES,  # it writes the frames asked, not the model's 17n + 5
            checkpoints=True,
            qualities=lim.qualities,  # simulated (the module's docstring)
            continues_segments=lim.continues_segments and self.encoding == "mp4",  # segment files are H.264
        )

    def set_ready(self, ready: bool, reason: str = "not ready", modes: tuple[str, ...] = MODES) -> None:
        """Make `modes` unready (or ready again), as a server that went away and came back."""
        for mode in modes:
            if ready:
                self._unready.pop(mode, None)
            else:
                self._unready[mode] = reason

    def check(self, job: JobSpec) -> None:
        """The fake's own pre-check of its limits, written apart from admission's contract."""
        r, lim = job.request, self.limits
        if r.mode not in lim.modes:
            raise ExecutorFailure("invalid", f"mode: the fake does not serve {r.mode}")
        seconds = snap_frames(r.frames) / FPS
        if seconds < lim.min_seconds or (lim.max_seconds is not None and seconds > lim.max_seconds):
            raise ExecutorFailure("invalid", f"frames: {r.frames} frames are {seconds:.2f} s, outside the fake's window")
        if lim.budget_tokens is not None and count_tokens(r).total > lim.budget_tokens:
            raise ExecutorFailure("invalid", f"tokens: over the fake's {lim.budget_tokens}-token budget")
        if r.quality not in lim.qualities:
            raise ExecutorFailure("invalid", f"quality: the fake does not run {r.quality}")
        given = r.uploads()
        for name, most in lim.media.items():
            if len(given.get(name, ())) > most:
                raise ExecutorFailure("invalid", f"{name}: the fake takes at most {most}")

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Nothing to load: marks the fake ready for its life."""
        self._ready = True
        try:
            yield
        finally:
            self._ready = False

    def reference(self, job: JobSpec) -> str | None:
        """`fake-<job id>-<attempt>`."""
        return f"fake-{job.job_id}-{job.attempt}"

    def info(self, job: JobSpec) -> dict[str, str]:
        """The job's plan, as the fields that differ from the default (`finish` where none do), and its
        quality level with the simulated cache that serves it."""
        out = {"plan": _describe(self.plan_for(job)), "quality": job.request.quality}
        run = CACHE_RUNS[job.request.quality]
        if run is not None:
            out["cache"] = f"simulated: a step after {run} computed in a row is served from the cache"
        return out

    def plan_for(self, job: JobSpec) -> FakePlan:
        """The job's plan: the constructor's plan for it (or the default), overridden by a `[fake ...]`
        directive in its prompt; raises `ValueError` for a directive it cannot parse."""
        plan = None
        if callable(self._plans):
            plan = self._plans(job)
        elif self._plans is not None:
            plan = self._plans.get(job.job_id)
        plan = plan or self.default
        match = _DIRECTIVE.search(job.request.prompt)
        return FakePlan.parse(match.group(1), plan) if match else plan

    def save_on_stop(self, job: JobSpec) -> None:
        """The stop that follows is h3core's own: checkpoint where the attempt stops."""
        self._save_on_stop.add((job.job_id, job.attempt))

    async def run(self, job: JobSpec) -> AsyncIterator[Update]:
        """Follow the job's plan step by step (from its checkpoint, where it resumes), checkpointing
        as its policy says, then write the video under a shielded scope (a cancel during the encode
        comes too late)."""
        plan = self.plan_for(job)
        total = job.request.steps
        self.check(job)
        self.runs += 1
        first, chain = 1, _chain_start(job)
        if job.resume is not None:
            first, chain = _continue(job)
            first += 1
        policy = job.checkpoints
        saved = (first - 1, time.monotonic())  # the last checkpoint's step (or where it began), and when
        reached = first - 1
        run_length, in_a_row, computed, cached = CACHE_RUNS[job.request.quality], 0, 0, 0
        try:
            yield Heartbeat("loaded")
            for step in range(first, total + 1):
                if plan.hang_at == step:
                    await anyio.sleep_forever()
                if plan.fail_at == step and job.attempt <= plan.fail_attempts:
                    _raise(plan.kind, step)
                # As a first-block cache: never the last step, and only after enough computed ones.
                serve = run_length is not None and in_a_row >= run_length and step < total
                await anyio.sleep(plan.step_seconds * (CACHED_STEP_COST if serve else 1.0))
                chain, reached = _step(chain, step, cached=serve), step
                in_a_row = 0 if serve else in_a_row + 1
                cached, computed = cached + serve, computed + (not serve)
                self.steps_run += 1
                yield Progress(step=step, total=total)
                if policy is not None and policy.due(step, total, saved[0], time.monotonic() - saved[1]):
                    done = await anyio.to_thread.run_sync(self._checkpoint, job, step, chain)
                    saved = (step, time.monotonic())
                    yield done
            if plan.no_result:
                return
            # Past the last step a stop no longer takes effect (as a model's decode and encode): the
            # video is written and is the result, a cancel meanwhile comes too late.
            with anyio.CancelScope(shield=True):
                self.finishing.add(job.job_id)
                try:
                    await anyio.sleep(plan.encode_seconds)
                    artifact = await anyio.to_thread.run_sync(self._write, job, chain)
                finally:
                    self.finishing.discard(job.job_id)
            yield Result(artifact, StepCounts(quality=job.request.quality, computed=computed, cached=cached))
        except anyio.get_cancelled_exc_class():
            if (job.job_id, job.attempt) not in self._save_on_stop or reached <= saved[0]:
                raise
            with anyio.CancelScope(shield=True):  # the step in flight is dropped: the state is the last one reached
                at_stop = await anyio.to_thread.run_sync(self._checkpoint, job, reached, chain)
            raise StoppedWithCheckpoint(at_stop) from None
        finally:
            self._save_on_stop.discard((job.job_id, job.attempt))
            with anyio.CancelScope(shield=True):
                await anyio.sleep(plan.cleanup_seconds)
                self.cleanups += 1

    def _checkpoint(self, job: JobSpec, step: int, chain: str) -> CheckpointSaved:  # runs in a worker thread
        t0 = time.perf_counter()
        data = json.dumps({"job_id": job.job_id, "step": step, "total": job.request.steps, "chain": chain}).encode()
        path, size, sha = self.artifacts.put_checkpoint(job.job_id, job.attempt, step, data)
        cp = Checkpoint(attempt=job.attempt, step=step, total=job.request.steps, path=path, bytes=size, sha256=sha)
        return CheckpointSaved(cp, paused_s=time.perf_counter() - t0, write_s=time.perf_counter() - t0)

    def _write(self, job: JobSpec, chain: str):  # runs in a worker thread
        r = job.request
        # The chain's end seeds the drawing: only a run that went through every step from the
        # seed (in one attempt or continued from checkpoints) draws this video.
        seed = int(chain[:15], 16)
        if job.segment is not None:
            return self._write_segment(job, job.segment, seed)
        key = (r.width, r.height, r.frames, seed)
        data = self._videos.get(key)
        if data is None:
            render = _render_mp4 if self.encoding == "mp4" else _render_y4m
            data = render(*_preview_size(r.width, r.height), r.frames, seed)
            self._videos[key] = data
            while len(self._videos) > 8:
                self._videos.popitem(last=False)
        suffix = _SUFFIXES[self.encoding]
        staged = self.artifacts.staging(job.job_id, job.attempt, suffix)
        Path(staged).write_bytes(data)
        return self.artifacts.commit(
            staged,
            job_id=job.job_id,
            attempt=job.attempt,
            frames=r.frames,
            duration_s=r.frames / r.fps,
            media_type=media_type(staged.name.removesuffix(".part")),
        )

    def _write_segment(self, job: JobSpec, segment: Segment, seed: int) -> Artifact:  # runs in a worker thread
        """The segment as the pipeline writes one: its pattern continues the frame it starts from
        (the first keyframe's colour, where one is given and readable: the frame the segment before
        kept last), the bar and the tone (the request's own seed's) go on across the joint."""
        import numpy as np

        from h3core.adapters.segment_files import audio_samples, write_segment

        r = job.request
        w, h = _preview_size(r.width, r.height)
        base = self._colour_of_first(job)
        if base is None:
            base = np.random.default_rng(seed).integers(0, 256, size=3, dtype=np.uint8)
        first = segment.start - segment.skip  # the joined video's frame it starts at
        video = _pattern(w, h, segment.frames, base, first=first)
        hz = 220 + (r.seed - segment.index) % 440  # the seed asked for: a segment's is the seed plus its index
        audio = _tone(hz, audio_samples(first, r.fps, _RATE), audio_samples(first + segment.frames, r.fps, _RATE))
        staged = self.artifacts.staging(job.job_id, job.attempt, ".mp4")
        write_segment(staged, video, audio, skip=segment.skip, fps=r.fps, sample_rate=_RATE, preset="ultrafast")
        keep = segment.keep
        return self.artifacts.put_segment(
            staged, job_id=job.job_id, attempt=job.attempt, index=segment.index, frames=keep, duration_s=keep / r.fps
        )

    def _colour_of_first(self, job: JobSpec) -> Any:
        """The first keyframe's colour (each channel's median: the bar is thin), or None without one."""
        keyframes = job.request.keyframes
        if keyframes is None or keyframes.first is None or self.upload_path is None:
            return None
        import numpy as np
        from PIL import Image

        try:
            with Image.open(self.upload_path(keyframes.first)) as image:
                pixels = np.asarray(image.convert("RGB")).reshape(-1, 3)
        except (OSError, KeyError) as exc:
            raise ExecutorFailure("invalid", f"keyframes.first: upload {keyframes.first} does not read: {exc}") from exc
        return np.median(pixels, axis=0).astype(np.uint8)


def _chain_start(job: JobSpec) -> str:
    return hashlib.sha256(f"fake:{job.request.seed}".encode()).hexdigest()


def _step(chain: str, step: int, *, cached: bool = False) -> str:
    return hashlib.sha256(f"{chain}:{step}{':cached' if cached else ''}".encode()).hexdigest()


def _continue(job: JobSpec) -> tuple[int, str]:
    """The step and chain a checkpoint holds, checked to be this job's."""
    assert job.resume is not None
    try:
        held = json.loads(job.resume.data)
        step, chain = int(held["step"]), str(held["chain"])
        ours = held["job_id"] == job.job_id and held["total"] == job.request.steps and step == job.resume.checkpoint.step
    except (ValueError, KeyError, TypeError) as exc:
        raise ExecutorFailure("executor_error", f"checkpoint {job.resume.checkpoint.path} does not read: {exc}") from exc
    if not ours:
        raise ExecutorFailure("executor_error", f"checkpoint {job.resume.checkpoint.path} is not of this job's step")
    return step, chain


def _describe(plan: FakePlan) -> str:
    default = FakePlan()
    parts = [f"{f.name}={getattr(plan, f.name)}" for f in fields(plan) if getattr(plan, f.name) != getattr(default, f.name)]
    return " ".join(parts) or "finish"


def _raise(kind: FailureKind, step: int) -> None:
    if kind == "oom":
        raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (fake executor, step {step})")
    if kind == "executor_error":
        raise RuntimeError(f"fake executor failed at step {step}")
    raise ExecutorFailure(kind, f"fake executor reports '{kind}' at step {step}")


def _preview_size(width: int, height: int) -> tuple[int, int]:
    """The request's aspect, at most _MAX_PREVIEW_SIDE a side, even sides (yuv420p)."""
    scale = max(width, height) / _MAX_PREVIEW_SIDE
    w = max(2, int(width / max(scale, 1)) // 2 * 2)
    h = max(2, int(height / max(scale, 1)) // 2 * 2)
    return w, h


_RATE = 32_000  # the fake's sound, as the model's


def _pattern(w: int, h: int, frames: int, base: Any, *, first: int = 0) -> Any:
    """Frames `first`.. of the test pattern: `base` colour, a white bar moving 3 pixels a frame."""
    import numpy as np

    video = np.empty((frames, h, w, 3), dtype=np.uint8)
    video[:] = base
    for i in range(frames):
        bar = ((first + i) * 3) % w
        video[i, :, bar : bar + 2, :] = 255
    return video


def _tone(hz: float, begin: int, end: int) -> Any:
    """Samples `begin`..`end` of a stereo sine at `hz`: parts of one tone join without a step."""
    import numpy as np

    tone = (0.1 * np.sin(2 * np.pi * hz * np.arange(begin, end) / _RATE)).astype(np.float32)
    return np.stack([tone, tone])


def _render_mp4(w: int, h: int, frames: int, seed: int) -> bytes:
    """A small moving test pattern and a tone, deterministic in its arguments (H.264 + AAC)."""
    import tempfile

    import numpy as np

    from h3core.adapters.video import write_mp4

    base = np.random.default_rng(seed).integers(0, 256, size=3, dtype=np.uint8)
    video = _pattern(w, h, frames, base)
    rate = _RATE
    audio = _tone(220 + seed % 440, 0, int(round(frames / 24 * rate)))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fake.mp4"
        write_mp4(path, video, fps=24, audio=audio, sample_rate=rate, preset="ultrafast")
        return path.read_bytes()


def _render_y4m(w: int, h: int, frames: int, seed: int) -> bytes:
    """The same pattern as raw 4:2:0 frames in a YUV4MPEG2 stream (no sound), in pure Python."""
    r, g, b = random.Random(seed).randbytes(3)
    # BT.601 full range, as the C420jpeg colour space of the header says.
    y = round(0.299 * r + 0.587 * g + 0.114 * b)
    u = round(128 - 0.168736 * r - 0.331264 * g + 0.5 * b)
    v = round(128 + 0.5 * r - 0.418688 * g - 0.081312 * b)
    chroma = bytes([u]) * (w * h // 4) + bytes([v]) * (w * h // 4)
    out = bytearray(f"YUV4MPEG2 W{w} H{h} F24:1 Ip A1:1 C420jpeg\n".encode())
    for i in range(frames):
        bar = (i * 3) % w
        row = bytearray([y]) * w
        row[bar : bar + 2] = b"\xff\xff"[: w - bar]
        out += b"FRAME\n" + bytes(row) * h + chroma
    return bytes(out)
