"""What every model executor does around one job: find its uploads, drive the (synchronous) work
in a worker thread while its steps stream to the runner, and store the video it returns.

The worker thread never sees anyio cancellation: when the runner cancels, the job's stop flag
is set, the work ends at its next step boundary, and `stream` waits for it (shielded) so that
nothing the job holds outlives the attempt. Past the last step (decoding, encoding the video) the
work no longer stops: a cancel then comes too late, and the video it finishes is the result
(`FinishedBeforeStop`), never thrown away.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import numpy as np

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.segment_files import segment_sound, write_segment
from h3core.adapters.video import write_mp4
from h3core.domain.events import Artifact, Checkpoint, Progress
from h3core.domain.segments import Segment
from h3core.executors.base import (
    CheckpointSaved,
    ExecutorFailure,
    FinishedBeforeStop,
    Heartbeat,
    JobSpec,
    Result,
    StoppedWithCheckpoint,
    Update,
    classify,
    host_oom,
)
from h3core.executors.pipeline.attention import AttentionRefused
from h3core.executors.pipeline.generate import Control, Media, save_checkpoint

# None: stopped before it finished; CheckpointSaved: stopped by h3core's own stop, checkpointed there.
Outcome = Result | ExecutorFailure | CheckpointSaved | None


async def stream(tg: anyio.abc.TaskGroup, work: Callable[[Control], Outcome], control: Control) -> AsyncIterator[Update]:
    """Run `work(control)` in a worker thread; yield its steps and stages, then its `Result`."""
    send, receive = anyio.create_memory_object_stream[Update](math.inf)
    token = anyio.lowlevel.current_token()

    def report(update: Update) -> None:  # from any thread: the job's, or its checkpoint writer's
        try:
            anyio.from_thread.run_sync(send.send_nowait, update, token=token)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, RuntimeError):
            pass  # the runner stopped listening (a cancel, the loop closing); the stop flag follows

    control.on_step = lambda step, total: report(Progress(step=step, total=total))
    control.on_stage = lambda stage: report(Heartbeat(stage))
    control.on_saved = report
    outcome: list[Outcome] = []
    done = anyio.Event()

    async def drive() -> None:
        try:
            async with send:
                outcome.append(await anyio.to_thread.run_sync(work, control))
        finally:
            done.set()

    async def stopped() -> None:
        control.stop.set()
        with anyio.CancelScope(shield=True):
            await done.wait()

    tg.start_soon(drive)
    try:
        async with receive:
            async for update in receive:
                yield update
    except BaseException:  # cancelled or closed by the runner: the work stops at its next step boundary
        await stopped()
        if outcome and isinstance(outcome[0], Result):  # ...unless it was past the last one
            raise FinishedBeforeStop(outcome[0]) from None
        if outcome and isinstance(outcome[0], CheckpointSaved):  # h3core's own stop, checkpointed where it stopped
            raise StoppedWithCheckpoint(outcome[0]) from None
        raise
    try:
        result = outcome[0]
        if isinstance(result, ExecutorFailure):
            raise result
        if result is None or isinstance(result, CheckpointSaved):
            raise ExecutorFailure("executor_error", "the job stopped before it finished")
        yield result
    finally:
        await stopped()


class Background:
    """Work done in a thread of its own, one piece at a time: `begin` after `drain`, which waits for the
    piece before and raises what it raised (so at most one runs while its caller goes on)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pending: threading.Thread | None = None
        self._error: BaseException | None = None

    def begin(self, work: Callable[[], None]) -> None:
        """Start `work` in the background (the piece before it drained)."""
        assert self._pending is None, "drain() first"
        self._pending = threading.Thread(target=self._run, args=(work,), name=self.name)
        self._pending.start()

    def drain(self) -> None:
        """Wait for the piece under way; raise what it raised."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    @contextlib.contextmanager
    def finishing(self) -> Iterator[None]:
        """Drain on leaving the block: what the work raised is raised where the block ended well or stopped
        (`StopRequested` and the like: a stop may have asked for that work), never over the block's own error,
        the root cause."""
        try:
            yield
        except Exception:
            with contextlib.suppress(Exception):
                self.drain()
            raise
        except BaseException:
            self.drain()
            raise
        self.drain()

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - a thread of its own: the caller's drain re-raises it
            self._error = exc


class CheckpointWriter:
    """Writes the checkpoints a job's loop hands over in a thread of its own, one at a time, so the
    loop waits only for the copy off the device: a checkpoint handed over while the one before it is
    still being written waits for it (at most two are held). Each is reported (`on_saved`) once it is
    durably stored."""

    def __init__(self, artifacts: ArtifactStore, job: JobSpec, on_saved: Callable[[CheckpointSaved], None]) -> None:
        self.artifacts = artifacts
        self.job = job
        self.on_saved = on_saved
        self.last: CheckpointSaved | None = None  # the newest stored
        self._writing = Background(f"h3-checkpoint-{job.job_id[:8]}")

    def hand(self, held: dict) -> None:
        """Store `held` (a snapshot of the loop) in the background; called from the job's thread."""
        handed = time.perf_counter()
        self.drain()
        # What the loop waited: the copy off the device (timed where it was made), and the write before this one.
        paused = held.pop("copy_s", 0.0) + time.perf_counter() - handed
        self._writing.begin(lambda: self._write(held["step"], held["total"], lambda: save_checkpoint(held), paused, handed))

    def hand_serialised(self, step: int, total: int, data: Callable[[], bytes], *, paused_s: float, made_s: float) -> None:
        """Store a checkpoint serialised elsewhere (a group's rank 0) in the background: `data()` gives its
        bytes, `paused_s` is what it cost that loop, `made_s` how long making it took there."""
        handed = time.perf_counter()
        self.drain()
        self._writing.begin(lambda: self._write(step, total, data, paused_s, handed - made_s))

    def drain(self) -> CheckpointSaved | None:
        """Wait for the checkpoint being written; raise what its write raised. The newest stored."""
        self._writing.drain()
        return self.last

    def finishing(self) -> contextlib.AbstractContextManager[None]:
        """Drain on leaving the block, as `Background.finishing` does."""
        return self._writing.finishing()

    def _write(self, step: int, total: int, data: Callable[[], bytes], paused: float, since: float) -> None:
        path, size, sha = self.artifacts.put_checkpoint(self.job.job_id, self.job.attempt, step, data())
        cp = Checkpoint(attempt=self.job.attempt, step=step, total=total, path=path, bytes=size, sha256=sha)
        self.last = CheckpointSaved(cp, paused_s=paused, write_s=time.perf_counter() - since)
        self.on_saved(self.last)


