"""An in-memory event store: the fake that honours the `EventStore` contract, for tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import datetime

from h3core.adapters.store.base import AppendOutcome, AppendRequest, Conflict, UnknownJob, VideoDeletion, precheck, utc_now
from h3core.domain.admission import QueueFilter
from h3core.domain.events import Body, Event, Submitted
from h3core.domain.state import IllegalEvent, JobState, Status, apply, extend
from h3core.domain.webhooks import Delivery


class MemoryEventStore:
    """The fake event store: logs, projections, positions and deliveries in memory, under one lock,
    gone with the process. `clock`: the time events are stamped with."""

    def __init__(self, *, clock: Callable[[], datetime] = utc_now) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self._logs: dict[str, list[Event]] = {}
        self._states: dict[str, JobState] = {}
        self._order: dict[str, int] = {}  # job -> submission order
        self._keys: dict[str, str] = {}  # idempotency key -> job
        self._stored: list[Event] = []  # every event, in the order stored (positions start at 1)
        self._positions: dict[str, int] = {}  # subscriptions' saved places
        self._deliveries: dict[tuple[str, int, str], Delivery] = {}
        self._videos_deleted: dict[str, datetime] = {}
        self._deletions: list[str] = []  # the jobs marked deleted, in the order marked (position i + 1)

    def _commit(self, state: JobState, events: Sequence[Event]) -> None:
        if isinstance(events[0].body, Submitted):
            if state.idempotency_key is not None:
                if state.idempotency_key in self._keys:
                    raise Conflict(f"idempotency key {state.idempotency_key!r} is already in use")
                self._keys[state.idempotency_key] = state.job_id
            self._order[state.job_id] = len(self._order) + 1
            self._logs[state.job_id] = []
        self._logs[state.job_id].extend(events)
        self._stored.extend(events)
        self._states[state.job_id] = state

    def append(
        self, job_id: str, bodies: Sequence[Body], *, expected_seq: int | None = None
    ) -> tuple[JobState, tuple[Event, ...]]:
        """Check and fold `bodies` onto the job's state and keep them, under the store's lock (`EventLog.append`)."""
        with self._lock:
            state = self._states.get(job_id)
            precheck(state, job_id, bodies, expected_seq)
            new_state, events = extend(state, job_id, bodies, self._clock())
            self._commit(new_state, events)
        return new_state, events

    def append_batch(self, items: Sequence[AppendRequest]) -> list[AppendOutcome]:
        """Each append in turn, under one hold of the lock; a refused one is returned as its exception, in place."""
        outcomes: list[AppendOutcome] = []
        with self._lock:
            for job_id, bodies, expected_seq in items:
                try:
                    outcomes.append(self.append(job_id, bodies, expected_seq=expected_seq))
                except (IllegalEvent, Conflict, UnknownJob, ValueError) as exc:
                    outcomes.append(exc)
        return outcomes

    def import_events(self, events: Sequence[Event]) -> int:
        """Keep events made elsewhere, each job's checked by folding it before any is kept; how many
        were new (`EventLog.import_events`)."""
        added = 0
        with self._lock:
            staged: dict[str, tuple[JobState, list[Event]]] = {}
            for e in sorted(events, key=lambda e: (e.job_id, e.seq)):
                log = self._logs.get(e.job_id, [])
                if e.seq <= len(log):
                    if log[e.seq - 1] != e:
                        raise Conflict(f"job {e.job_id} event #{e.seq} differs from the stored one")
                    continue
                prev: tuple[JobState | None, list[Event]] = staged.get(e.job_id, (self._states.get(e.job_id), []))
                staged[e.job_id] = (apply(prev[0], e), [*prev[1], e])
            for state, evs in staged.values():
                self._commit(state, evs)
                added += len(evs)
        return added

    def get(self, job_id: str) -> JobState | None:
        """The job's current state; None for an unknown job."""
        with self._lock:
            return self._states.get(job_id)

    def events(self, job_id: str, after_seq: int = 0) -> list[Event]:
        """The job's events after seq `after_seq`, in seq order ([] for an unknown job)."""
        with self._lock:
            return list(self._logs.get(job_id, [])[after_seq:])

    def by_idempotency_key(self, key: str) -> JobState | None:
        """The state of the job submitted with idempotency key `key`; None if none was."""
        with self._lock:
            job = self._keys.get(key)
            return self._states[job] if job else None

    def _ordered(self) -> list[JobState]:
        return [self._states[j] for j in sorted(self._order, key=self._order.__getitem__)]

    def list_jobs(
        self,
        *,
        status: Status | None = None,
        limit: int = 50,
        before: int | None = None,
        after: int | None = None,
        oldest_first: bool = False,
    ) -> list[tuple[int, JobState]]:
        """Jobs newest (or oldest) first with their cursors, only those between `after` and `before`
        (`JobProjections.list_jobs`)."""
        return self._page(lambda s: status is None or s.status == status, limit, before, after, oldest_first)

    def list_videos(
        self, *, limit: int = 50, before: int | None = None, after: int | None = None, oldest_first: bool = False
    ) -> list[tuple[int, JobState]]:
        """`list_jobs` without the jobs whose video is marked deleted (`JobProjections.list_videos`)."""
        return self._page(lambda s: s.job_id not in self._videos_deleted, limit, before, after, oldest_first)

    def _page(
        self, keep: Callable[[JobState], bool], limit: int, before: int | None, after: int | None, oldest_first: bool
    ) -> list[tuple[int, JobState]]:
        with self._lock:
            ordered = self._ordered()
            out = [
                (self._order[s.job_id], s)
                for s in (ordered if oldest_first else reversed(ordered))
                if keep(s)
                and (before is None or self._order[s.job_id] < before)
                and (after is None or self._order[s.job_id] > after)
            ]
        return out[:limit]

    def mark_video_deleted(self, job_id: str, at: datetime) -> None:
        """Mark the job's video deleted, the first time kept (and the next deletion position);
        UnknownJob for a job not held."""
        with self._lock:
            if job_id not in self._states:
                raise UnknownJob(job_id)
            if job_id not in self._videos_deleted:
                self._videos_deleted[job_id] = at
                self._deletions.append(job_id)

    def video_deleted_at(self, job_id: str) -> datetime | None:
        """When the job's video was marked deleted; None if it never was."""
        with self._lock:
            return self._videos_deleted.get(job_id)

    def videos_deleted_at(self, job_ids: Collection[str]) -> dict[str, datetime]:
        """`video_deleted_at` of each of `job_ids` marked deleted."""
        with self._lock:
            return {j: self._videos_deleted[j] for j in job_ids if j in self._videos_deleted}

    def video_deletions(self, after: int = 0, limit: int = 1000) -> list[VideoDeletion]:
        """The jobs marked deleted after position `after`, in marking order."""
        with self._lock:
            start = max(after, 0)
            out = []
            for position, job_id in enumerate(self._deletions[start : start + limit], start + 1):
                state = self._states[job_id]
                out.append(VideoDeletion(position, job_id, state.status, state.artifact.path if state.artifact else None))
            return out

    def cursor_of(self, job_id: str) -> int | None:
        """The job's submission order; None for an unknown job."""
        with self._lock:
            return self._order.get(job_id)

    def _queue_sorted(self, statuses: set[str]) -> list[JobState]:
        with self._lock:
            jobs = [s for s in self._ordered() if s.status in statuses]
            return sorted(jobs, key=lambda s: (-s.priority, self._order[s.job_id]))

    def queued(
        self,
        limit: int = 100,
        exclude: Collection[str] = (),
        modes: Collection[str] | None = None,
        fits: QueueFilter | None = None,
    ) -> list[JobState]:
        """Queued jobs by priority, then submission order, filtered as `JobProjections.queued` says."""
        return [
            s
            for s in self._queue_sorted({"queued"})
            if s.job_id not in exclude
            and (modes is None or s.request.mode in modes)
            and (fits is None or fits.passes(s.request.frames, s.tokens))
        ][:limit]

    def unfinished(self) -> list[JobState]:
        """Every job submitted, queued or running, in queue order."""
        return self._queue_sorted({"submitted", "queued", "running"})

    def counts(self) -> dict[str, int]:
        """Jobs per status (a status no job has is left out)."""
        with self._lock:
            out: dict[str, int] = {}
            for s in self._states.values():
                out[s.status] = out.get(s.status, 0) + 1
            return out

    def queue_position(self, job_id: str) -> int | None:
        """1 for the next queued job to run; None if the job is not queued."""
        queued = [s.job_id for s in self.queued(limit=len(self._states))]
        return queued.index(job_id) + 1 if job_id in queued else None

    def ping(self) -> None:
        """Nothing to check: memory always takes a write."""
        pass

    def job_ids(self) -> list[str]:
        """Every job id, in submission order."""
        with self._lock:
            return [s.job_id for s in self._ordered()]

    def all_events(self, batch: int = 10_000) -> Iterator[Event]:
        """Every stored event, job by job in submission order (`batch` does not matter here)."""
        for job_id in self.job_ids():
            yield from self.events(job_id)

    def cursor(self) -> int:
        """How many events are stored: the newest one's position (0: none yet)."""
        with self._lock:
            return len(self._stored)

    def events_after(self, cursor: int, limit: int = 1000) -> list[tuple[int, Event]]:
        """Up to `limit` events stored after position `cursor`, each with its position."""
        with self._lock:
            return list(enumerate(self._stored[cursor : cursor + limit], start=cursor + 1))

    def position(self, name: str) -> int | None:
        """The position saved under `name`; None if none was."""
        with self._lock:
            return self._positions.get(name)

    def save_position(self, name: str, position: int) -> None:
        """Keep `position` under `name`, replacing the one before."""
        with self._lock:
            self._positions[name] = position

    def save_deliveries(self, records: Sequence[Delivery]) -> None:
        """Keep the records, each replacing the one of its (job, seq, url)."""
        with self._lock:
            self._deliveries.update({(r.job_id, r.seq, r.url): r for r in records})

    def deliveries(self, job_id: str) -> list[Delivery]:
        """The job's delivery records, by seq then url."""
        with self._lock:
            return [r for key, r in sorted(self._deliveries.items()) if key[0] == job_id]

    def close(self) -> None:
        """Nothing to release."""
        pass
