"""The runner: takes queued jobs from the store, drives executors, writes every event.

The terminal guarantee: once a job is `Running`, exactly one terminal event (or a retry) is
written whatever happens: the executor returns, raises, returns without a result, hangs (stall
timeout), overruns its deadline, is cancelled, or the runner itself is cancelled (docs/design.md
§2.1: cancellation is a `BaseException`, so it is never caught as an error here). Terminal
writes happen in shielded scopes; executors never write events.

One exception, by design: when the runner is stopped while an attempt of a `Resumable` executor
runs and that executor detaches it (its work goes on outside h3core, a ComfyUI prompt), nothing
is written and the attempt stays `running` in the log; the next start re-attaches to it
(`Resumed`) and the guarantee resumes there: it ends as above, or `executor_lost` if the work is
gone. A stop or a crash leaves nothing that no start will end.

Nor does a lost store: a failing write is retried for `store_retry_s`; past it nothing can be
written, so `run` stops every attempt and raises `StoreUnavailable` (the process exits), and the
next start ends what stayed `running` as after a crash.
"""

from __future__ import annotations

import functools
import logging
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskStatus
from pydantic import BaseModel, ConfigDict, Field

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.store.base import Conflict, EventStore
from h3core.bus import EventBus
from h3core.contracts import CapabilityFile, LiveContract, publish_capabilities
from h3core.domain.admission import AdmissionPolicy, AdmitAll, Refuse
from h3core.domain.adoption import Adopt, Discard, adoption, judge
from h3core.domain.capabilities import MODES, Capabilities
from h3core.domain.events import (
    Admitted,
    Artifact,
    AttemptFailed,
    Body,
    Cancelled,
    CancelRequested,
    Done,
    Failed,
    Progress,
    Recovered,
    Resumed,
    Running,
    Submitted,
)
from h3core.domain.failures import FailureKind
from h3core.domain.geometry import Media
from h3core.domain.request import GenerationRequest
from h3core.domain.retry import RetryPolicy
from h3core.domain.state import IllegalEvent, JobState
from h3core.executors.base import Executor, Heartbeat, JobSpec, Result, Resumable, classify
from h3core.store_retry import StoreUnavailable, retrying
from h3core.writer import Queued, _GroupWriter

T = TypeVar("T")

log = logging.getLogger("h3core.runner")

# Progress events an attempt may have queued to the writer and not yet seen written. They are
# written in order; the executor does not wait for each to reach the disk (the terminal event
# does wait for all of them), so a slow or busy store costs a job no time per step.
PROGRESS_IN_FLIGHT = 16


class RunnerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    slots: int = Field(default=1, ge=1, le=256)
    stall_timeout_s: float = Field(default=600.0, gt=0)  # no progress or heartbeat for this long
    attempt_deadline_s: float | None = Field(default=None, gt=0)
    cancel_grace_s: float = Field(default=30.0, ge=0)  # time an executor gets to stop
    poll_interval_s: float = Field(default=0.5, gt=0)  # to see work other processes stored
    # A job not started this long after it was admitted fails `deadline` (waiting for a slot, or
    # for its mode to become ready); None: it waits as long as it takes.
    queue_timeout_s: float | None = Field(default=None, gt=0)
    retry: RetryPolicy = RetryPolicy()
    # A store write or read failing (locked, I/O error) is retried this long; past it the store is
    # unusable: `run` stops its jobs and raises `StoreUnavailable`.
    store_retry_s: float = Field(default=30.0, gt=0)


class Refused(Exception):
    """Admission refused the request; it did not become a job."""

    def __init__(self, decision: Refuse) -> None:
        super().__init__(decision.detail)
        self.decision = decision


class IdempotencyMismatch(Exception):
    """The idempotency key names a job submitted with a different request."""

    def __init__(self, key: str, job_id: str) -> None:
        super().__init__(f"idempotency key {key!r} was used for job {job_id} with a different request")
        self.key = key
        self.job_id = job_id


class NotCancellable(Exception):
    def __init__(self, state: JobState) -> None:
        super().__init__(f"job {state.job_id} already ended '{state.status}'")
        self.state = state


class ShuttingDown(Exception):
    """The runner no longer admits work."""


