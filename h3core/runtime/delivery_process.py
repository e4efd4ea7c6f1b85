"""Webhooks delivered by a process of their own, beside the process that runs the jobs.

The process that runs the jobs (roles `all` and `runner`, and `h3core worker`: on SQLite the one
holding the runner lock; on PostgreSQL every runner node's, of which one at a time holds the
store's delivery turn while the others stand by to take it over) starts `DeliveryProcess`: a
child Python process that runs the `WebhookDispatcher` over the same store, following the log by
reading it every `resync_s` (no bus crosses processes). Delivery's CPU (HTTP, TLS, signing, JSON,
reading the log) is then none of the runner's: a process of one thread cannot give an event
loop's time to a hundred sends a second and lose nothing (bench.throughput.webhooks: 54 % of the
runner's jobs/s in-process).

The child's stdin is its lifeline: the parent never writes after the config line, and the child
stops (its position saved) when stdin ends, as it does when the parent exits, however it exits
(kill -9 included), so no delivering process outlives the runner that started it. The child
prints its outcome counts as JSON lines; the parent adds them to `outcomes` (/metrics). A child
that dies is started again after `restart_s`: it goes on from the saved position.

On a store shared by nodes the child delivers only while it holds the delivery turn, a lease of
`turn_lease_s` that it renews every third of it (`h3core.adapters.store.nodes`, Turns); one that
stands by tries for the turn as often. A child frozen or cut off from the store past its lease
sends and saves nothing more (the dispatcher checks the turn before each) and exits; its parent
starts another, which waits for the turn while another node's child delivers. The child's store
reads and writes are tried again on transient failures (a restarted server, ended sessions) for
`store_retry_s`, renewals for as long as the lease lasts; past that it exits 1, one line logged,
and is started again. It always exits once delivery ends: a worker thread still blocked (on the
lifeline, or on a store that hangs) never keeps it alive.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections import Counter
from collections.abc import Sequence
from functools import partial
from subprocess import PIPE
from typing import TYPE_CHECKING, Literal

import anyio
from anyio.abc import Process, TaskStatus
from pydantic import BaseModel, Field, SecretStr

from h3core.adapters.store.nodes import Turn, TurnLost, WithTurns
from h3core.domain.webhooks import Endpoint
from h3core.runtime.logs import configure
from h3core.runtime.settings import Settings, endpoint_secrets, secret_list
from h3core.runtime.store_retry import StoreUnavailable, retrying, transient

if TYPE_CHECKING:
    from h3core.runtime.webhooks import WebhookDispatcher

__all__ = ["DeliveryConfig", "DeliveryProcess", "delivery_for", "main"]

log = logging.getLogger("h3core.webhooks")

SECRET_ENV = "H3_WEBHOOK_SECRET"
REPORT_EVERY_S = 0.25
TURN = "webhooks"  # the one delivery turn of a deployment on a shared store
STOP_GRACE_S = 10.0
RENEW_RETRY_S = 0.1  # the pause between tries of a renewal that failed, while the lease lasts


class DeliveryConfig(BaseModel):
    """What the delivering process needs, handed over on its stdin (secrets go in its environment)."""

    db: str
    endpoints: list[Endpoint] = []
    allow: list[str] = []
    resync_s: float = 0.05  # how often the log is read for new events
    # A store shared by nodes: how long the delivery turn lasts unrenewed (renewed, and tried for
    # by a node standing by, every third of it).
    turn_lease_s: float = Field(default=5.0, gt=0)
    store_retry_s: float = Field(default=30.0, gt=0)  # how long a failing store is tried again before the child exits
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"


class DeliveryProcess:
    """Starts and keeps the delivering child process; `outcomes` adds up what it reports."""

    def __init__(self, config: DeliveryConfig, secrets: Sequence[str], *, restart_s: float = 1.0) -> None:
        """`secrets`: the deployment's (none: only endpoints with their own are sent to)."""
        self.config = config
        self.secrets = list(secrets)
        self.restart_s = restart_s
        self.outcomes: Counter[str] = Counter()  # over every child this one started
        self.starts = 0
        self.pid: int | None = None  # the child's, while one runs
        # Whether the child delivers now: False while it stands by for the turn of a store shared
        # by nodes (another node delivers), None before it says.
        self.delivering: bool | None = None
        self._started = False

    def _env(self) -> dict[str, str]:
        return {**os.environ, SECRET_ENV: ",".join(self.secrets)}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep a child delivering until cancelled; started once the first child is (not waiting
        for its imports: the place it starts from is in the store, whenever it reads it). A fault
        in delivery ends the child, logged, not the caller; the next goes on where the log says."""
        pause = self.restart_s
        while True:
            began = anyio.current_time()
            ended = await self._one(task_status)
            pause = self.restart_s if anyio.current_time() - began > 60 else min(2 * pause, 60.0)
            log.warning("the webhook delivery process ended (%s); starting another in %.1f s", ended, pause)
            await anyio.sleep(pause)

    async def _one(self, task_status: TaskStatus[None]) -> str:
        """One child, until it ends (its exit status) or this is cancelled (the child stopped first)."""
        process = await anyio.open_process(
            [sys.executable, "-m", "h3core.runtime.delivery_process"], stdin=PIPE, stdout=PIPE, stderr=None, env=self._env()
        )
        self.starts += 1
        self.pid = process.pid
        assert process.stdin is not None and process.stdout is not None
        base = self.outcomes.copy()
        try:
            if not self._started:
                self._started = True
                task_status.started()
            try:
                await process.stdin.send((self.config.model_dump_json() + "\n").encode())
            except (anyio.BrokenResourceError, OSError):
                return f"ended before its config was read: exit status {await process.wait()}"
            buffered = b""
            async for chunk in process.stdout:
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    report = json.loads(line)
                    if "delivering" in report:
                        self.delivering = bool(report["delivering"])
                    if "outcomes" in report:  # each count only grows: set in place, never cleared (/metrics reads it)
                        for outcome, n in (base + Counter(report["outcomes"])).items():
                            self.outcomes[outcome] = n
            return f"exit status {await process.wait()}"
        finally:
            self.delivering = None
            with anyio.CancelScope(shield=True):
                await _stop(process)

    def __repr__(self) -> str:
        return f"DeliveryProcess(db={self.config.db!r}, starts={self.starts})"


def delivery_for(settings: Settings) -> DeliveryProcess | None:
    """The delivering process a process that runs jobs starts beside its runner; None without
    H3_WEBHOOK_SECRET and endpoints. Raises SettingsError for endpoints it cannot sign for."""
    endpoints = settings.endpoints()
    if settings.webhook_secret is None and not endpoints:
        return None
    config = DeliveryConfig(
        db=str(settings.db),
        endpoints=endpoints,
        allow=settings.webhooks_allow,
        resync_s=settings.tail_interval,
        turn_lease_s=settings.webhook_turn_lease,
        store_retry_s=settings.store_retry,
        log_format=settings.log_format,
        log_level=settings.log_level,
    )
    return DeliveryProcess(config, secret_list(settings.webhook_secret) if settings.webhook_secret is not None else [])


async def _stop(process: Process) -> None:
    """End the child's stdin (it saves its position and exits); kill it if it takes too long."""
    if process.returncode is None:
        assert process.stdin is not None
        await process.stdin.aclose()
        with anyio.move_on_after(STOP_GRACE_S):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _deliver(config: DeliveryConfig) -> None:
    from h3core.adapters.store.location import open_store_at, parse_location
    from h3core.adapters.webhooks import WebhookSender
    from h3core.domain.webhooks import Allow
    from h3core.runtime.bus import EventBus
    from h3core.runtime.webhooks import WebhookDispatcher

    secrets = secret_list(SecretStr(os.environ.get(SECRET_ENV, "")))
    # The SQLite file, or the PostgreSQL server (which may be restarting).
    store = await retrying(partial(open_store_at, parse_location(config.db)), limit_s=config.store_retry_s, what="open")
    bus = EventBus()
    bus.close()  # nobody publishes in this process: the subscription reads the store every resync_s
    sender = WebhookSender(secrets, Allow(config.allow))
    dispatcher = WebhookDispatcher(
        store,
        bus,
        sender,
        endpoints=config.endpoints,
        endpoint_secrets=endpoint_secrets(config.endpoints),
        resync_s=config.resync_s,
        store_retry_s=config.store_retry_s,
    )
    try:
        async with anyio.create_task_group() as tg:

            async def deliver() -> None:
                turn = await _wait_for_turn(store, config)
                dispatcher.turn = turn  # checked before every send and save
                _report({"delivering": True})
                try:
                    async with anyio.create_task_group() as inner:
                        await inner.start(dispatcher.run)
                        inner.start_soon(_report_outcomes, dispatcher)
                        if turn is not None:
                            inner.start_soon(_keep_turn, turn)
                finally:
                    if turn is not None:
                        with anyio.CancelScope(shield=True):
                            await _release(turn)

            tg.start_soon(deliver)
            # The lifeline: stdin ends when the parent closes it or exits (however it exits).
            await anyio.to_thread.run_sync(sys.stdin.buffer.read, abandon_on_cancel=True)
            tg.cancel_scope.cancel()
    finally:
        _report({"outcomes": dict(dispatcher.outcomes)})
        store.close()


