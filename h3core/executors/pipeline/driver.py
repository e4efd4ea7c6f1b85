"""What every model executor does around one job: find its uploads, drive the (synchronous) work
in a worker thread while its steps stream to the runner, and store the video it returns.

The worker thread never sees anyio cancellation: when the runner cancels, the job's stop flag
is set, the work ends at its next step boundary, and `stream` waits for it (shielded) so that
nothing the job holds outlives the attempt. Past the last step (decoding, encoding the video) the
work no longer stops: a cancel then comes too late, and the video it finishes is the result
(`FinishedBeforeStop`), never thrown away.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread
import numpy as np

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.video import write_mp4
from h3core.domain.events import Artifact, Progress
from h3core.executors.base import ExecutorFailure, FinishedBeforeStop, Heartbeat, JobSpec, Result, Update, classify, host_oom
from h3core.executors.pipeline.attention import AttentionRefused
from h3core.executors.pipeline.generate import Control, Media

Outcome = Artifact | ExecutorFailure | None  # None: stopped before it finished


async def stream(tg: anyio.abc.TaskGroup, work: Callable[[Control], Outcome], control: Control) -> AsyncIterator[Update]:
    """Run `work(control)` in a worker thread; yield its steps and stages, then its `Result`."""
    send, receive = anyio.create_memory_object_stream[Update](math.inf)

    def report(update: Update) -> None:
        try:
            anyio.from_thread.run_sync(send.send_nowait, update)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the runner stopped listening (a cancel); the stop flag follows

    control.on_step = lambda step, total: report(Progress(step=step, total=total))
    control.on_stage = lambda stage: report(Heartbeat(stage))
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
        if outcome and isinstance(outcome[0], Artifact):  # ...unless it was past the last one
            raise FinishedBeforeStop(Result(outcome[0])) from None
        raise
    try:
        result = outcome[0]
        if isinstance(result, ExecutorFailure):
            raise result
        if result is None:
            raise ExecutorFailure("executor_error", "the job stopped before it finished")
        yield Result(result)
    finally:
        await stopped()


def save_video(artifacts: ArtifactStore, job: JobSpec, frames: np.ndarray, audio: np.ndarray, sample_rate: int) -> Artifact:
    """H.264 + AAC through the artifact store's staging, committed under the attempt."""
    staged = artifacts.staging(job.job_id, job.attempt)
    write_mp4(staged, frames, fps=job.request.fps, audio=audio, sample_rate=sample_rate)
    count = int(frames.shape[0])
    return artifacts.commit(staged, job_id=job.job_id, attempt=job.attempt, frames=count, duration_s=count / job.request.fps)


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
