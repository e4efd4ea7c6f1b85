"""Attempt supervision: drive an executor through one attempt and write exactly one end for it.

Each attempt is two tasks: the driver iterates the executor (in a shielded scope, so a stop of the
runner reaches it only through the watcher) and the watcher stops it on a cancel, a stall, a
deadline or a stop of h3core, ending the job itself if the executor will not stop within its
grace (the cancel grace, plus what the executor says following its work after a stop may take).
Whatever happens, `_end` writes the attempt's end once, shielded, and the slot frees only once
the executor's iteration has ended.

Checkpoints: an attempt of an executor that keeps them starts from the newest checkpoint the log
holds whose file still has its recorded size and sha256 (`restored`; each unusable one is
`checkpoint_rejected` and the one before it is tried), logs each checkpoint the executor stores
(`checkpointed`, after its step's progress) and removes those the log no longer keeps; a
graceful stop asks the executor to checkpoint where it stops. Once the job ends, its checkpoints go.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import AsyncGenerator, Callable, Collection
from contextlib import aclosing
from dataclasses import replace
from typing import cast

import anyio
import anyio.abc

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.store.base import Conflict
from h3core.adapters.store.nodes import LeaseLost
from h3core.domain.events import Artifact, Body, Checkpoint, Checkpointed, CheckpointRejected, Progress, Restored
from h3core.domain.state import JobState
from h3core.executors.base import (
    Checkpointing,
    CheckpointSaved,
    Executor,
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
from h3core.runtime._attempt import Attempt, end_event
from h3core.runtime._journal import Journal, log_written
from h3core.runtime._recovery import can_resume
from h3core.runtime.config import RunnerConfig
from h3core.runtime.store_retry import StoreUnavailable

log = logging.getLogger("h3core.runner")

# Progress events an attempt may have queued to the writer and not yet seen written. They are
# written in order; the executor does not wait for each to reach the disk (the terminal event
# does wait for all of them), so a slow or busy store costs a job no time per step.
PROGRESS_IN_FLIGHT = 16


class Supervisor:
    def __init__(
        self,
        journal: Journal,
        executor: Executor,
        config: RunnerConfig,
        *,
        on_end: Callable[[], None],
        artifacts: ArtifactStore | None = None,
    ) -> None:
        """`on_end`: called once an attempt's task has ended and its slot is free. `artifacts`: where
        checkpoints are read back and removed (None: no checkpoints are kept)."""
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

    async def watch_store(self) -> None:
        """Notice cancels other processes stored for our running jobs."""
        while True:
            await anyio.sleep(self.config.poll_interval_s)
            for job_id, attempt in list(self.attempts.items()):
                if attempt.cancel:
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
        spec = _spec(a.state)
        try:
            with scope:
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
                            if not a.ended:
                                await self._report(a, update)
                        elif isinstance(update, CheckpointSaved):
                            if not a.ended:
                                await self._logged(a, update)
                        elif not isinstance(update, Heartbeat):
                            raise TypeError(f"executor yielded {update!r}, not Progress, Heartbeat or Result")
                await self._settle(a)  # a refused progress event fails the attempt
            if a.result is None and not scope.cancel_called:
                a.error = ("executor_error", "executor finished without a result", None)
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
            log.warning("executor %s failed job %s (%s): %s", self.executor.name, a.state.job_id, kind, message, extra=where)
            log.debug("executor %s failed job %s", self.executor.name, a.state.job_id, exc_info=exc, extra=where)
        finally:
            a.driver_done = True
            a.wake()

    async def _report(self, a: Attempt, update: Body) -> None:
        self._settled(a)
        a.reported.append(self.journal.writer.enqueue(a.state.job_id, [update]))
        await self._settle(a, keep=PROGRESS_IN_FLIGHT)

    async def _logged(self, a: Attempt, saved: CheckpointSaved) -> None:
        """Log a checkpoint the executor stored (after its step's progress; the executor does not
        wait for it to be written), then remove the ones the log no longer keeps: a job holds its
        newest two, and those still on their way to the log, whatever its length."""
        await self._report(a, Checkpointed(checkpoint=saved.checkpoint, paused_s=saved.paused_s, write_s=saved.write_s))
        coming = {b.checkpoint.path for item in a.reported for b in item.bodies if isinstance(b, Checkpointed)}
        await self._prune(a.state, also=coming)

    async def _prune(self, state: JobState, also: Collection[str] = ()) -> None:
        """Remove the job's checkpoint files its log does not keep (all of them once it ended), but
        those in `also`."""
        if self.artifacts is None:
            return
        artifacts = self.artifacts
        keep = set() if state.terminal else {c.path for c in state.checkpoints} | set(also)

        def prune() -> None:
            for f in artifacts.checkpoint_files(state.job_id):
                if f.path not in keep:
                    artifacts.remove(f.path)

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
                a.state = await self.journal.append(a.state.job_id, [Restored(attempt=a.state.attempt, checkpoint=cp)])
                return replace(spec, resume=Resume(cp, data), last_step=cp.step)
            rejected = CheckpointRejected(attempt=a.state.attempt, checkpoint=cp, reason=why)
            a.state = await self.journal.append(a.state.job_id, [rejected])
            log.warning("job %s: checkpoint %s unusable: %s", a.state.job_id, cp.path, why, extra={"job_id": a.state.job_id})
        return spec

    async def _settle(self, a: Attempt, *, keep: int = 0, quiet: bool = False) -> None:
        """Wait until at most `keep` of the attempt's progress events are unwritten."""
        while len(a.reported) > keep:
            await a.reported[0].done.wait()
            self._settled(a, quiet=quiet)

    def _settled(self, a: Attempt, *, quiet: bool = False) -> None:
        """Take the outcomes of the progress events written so far: the newest state, or the
        store's refusal (an executor breaking the progress contract), raised unless `quiet`."""
        while a.reported and a.reported[0].done.is_set():
            item = a.reported.pop(0)
            outcome = item.outcome
            if isinstance(outcome, Exception):
                if not quiet:
                    raise outcome
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
        resumable = self.journal.lost is None and can_resume(self.executor, a.state)
        if not driver.cancel_called and not a.cancel and not a.driver_done and resumable:
            assert isinstance(self.executor, Resumable) and a.state.executor_ref is not None
            a.detached = self.executor.detach(_spec(a.state), a.state.executor_ref)
        graceful = self.journal.lost is None and not driver.cancel_called and not a.cancel and not a.driver_done
        if graceful and not a.detached and isinstance(self.executor, Checkpointing) and self._checkpoints():
            self.executor.save_on_stop(_spec(a.state))
        driver.cancel()

    async def _watch_attempt(self, a: Attempt, driver: anyio.CancelScope) -> None:
        cfg = self.config
        deadline = anyio.current_time() + (cfg.attempt_deadline_s or math.inf)
        while not a.driver_done:
            now = anyio.current_time()
            if a.cancel or now >= a.last_touch + cfg.stall_timeout_s or now >= deadline:
                break
            signal = a.signal
            with anyio.move_on_after(min(a.last_touch + cfg.stall_timeout_s, deadline) - now):
                await signal.wait()
        else:
            return
        if not a.cancel:
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
        try:
            if a.at_stop is not None:
                await self._log_at_stop(a, a.at_stop)
            body = end_event(a, self.config, interrupted=interrupted, grace_expired=grace_expired)
            await self._write_outcome(a, body, interrupted=interrupted, grace_expired=grace_expired)
            if a.state.terminal or a.state.status == "queued":
                await self._prune(a.state)
        except StoreUnavailable as exc:
            log.error(
                "job %s: its end (%s) cannot be written, the store is unusable; it stays %s until the next start ends it",
                a.state.job_id,
                body.type,
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
        except (Conflict, ValueError) as exc:  # refused (a cancel meanwhile, a lease lost): the stop ends it as it would
            log.warning(
                "job %s: the checkpoint at its stop is not logged: %s", a.state.job_id, exc, extra={"job_id": a.state.job_id}
            )

    async def _write_outcome(self, a: Attempt, body: Body, *, interrupted: bool, grace_expired: bool) -> None:
        while True:
            try:
                a.state = await self.journal.append(a.state.job_id, [body], expected_seq=a.state.last_seq)
                return
            except LeaseLost as exc:
                # Another node took the attempt over (this node had stopped beating): its end is written.
                log.warning("job %s: %s; its end here is not written", a.state.job_id, exc, extra={"job_id": a.state.job_id})
                return
            except Conflict:
                # Someone appended meanwhile (a cancel request): reload and decide again.
                current = await self.journal.read(self.journal.store.get, a.state.job_id)
                if current is None or current.terminal:
                    return
                if current.cancel_requested:
                    a.cancel = True
                a.state = current
                body = end_event(a, self.config, interrupted=interrupted, grace_expired=grace_expired)


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


def _spec(state: JobState) -> JobSpec:
    return JobSpec(state.job_id, state.attempt, state.request, state.tokens, last_step=state.step or 0)