def save_video(
    artifacts: ArtifactStore, job: JobSpec, frames: np.ndarray, audio: np.ndarray, sample_rate: int, control: Control
) -> Artifact:
    """H.264 + AAC through the artifact store's staging (each second encoded a sign of life),
    committed under the attempt; a long video's segment written and committed as one (the executor
    contract's **Segments**)."""
    staged = artifacts.staging(job.job_id, job.attempt)
    if job.segment is not None:
        return _save_segment(artifacts, job, job.segment, staged, frames, audio, sample_rate)
    alive = functools.partial(control.alive, "encode")
    write_mp4(staged, frames, fps=job.request.fps, audio=audio, sample_rate=sample_rate, alive=alive)
    count = int(frames.shape[0])
    return artifacts.commit(staged, job_id=job.job_id, attempt=job.attempt, frames=count, duration_s=count / job.request.fps)


def _save_segment(
    artifacts: ArtifactStore, job: JobSpec, segment: Segment, staged: Path, frames: np.ndarray, audio: np.ndarray, rate: int
) -> Artifact:
    fps = job.request.fps
    if frames.shape[0] < segment.frames:
        raise ExecutorFailure(
            "executor_error", f"segment {segment.index}: the model made {frames.shape[0]} frames, {segment.frames} asked"
        )
    sound = segment_sound(audio, segment, fps=fps, sample_rate=rate)
    write_segment(staged, frames[: segment.frames], sound, skip=segment.skip, fps=fps, sample_rate=rate)
    return artifacts.put_segment(
        staged, job_id=job.job_id, attempt=job.attempt, index=segment.index, frames=segment.keep, duration_s=segment.keep / fps
    )


def model_failure(exc: BaseException, *, where: str, tokens: int | None) -> ExecutorFailure:
    """What a model's exception means for the job; an OOM names the device (the host's memory where that ran
    out, whatever device the model is on) and the sequence it hit."""
    if isinstance(exc, ExecutorFailure):
        return exc
    if isinstance(exc, AttentionRefused):
        return ExecutorFailure("invalid", str(exc))
    kind, message, detail = classify(exc)
    if kind == "oom":
        at = f" at a {tokens}-token sequence" if tokens else ""
        on = f"the host (cpu memory; the model on {where})" if host_oom(exc) else where
        message = f"out of memory on {on}{at}: {exc}"[:2000]
    return ExecutorFailure(kind, message, detail)


def media_for(job: JobSpec, upload_path: Callable[[str], Path]) -> Media:
    """The job's uploads as local files; a missing one makes the job `invalid`."""
    r = job.request

    def path(upload_id: str | None) -> Path | None:
        if upload_id is None:
            return None
        try:
            return upload_path(upload_id)
        except (FileNotFoundError, KeyError) as exc:
            raise ExecutorFailure("invalid", f"upload {upload_id} is gone: {exc}") from exc

    if r.keyframes is not None:
        return Media(first=path(r.keyframes.first), last=path(r.keyframes.last))
    if r.references is not None:
        refs = r.references
        return Media(
            images=tuple(path(i) for i in refs.images),  # type: ignore[misc]
            videos=tuple(path(i) for i in refs.videos),  # type: ignore[misc]
            audios=tuple(path(i) for i in refs.audios),  # type: ignore[misc]
        )
    return Media()
