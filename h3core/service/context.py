"""What a request handler may touch: the service's parts, made once per process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import anyio
import anyio.abc

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.store.base import EventStore
from h3core.adapters.store.location import runner_lock_for
from h3core.adapters.uploads import LocalUploadStore
from h3core.domain.webhooks import Allow
from h3core.runtime.admission import ServiceAdmission
from h3core.runtime.bus import EventBus
from h3core.runtime.delivery_process import DeliveryProcess
from h3core.runtime.node import build_node
from h3core.runtime.runner import Runner
from h3core.runtime.settings import Settings
from h3core.runtime.store_retry import StoreUnavailable
from h3core.runtime.submissions import Submissions
from h3core.runtime.tail import StoreTail
from h3core.service.metrics import Metrics
from h3core.service.readiness import Readiness

log = logging.getLogger("h3core.service")

# How long a process whose runner failed keeps answering (503) before it exits (`Service.run_runner`).
FATAL_LINGER_S = 1.0


@dataclass
class Service:
    """Everything a request handler may touch, made once per process."""

    settings: Settings
    store: EventStore
    artifacts: ArtifactStore
    uploads: LocalUploadStore
    # Admission and /v1/ceilings: the profile and what the executor can run (on PostgreSQL, what
    # any live runner node can run).
    contract: ServiceAdmission
    submissions: Submissions  # every submit and cancel, whichever dialect it came in
    runner: Runner | None  # None in the api role: its jobs run in another process
    metrics: Metrics
    bus: EventBus  # every event this process learns of: the runner's, or the store tail's
    # What other processes store reaches `bus` through it: the api role's, and a PostgreSQL node's.
    tail: StoreTail | None = None
    # Delivers jobs' webhooks where the runner runs (roles all and runner), with H3_WEBHOOK_SECRET
    # set: a child process of this one (h3core.runtime.delivery_process).
    webhooks: DeliveryProcess | None = None
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    # Previews (thumbnails, spritesheets) decode video on worker threads: two at once at most, so
    # a burst of them cannot take every thread the service has.
    previews: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(2))
    stopping: bool = False
    # Set when a task the process needs failed after start-up (the runner, the tail, the
    # submissions: `StoreUnavailable` when the store is unusable); `on_fatal` then ends the process.
    fatal: Exception | None = None
    on_fatal: Callable[[], None] | None = None
    _runner_scope: anyio.CancelScope | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    # What /readyz reports of the store and the runner process or nodes: looked at by `readiness.run`
    # (the app starts it) every `ready_cache` seconds; /readyz reads it from memory.
    readiness: Readiness = field(init=False)

    def __post_init__(self) -> None:
        api = self.settings.role == "api"
        runner_lock = runner_lock_for(self.settings.db) if api else None  # another process
        self.readiness = Readiness(self.store, runner_lock, self.settings.ready_cache, self.settings.ready_stale, api=api)

    @property
    def webhook_allow(self) -> Allow:
        """What `H3_WEBHOOKS_ALLOW` lets a job's webhook reach besides public addresses: host names and
        address ranges."""
        return Allow(self.settings.webhooks_allow)

    async def run_webhooks(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Deliver webhooks until cancelled (nothing to do without a dispatcher). A fault in the
        delivery code stops the deliveries, logged, not the service: they resume from the log
        on the next start."""
        if self.webhooks is None:
            task_status.started()
            return
        try:
            await self.webhooks.run(task_status=task_status)
        except Exception:
            log.exception("webhook deliveries stopped; they go on from where they were on the next start")

    def begin_shutdown(self) -> None:
        """Stop now (SIGTERM): stop admitting, stop the runner, which records running jobs as
        interrupted (or leaves them running for the next start, where the executor detaches them:
        ComfyUI's prompts), then end the live streams, so open connections do not hold the stop up.
        Safe to call from a signal handler."""
        self.stopping = True
        if self._loop is not None and self._runner_scope is not None:
            self._loop.call_soon_threadsafe(self._runner_scope.cancel)

    async def run_runner(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the runner (in the api role, the submissions alone) and the store tail until cancelled or
        `begin_shutdown`; `task_status` is started once the runner has. Any of them failing after
        start-up (a store unusable for longer than the retry limit, a bug), or ending unasked, is
        fatal: recorded in `fatal`, and the process ended through `on_fatal` `FATAL_LINGER_S` later
        (at start-up it raises). The bus is closed after the runner's last events."""
        self._loop = asyncio.get_running_loop()
        try:
            with anyio.CancelScope() as scope:
                self._runner_scope = scope
                async with anyio.create_task_group() as tg:
                    if self.tail is not None:
                        await tg.start(self.tail.run)
                    if self.runner is None:
                        await self.submissions.run(task_status=task_status)
                    else:
                        await self.runner.run(task_status=task_status)
                    tg.cancel_scope.cancel()  # the tail, once the runner has stopped
            if not self.stopping:  # nothing asked it to stop: a process that would serve 503 forever
                raise RuntimeError("the runner stopped by itself")
        except* Exception as group:
            if not self.submissions.started:
                raise  # at start-up: the service does not start
            self.fail(_cause(group), "the runner")
        self.bus.close()  # after the runner's last events (the interruptions) went out
        if self.fatal is not None:
            await self._end_process()

    def fail(self, exc: Exception, what: str) -> None:
        """`what` failed past start-up with `exc`: the process cannot do its job. Record it (the first
        cause is kept), stop admitting and stop the runner; `run_runner` ends the process."""
        if self.fatal is None:
            self.fatal = exc
            if not isinstance(exc, StoreUnavailable):  # the store's loss is logged where it was given up on
                log.error("%s failed; h3core stops: %s", what, exc, exc_info=exc)
        self.stopping = True
        if self._runner_scope is not None:
            self._runner_scope.cancel()

    async def keep(self, what: str, work: Callable[[], Awaitable[object]]) -> None:
        """`work()`, a task the process needs beside the runner (the metrics' follower): its failure
        is fatal, as the runner's is."""
        try:
            await work()
        except Exception as exc:
            self.fail(exc, what)
            if self.bus.closed:  # the runner's task has ended already: it will not end the process
                await self._end_process()

    def health(self) -> str | None:
        """Why the process cannot do its job (/healthz: a liveness probe restarts it), or None. It
        cannot once `fatal` is set: the runner's task (runner, tail, submissions) or another the
        process needs failed, or ended unasked, or the store failed past the retry limit (every
        loop that reads it gives up there)."""
        return None if self.fatal is None else f"h3core is stopping: {self.fatal}"

    async def _end_process(self) -> None:
        """End the process through `on_fatal`, `FATAL_LINGER_S` from now, answering 503 on /healthz
        and /readyz meanwhile: a client or probe polling them sees why before the port closes."""
        await anyio.sleep(FATAL_LINGER_S)
        if self.on_fatal is not None:
            self.on_fatal()


def _cause(group: BaseExceptionGroup) -> Exception:
    """What ended a task group: its `StoreUnavailable` where there is one (the others follow from
    it), else its first exception."""
    unusable, _ = group.split(StoreUnavailable)
    exc: BaseException = unusable if unusable is not None else group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, Exception)  # `except* Exception` gives only those
    return exc


def build_service(settings: Settings) -> Service:
    """The service's parts: the node `settings` describe (`h3core.runtime.node`), and its metrics."""
    node = build_node(settings)
    for name, size in node.files.uploads.sweep_parts():  # uploads a dead process was receiving: never finished
        log.warning("removed %s (%d bytes): an upload cut off before it was stored", name, size, extra={"file": name})
    metrics = Metrics(node.store, node.executor)
    if node.webhooks is not None:
        metrics.watch_webhooks(node.webhooks)
    files = node.files
    return Service(
        settings,
        node.store,
        files.artifacts,
        files.uploads,
        node.contract,
        node.submissions,
        node.runner,
        metrics,
        node.bus,
        node.tail,
        webhooks=node.webhooks,
    )
