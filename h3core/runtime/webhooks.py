"""Delivering jobs' webhooks from the log: a durable subscription is the outbox.

`WebhookDispatcher` follows the whole log as the subscription "webhooks" (from the first event
stored, the first time: a store older than webhooks holds none to send, and nothing stored
between an upgrade and the first start is skipped). Each event that an endpoint wants (the job's
own webhook, and each of the deployment's `endpoints`) becomes a delivery; one job's deliveries
to one endpoint go one after another, in log order; the rest side by side, at most `concurrency`
sends at once to one target (scheme, host, port): a target that hangs fills its own slots only.
The subscription's position advances only past events whose delivery has ended
(delivered, or given up), so a crash, a restart or a shutdown between an event and its delivery
delivers it after the next start. Every delivery of one event carries the same `webhook-id`, so
a receiver drops the repeats such a restart can send.

Terminal events (`completed`) are tried again on failure, after pauses from `first_s` doubling
to `longest_s`, each cut by up to half at random (jitter), for `limit_s` from the first failure
(DELIVERY_BACKOFF: 0.5 s to 5 min, for 1 hour); then the delivery is given up: logged, counted
(`outcomes`, /metrics), and passed. `start` and `progress` are tried once: the next event, or
the end, says more. A job's progress goes at most once per `progress_every_s` (0.5 s, as
Replicate's): one that a later progress overtakes while it waits is not sent (the latest wins),
nor one whose job has ended: its terminal event read, or, for what was stored before this
dispatcher started (a restart, another node's delivery taken over from the saved place), its job
ended in the store. So no job's progress reaches a receiver after that job's end, which a
process that delivered it before the takeover may already have sent.
Each delivery's tries and outcome are kept in the store (`deliveries(job_id)`: the API's
GET /v1/jobs/{id}/webhooks and `h3core replay`), saved with the position.

The runner never waits for any of this: the dispatcher reads the store and the bus (a service
runs it in a process of its own: `h3core.runtime.delivery_process`). At most `target_window`
deliveries to one target are held in memory (with their events), `window` in all; a target's
deliveries past its share are deferred, kept as (job, seq) only and read back from the store, in
order, as it has room. So a dead receiver holds the position (a restart sends again what came
after it) but never stops the reading, nor another receiver's deliveries.

Delivering from a store shared by nodes takes the deployment's delivery turn (`turn`, taken by
the caller: `h3core.runtime.delivery_process`): it is checked before every send and every save,
and once it is not held (its lease passed unrenewed: this process was frozen, or cut off from
the store) `run` ends with `TurnLost`, sending and saving nothing more. With `store_retry_s`, the
store's reads and writes are tried again on transient failures for that long; past it `run`
ends with `StoreUnavailable`. Needs the `service` extra (`h3core.adapters.webhooks`).
"""

from __future__ import annotations

import json
import logging
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TypeVar
from urllib.parse import urlsplit

import anyio
from anyio.abc import TaskGroup, TaskStatus

from h3core.adapters.backoff import Backoff, retry
from h3core.adapters.store.base import EventStore
from h3core.adapters.store.nodes import Turn, TurnLost
from h3core.adapters.webhooks import DeliveryFailed, WebhookSender
from h3core.domain.events import Event, Submitted
from h3core.domain.webhooks import Allow, Delivery, Endpoint, WebhookTarget, event_kind, superseded_by_later, webhook_id
from h3core.runtime.bus import EventBus
from h3core.runtime.settings import Settings, endpoint_secrets, secret_list
from h3core.runtime.store_retry import in_thread
from h3core.runtime.subscription import Subscription

__all__ = ["DELIVERY_BACKOFF", "SUBSCRIPTION", "WebhookDispatcher", "dispatcher_for", "target_of"]

log = logging.getLogger("h3core.webhooks")

T = TypeVar("T")

SUBSCRIPTION = "webhooks"
DELIVERY_BACKOFF = Backoff(first_s=0.5, longest_s=300.0, limit_s=3600.0, jitter=0.5)


@dataclass(frozen=True)
class _Delivery:
    position: int
    event: Event
    endpoint: Endpoint


@dataclass(frozen=True)
class _Deferred:
    """A delivery to a target already holding its share: its event is read again from the store
    when the target has room (so a dead receiver's backlog holds no events, nor anyone's place)."""

    position: int
    job_id: str
    seq: int
    endpoint: Endpoint


Lane = tuple[str, str]  # (job id, endpoint url): one job's deliveries to one receiver, in order


