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
Replicate's): one that a later progress overtakes while it waits is not sent (the latest wins).
Each delivery's tries and outcome are kept in the store (`deliveries(job_id)`: the API's
GET /v1/jobs/{id}/webhooks and `h3core replay`), saved with the position.

The runner never waits for any of this: the dispatcher reads the store and the bus (a service
runs it in a process of its own: `h3core.runtime.delivery_process`). At most `target_window`
deliveries to one target are held in memory (with their events), `window` in all; a target's
deliveries past its share are deferred, kept as (job, seq) only and read back from the store, in
order, as it has room. So a dead receiver holds the position (a restart sends again what came
after it) but never stops the reading, nor another receiver's deliveries.
Needs the `service` extra (`h3core.adapters.webhooks`).
"""

from __future__ import annotations

import json
import logging
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

import anyio
from anyio.abc import TaskGroup, TaskStatus

from h3core.adapters.backoff import Backoff, retry
from h3core.adapters.store.base import EventStore
from h3core.adapters.webhooks import DeliveryFailed, WebhookSender
from h3core.domain.events import Event, Submitted
from h3core.domain.webhooks import Allow, Delivery, Endpoint, WebhookTarget, event_kind, webhook_id
from h3core.runtime.bus import EventBus
from h3core.runtime.settings import Settings, endpoint_secrets, secret_list
from h3core.runtime.subscription import Subscription

__all__ = ["DELIVERY_BACKOFF", "SUBSCRIPTION", "WebhookDispatcher", "dispatcher_for", "target_of"]

log = logging.getLogger("h3core.webhooks")

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
    ) -> None:
        self.store = store
        self.sender = sender
        self.endpoints = tuple(endpoints)  # the deployment's, for every job besides its own webhook
        self.endpoint_secrets = dict(endpoint_secrets or {})  # their own secrets, by `Endpoint.secret_env`
        self.backoff = backoff
        self.subscription = Subscription(store, bus, SUBSCRIPTION, batch=500, resync_s=resync_s)
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

    def position(self) -> int:
        """Where the subscription can be saved now: before the oldest delivery still pending."""
        return min(self._pending) - 1 if self._pending else self._read_to

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Deliver until cancelled; the position is saved as deliveries end, and once more at the end."""
        self._read_to = self._saved = await self.subscription.position()
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
                await self._save()
                await self.sender.aclose()

    async def _take(self, position: int, event: Event) -> None:
        target = await self._target(event)
        if event.terminal:
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
            events = await anyio.to_thread.run_sync(self.store.events, d.job_id, d.seq - 1)
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
            state = await anyio.to_thread.run_sync(self.store.get, event.job_id)
            self._targets[event.job_id] = state.webhook if state is not None else None
        return self._targets[event.job_id]

    async def _drain(self, key: Lane) -> None:
        lane = self._lanes[key]
        job_id = key[0]
        try:
            while lane:
                if event_kind(lane[0].event) != "progress" or self.progress_every_s <= 0:
                    await self._deliver(lane[0])
                elif not self._overtaken(lane):
                    last = self._last_progress.get(key, -float("inf"))
                    wait = last + self.progress_every_s - anyio.current_time()
                    if wait > 0:
                        await anyio.sleep(wait)
                    if not self._overtaken(lane):
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

    def _overtaken(self, lane: deque[_Delivery]) -> bool:
        """Is a later progress right behind the one at the lane's head? Then the latest wins."""
        if len(lane) > 1 and event_kind(lane[1].event) == "progress":
            self.outcomes["superseded"] += 1
            return True
        return False

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

    async def _save(self) -> None:
        """The delivery records noted since the last save, then the position (one write each)."""
        if self._unsaved:
            records, self._unsaved = list(self._unsaved.values()), {}
            await anyio.to_thread.run_sync(self.store.save_deliveries, records)
        at = self.position()
        if at != self._saved:
            await self.subscription.save(at)
            self._saved = at


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
        store, bus, sender, endpoints=endpoints, endpoint_secrets=endpoint_secrets(endpoints), resync_s=settings.poll_interval
    )