async def _report_outcomes(dispatcher: WebhookDispatcher) -> None:
    last: dict[str, int] = {}
    while True:
        if dict(dispatcher.outcomes) != last:
            last = dict(dispatcher.outcomes)
            _report({"outcomes": last})
        await anyio.sleep(REPORT_EVERY_S)


async def _wait_for_turn(store: object, config: DeliveryConfig) -> Turn | None:
    """On a store shared by nodes, wait for the deployment's one delivery turn: every node that
    has the secret may deliver, one at a time, or each would send every event. None: the store
    has one runner (SQLite), whose process is the only one delivering."""
    if not isinstance(store, WithTurns):
        return None
    waiting = False
    take = partial(store.turns.take_turn, TURN, config.turn_lease_s)
    while True:
        turn = await retrying(take, limit_s=config.store_retry_s, what="take of the delivery turn")
        if turn is not None:
            if waiting:
                log.info("this node delivers the webhooks now (the node that did has stopped, or lost its turn)")
            return turn
        if not waiting:
            log.info("another node delivers the webhooks; this one takes over if it stops")
            _report({"delivering": False})
            waiting = True
        await anyio.sleep(config.turn_lease_s / 3)


async def _keep_turn(turn: Turn) -> None:
    """Renew the turn every third of its lease; end this process (`TurnLost`) once it is not held:
    another process took it, or no renewal got through within the lease (the store unreachable,
    or this process frozen past it). A renewal that fails is tried again while the lease lasts;
    one that hangs is left to its thread (the process is ending)."""
    every = turn.lease_s / 3
    while True:
        await anyio.sleep(every)
        failed: Exception | None = None
        while True:
            if not turn.held():
                why = f"the last failure: {failed}" if failed is not None else "this process was held up past it"
                raise TurnLost(f"no renewal of the webhook delivery turn got through within its lease ({why})")
            renewed: bool | None = None
            try:
                with anyio.move_on_after(every):
                    renewed = await anyio.to_thread.run_sync(turn.renew, abandon_on_cancel=True)
            except Exception as exc:
                if not transient(exc):
                    raise
                if failed is None:
                    log.warning("renewing the webhook delivery turn failed (%s); trying again while its lease lasts", exc)
                failed = exc
                await anyio.sleep(RENEW_RETRY_S)
                continue
            if renewed is not None:
                break
        if not renewed:
            raise TurnLost("the webhook delivery turn passed to another process, or its lease ran out before it was renewed")
        if failed is not None:
            log.info("the webhook delivery turn is renewed again")


