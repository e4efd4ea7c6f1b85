"""`Jobs`: h3core embedded in another program, with no HTTP and no process of its own.

    async with Jobs("jobs.db", FakeExecutor(artifacts), artifacts=artifacts) as jobs:
        job = await jobs.submit(GenerationRequest(prompt="a red fox", frames=24, steps=4))
        async for event in jobs.follow(job.job_id):
            ...
        done = await jobs.result(job.job_id)

Entering opens the store (a SQLite path, taking the store's runner lock as `serve` and `worker`
do, or an `EventStore` the caller owns, or None for one in memory) and runs the runner in a task
group until the block exits: leaving is a shutdown (running attempts end `interrupted`, or are
left for the next start to resume where the executor can). Every store call from these methods
runs on a worker thread, so none blocks the caller's event loop.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import anyio

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.lock import RunnerLock
from h3core.adapters.store.base import EventStore, UnknownJob
from h3core.adapters.store.location import open_store_at, parse_location, runner_lock_for
from h3core.adapters.store.memory import MemoryEventStore
from h3core.adapters.uploads import UploadStore
from h3core.domain.admission import AdmissionPolicy
from h3core.domain.events import Event
from h3core.domain.request import GenerationRequest
from h3core.domain.state import JobState, apply
from h3core.domain.webhooks import WebhookTarget
from h3core.executors.base import Executor
from h3core.runtime.config import RunnerConfig
from h3core.runtime.errors import ShuttingDown
from h3core.runtime.follow import follow
from h3core.runtime.runner import Runner
from h3core.runtime.settings import default_node_id
from h3core.runtime.submissions import Submission, WebhookPolicy
from h3core.runtime.subscription import Start, Subscription

__all__ = ["JobCancelled", "JobFailed", "JobNotDone", "Jobs"]

T = TypeVar("T")


class JobNotDone(Exception):
    """`Jobs.result` of a job that ended without a video; `state` is how it ended."""

    def __init__(self, state: JobState, message: str) -> None:
        super().__init__(message)
        self.state = state


class JobFailed(JobNotDone):
    """The job failed; `state.error` says how (its kind, message and detail)."""

    def __init__(self, state: JobState) -> None:
        err = state.error
        why = f"{err.kind}: {err.message}" if err is not None else "no error recorded"
        super().__init__(state, f"job {state.job_id} failed ({why}); `h3core replay {state.job_id}` shows its log")


class JobCancelled(JobNotDone):
    """The job was cancelled before it finished."""

    def __init__(self, state: JobState) -> None:
        super().__init__(state, f"job {state.job_id} was cancelled; its log says by whom and why")


class Jobs:
    """A store, an executor and the runner between them, for the length of an `async with`."""

    def __init__(
        self,
        store: str | Path | EventStore | None,
        executor: Executor,
        *,
        artifacts: ArtifactStore | None = None,
        config: RunnerConfig | None = None,
        admission: AdmissionPolicy | None = None,
        uploads: UploadStore | None = None,
        webhooks: WebhookPolicy | None = None,
        node: str | None = None,
    ) -> None:
        """`store`: a SQLite file or a postgresql:// URL (opened and closed here), an open `EventStore` (left open), or
        None (in memory, gone at exit). `artifacts`: where the executor commits videos, so that a
        restart adopts a video committed before a crash; `admission`: by default, what the
        executor says it can run. `uploads`: where the uploads a request names are kept;
        `webhooks`: whether a request may name a webhook, and where to (`WebhookPolicy`; by default
        none: the deliveries are `serve`'s or `worker`'s, with H3_WEBHOOK_SECRET). `node`: on a
        postgresql:// URL, this process's node id (by default what `serve` takes: H3_NODE, else
        the host's name)."""
        self._store_arg = store
        self._executor = executor
        self._artifacts = artifacts
        self._config = config or RunnerConfig()
        self._admission = admission
        self._uploads = uploads
        self._webhooks = webhooks
        self._node = node
        self._exits: AsyncExitStack | None = None
        self._runner: Runner | None = None

    # -- the lifetime ---------------------------------------------------------------------

    async def __aenter__(self) -> Jobs:
        if self._exits is not None:
            raise RuntimeError("this Jobs is already open; make a new one")
        exits = AsyncExitStack()
        await exits.enter_async_context(self._running())
        self._exits = exits
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        exits, self._exits = self._exits, None
        assert exits is not None
        return await exits.__aexit__(exc_type, exc, tb)

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        lock: RunnerLock | None = None
        owned = isinstance(self._store_arg, str | Path)
        if owned:
            where = parse_location(self._store_arg)  # type: ignore[arg-type]
            lock_path = runner_lock_for(where)  # None for PostgreSQL: runner nodes share its queue
            if lock_path is not None:
                lock = RunnerLock(lock_path)
                lock.acquire()  # LockHeld: another runner (a serve, a worker, a Jobs) has this store
        try:
            if owned:
                # On PostgreSQL this process is a runner node among any others, named as `serve`
                # names one (a restart is the same node, and takes its attempts back at once).
                node = {"node": self._node or default_node_id()} if lock_path is None else {}
                store: EventStore = await anyio.to_thread.run_sync(functools.partial(open_store_at, where, **node))
            else:
                store = self._store_arg if self._store_arg is not None else MemoryEventStore()  # type: ignore[assignment]
            try:
                runner = Runner(
                    store,
                    self._executor,
                    self._config,
                    admission=self._admission,
                    artifacts=self._artifacts,
                    uploads=self._uploads,
                    webhooks=self._webhooks,
                )
                try:
                    async with anyio.create_task_group() as tg:
                        await tg.start(runner.run)
                        self._runner = runner
                        try:
                            yield
                        finally:
                            tg.cancel_scope.cancel()  # the runner's shutdown
                finally:
                    # After its last events, or its failure (the store lost): followers end, rather
                    # than read a failing store again and again (`follow`).
                    runner.bus.close()
            finally:
                self._runner = None
                if owned:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(store.close)
        finally:
            if lock is not None:
                lock.release()

    @property
    def runner(self) -> Runner:
        """The runner while this `Jobs` is open; `RuntimeError` outside its `async with`."""
        if self._runner is None:
            raise RuntimeError("Jobs is not open: use it as `async with Jobs(...) as jobs:`")
        return self._runner

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(lambda: fn(*args))

    # -- the API --------------------------------------------------------------------------

    async def submit(
        self,
        request: GenerationRequest,
        *,
        priority: int = 0,
        idempotency_key: str | None = None,
        webhook: WebhookTarget | None = None,
    ) -> JobState:
        """Admit and store a job; its state as stored (`job_id`, `status` queued). Raises
        `InvalidSubmission` (a webhook or an upload it may not name), `Refused` (admission's
        reason and ceiling), `IdempotencyMismatch` or `ShuttingDown`. `submission` says also
        whether the call created the job."""
        return (await self.submission(request, priority=priority, idempotency_key=idempotency_key, webhook=webhook)).state

    async def submission(
        self,
        request: GenerationRequest,
        *,
        priority: int = 0,
        idempotency_key: str | None = None,
        webhook: WebhookTarget | None = None,
    ) -> Submission:
        """`submit`, answering also whether this call created the job (False: an idempotent
        replay of the job an earlier call with the same key created)."""
        return await self.runner.submissions.submit(request, priority=priority, idempotency_key=idempotency_key, webhook=webhook)

    async def get(self, job_id: str) -> JobState:
        """The job's state now; `UnknownJob` if there is no such job."""
        state = await self._read(self.runner.store.get, job_id)
        if state is None:
            raise UnknownJob(job_id)
        return state

    async def events(self, job_id: str, after_seq: int = 0) -> list[Event]:
        """The job's stored events after `after_seq`, in order."""
        await self.get(job_id)
        return await self._read(self.runner.store.events, job_id, after_seq)

    async def follow(self, job_id: str, after_seq: int = 0) -> AsyncIterator[Event]:
        """Every event of the job after `after_seq`, stored ones first, then each as it is
        written, ending after the terminal one (or when the runner stops). Nothing is missed:
        it subscribes before it reads the store, and reads the store again whenever the live
        feed dropped it or skipped (events another process stored reach it that way)."""
        await self.get(job_id)
        async for e in follow(
            self.runner.bus, self.runner.store.events, job_id, after_seq, resync_s=self._config.poll_interval_s
        ):
            if e is not None:  # None: a quiet spell, after which the store was read again
                yield e

    async def wait(self, job_id: str) -> JobState:
        """The job's final state (done, failed or cancelled), once it has one. Raises
        `ShuttingDown` if this `Jobs` closes first."""
        state: JobState | None = None
        async for e in self.follow(job_id):
            state = apply(state, e)  # the state the log folds to, with no read after the end
        if state is None or not state.terminal:
            status = state.status if state is not None else "unknown"
            raise ShuttingDown(f"the runner stopped before job {job_id} ended (it is {status})")
        return state

    async def result(self, job_id: str) -> JobState:
        """The job's final state if it is done (`state.artifact` is its video); `JobFailed` or
        `JobCancelled` otherwise, with the state attached."""
        state = await self.wait(job_id)
        if state.status == "failed":
            raise JobFailed(state)
        if state.status == "cancelled":
            raise JobCancelled(state)
        return state

    def subscribe(self, name: str, *, start: Start = "beginning") -> Subscription:
        """A named, durable subscription to every job's events in store order: `await
        sub.run(handler)` hands each event to `handler`, at least once, and keeps its place in
        the store, so a restart (of this `Jobs` on the same store) goes on where it was. `start`:
        where a name never run before begins, at the first event stored or at the next one."""
        return Subscription(self.runner.store, self.runner.bus, name, start=start, resync_s=self._config.poll_interval_s)

    async def reprioritize(self, job_id: str, priority: int) -> JobState:
        """Change a queued job's priority (higher starts first; -100 to 100). Raises `UnknownJob`, or
        `NotQueued` once it has started or ended."""
        try:
            return await self.runner.submissions.reprioritize(job_id, priority)
        except KeyError:
            raise UnknownJob(job_id) from None

    async def cancel(self, job_id: str, reason: str = "cancelled by request") -> JobState:
        """Cancel a job: a queued one ends at once, a running one once its executor has stopped
        (`wait` for that). Raises `UnknownJob`, or `NotCancellable` if it has already ended."""
        try:
            return await self.runner.cancel(job_id, reason)
        except UnknownJob:
            raise
        except KeyError:
            raise UnknownJob(job_id) from None
