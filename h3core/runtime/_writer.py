"""The runner's single writer, with group commit.

Every event the runner writes goes through here, in the order it was asked for. Whatever is
waiting when the writer comes round is committed in one transaction (one fsync), each append
still checked and all-or-nothing on its own (`EventStore.append_batch`). Published to the bus
only once durable.

A failing transaction is retried (`h3core.runtime.store_retry`); once the store has failed for longer
than `retry_s`, the writer gives up for good: `failure` is set, `failed` fires, and every append
from then on is refused with that `StoreUnavailable`, so no caller waits on a dead store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus

from h3core.adapters.store.base import AppendOutcome, AppendRequest, EventStore
from h3core.domain.events import Body
from h3core.domain.state import JobState
from h3core.runtime.bus import EventBus
from h3core.runtime.store_retry import StoreUnavailable, retrying


@dataclass
class Queued:
    """An append handed to the writer."""

    job_id: str
    bodies: Sequence[Body]
    expected_seq: int | None
    done: anyio.Event = field(default_factory=anyio.Event)
    outcome: AppendOutcome | None = None


class GroupWriter:
    def __init__(self, store: EventStore, bus: EventBus, *, max_batch: int = 256, retry_s: float = 30.0) -> None:
        self.store = store
        self.bus = bus
        self.max_batch = max_batch
        self.retry_s = retry_s
        self.failure: StoreUnavailable | None = None
        self.failed = anyio.Event()
        self._pending: list[Queued] = []
        self._wake = anyio.Event()
        self._running = False
        self._closing = False
        self._thread = anyio.CapacityLimiter(1)
        self.batches = 0  # for benchmarks and tests
        self.appends = 0

    async def append(self, job_id: str, bodies: Sequence[Body], expected_seq: int | None = None) -> JobState:
        (outcome,) = await self.append_many([(job_id, bodies, expected_seq)])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def append_many(self, requests: Sequence[AppendRequest]) -> list[JobState | Exception]:
        """Several appends, each all or nothing (`EventStore.append_batch`); each one's new state,
        or the exception that refused it, in order. They share a commit when they fit a batch."""
        if not self._running:  # before the runner starts (a submit from the CLI), or after it ends
            outcomes = await self._commit(requests)
            for outcome in outcomes:
                if not isinstance(outcome, Exception):
                    self.bus.publish(outcome[1])
        else:
            items = [self.enqueue(*request) for request in requests]
            # Once queued, the appends will happen: wait for their outcomes even if we are
            # cancelled, so the caller never believes in an event that was, or was not, written.
            with anyio.CancelScope(shield=True):
                for item in items:
                    await item.done.wait()
            outcomes = [item.outcome for item in items if item.outcome is not None]
        return [outcome if isinstance(outcome, Exception) else outcome[0] for outcome in outcomes]

    def enqueue(self, job_id: str, bodies: Sequence[Body], expected_seq: int | None = None) -> Queued:
        """Queue an append and return at once (only while `run` runs): it will be written, in order
        after everything queued before it; its `done` is set once it is, with its `outcome`."""
        if not self._running:
            raise RuntimeError("enqueue needs the writer running; use append")
        item = Queued(job_id, bodies, expected_seq)
        self._pending.append(item)
        self._wake.set()
        return item

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Write until `close()` and the queue is empty. Run it shielded: writes must outlive the
        cancellation of the tasks that queue them (their terminal events come then)."""
        self._running = True
        task_status.started()
        try:
            while True:
                if not self._pending:
                    if self._closing:
                        return
                    await self._wake.wait()
                    self._wake = anyio.Event()
                    continue
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                requests = [(p.job_id, p.bodies, p.expected_seq) for p in batch]
                outcomes = await self._commit(requests)
                self.batches += 1
                self.appends += len(batch)
                for item, outcome in zip(batch, outcomes, strict=True):
                    item.outcome = outcome
                    if not isinstance(outcome, Exception):
                        self.bus.publish(outcome[1])  # here, in commit order
                    item.done.set()
        finally:
            self._running = False

    async def _commit(self, requests: Sequence[AppendRequest]) -> list[AppendOutcome]:
        """One transaction for `requests`, retried while the store fails transiently; each
        request's outcome, or the error that failed the whole transaction for each."""
        if self.failure is not None:
            return [self.failure] * len(requests)
        try:
            return await retrying(
                lambda: self.store.append_batch(requests), limit_s=self.retry_s, what="write", limiter=self._thread
            )
        except StoreUnavailable as exc:
            self.failure = exc
            self.failed.set()
            return [exc] * len(requests)
        except Exception as exc:  # not the database's state (a bug, a full disk's OSError): this batch only
            return [exc] * len(requests)

    def close(self) -> None:
        self._closing = True
        self._wake.set()
