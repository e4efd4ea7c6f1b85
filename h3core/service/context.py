"""What a request handler may touch: the service's parts, made once per process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import anyio
import anyio.abc

from h3core.adapters.artifacts import LocalArtifactStore
from h3core.adapters.profiles import builtin_profiles, load_profile_ref
from h3core.adapters.store.location import is_postgres_url, open_store_at, runner_lock_for
from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.adapters.uploads import DEFAULT_LIMITS, LocalUploadStore
from h3core.domain.webhooks import Allow
from h3core.runtime.bus import EventBus
from h3core.runtime.contracts import CapabilityFile, LiveContract, ServiceContract, capabilities_path
from h3core.runtime.delivery_process import DeliveryProcess, delivery_for
from h3core.runtime.executor_factory import make_executor
from h3core.runtime.fleet import FleetContract
from h3core.runtime.runner import Runner
from h3core.runtime.settings import Settings
from h3core.runtime.store_retry import StoreUnavailable
from h3core.runtime.tail import StoreTail
from h3core.service.metrics import Metrics
from h3core.service.readiness import Readiness

log = logging.getLogger("h3core.service")


@dataclass
class Service:
    """Everything a request handler may touch, made once per process."""

    settings: Settings
    store: SQLiteEventStore
    artifacts: LocalArtifactStore
    uploads: LocalUploadStore
    # Admission and /v1/ceilings: the profile and what the executor can run (on PostgreSQL, what
    # any live runner node can run).
    contract: ServiceContract
    runner: Runner  # in the api role, only for submitting and cancelling: its jobs run elsewhere
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
    # Set when the runner stopped because the store is unusable; `on_fatal` then ends the process.
    fatal: StoreUnavailable | None = None
    on_fatal: Callable[[], None] | None = None
    _runner_scope: anyio.CancelScope | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    readiness: Readiness = field(init=False)  # /readyz's looks at the disk, reused for `ready_cache` seconds

    def __post_init__(self) -> None:
        runner_lock = runner_lock_for(self.settings.db) if self.settings.role == "api" else None  # another process
        self.readiness = Readiness(self.store, runner_lock, self.settings.ready_cache)

    @property
    def webhook_allow(self) -> Allow:
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
        self._loop = asyncio.get_running_loop()
        try:
            with anyio.CancelScope() as scope:
                self._runner_scope = scope
                async with anyio.create_task_group() as tg:
                    if self.tail is not None:
                        await tg.start(self.tail.run)
                    if self.settings.role == "api":
                        await self.runner.admit_only(task_status=task_status)
                    else:
                        await self.runner.run(task_status=task_status)
                    tg.cancel_scope.cancel()  # the tail, once the runner has stopped
        except* StoreUnavailable as group:
            if not self.runner.started:
                raise  # at start-up: the service does not start
            self.fatal = StoreUnavailable.within(group)
            self.stopping = True
            if self.on_fatal is not None:
                self.on_fatal()
        self.bus.close()  # after the runner's last events (the interruptions) went out


def fleet_interval(settings: Settings) -> float:
    """How often a node reads the others' statements: well within a lease (a beat is a third)."""
    return min(1.0, settings.lease / 3)


def build_service(settings: Settings) -> Service:
    store = open_store_at(settings.db, **settings.store_options())
    artifacts = LocalArtifactStore(settings.artifacts)
    uploads = LocalUploadStore(
        settings.uploads,
        limits={k: min(v, settings.max_upload_bytes) for k, v in DEFAULT_LIMITS.items()},
        max_pixels=settings.max_upload_pixels,
    )
    for name, size in uploads.sweep_parts():  # uploads a dead process was receiving: never finished
        log.warning("removed %s (%d bytes): an upload cut off before it was stored", name, size, extra={"file": name})
    explicit = load_profile_ref(settings.capacity_profile) if settings.capacity_profile is not None else None
    shared = is_postgres_url(settings.db)  # runner nodes state what they can run in the store
    if settings.role == "api":  # no executor here: the runner process has it, and states what it can run
        contract: ServiceContract
        if shared:  # every live node's statement: the request goes to the queue if one can run it
            contract = FleetContract(store, builtin_profiles(), profile=explicit, interval_s=fleet_interval(settings))
        else:
            board = CapabilityFile(capabilities_path(settings.db), interval_s=settings.tail_interval)
            contract = LiveContract(board.read, builtin_profiles(), profile=explicit)
        runner = Runner(store, None, settings.runner_config(), admission=contract)  # type: ignore[arg-type]
        bus = EventBus()
        tail = StoreTail(store, bus, interval_s=settings.tail_interval)
        return Service(settings, store, artifacts, uploads, contract, runner, Metrics(store), bus, tail)
    executor = make_executor(settings, artifacts, uploads)
    local = LiveContract(executor.capabilities, builtin_profiles(), profile=explicit)
    # On PostgreSQL: this node's executor, and every other live node's statement.
    contract = (
        FleetContract(store, builtin_profiles(), profile=explicit, local=local, interval_s=fleet_interval(settings))
        if shared
        else local
    )
    # An API process beside this one admits against what this executor states it can run.
    board = CapabilityFile(capabilities_path(settings.db))
    runner = Runner(store, executor, settings.runner_config(), admission=contract, board=board, artifacts=artifacts)
    metrics = Metrics(store, executor)
    webhooks = delivery_for(settings)  # SettingsError: endpoints without a secret
    if webhooks is not None:
        metrics.watch_webhooks(webhooks)
    if not settings.store_options():
        return Service(settings, store, artifacts, uploads, contract, runner, metrics, runner.bus, webhooks=webhooks)
    # One node among several: its live streams and metrics follow the store (every node's events,
    # each once, in store order), woken by the store's notifications, not this runner's bus alone.
    bus = EventBus()
    tail = StoreTail(store, bus, interval_s=settings.tail_interval)
    return Service(settings, store, artifacts, uploads, contract, runner, metrics, bus, tail, webhooks=webhooks)