def target_of(url: str) -> str:
    """The receiver a URL reaches (scheme, host, port): what slots and shares are counted by."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


class WebhookDispatcher:
    """Sends the webhooks the log asks for, from the durable subscription "webhooks" (see the module)."""

    def __init__(
        self,
        store: EventStore,
        bus: EventBus,
        sender: WebhookSender,
        *,
        endpoints: Sequence[Endpoint] = (),
        endpoint_secrets: Mapping[str, Sequence[str]] | None = None,
        backoff: Backoff = DELIVERY_BACKOFF,
        concurrency: int = 16,
        window: int = 10_000,
        target_window: int = 1000,
        save_every_s: float = 0.2,
        progress_every_s: float = 0.5,
        resync_s: float = 1.0,
        store_retry_s: float | None = None,
        turn: Turn | None = None,
    ) -> None:
        self.store = store
        self.sender = sender
        self.endpoints = tuple(endpoints)  # the deployment's, for every job besides its own webhook
        self.endpoint_secrets = dict(endpoint_secrets or {})  # their own secrets, by `Endpoint.secret_env`
        self.backoff = backoff
        self.store_retry_s = store_retry_s  # how long a failing store is tried again (None: not at all)
        self.turn = turn  # the deployment's delivery turn, where the store is shared by nodes
        self.subscription = Subscription(store, bus, SUBSCRIPTION, batch=500, resync_s=resync_s, retry_s=store_retry_s)
        self.concurrency = concurrency  # sends at once to one target (scheme, host, port)
        self._sends: dict[str, anyio.CapacityLimiter] = {}  # per target: a slow one fills its own
        self.window = window  # deliveries held in memory, in all
        self.target_window = target_window  # ... to one target; past it, deferred (`_Deferred`)
        self.save_every_s = save_every_s
        self.progress_every_s = progress_every_s  # a job's progress is sent at most this often
        # delivered, failed (a try that did not reach a 2xx), retried, given_up, superseded (a
        # progress not sent: a later one came within `progress_every_s`): for /metrics.
        self.outcomes: Counter[str] = Counter()
        self._targets: dict[str, WebhookTarget | None] = {}  # jobs not yet ended, by id
        self._lanes: dict[Lane, deque[_Delivery]] = {}  # deliveries waiting, in log order
        self._last_progress: dict[Lane, float] = {}  # when a lane's last progress was sent (jobs not ended)
        self._pending: Counter[int] = Counter()  # positions read, with their deliveries not yet ended
        self._held: Counter[str] = Counter()  # deliveries held in memory (their events), per target
        self._deferred: dict[str, deque[_Deferred]] = {}  # per target, in log order
        self._tg: TaskGroup | None = None
        self._read_to = 0  # every event up to here is read
        self._saved = 0
        self._moved = anyio.Event()  # a delivery ended: the position may advance, the window has room
        # What became of each delivery since the last save (`store.deliveries(job_id)` shows them).
        self._unsaved: dict[tuple[str, int, str], Delivery] = {}
        # Jobs whose terminal event was read, at its position: their progress still waiting is
        # not sent. Dropped once the position passes it (no earlier event of the job is pending).
        self._ended_at: dict[str, int] = {}
        # The end of the log when this dispatcher started: what is at or before it may have been
        # delivered by a process before this one, so a job's end is looked up in the store.
        self._backlog_to = 0
        self._ended_in_store: dict[str, bool] = {}  # of the backlog's jobs, looked up once each

    def position(self) -> int:
        """Where the subscription can be saved now: before the oldest delivery still pending."""
        return min(self._pending) - 1 if self._pending else self._read_to

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Deliver until cancelled; the position is saved as deliveries end, and once more at the end."""
        self._read_to = self._saved = await self.subscription.position()
        self._backlog_to = await self._store_call(self.store.cursor, "cursor read")
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._keep_position)
                task_status.started()
                async with aclosing(self.subscription.batches(self._read_to)) as batches:
                    async for rows in batches:
                        for position, event in rows:
                            while self._held.total() >= self.window:
                                await self._wait_moved()
                            await self._take(position, event)
                            self._read_to = position
                        self._signal()
        finally:
            with anyio.CancelScope(shield=True):
                await self._last_save()
                await self.sender.aclose()

    async def _store_call(self, call: Callable[[], T], what: str) -> T:
        return await in_thread(call, limit_s=self.store_retry_s, what=what)

    def _check_turn(self) -> None:
        """Raise `TurnLost` unless this process still holds the delivery turn (or needs none)."""
        if self.turn is not None and not self.turn.held():
            raise TurnLost(f"the delivery turn {self.turn.name!r} is no longer this process's: its lease passed unrenewed")

    async def _take(self, position: int, event: Event) -> None:
        target = await self._target(event)
        if event.terminal:
            self._ended_at[event.job_id] = position
            self._targets.pop(event.job_id, None)
            for key in [k for k in self._last_progress if k[0] == event.job_id]:
                del self._last_progress[key]
        endpoints = ((Endpoint.of(target),) if target is not None else ()) + self.endpoints
        for endpoint in endpoints:
            if not endpoint.wants(event):
                continue
            self._pending[position] += 1
            to = target_of(endpoint.url)
            if self._deferred.get(to) or self._held[to] >= self.target_window:
                # Behind the target's other deferred ones, so a job's deliveries keep their order.
                self._deferred.setdefault(to, deque()).append(_Deferred(position, event.job_id, event.seq, endpoint))
                continue
            self._hold(_Delivery(position, event, endpoint))

    def _hold(self, d: _Delivery) -> None:
        assert self._tg is not None
        self._held[target_of(d.endpoint.url)] += 1
        key = (d.event.job_id, d.endpoint.url)
        lane = self._lanes.get(key)
        if lane is not None:  # its lane is delivering: this one waits its turn there
            lane.append(d)
            return
        self._lanes[key] = deque([d])
        self._tg.start_soon(self._drain, key)

    async def _undefer(self, target: str) -> None:
        """Hold the target's deferred deliveries again, oldest first, as it has room; their events
        read back from the store. One of these per target at a time (it is the one that pops)."""
        waiting = self._deferred.get(target)
        while waiting and self._held[target] < self.target_window:
            d = waiting[0]
            events = await self._store_call(partial(self.store.events, d.job_id, d.seq - 1), "read of a job's events")
            waiting.popleft()
            event = next(e for e in events if e.seq == d.seq)
            self._hold(_Delivery(d.position, event, d.endpoint))
        if not waiting:
            self._deferred.pop(target, None)

    async def _target(self, event: Event) -> WebhookTarget | None:
        if isinstance(event.body, Submitted):
            self._targets[event.job_id] = event.body.webhook
            return event.body.webhook
        if event.job_id not in self._targets:  # submitted before the position: its state says
            state = await self._store_call(partial(self.store.get, event.job_id), "read of a job")
            self._targets[event.job_id] = state.webhook if state is not None else None
        return self._targets[event.job_id]

    async def _drain(self, key: Lane) -> None:
        lane = self._lanes[key]
        job_id = key[0]
        try:
            while lane:
                if not superseded_by_later(lane[0].event):
                    await self._deliver(lane[0])
                elif not await self._superseded(lane):
                    last = self._last_progress.get(key, -float("inf"))
                    wait = last + self.progress_every_s - anyio.current_time()
                    if wait > 0:
                        await anyio.sleep(wait)
                    if self.progress_every_s <= 0 or not await self._superseded(lane):
                        if job_id in self._targets:  # not ended (an ended job's entry would stay for good)
                            self._last_progress[key] = anyio.current_time()
                        await self._deliver(lane[0])
                self._ended(lane.popleft())
        finally:
            del self._lanes[key]

    def _ended(self, d: _Delivery) -> None:
        self._pending[d.position] -= 1
        if self._pending[d.position] <= 0:
            del self._pending[d.position]
        target = target_of(d.endpoint.url)
        self._held[target] -= 1
        if self._held[target] <= 0:
            del self._held[target]
            if target not in self._deferred:
                self._sends.pop(target, None)
        # Room again: the first delivery to end below the share starts the undeferring.
        if self._deferred.get(target) and self._held[target] == self.target_window - 1 and self._tg is not None:
            self._tg.start_soon(self._undefer, target)
        self._signal()

    async def _superseded(self, lane: deque[_Delivery]) -> bool:
        """Is the progress at the lane's head not to be sent? A later progress is right behind it
        (throttled: the latest wins), or its job has ended (the module docstring); counted."""
        head = lane[0]
        overtaken = self.progress_every_s > 0 and len(lane) > 1 and superseded_by_later(lane[1].event)
        if overtaken or await self._job_ended(head):
            self.outcomes["superseded"] += 1
            return True
        return False

    async def _job_ended(self, d: _Delivery) -> bool:
        job_id = d.event.job_id
        if job_id in self._ended_at:
            return True
        if d.position > self._backlog_to:  # stored since this dispatcher started: its end, if any, is read in order
            return False
        ended = self._ended_in_store.get(job_id)
        if ended is None:
            state = await self._store_call(partial(self.store.get, job_id), "read of a job")
            ended = self._ended_in_store[job_id] = state is not None and state.terminal
        return ended

    async def _deliver(self, d: _Delivery) -> None:
        msg_id = webhook_id(d.event)
        secrets = self.endpoint_secrets[d.endpoint.secret_env] if d.endpoint.secret_env else None
        body = json.dumps(d.endpoint.body(d.event), separators=(",", ":"))

        record = Delivery(
            job_id=d.event.job_id,
            seq=d.event.seq,
            event_type=d.event.type,
            url=d.endpoint.url,
            webhook_id=msg_id,
            outcome="trying",
            updated_at=datetime.now(UTC),
        )

        def note(**change: object) -> None:
            nonlocal record
            record = record.model_copy(update={**change, "updated_at": datetime.now(UTC)})
            self._unsaved[(record.job_id, record.seq, record.url)] = record
            self._signal()

        target = target_of(d.endpoint.url)

        async def once() -> None:
            sends = self._sends.get(target)
            if sends is None:
                sends = self._sends[target] = anyio.CapacityLimiter(self.concurrency)
            async with sends:
                self._check_turn()  # a send waits for its slot: checked after the wait, just before it goes
                try:
                    await self.sender.send(d.endpoint.url, msg_id, body, secrets=secrets)
                except DeliveryFailed as exc:
                    self.outcomes["failed"] += 1
                    note(tries=record.tries + 1, last_error=str(exc))
                    raise
            note(tries=record.tries + 1, outcome="delivered")

        def again(exc: Exception, tries: int, pause: float) -> None:
            self.outcomes["retried"] += 1
            log.info("webhook %s to %s failed (%s), try %d; again in %.1f s", msg_id, d.endpoint.url, exc, tries, pause)

        try:
            if event_kind(d.event) == "completed":
                await retry(
                    once,
                    self.backoff,
                    retry_if=lambda exc: isinstance(exc, DeliveryFailed) and exc.retryable,
                    on_retry=again,
                )
            else:
                await once()
        except DeliveryFailed as exc:
            self.outcomes["given_up"] += 1
            note(outcome="given_up")
            log.warning(
                "webhook %s (job %s event #%d, %s) to %s given up: %s",
                msg_id,
                d.event.job_id,
                d.event.seq,
                d.event.type,
                d.endpoint.url,
                exc,
                extra={"job_id": d.event.job_id},
            )
            return
        self.outcomes["delivered"] += 1

    def _signal(self) -> None:
        self._moved.set()
        self._moved = anyio.Event()

    async def _wait_moved(self) -> None:
        await self._moved.wait()

    async def _keep_position(self) -> None:
        """Save the position as it advances, at most every `save_every_s`: one small write for a
        burst of deliveries, and a restart repeats no more than that."""
        while True:
            if self.position() == self._saved and not self._unsaved:
                await self._wait_moved()  # no checkpoint since the look: no move is missed
                continue
            await self._save()
            await anyio.sleep(self.save_every_s)

    async def _save(self, *, once: bool = False) -> None:
        """The delivery records noted since the last save, then the position (one write each);
        `once`: each tried once, not retried."""
        self._check_turn()  # a process that lost the turn writes nothing over its taker's
        limit_s = None if once else self.store_retry_s
        if self._unsaved:
            records, self._unsaved = list(self._unsaved.values()), {}
            await in_thread(partial(self.store.save_deliveries, records), limit_s=limit_s, what="save of delivery records")
        at = self.position()
        if at != self._saved:
            await in_thread(partial(self.store.save_position, SUBSCRIPTION, at), limit_s=limit_s, what="position save")
            self._saved = at
        self._ended_at = {job_id: p for job_id, p in self._ended_at.items() if p > at}
        if at >= self._backlog_to:
            self._ended_in_store.clear()

    async def _last_save(self) -> None:
        """The save as `run` ends, tried once: a store that fails it, or a turn lost, leaves the
        next process to send again from the last place saved (logged, not raised: what ended
        `run` is what its caller hears of)."""
        if self.turn is not None and not self.turn.held():
            log.warning("the webhook delivery turn is lost: the position and records since the last save are not saved")
            return
        try:
            await self._save(once=True)
        except Exception as exc:
            log.warning("webhook deliveries since the last save could not be saved (%s): the next start sends them again", exc)


def dispatcher_for(settings: Settings, store: EventStore, bus: EventBus) -> WebhookDispatcher | None:
    """A dispatcher in this process (a library's; a service's runs in a process of its own:
    `h3core.runtime.delivery_process`); None with no secret to sign with. Raises SettingsError
    for endpoints without a secret."""
    endpoints = settings.endpoints()
    if settings.webhook_secret is None and not endpoints:
        return None
    secrets = secret_list(settings.webhook_secret) if settings.webhook_secret is not None else []
    sender = WebhookSender(secrets, Allow(settings.webhooks_allow))
    return WebhookDispatcher(
        store,
        bus,
        sender,
        endpoints=endpoints,
        endpoint_secrets=endpoint_secrets(endpoints),
        resync_s=settings.poll_interval,
        store_retry_s=settings.store_retry,
    )
