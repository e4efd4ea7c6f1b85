"""Attempt supervision: drive an executor through one attempt and write exactly one end for it.

Each attempt is two tasks: the driver iterates the executor (in a shielded scope, so a stop of the
runner reaches it only through the watcher) and the watcher stops it on a cancel, a stall, a
deadline or a stop of h3core, ending the job itself if the executor will not stop within its
grace (the cancel grace, plus what the executor says following its work after a stop may take).
Whatever happens, `_end` writes the attempt's end once, shielded, and the slot frees only once
the executor's iteration has ended.

Unless the attempt is lost to this node: the store refused a write because the job no longer runs
it (another node took its lease over, re-queued it or started a later attempt), or the heartbeat
found its lease gone. Then its executor is stopped and nothing more is written for it, not even
the video it finished or the checkpoint it stored at a stop (`_lose`): the job is another's to end.
What only the attempt's own process writes (progress, checkpoints logged, restored or rejected) is
refused alike, and handled alike, wherever it is written.

Checkpoints: an attempt of an executor that keeps them starts from the newest checkpoint the log
holds whose file still has its recorded size and sha256 (`restored`; each unusable one is
`checkpoint_rejected` and the one before it is tried), logs each checkpoint the executor stores
(`checkpointed`, after its step's progress) and removes those the log no longer keeps; a
graceful stop asks the executor to checkpoint where it stops. Once the job ends, its checkpoints go.
An attempt removes no checkpoint file of a later attempt (its state may be behind: the job moved on).

A long video (the job's `plan`): the attempt makes each segment its log does not hold by one call,
in order, each after the first from the last frame the one before kept (an upload), logs each as
soon as it is committed (`segment_done`), and joins them into the job's video once all are made.
A failure names its segment; each call has the attempt deadline; a retry goes on at the first
segment not logged (and inside it from its checkpoint: a segment's end clears them).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Sequence
from contextlib import ExitStack, aclosing
from dataclasses import replace
from pathlib import Path
from typing import cast

import anyio
import anyio.abc

from h3core.adapters.artifacts import ArtifactStore, sha256_file
from h3core.adapters.store.base import Conflict
from h3core.adapters.store.nodes import LeaseLost, node_leases
from h3core.adapters.uploads import UploadStore
from h3core.domain.events import Artifact, Body, Checkpoint, Checkpointed, CheckpointRejected, Progress, Restored, SegmentDone
from h3core.domain.quality import StepCounts
from h3core.domain.retention import garbage
from h3core.domain.state import IllegalEvent, JobState
from h3core.executors.base import (
    Checkpointing,
    CheckpointSaved,
    Executor,
    ExecutorFailure,
    FinishedBeforeStop,
    Heartbeat,
    JobSpec,
    Result,
    Resumable,
    Resume,
    StoppedWithCheckpoint,
    Update,
    classify,
)
from h3core.runtime._attempt import Attempt, end_event, spec_of
from h3core.runtime._journal import Journal, log_written
from h3core.runtime._recovery import can_resume
from h3core.runtime.config import RunnerConfig
from h3core.runtime.store_retry import StoreUnavailable

log = logging.getLogger("h3core.runner")

# Progress events an attempt may have queued to the writer and not yet seen written. They are
# written in order; the executor does not wait for each to reach the disk (the terminal event
# does wait for all of them), so a slow or busy store costs a job no time per step.
PROGRESS_IN_FLIGHT = 16

# The store's refusals of what an attempt reports that mean the job no longer runs the attempt:
# another writer ended or re-queued it, or adopted its video (this process settles every report
# of an attempt before writing its end, so it is never the one). `attempt_order` too, where what
# was refused names this attempt: the job runs another one.
MOVED_ON = frozenset({"not_running", "after_terminal", "recovered_then_done"})


class AttemptLost(Exception):
    """The attempt is no longer this node's (`Attempt.lost` says why): its driver stops."""