@dataclass
class _Attempt:
    """One running attempt, shared by its driver and watcher tasks."""

    state: JobState
    last_touch: float
    signal: anyio.Event = field(default_factory=anyio.Event)
    cancel: bool = False
    stop_reason: FailureKind | None = None  # stalled / deadline, when the watcher stopped it
    result: Result | None = None
    error: tuple[FailureKind, str, str | None] | None = None
    driver_done: bool = False
    ended: bool = False  # the terminal (or retry) event is written
    resume: bool = False  # re-attached after a restart: follow, do not start
    stopping: bool = False  # h3core is stopping while the attempt runs
    detached: bool = False  # ...and the executor leaves its work running for the next start
    reported: list[Queued] = field(default_factory=list)  # progress handed to the writer, oldest first

    def wake(self) -> None:
        self.signal.set()
        self.signal = anyio.Event()


def new_job_id() -> str:
    return uuid.uuid4().hex


class Runner:
    def __init__(
        self,
        store: EventStore,
        executor: Executor,
        config: RunnerConfig | None = None,
        *,
        admission: AdmissionPolicy | None = None,
        bus: EventBus | None = None,
        id_factory: Callable[[], str] = new_job_id,
        board: CapabilityFile | None = None,
        artifacts: ArtifactStore | None = None,
    ) -> None:
        """`board`: where to publish what the executor can run, for processes that admit jobs
        this runner runs (an API process on the same store). `artifacts`: where the executor
        commits videos, for recovery to adopt one committed before a crash and to clear what a
        dead attempt left; None: recovery reruns such attempts."""
        self.store = store
        self.executor = executor
        self.artifacts = artifacts
        self.config = config or RunnerConfig()
        # By default a request is judged against what the executor says it can run (a runner
        # that only submits, for another process's executor, is given that one's contract).
        self.admission = admission or (LiveContract(executor.capabilities) if executor is not None else AdmitAll())
        self.bus = bus or EventBus()
        self._new_id = id_factory
        self.board = board
        self.writer = _GroupWriter(store, self.bus, retry_s=self.config.store_retry_s)
        self._store_lost: StoreUnavailable | None = None
        self._attempts: dict[str, _Attempt] = {}
        self._busy: set[str] = set()  # job ids whose task is alive (cleanup may outlive the attempt)
        self._wake = anyio.Event()
        self._accepting = False
        self.started = False

    # -- the store, off the event loop --------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A store read, off the event loop (reads never wait behind writes), retried while the
        store fails transiently."""
        try:
            return await retrying(lambda: fn(*args, **kwargs), limit_s=self.config.store_retry_s, what="read")
        except StoreUnavailable as exc:
            self._lose_store(exc)
            raise

    async def _append(self, job_id: str, bodies: Sequence[Body], expected_seq: int | None = None) -> JobState:
        state = await self.writer.append(job_id, bodies, expected_seq)
        _log_written(state, bodies)
        return state

    def _lose_store(self, exc: StoreUnavailable) -> None:
        """The store is unusable: admit nothing more; `run` stops every job and raises `exc`."""
        if self._store_lost is None:
            self._store_lost = exc
        self._accepting = False

    async def _stop_on_store_loss(self) -> None:
        await self.writer.failed.wait()
        assert self.writer.failure is not None
        self._lose_store(self.writer.failure)
        raise self.writer.failure

    def _poke(self) -> None:
        self._wake.set()
        self._wake = anyio.Event()

    @property
    def accepting(self) -> bool:
        """Running and admitting jobs (false before `run` has recovered, and once it stops)."""
        return self._accepting

    # -- public API -----------------------------------------------------------------------

    async def submit(
        self,
        request: GenerationRequest,
        *,
        priority: int = 0,
        idempotency_key: str | None = None,
        job_id: str | None = None,
        media: Mapping[str, Media] | None = None,
        remixed_from: str | None = None,
    ) -> JobState:
        """Admit and store a job. Raises `Refused`, `IdempotencyMismatch` or `ShuttingDown`.

        `media` is what is known of the request's uploads, for admission to count their tokens.
        `remixed_from`: the job this one remixes (same parameters, a new prompt), kept in its log.
        """
        if not self._accepting and self.started:
            raise ShuttingDown("h3core is shutting down and admits no new jobs")
        if idempotency_key is not None:
            existing = await self._call(self.store.by_idempotency_key, idempotency_key)
            if existing is not None:
                return self._same_or_mismatch(existing, request, priority, remixed_from, idempotency_key)
        decision = self.admission.decide(request, media)
        if isinstance(decision, Refuse):
            raise Refused(decision)
        bodies: list[Body] = [
            Submitted(
                request=request,
                priority=priority,
                retry=self.config.retry,
                warnings=request.warnings(),
                idempotency_key=idempotency_key,
                remixed_from=remixed_from,
            ),
            Admitted(tokens=decision.tokens),
        ]
        try:
            state = await self._append(job_id or self._new_id(), bodies, expected_seq=0)
        except Conflict:
            if idempotency_key is None:
                raise
            existing = await self._call(self.store.by_idempotency_key, idempotency_key)
            if existing is None:
                raise
            return self._same_or_mismatch(existing, request, priority, remixed_from, idempotency_key)
        self._poke()
        return state

    @staticmethod
    def _same_or_mismatch(
        existing: JobState, request: GenerationRequest, priority: int, remixed_from: str | None, key: str
    ) -> JobState:
        if existing.request == request and existing.priority == priority and existing.remixed_from == remixed_from:
            return existing
        raise IdempotencyMismatch(key, existing.job_id)

    async def cancel(self, job_id: str, reason: str = "cancelled by request") -> JobState:
        """Queued jobs end at once; running ones end once the executor has stopped."""
        while True:
            state = await self._call(self.store.get, job_id)
            if state is None:
                raise KeyError(job_id)
            if state.terminal:
                raise NotCancellable(state)
            if state.status == "running" and state.cancel_requested:
                return state
            body: Body = Cancelled(reason=reason) if state.status != "running" else CancelRequested(reason=reason)
            try:
                state = await self._append(job_id, [body], expected_seq=state.last_seq)
            except (Conflict, IllegalEvent):
                continue  # the job moved on (started, progressed, ended): decide again
            attempt = self._attempts.get(job_id)
            if attempt is not None:
                attempt.cancel = True
                attempt.wake()
            return state

    # -- the loop -------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Recover, then run queued jobs until cancelled. Cancelling this is a shutdown.

        Raises `StoreUnavailable` once the store has failed for `store_retry_s`: every running
        attempt is stopped first (their ends cannot be written: the next start records them)."""
        try:
            async with self.executor.running(), anyio.create_task_group() as writing:
                await writing.start(self._write_shielded)
                writing.start_soon(self._stop_on_store_loss)
                try:
                    resumable = await self._recover()
                    slots = anyio.Semaphore(self.slot_count())
                    async with anyio.create_task_group() as tg:
                        for state in resumable:  # re-attach first: their work is already running
                            await slots.acquire()
                            tg.start_soon(functools.partial(self._job, state, slots, resume=True))
                        self._accepting = True
                        self.started = True
                        task_status.started()
                        tg.start_soon(self._watch_store)
                        if self.board is not None:
                            tg.start_soon(publish_capabilities, self.executor, self.board)
                        if self.config.queue_timeout_s is not None:
                            tg.start_soon(self._expire_queued, self.config.queue_timeout_s)
                        await self._dispatch(tg, slots)
                finally:
                    self._accepting = False
                    self.writer.close()  # every job task has ended: drain what they wrote, stop
        except* StoreUnavailable as group:
            raise self._store_lost or StoreUnavailable.within(group) from None
        finally:
            self._accepting = False

    def slot_count(self) -> int:
        """Attempts run at once: the configured slots, or fewer where the executor bounds its own
        concurrency (ComfyUI's prompts): the jobs beyond it wait queued here, in h3core's order."""
        most = self.executor.capabilities().concurrency
        return self.config.slots if most is None else min(self.config.slots, most)

    async def admit_only(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Accept submits and cancels, group-committed as `run` does, and run no job: for a
        process that only takes requests while another process's runner runs the jobs (it sees
        them in the store). Cancelling this stops admitting."""
        try:
            async with anyio.create_task_group() as writing:
                await writing.start(self._write_shielded)
                writing.start_soon(self._stop_on_store_loss)
                try:
                    self._accepting = True
                    self.started = True
                    task_status.started()
                    await anyio.sleep_forever()
                finally:
                    self._accepting = False
                    self.writer.close()
        except* StoreUnavailable as group:
            raise self._store_lost or StoreUnavailable.within(group) from None

    async def _write_shielded(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.CancelScope(shield=True):
            await self.writer.run(task_status=task_status)

    def _can_resume(self, state: JobState) -> bool:
        return isinstance(self.executor, Resumable) and state.executor == self.executor.name and state.executor_ref is not None

    async def _recover(self) -> list[JobState]:
        """End what a dead or stopped process left running, or return it, marked `Resumed`, where
        the executor re-attaches to its work."""
        # Load fully, then write (docs/design.md §2.3): the list is materialised before any append.
        unfinished = await self._call(self.store.unfinished)
        resumable = []
        now = datetime.now(UTC)
        for state in unfinished:
            verdict = None
            if state.status == "running" and self.artifacts is not None:
                found = await self._call(self.artifacts.committed, state.job_id, state.attempt)
                verdict = judge(state, found)
            if isinstance(verdict, Adopt):  # finished before the crash: its Done, not a rerun
                await self._append(state.job_id, adoption(state, verdict), expected_seq=state.last_seq)
            elif state.status == "running" and self._can_resume(state):
                assert state.executor_ref is not None
                away = max(0.0, (now - state.updated_at).total_seconds())
                resumed = Resumed(attempt=state.attempt, executor_ref=state.executor_ref, after_s=round(away, 3))
                resumable.append(await self._append(state.job_id, [resumed], expected_seq=state.last_seq))
            elif state.status == "running":
                message = f"h3core stopped while attempt {state.attempt} was running"
                if isinstance(verdict, Discard):
                    message += f"; {verdict.reason}"
                if state.cancel_requested:
                    body: Body = Cancelled(reason="cancel was requested; h3core stopped before the executor confirmed")
                else:
                    body = self._failure(state, "interrupted", message, None)
                await self._append(state.job_id, [body], expected_seq=state.last_seq)
                if self.artifacts is not None:  # what the dead attempt left: partial or unverified
                    await self._call(self.artifacts.discard, state.job_id, state.attempt)
            elif state.status == "submitted":  # a log imported without its admission
                decision = self.admission.decide(state.request)
                if isinstance(decision, Refuse):
                    body = Failed(kind="invalid", message=f"refused at recovery: {decision.detail}")
                else:
                    body = Admitted(tokens=decision.tokens)
                await self._append(state.job_id, [body], expected_seq=state.last_seq)
        return resumable

    def _failure(self, state: JobState, kind: FailureKind, message: str, detail: str | None) -> Body:
        """A retry where the job's own policy allows one, else the terminal failure."""
        if not state.cancel_requested and state.retry.allows_retry(kind, state.attempt):
            return AttemptFailed(kind=kind, message=message, detail=detail, attempt=state.attempt, tokens=state.tokens)
        return Failed(kind=kind, message=message, detail=detail, tokens=state.tokens)

    async def _dispatch(self, tg: anyio.abc.TaskGroup, slots: anyio.Semaphore) -> None:
        while True:
            await slots.acquire()
            free = 1
            while slots.value:  # every slot free now is filled from the same read of the queue
                slots.acquire_nowait()
                free += 1
            try:
                claimed = await self._claim(free)
            except BaseException:
                for _ in range(free):
                    slots.release()
                raise
            for _ in range(free - len(claimed)):
                slots.release()
            for state in claimed:
                tg.start_soon(self._job, state, slots)

    async def _claim(self, wanted: int) -> list[JobState]:
        """Mark up to `wanted` queued jobs running (at least one: waits for work). Only jobs in a
        mode the executor can start now are taken; the others wait in the queue, in order."""
        while True:
            wake = self._wake
            caps = self.executor.capabilities()
            runnable = caps.runnable_modes
            if runnable:
                modes = None if set(runnable) >= set(MODES) else frozenset(runnable)
                # Our own jobs can be queued while their task ends (a retry): skip those.
                queued = await self._call(self.store.queued, wanted, frozenset(self._busy), modes)
                if queued:
                    starts = [(s.job_id, [self._start(s, caps)], s.last_seq) for s in queued]
                    outcomes = await self.writer.append_many(starts)
                    for (_, bodies, _), outcome in zip(starts, outcomes, strict=True):
                        if isinstance(outcome, StoreUnavailable):
                            raise outcome
                        if not isinstance(outcome, Exception):
                            _log_written(outcome, bodies)
                    claimed = [o for o in outcomes if not isinstance(o, Exception) and o.status == "running"]
                    if claimed:
                        return claimed
                    # None taken: each was cancelled or taken meanwhile (Conflict), or refused by the
                    # executor (now failed). Look again at once, unless the log itself refused them all.
                    if not all(isinstance(o, IllegalEvent) for o in outcomes):
                        continue
            with anyio.move_on_after(self.config.poll_interval_s):
                await wake.wait()

    def _start(self, state: JobState, caps: Capabilities) -> Body:
        """The event that starts a queued job's next attempt, or fails it if the executor refuses.
        It records where the attempt runs (`caps.identity()`) beside what the executor chose."""
        spec = JobSpec(state.job_id, state.attempt + 1, state.request, state.tokens)
        try:
            self.executor.check(spec)
            return Running(
                attempt=spec.attempt,
                executor=self.executor.name,
                executor_ref=self.executor.reference(spec),
                info={**caps.identity(), **self.executor.info(spec)},
            )
        except Exception as exc:  # the executor cannot even describe this job: end it, go on
            kind, message, detail = classify(exc)
            return Failed(kind="invalid", message=f"the executor refused the job: {message}", detail=detail)

    async def _watch_store(self) -> None:
        """Notice cancels other processes stored for our running jobs."""
        while True:
            await anyio.sleep(self.config.poll_interval_s)
            for job_id, attempt in list(self._attempts.items()):
                if attempt.cancel:
                    continue
                state = await self._call(self.store.get, job_id)
                if state is not None and state.cancel_requested:
                    attempt.cancel = True
                    attempt.wake()

    async def _expire_queued(self, limit_s: float) -> None:
        """Fail jobs that were not started within `limit_s` of their admission."""
        every = min(max(limit_s / 10, self.config.poll_interval_s), 30.0)
        while True:
            await anyio.sleep(every)
            now = datetime.now(UTC)
            caps = self.executor.capabilities()
            for state in await self._call(self.store.unfinished):
                if state.status != "queued" or state.attempt or state.admitted_at is None or state.job_id in self._busy:
                    continue
                waited = (now - state.admitted_at).total_seconds()
                if waited < limit_s:
                    continue
                why = caps.waiting_reason(state.request.mode)
                body = Failed(
                    kind="deadline",
                    message=f"not started within {limit_s:g}s of admission (waited {waited:.0f}s"
                    + (f"; {why})" if why else "; every slot was busy)"),
                )
                try:
                    await self._append(state.job_id, [body], expected_seq=state.last_seq)
                except (Conflict, IllegalEvent):
                    pass  # it moved on meanwhile (started or cancelled)

    # -- one attempt ------------------------------------------------------------------------

    async def _job(self, state: JobState, slots: anyio.Semaphore, *, resume: bool = False) -> None:
        a = _Attempt(state=state, last_touch=anyio.current_time(), resume=resume, cancel=state.cancel_requested)
        self._attempts[state.job_id] = a
        self._busy.add(state.job_id)
        interrupted = False
        try:
            async with anyio.create_task_group() as tg:
                # Shielded: a stop of the runner reaches the executor only through `_watch`, which
                # first asks a resumable executor whether to leave the work running.
                driver = anyio.CancelScope(shield=True)
                tg.start_soon(self._drive, a, driver)
                await self._watch(a, driver, tg)
        except anyio.get_cancelled_exc_class():
            interrupted = True
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await self._end(a, interrupted=interrupted)
                self._attempts.pop(state.job_id, None)
                self._busy.discard(state.job_id)
                slots.release()
                self._poke()

    async def _drive(self, a: _Attempt, scope: anyio.CancelScope) -> None:
        spec = JobSpec(a.state.job_id, a.state.attempt, a.state.request, a.state.tokens, last_step=a.state.step or 0)
        try:
            with scope:
                if a.resume:
                    assert isinstance(self.executor, Resumable) and a.state.executor_ref is not None
                    source = self.executor.resume(spec, a.state.executor_ref)
                else:
                    source = self.executor.run(spec)
                async with aclosing(source) as updates:
                    async for update in updates:
                        a.last_touch = anyio.current_time()
                        if a.result is not None:
                            raise RuntimeError(f"executor yielded {type(update).__name__} after its result")
                        if isinstance(update, Result):
                            if not isinstance(update.artifact, Artifact):
                                raise TypeError(f"executor returned {update.artifact!r}, not an Artifact")
                            a.result = update
                        elif isinstance(update, Progress):
                            if not a.ended:
                                await self._report(a, update)
                        elif not isinstance(update, Heartbeat):
                            raise TypeError(f"executor yielded {update!r}, not Progress, Heartbeat or Result")
                await self._settle(a)  # a refused progress event fails the attempt
            if a.result is None and not scope.cancel_called:
                a.error = ("executor_error", "executor finished without a result", None)
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

    async def _report(self, a: _Attempt, update: Progress) -> None:
        self._settled(a)
        a.reported.append(self.writer.enqueue(a.state.job_id, [update]))
        await self._settle(a, keep=PROGRESS_IN_FLIGHT)

    async def _settle(self, a: _Attempt, *, keep: int = 0, quiet: bool = False) -> None:
        """Wait until at most `keep` of the attempt's progress events are unwritten."""
        while len(a.reported) > keep:
            await a.reported[0].done.wait()
            self._settled(a, quiet=quiet)

    def _settled(self, a: _Attempt, *, quiet: bool = False) -> None:
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
                    _log_written(a.state, item.bodies)

    async def _watch(self, a: _Attempt, driver: anyio.CancelScope, tg: anyio.abc.TaskGroup) -> None:
        """Stop the driver on cancel, stall, deadline or a stop of the runner; end the job if it will not stop."""
        try:
            await self._watch_attempt(a, driver)
        except anyio.get_cancelled_exc_class():
            self._stop_for_shutdown(a, driver)
            raise

    def _stop_for_shutdown(self, a: _Attempt, driver: anyio.CancelScope) -> None:
        """h3core stops while the attempt runs: a resumable executor may leave its work running
        for the next start (nothing is written then), else it is stopped and recorded interrupted.
        An attempt already being stopped (a cancel, a stall) is stopped as it was."""
        a.stopping = True
        # A lost store stops the work too: this process is going away without a way to record it.
        resumable = self._store_lost is None and self._can_resume(a.state)
        if not driver.cancel_called and not a.cancel and not a.driver_done and resumable:
            assert isinstance(self.executor, Resumable) and a.state.executor_ref is not None
            spec = JobSpec(a.state.job_id, a.state.attempt, a.state.request, a.state.tokens, last_step=a.state.step or 0)
            a.detached = self.executor.detach(spec, a.state.executor_ref)
        driver.cancel()

    async def _watch_attempt(self, a: _Attempt, driver: anyio.CancelScope) -> None:
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
        with anyio.move_on_after(cfg.cancel_grace_s):
            while not a.driver_done:
                signal = a.signal
                await signal.wait()
        if not a.driver_done:
            # The executor ignores cancellation: the job ends anyway; its cleanup runs on.
            await self._end(a, grace_expired=True)

    def _outcome(self, a: _Attempt, *, interrupted: bool, grace_expired: bool) -> Body | None:
        """The event that ends the attempt; None for one detached at a stop (resumed at the next start)."""
        state = a.state
        if a.result is not None and not grace_expired:
            return Done(artifact=a.result.artifact, tokens=state.tokens)
        if a.detached:
            return None  # a cancel requested meanwhile is in the log: the resumed attempt honours it
        why = None  # why the runner stopped the attempt, if it did
        if a.cancel:
            why = "cancelled by request"
        elif a.stop_reason == "stalled":
            why = f"no progress for {self.config.stall_timeout_s:g}s (last step {state.step}/{state.total})"
        elif a.stop_reason == "deadline":
            why = f"attempt {state.attempt} ran past its {self.config.attempt_deadline_s:g}s deadline"
        elif interrupted or a.stopping:
            why = "h3core was stopped while the job ran"
        if why is not None and grace_expired:
            # Ended without the executor's word that its work stopped: never `cancelled` then.
            msg = f"{why}, but the executor did not stop within {self.config.cancel_grace_s:g}s: its work may still run"
            return self._failure(state, "stop_unconfirmed", msg, None)
        if why is not None and a.error is not None and a.error[0] == "stop_unconfirmed":
            kind, message, detail = a.error
            return self._failure(state, kind, f"{why}, but {message}", detail)
        if a.cancel:
            return Cancelled(reason=why or "")
        if a.stop_reason is not None:
            return self._failure(state, a.stop_reason, why or "", None)
        if why is not None:
            return self._failure(state, "interrupted", why, None)
        if a.error is not None:
            return self._failure(state, *a.error)
        return self._failure(state, "executor_error", "executor finished without a result", None)

    async def _end(self, a: _Attempt, *, interrupted: bool = False, grace_expired: bool = False) -> None:
        if a.ended:
            return
        a.ended = True
        # Shielded wherever it is called from: once `ended` is set, the write must happen even if
        # the runner is being cancelled this very moment (the stateful test found that window).
        with anyio.CancelScope(shield=True):
            await self._write_end(a, interrupted=interrupted, grace_expired=grace_expired)

    async def _write_end(self, a: _Attempt, *, interrupted: bool, grace_expired: bool) -> None:
        await self._settle(a, quiet=True)  # the terminal event comes after every progress event
        body = self._outcome(a, interrupted=interrupted, grace_expired=grace_expired)
        try:
            await self._write_outcome(a, body, interrupted=interrupted, grace_expired=grace_expired)
        except StoreUnavailable as exc:
            log.error(
                "job %s: its end (%s) cannot be written, the store is unusable; it stays %s until the next start ends it",
                a.state.job_id,
                body.type if body else "none",
                a.state.status,
                extra={"job_id": a.state.job_id, "attempt": a.state.attempt, "error": str(exc)},
            )

    async def _write_outcome(self, a: _Attempt, body: Body | None, *, interrupted: bool, grace_expired: bool) -> None:
        while body is not None:
            try:
                a.state = await self._append(a.state.job_id, [body], expected_seq=a.state.last_seq)
                return
            except Conflict:
                # Someone appended meanwhile (a cancel request): reload and decide again.
                current = await self._call(self.store.get, a.state.job_id)
                if current is None or current.terminal:
                    return
                if current.cancel_requested:
                    a.cancel = True
                a.state = current
                body = self._outcome(a, interrupted=interrupted, grace_expired=grace_expired)