async def _release(turn: Turn) -> None:
    """Give the turn up, so that another node goes on at once; a store that cannot be reached
    leaves it to pass with its lease."""
    try:
        with anyio.move_on_after(turn.lease_s):
            await anyio.to_thread.run_sync(turn.release, abandon_on_cancel=True)
    except Exception as exc:
        log.info("the webhook delivery turn could not be released (%s): it passes with its lease", exc)


def _report(message: dict[str, object]) -> None:
    try:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the parent is gone (killed): nobody to tell
        pass


def _first(group: BaseExceptionGroup) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def main() -> None:
    """The child: read the config line from stdin, deliver until stdin ends; exit 1 when the turn
    is lost or the store stays unusable (the parent starts another)."""
    config = DeliveryConfig.model_validate_json(sys.stdin.buffer.readline())
    configure(config.log_format, config.log_level)
    status = 1
    try:
        anyio.run(_deliver, config)
        status = 0
    except* TurnLost as group:
        log.warning("%s: this process stops, another waits for the turn", _first(group))
    except* StoreUnavailable as group:
        log.error("webhook delivery stops (%s): this process is started again", _first(group))
    except* Exception:
        log.exception("the webhook delivery process failed")
    finally:
        # Exit now, whatever ended it: a worker thread still blocked on the lifeline (stdin) or on a
        # store that hangs would hold the interpreter's exit, and the process would live on idle.
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError):  # the parent is gone: nobody reads
                stream.flush()
        os._exit(status)


if __name__ == "__main__":
    main()