class Supervisor:
    def __init__(
        self,
        journal: Journal,
        executor: Executor,
        config: RunnerConfig,
        *,
        on_end: Callable[[], None],
        artifacts: ArtifactStore | None = None,
        uploads: UploadStore | None = None,
    ) -> None:
        """`on_end`: called once an attempt's task has ended and its slot is free. `artifacts`: where
        checkpoints and a long video's segments are read back and removed (None: no checkpoints are
        kept); `uploads`: where the frame a segment continues from is handed to the executor."""
        self.uploads = uploads
        self.journal = journal
        self.executor = executor
        self.config = config
        self.artifacts = artifacts
        self.on_end = on_end
        self.attempts: dict[str, Attempt] = {}
        self.busy: set[str] = set()  # job ids whose task is alive (cleanup may outlive the attempt)

    def cancel(self, job_id: str) -> None:
        """A cancel was stored for the job: stop its attempt, if it runs here."""
        attempt = self.attempts.get(job_id)
        if attempt is not None:
            attempt.cancel = True
            attempt.wake()

    def leased(self) -> dict[str, float]:
        """The attempts this node still runs and may write for, each with when it began here."""
        return {j: a.began for j, a in self.attempts.items() if not a.ended and a.lost is None}

    def lose(self, job_id: str, why: str, holder: str | None = None) -> None:
        """The job's attempt is no longer this node's (its heartbeat found the lease gone; `holder`:
        the node holding it now, if one does): stop it and write nothing more for it."""
        attempt = self.attempts.get(job_id)
        if attempt is not None and not attempt.ended:
            self._lose(attempt, why, holder)

    async def watch_store(self) -> None:
        """Notice cancels other processes stored for our running jobs."""
        while True:
            await anyio.sleep(self.config.poll_interval_s)
            for job_id, attempt in list(self.attempts.items()):
                if attempt.cancel or attempt.lost is not None:
                    continue
                state = await self.journal.read(self.journal.store.get, job_id)
                if state is not None and state.cancel_requested:
                    attempt.cancel = True
                    attempt.wake()

    async def job(self, state: JobState, slots: anyio.Semaphore, *, resume: bool = False) -> None:
        a = Attempt(state=state, last_touch=anyio.current_time(), resume=resume, cancel=state.cancel_requested)
        self.attempts[state.job_id] = a
        self.busy.add(state.job_id)
        interrupted = False
        try:
            async with anyio.create_task_group() as tg:
                # Shielded: a stop of the runner reaches the executor only through `_watch`, which
                # first asks a resumable executor whether to leave the work running.
                driver = anyio.CancelScope(shield=True)
                tg.start_soon(self._drive, a, driver)
                await self._watch(a, driver)
        except anyio.get_cancelled_exc_class():
            interrupted = True
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await self._end(a, interrupted=interrupted)
                self.attempts.pop(state.job_id, None)
                self.busy.discard(state.job_id)
                slots.release()
                self.on_end()

    def _checkpoints(self) -> bool:
        """Whether this runner's attempts keep checkpoints: an executor that keeps them, a policy
        that asks for them and a store to put them in."""
        return self.artifacts is not None and self.config.checkpoints.enabled and self.executor.capabilities().checkpoints

    async def _drive(self, a: Attempt, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                if a.state.plan is None:
                    await self._run(a, spec_of(a.state))
                else:
                    await self._segments(a)
            if a.result is None and not scope.cancel_called:
                a.error = ("executor_error", "executor finished without a result", None)
        except AttemptLost:  # `_lose` said why; the executor's work was stopped on the way out
            pass
        except StoppedWithCheckpoint as stopped:  # h3core's own stop, and the executor checkpointed there
            a.at_stop = stopped.saved
        except FinishedBeforeStop as finished:  # stopped (a cancel, a stall) after the work had finished
            try:
                a.result = _checked(finished.result)
            except TypeError as exc:
                a.error = classify(exc)
            log.info(
                "job %s: the executor had finished before the stop took effect",
                a.state.job_id,
                extra={"job_id": a.state.job_id, "attempt": a.state.attempt, "executor": self.executor.name},
            )
        except Exception as exc:  # errors only: cancellation is a BaseException and passes
            a.result = None
            a.error = classify(exc)
            kind, message, _ = a.error
            where = {"job_id": a.state.job_id, "attempt": a.state.attempt, "executor": self.executor.name, "kind": kind}
            # The failure's event is its WARNING (the journal logs it once written); here, the traceback.
            log.debug(
                "executor %s failed job %s (%s): %s", self.executor.name, a.state.job_id, kind, message, exc_info=exc, extra=where
            )
        finally:
            a.driver_done = True
            a.wake()

    async def _run(self, a: Attempt, spec: JobSpec) -> None:
        """One call of the executor: its updates reported, its result in `a.result`."""
        if self._checkpoints() and not a.resume:
            spec = await self._restore(a, spec)
        if a.resume:
            assert isinstance(self.executor, Resumable) and a.state.executor_ref is not None
            source = self.executor.resume(spec, a.state.executor_ref)
        else:
            source = self.executor.run(spec)
        # An executor's run is an async generator (closed here, so its cleanup runs now).
        async with aclosing(cast("AsyncGenerator[Update, None]", source)) as updates:
            async for update in updates:
                a.last_touch = anyio.current_time()
                if a.result is not None:
                    raise RuntimeError(f"executor yielded {type(update).__name__} after its result")
                if isinstance(update, Result):
                    a.result = _checked(update)
                elif isinstance(update, Progress):
                    if not a.ended and a.lost is None:
                        await self._report(a, update)
                elif isinstance(update, CheckpointSaved):
                    if not a.ended and a.lost is None:
                        await self._logged(a, update)
                elif not isinstance(update, Heartbeat):
                    raise TypeError(f"executor yielded {update!r}, not Progress, Heartbeat or Result")
        await self._settle(a)  # a refused progress event fails the attempt

    async def _segments(self, a: Attempt) -> None:
        """A long video: each segment its log does not hold yet made by one call, in order, and
        logged (`segment_done`) as soon as it is committed, so that no later attempt makes it again;
        then the segments joined into the job's video (`a.result`). A resumed attempt follows the
        call of the segment its log says is next (left running when h3core stopped), then makes
        the rest."""
        assert a.state.plan is not None
        counts: list[StepCounts] = []
        count = len(a.state.plan.segments)
        while (index := a.state.segment) is not None:
            try:
                made = await self._segment(a, index)
            except (AttemptLost, StoppedWithCheckpoint):
                raise
            except Exception as exc:  # the failure names the segment (cancellation passes)
                kind, message, detail = classify(exc)
                raise ExecutorFailure(kind, f"segment {index + 1} of {count}: {message}", detail) from exc
            a.resume = False  # only the call that outlived h3core is followed: the next ones are made
            if made is None:
                return  # stopped, or no result: the driver records it
            if made.steps is not None:
                counts.append(made.steps)
        a.result = Result(await self._join(a), _added(counts))

    async def _segment(self, a: Attempt, index: int) -> Result | None:
        """Make segment `index` and log it; its result, or None where the call ended without one
        (a segment finished as a stop came is logged, and None returned: the stop goes on)."""
        # A resumed call runs already: it was handed its first frame when it was made.
        continued_from = await self._continued_from(a) if index and not a.resume else None
        a.call_began = anyio.current_time()
        a.wake()  # the watcher's deadline moves with the call
        try:
            await self._run(a, spec_of(a.state, continued_from=continued_from))
        except FinishedBeforeStop as finished:
            with anyio.CancelScope(shield=True):
                await self._segment_done(a, index, _checked(finished.result))
            return None
        if a.result is None:
            return None
        result, a.result = a.result, None
        await self._segment_done(a, index, result)
        return result

    async def _continued_from(self, a: Attempt) -> str:
        """The upload holding the frame the segment before kept last: the next one's first keyframe."""
        if self.uploads is None or self.artifacts is None:
            raise ExecutorFailure(
                "executor_error", "a long video needs an artifact store and an upload store to continue its segments"
            )
        artifacts, before = self.artifacts, a.state.segments[-1]

        def last_frame() -> bytes:
            from h3core.adapters.segment_files import last_frame_png

            with artifacts.local_file(before.path) as local:
                _verify(local, before)
                return last_frame_png(local)

        png = await anyio.to_thread.run_sync(last_frame)
        upload = await self.uploads.put("image/png", _chunks(png))
        a.last_touch = anyio.current_time()
        return upload.id

    async def _segment_done(self, a: Attempt, index: int, result: Result) -> None:
        """Log the committed segment: it is the job's, whichever attempt goes on."""
        assert a.state.plan is not None
        segment = a.state.plan.segments[index]
        if result.artifact.frames != segment.keep:
            raise ExecutorFailure(
                "executor_error", f"its segment file holds {result.artifact.frames} frames, {segment.keep} planned"
            )
        await self._write_own(a, SegmentDone(index=index, artifact=result.artifact))
        log.info(
            "job %s: segment %d of %d made (%s)",
            a.state.job_id,
            index + 1,
            len(a.state.plan.segments),
            result.artifact.path,
            extra={"job_id": a.state.job_id, "attempt": a.state.attempt, "segment": index, "path": result.artifact.path},
        )

    async def _join(self, a: Attempt) -> Artifact:
        """The segments joined into the job's video and committed under the attempt. Past the last
        segment a stop no longer takes effect, as past a model's last step: the video is written."""
        plan, state, artifacts = a.state.plan, a.state, self.artifacts
        assert plan is not None and artifacts is not None
        fps = state.request.fps

        def join() -> Artifact:
            from h3core.adapters.segment_files import join_segments

            with ExitStack() as stack:
                parts = []
                for made in state.segments:
                    local = stack.enter_context(artifacts.local_file(made.path))
                    _verify(local, made)
                    parts.append(local)
                staged = artifacts.staging(state.job_id, state.attempt)
                join_segments(parts, plan, staged, fps=fps)
            return artifacts.commit(
                staged, job_id=state.job_id, attempt=state.attempt, frames=plan.frames, duration_s=plan.frames / fps
            )

        with anyio.CancelScope(shield=True):
            artifact = await anyio.to_thread.run_sync(join)
        a.last_touch = anyio.current_time()
        return artifact

    async def _report(self, a: Attempt, update: Body) -> None:
        self._settled(a)
        a.reported.append(self.journal.writer.enqueue(a.state.job_id, [update]))
        await self._settle(a, keep=PROGRESS_IN_FLIGHT)

    async def _logged(self, a: Attempt, saved: CheckpointSaved) -> None:
        """Log a checkpoint the executor stored (after its step's progress; the executor does not
        wait for it to be written), then remove the ones the log no longer keeps: a job holds its
        newest two, and those still on their way to the log, whatever its length."""
        await self._report(a, Checkpointed(checkpoint=saved.checkpoint, paused_s=saved.paused_s, write_s=saved.write_s))
        if a.lost is not None:  # its state is behind the job's: what it would remove may be another's
            return
        coming = {b.checkpoint.path for item in a.reported for b in item.bodies if isinstance(b, Checkpointed)}
        await self._prune(a.state, also=coming)

    async def _prune(self, state: JobState, also: Collection[str] = ()) -> None:
        """Remove the job's checkpoint files its log does not keep (all of them once it ended), but
        those in `also` and those of attempts after `state`'s: `state` may be behind the job (its
        attempt lost, or the job queued again and claimed elsewhere), whose later attempt's files
        are not this one's to judge. Once an attempt ended, the segment files no join will read
        go too (`garbage`: all of them once the job ended)."""
        if self.artifacts is None:
            return
        artifacts = self.artifacts
        keep = set() if state.terminal else {c.path for c in state.checkpoints} | set(also)

        def prune() -> None:
            for f in artifacts.checkpoint_files(state.job_id):
                if f.path not in keep and (state.terminal or f.attempt <= state.attempt):
                    artifacts.remove(f.path)
            if state.status != "running":  # a running attempt's are its own, and earlier ones' went at their end
                for g in garbage(artifacts.segment_files(state.job_id), {state.job_id: state}):
                    artifacts.remove(g.file.path)

        try:
            await anyio.to_thread.run_sync(prune)
        except (OSError, ValueError) as exc:  # a file left behind is gc's to remove, never the job's failure
            log.warning("job %s: its old checkpoints were not removed: %s", state.job_id, exc, extra={"job_id": state.job_id})

    async def _restore(self, a: Attempt, spec: JobSpec) -> JobSpec:
        """The attempt's spec with the newest usable checkpoint to continue from (each unusable one
        logged `checkpoint_rejected`, then the one before it tried; none: from step 0)."""
        assert self.artifacts is not None
        spec = replace(spec, checkpoints=self.config.checkpoints)
        for cp in reversed(a.state.checkpoints):
            if cp.total != a.state.request.steps:
                why: str | None = f"made for {cp.total} steps, the job has {a.state.request.steps}"
                data = b""
            else:
                data, why = await anyio.to_thread.run_sync(_read_checked, self.artifacts, cp)
            if why is None:
                await self._write_own(a, Restored(attempt=a.state.attempt, checkpoint=cp))
                return replace(spec, resume=Resume(cp, data), last_step=cp.step)
            await self._write_own(a, CheckpointRejected(attempt=a.state.attempt, checkpoint=cp, reason=why))
            log.warning("job %s: checkpoint %s unusable: %s", a.state.job_id, cp.path, why, extra={"job_id": a.state.job_id})
        return spec

    async def _write_own(self, a: Attempt, body: Body) -> None:
        """Append what only the attempt's own process writes, directly (not through the writer): a
        refusal that says the job no longer runs the attempt loses it (`AttemptLost`)."""
        try:
            a.state = await self.journal.append(a.state.job_id, [body])
        except (Conflict, IllegalEvent) as exc:
            lost = _lost_by(exc, [body], a.state.attempt)
            if lost is None:
                raise
            self._lose(a, *lost)
            raise AttemptLost(a.lost) from None

    async def _settle(self, a: Attempt, *, keep: int = 0, quiet: bool = False) -> None:
        """Wait until at most `keep` of the attempt's progress events are unwritten."""
        while len(a.reported) > keep:
            await a.reported[0].done.wait()
            self._settled(a, quiet=quiet)

    def _settled(self, a: Attempt, *, quiet: bool = False) -> None:
        """Take the outcomes of the reports written so far: the newest state, or the store's
        refusal, raised unless `quiet`: `AttemptLost` where the job no longer runs the attempt
        (refused so, or written onto a job that moved on), else the refusal itself (an executor
        breaking the progress or checkpoint contract)."""
        while a.reported and a.reported[0].done.is_set():
            item = a.reported.pop(0)
            outcome = item.outcome
            if isinstance(outcome, Exception):
                lost = _lost_by(outcome, item.bodies, a.state.attempt)
                if lost is not None:
                    self._lose(a, *lost)
                    if not quiet:
                        raise AttemptLost(a.lost)
                elif not quiet:
                    raise outcome
            elif outcome is not None and (moved := _moved_on(a.state, outcome[0])) is not None:
                # Written, but onto the job after it moved on: a store that does not fence
                # (SQLite's) took a step onto another attempt. Its end is not this one's to write.
                self._lose(a, *moved)
                if not quiet:
                    raise AttemptLost(a.lost)
            elif outcome is not None:
                a.state = outcome[0]
                if log.isEnabledFor(logging.DEBUG):  # steps are logged at DEBUG: spare the hot path otherwise
                    log_written(a.state, item.bodies)

    async def _watch(self, a: Attempt, driver: anyio.CancelScope) -> None:
        """Stop the driver on cancel, stall, deadline or a stop of the runner; end the job if it will not stop."""
        try:
            await self._watch_attempt(a, driver)
        except anyio.get_cancelled_exc_class():
            self._stop_for_shutdown(a, driver)
            raise

    def _stop_for_shutdown(self, a: Attempt, driver: anyio.CancelScope) -> None:
        """h3core stops while the attempt runs: a resumable executor may leave its work running
        for the next start (`detached` is written then), else it is stopped and recorded interrupted.
        An attempt already being stopped (a cancel, a stall) is stopped as it was."""
        a.stopping = True
        # A lost store stops the work too: this process is going away without a way to record it.
        # So does a lost attempt: the job is another node's now, its work is neither left running
        # nor checkpointed here.
        ours = self.journal.lost is None and a.lost is None
        resumable = ours and can_resume(self.executor, a.state)
        if not driver.cancel_called and not a.cancel and not a.driver_done and resumable:
            assert isinstance(self.executor, Resumable) and a.state.executor_ref is not None
            a.detached = self.executor.detach(spec_of(a.state), a.state.executor_ref)
        graceful = ours and not driver.cancel_called and not a.cancel and not a.driver_done
        if graceful and not a.detached and isinstance(self.executor, Checkpointing) and self._checkpoints():
            self.executor.save_on_stop(spec_of(a.state))
        driver.cancel()

    async def _watch_attempt(self, a: Attempt, driver: anyio.CancelScope) -> None:
        cfg = self.config
        while not a.driver_done:
            # Each call has the deadline: a long video's attempt makes several.
            deadline = a.call_began + (cfg.attempt_deadline_s or math.inf)
            now = anyio.current_time()
            if a.cancel or a.lost is not None or now >= a.last_touch + cfg.stall_timeout_s or now >= deadline:
                break
            signal = a.signal
            with anyio.move_on_after(min(a.last_touch + cfg.stall_timeout_s, deadline) - now):
                await signal.wait()
        else:
            return
        if not a.cancel and a.lost is None:
            stalled = anyio.current_time() >= a.last_touch + cfg.stall_timeout_s
            a.stop_reason = "stalled" if stalled else "deadline"
        driver.cancel()
        # An executor that follows its work after a stop (a ComfyUI prompt runs on until an interrupt
        # lands) says how long it may: the job then ends as that work did, not at the grace.
        a.stop_wait_s = self.executor.capabilities().stop_wait_s or 0.0
        with anyio.move_on_after(cfg.cancel_grace_s + a.stop_wait_s):
            while not a.driver_done:
                signal = a.signal
                await signal.wait()
        if not a.driver_done:
            # The executor ignores cancellation: the job ends anyway; its cleanup runs on.
            await self._end(a, grace_expired=True)

    async def _end(self, a: Attempt, *, interrupted: bool = False, grace_expired: bool = False) -> None:
        if a.ended:
            return
        a.ended = True
        # Shielded wherever it is called from: once `ended` is set, the write must happen even if
        # the runner is being cancelled this very moment (the stateful test found that window).
        with anyio.CancelScope(shield=True):
            await self._write_end(a, interrupted=interrupted, grace_expired=grace_expired)

    async def _write_end(self, a: Attempt, *, interrupted: bool, grace_expired: bool) -> None:
        await self._settle(a, quiet=True)  # the terminal event comes after every progress event
        body: Body | None = None
        try:
            if a.at_stop is not None and a.lost is None:
                await self._log_at_stop(a, a.at_stop)
            if a.lost is not None:  # found so now, or before: not this node's to end
                self._not_recorded(a)
                return
            body = end_event(a, self.config, interrupted=interrupted, grace_expired=grace_expired)
            await self._write_outcome(a, body, interrupted=interrupted, grace_expired=grace_expired)
            if a.state.terminal or a.state.status == "queued":
                await self._prune(a.state)
        except StoreUnavailable as exc:
            log.error(
                "job %s: its end (%s) cannot be written, the store is unusable; it stays %s until the next start ends it",
                a.state.job_id,
                body.type if body is not None else "after the checkpoint at its stop",
                a.state.status,
                extra={"job_id": a.state.job_id, "attempt": a.state.attempt, "error": str(exc)},
            )

    async def _log_at_stop(self, a: Attempt, saved: CheckpointSaved) -> None:
        """Log the checkpoint stored where h3core's stop stopped the attempt (its step's progress
        first, where the stop came before the runner logged it)."""
        cp = saved.checkpoint
        if cp in a.state.checkpoints:
            return  # logged while the attempt ran
        bodies: list[Body] = []
        if a.state.step is None or a.state.step < cp.step:
            bodies.append(Progress(step=cp.step, total=cp.total))
        bodies.append(Checkpointed(checkpoint=cp, paused_s=saved.paused_s, write_s=saved.write_s))
        try:
            a.state = await self.journal.append(a.state.job_id, bodies, expected_seq=a.state.last_seq)
        except (Conflict, ValueError) as exc:  # refused: a cancel meanwhile (the stop ends it as it would), or lost
            lost = _lost_by(exc, bodies, a.state.attempt)
            if lost is not None:
                self._lose(a, *lost)
                return
            log.warning(
                "job %s: the checkpoint at its stop is not logged: %s", a.state.job_id, exc, extra={"job_id": a.state.job_id}
            )

    async def _write_outcome(self, a: Attempt, body: Body, *, interrupted: bool, grace_expired: bool) -> None:
        while True:
            try:
                a.state = await self.journal.append(a.state.job_id, [body], expected_seq=a.state.last_seq)
                return
            except LeaseLost as exc:
                # Another node took the attempt over (this node had stopped beating): it ends it.
                self._lose(a, str(exc), exc.holder)
                self._not_recorded(a)
                return
            except Conflict:
                # Someone appended meanwhile: a cancel request (decide again), or another node that
                # took the attempt over and moved the job on (then it is not ours to end).
                current = await self.journal.read(self.journal.store.get, a.state.job_id)
                moved = _moved_on(a.state, current)
                if moved is not None:
                    self._lose(a, *moved)
                    self._not_recorded(a)
                    return
                assert current is not None  # a job that is gone has moved on
                if current.cancel_requested:
                    a.cancel = True
                a.state = current
                body = end_event(a, self.config, interrupted=interrupted, grace_expired=grace_expired)

    def _lose(self, a: Attempt, why: str, holder: str | None = None) -> None:
        """The attempt is no longer this node's: its driver and watcher stop, and nothing more is
        written for it (said once, with who holds the job now where that is known)."""
        if a.lost is not None:
            return
        a.lost = why
        a.wake()
        leases = node_leases(self.journal.store)
        node = leases.node_id if leases is not None else None
        log.warning(
            "job %s: attempt %d is lost to this node (%s): its work is stopped here and nothing more is written for it",
            a.state.job_id,
            a.state.attempt,
            why,
            extra={"job_id": a.state.job_id, "attempt": a.state.attempt, "node": node, "holder": holder, "why": why},
        )

    def _not_recorded(self, a: Attempt) -> None:
        """Say so where the lost attempt had finished its video, or stored a checkpoint where
        h3core's stop stopped it: neither is the job's (another node's attempt makes the video,
        or adopted this one's if it found it committed; gc removes what is left)."""
        if a.result is not None:
            log.warning(
                "job %s: attempt %d finished its video %s after the attempt was lost to this node: not recorded",
                a.state.job_id,
                a.state.attempt,
                a.result.artifact.path,
                extra={"job_id": a.state.job_id, "attempt": a.state.attempt, "path": a.result.artifact.path},
            )
        if a.at_stop is not None and a.at_stop.checkpoint not in a.state.checkpoints:
            path = a.at_stop.checkpoint.path
            log.warning(
                "job %s: attempt %d stored the checkpoint %s at its stop after the attempt was lost to this node: not logged",
                a.state.job_id,
                a.state.attempt,
                path,
                extra={"job_id": a.state.job_id, "attempt": a.state.attempt, "path": path},
            )


def _lost_by(refusal: Exception, bodies: Sequence[Body], attempt: int) -> tuple[str, str | None] | None:
    """Why the store's refusal of `bodies`, reported for `attempt`, means the job no longer runs
    the attempt (and who holds it now, where the store said), or None: the executor broke its
    contract (a step or checkpoint out of order)."""
    if isinstance(refusal, LeaseLost):
        return str(refusal), refusal.holder
    if not isinstance(refusal, IllegalEvent):
        return None
    ours = all(_attempt_of(b) in (None, attempt) for b in bodies)
    if refusal.code in MOVED_ON or (refusal.code == "attempt_order" and ours):
        return f"the store refused its {'/'.join(b.type for b in bodies)}: {refusal}", None
    return None


def _attempt_of(body: Body) -> int | None:
    """The attempt a report names, if it names one (progress does not)."""
    if isinstance(body, Checkpointed):
        return body.checkpoint.attempt
    return getattr(body, "attempt", None)


def _moved_on(mine: JobState, current: JobState | None) -> tuple[str, str | None] | None:
    """Why the job, as read again after a conflict, no longer runs the attempt `mine` runs (and the
    node running it now, if one does), or None while it still does."""
    if current is None:
        return "the job is gone from the store", None
    if current.status == "running" and current.attempt == mine.attempt:
        return None
    holder = current.info.get("node") if current.status == "running" else None
    where = f" on node {holder}" if holder else ""
    return f"the job moved on meanwhile: it is {current.status}, at attempt {current.attempt}{where}", holder


def _checked(result: Result) -> Result:
    if not isinstance(result.artifact, Artifact):
        raise TypeError(f"executor returned {result.artifact!r}, not an Artifact")
    return result


def _read_checked(artifacts: ArtifactStore, cp: Checkpoint) -> tuple[bytes, str | None]:
    """The checkpoint's bytes, and why they are unusable (None: its recorded size and sha256)."""
    try:
        data = artifacts.read_checkpoint(cp.path)
    except FileNotFoundError:
        return b"", "its file is missing"
    except (OSError, ValueError) as exc:
        return b"", f"its file does not read: {exc}"
    if len(data) != cp.bytes:
        return b"", f"truncated or grown: {len(data)} bytes, {cp.bytes} recorded"
    if hashlib.sha256(data).hexdigest() != cp.sha256:
        return b"", "its sha256 differs from the one recorded"
    return data, None


def _verify(local: Path, made: Artifact) -> None:
    """A segment file as its `segment_done` recorded it (size and sha256), else the attempt fails:
    a segment is never made twice, so a changed or missing one is a loss the job reports."""
    size = local.stat().st_size
    if size != made.bytes or sha256_file(local) != made.sha256:
        raise ExecutorFailure(
            "executor_error", f"segment file {made.path} changed since it was made ({size} bytes, {made.bytes} recorded)"
        )


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _added(counts: Sequence[StepCounts]) -> StepCounts | None:
    """The steps of every segment's call together (None where an executor counted none)."""
    if not counts:
        return None
    return StepCounts(quality=counts[0].quality, computed=sum(c.computed for c in counts), cached=sum(c.cached for c in counts))