def _log_written(state: JobState, bodies: Sequence[Body]) -> None:
    """One record per event the runner wrote, with the job and attempt as fields: a job's life
    at INFO (its steps at DEBUG), its failures at WARNING."""
    for body in bodies:
        extra: dict[str, Any] = {"job_id": state.job_id, "attempt": state.attempt, "event": body.type}
        match body:
            case Admitted():
                extra |= {"tokens": body.tokens, "priority": state.priority, "mode": state.request.mode}
                log.info("job %s admitted (%s tokens)", state.job_id, body.tokens, extra=extra)
            case Running():
                extra |= {"executor": body.executor, "executor_ref": body.executor_ref}
                log.info("job %s started: attempt %d on %s", state.job_id, body.attempt, body.executor, extra=extra)
            case Resumed():
                extra |= {"executor": state.executor, "executor_ref": body.executor_ref}
                log.info(
                    "job %s resumed: attempt %d, %gs after h3core stopped", state.job_id, body.attempt, body.after_s, extra=extra
                )
            case Progress():
                extra |= {"step": body.step, "total": body.total}
                log.debug("job %s step %d/%d", state.job_id, body.step, body.total, extra=extra)
            case Done():
                extra |= {"path": body.artifact.path, "bytes": body.artifact.bytes}
                log.info("job %s done", state.job_id, extra=extra)
            case Recovered():
                extra |= {"path": body.artifact.path}
                log.info("job %s recovered: attempt %d had committed its video", state.job_id, body.attempt, extra=extra)
            case AttemptFailed():
                extra |= {"attempt": body.attempt, "kind": body.kind}
                log.warning(
                    "job %s attempt %d failed (%s), queued again: %s",
                    state.job_id,
                    body.attempt,
                    body.kind,
                    body.message,
                    extra=extra,
                )
            case Failed():
                extra |= {"kind": body.kind}
                log.warning("job %s failed (%s): %s", state.job_id, body.kind, body.message, extra=extra)
            case CancelRequested():
                log.info("job %s: cancel requested (%s)", state.job_id, body.reason, extra=extra)
            case Cancelled():
                log.info("job %s cancelled: %s", state.job_id, body.reason, extra=extra)
            case _:  # submitted: its admission (or refusal) follows in the same append
                log.debug("job %s %s", state.job_id, body.type, extra=extra)
