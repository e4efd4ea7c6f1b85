"""The event store contract, in two parts: the log and the projections.

`EventLog` keeps each job's append-only event log. Implementations must honour:

- **Validate before write.** `append` folds the new events onto the job's current state (as
  read inside the same write transaction) with `h3core.domain.state.extend`; an illegal event
  raises `IllegalEvent` and nothing of the batch is stored.
- **Atomic batches.** All events of one `append` and the projection update land together or not
  at all. `append_batch` commits many appends at once, each still all or nothing.
- **Optimistic concurrency.** With `expected_seq`, the append fails with `Conflict` unless the
  job's last stored seq equals it (0: the job must not exist yet). `(job_id, seq)` is unique.
- **Never updated, never deleted.** Stored events are immutable.
- **Followable.** `cursor`/`events_after` give every job's events in the order they were stored,
  gap-free: what another process follows.
- **Positions kept.** `save_position(name, position)` keeps a named reader's place in that order
  (a subscription's, `h3core.runtime.subscription`) as durably as an append: once it returns, a
  later `position(name)` (in this process or the next) answers it, until the next save of that
  name overwrites it. A name never saved has no position (None).
- **Deliveries kept.** `save_deliveries` keeps what became of webhook deliveries, one record per
  (job, seq, url), a later save replacing the earlier; `deliveries(job_id)` answers a job's in
  (seq, url) order ([] for none).

`JobProjections` answers queries over every job's current state, kept in step with the log
(the state a job's log folds to, always):

- **Queue order.** `queued()` returns queued jobs by priority (highest first), then by
  submission order; a retried job keeps its original place.
- **Stable cursors.** A job's cursor is its submission order; listings page on it both ways.
- **Deleted videos kept apart.** `mark_video_deleted(job_id, at)` records that the job's video was
  deleted (OpenAI's Videos API: DELETE /v1/videos/{id}), keeping the first time, read back by
  `video_deleted_at` (`videos_deleted_at` for many jobs at once). It is no event (a finished job's
  log takes none) and no fold undoes it: later appends and a rebuilt projection keep it.
  `list_videos` pages as `list_jobs` does, leaving marked jobs out where it selects, so a page
  costs the same however many were deleted (SQL stores: a partial index of the unmarked jobs).
- **Deletions followable.** The first mark of a job takes the next position of the deletions,
  and `video_deletions(after)` gives the jobs marked after a position in the order they were
  marked, gap-free as `events_after` (a mark never appears after one made later): each node
  removes the files it holds of deleted videos by reading only what was marked since it last
  looked (`h3core.runtime.deletions`).

Both: **no open cursors.** Every read returns fully materialised values, so a read never holds
a lock a writer waits on (docs/design.md §2.3).

`EventStore` is both, plus `ping` and `close`. `MemoryEventStore` is the fake that honours the
same contract; `SQLiteEventStore` the real one; `h3core.testing.store.EventStoreContract` tests
an implementation against it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from datetime import UTC, datetime
from typing import NamedTuple, Protocol, runtime_checkable

from h3core.domain.admission import QueueFilter
from h3core.domain.events import Body, Event, Submitted
from h3core.domain.state import JobState, Status
from h3core.domain.webhooks import Delivery


class Conflict(RuntimeError):
    """The job's log moved on since the caller read it (or the job already exists)."""


class UnknownJob(KeyError):
    """No job with that id."""


# (job_id, bodies, expected_seq): one append of a batch; its outcome is what `append` returns,
# or the exception `append` would have raised.
AppendRequest = tuple[str, Sequence[Body], int | None]
AppendOutcome = tuple[JobState, tuple[Event, ...]] | Exception


def precheck(state: JobState | None, job_id: str, bodies: Sequence[Body], expected_seq: int | None) -> None:
    """What every store checks before folding an append (`h3core.domain.state.extend`): the
    caller's expectation, and that a new job starts with `Submitted`. For implementers: call both,
    in this order, inside the write transaction."""
    if not bodies:
        raise ValueError("append needs at least one event")
    current = state.last_seq if state else 0
    if expected_seq is not None and expected_seq != current:
        raise Conflict(f"job {job_id} is at seq {current}, caller expected {expected_seq}")
    if state is None and not isinstance(bodies[0], Submitted):
        raise UnknownJob(job_id)


def utc_now() -> datetime:
    """The time now, in UTC: the stores' clock unless one is given."""
    return datetime.now(UTC)


class VideoDeletion(NamedTuple):
    """A job whose video was marked deleted, as `video_deletions` follows them: its deletion
    position, and its status and video (`JobState.artifact.path`, None while it has none) as the
    store holds them now."""

    position: int
    job_id: str
    status: Status
    path: str | None


@runtime_checkable
class EventLog(Protocol):
    """Each job's append-only event log (the module docstring states the contract)."""

    def append(
        self, job_id: str, bodies: Sequence[Body], *, expected_seq: int | None = None
    ) -> tuple[JobState, tuple[Event, ...]]:
        """Append `bodies` to the job's log (a new job when the first body is `Submitted`)."""
        ...

    def append_batch(self, items: Sequence[AppendRequest]) -> list[AppendOutcome]:
        """Several appends made durable together (group commit), each one all or nothing and
        checked as `append` checks it; a refused one is returned as its exception, in place."""
        ...

    def import_events(self, events: Sequence[Event]) -> int:
        """Store events made elsewhere (their seq and time kept), checked like `append`.

        Events already present with identical content are skipped; returns how many were new.
        """
        ...

    def events(self, job_id: str, after_seq: int = 0) -> list[Event]:
        """The job's events after seq `after_seq`, in seq order ([] for an unknown job)."""
        ...

    def job_ids(self) -> list[str]:
        """Every job id, in submission order."""
        ...

    def all_events(self, batch: int = 10_000) -> Iterator[Event]:
        """Every stored event, job by job in submission order, fetched in batches."""
        ...

    def cursor(self) -> int:
        """The position of the newest stored event, of any job (0: none yet)."""
        ...

    def events_after(self, cursor: int, limit: int = 1000) -> list[tuple[int, Event]]:
        """Events of every job stored after `cursor`, in the order they were stored, each with
        its position: what a process follows to see what other processes write. Gap-free: an
        event never appears after one stored later."""
        ...

    def position(self, name: str) -> int | None:
        """The position last saved under `name` (a subscription's place in `events_after` order);
        None if none was ever saved."""
        ...

    def save_position(self, name: str, position: int) -> None:
        """Keep `position` under `name`, as durably as an append, replacing the one saved before."""
        ...

    def save_deliveries(self, records: Sequence[Delivery]) -> None:
        """Keep these delivery records, each replacing the one of its (job, seq, url), all at once."""
        ...

    def deliveries(self, job_id: str) -> list[Delivery]:
        """The job's delivery records, by seq then url."""
        ...


@runtime_checkable
class JobProjections(Protocol):
    """Queries over every job's current state, as its log folds (the module docstring)."""

    def get(self, job_id: str) -> JobState | None:
        """The job's current state; None for an unknown job."""
        ...

    def by_idempotency_key(self, key: str) -> JobState | None:
        """The state of the job submitted with idempotency key `key`; None if none was."""
        ...

    def list_jobs(
        self,
        *,
        status: Status | None = None,
        limit: int = 50,
        before: int | None = None,
        after: int | None = None,
        oldest_first: bool = False,
    ) -> list[tuple[int, JobState]]:
        """Newest first (or oldest first), with each job's cursor (its submission order); only
        jobs whose cursor is below `before` and above `after`, so either pages on."""
        ...

    def cursor_of(self, job_id: str) -> int | None:
        """The job's cursor in `list_jobs` (its submission order); None for an unknown job."""
        ...

    def list_videos(
        self, *, limit: int = 50, before: int | None = None, after: int | None = None, oldest_first: bool = False
    ) -> list[tuple[int, JobState]]:
        """`list_jobs` without the jobs whose video is marked deleted, skipped where selected: a
        page reads no more with many marked than with none."""
        ...

    def mark_video_deleted(self, job_id: str, at: datetime) -> None:
        """Record that the job's video was deleted at `at`, durably; a job marked before keeps its
        first time. Raises UnknownJob for a job the store does not hold."""
        ...

    def video_deleted_at(self, job_id: str) -> datetime | None:
        """When `mark_video_deleted` recorded the job's video deleted; None if it never did."""
        ...

    def videos_deleted_at(self, job_ids: Collection[str]) -> dict[str, datetime]:
        """`video_deleted_at` of each of `job_ids` whose video is marked deleted (the others left out)."""
        ...

    def video_deletions(self, after: int = 0, limit: int = 1000) -> list[VideoDeletion]:
        """The first `limit` jobs whose video was marked deleted after position `after`, in the
        order they were marked: gap-free, as `events_after` (the module docstring). Positions
        start at 1."""
        ...

    def queued(
        self,
        limit: int = 100,
        exclude: Collection[str] = (),
        modes: Collection[str] | None = None,
        fits: QueueFilter | None = None,
    ) -> list[JobState]:
        """Queued jobs in the order they should run, leaving out the ids in `exclude` (a runner's
        claim skips jobs it still holds, so it parses only the states it can take), where `modes`
        is given, jobs in other modes (the executor cannot start those now) and, where `fits` is
        given, jobs it does not pass (`fits.passes(request.frames, tokens)`: a node's pre-filter)."""
        ...

    def unfinished(self) -> list[JobState]:
        """Every job that has not ended, in queue order."""
        ...

    def counts(self) -> dict[str, int]:
        """Jobs per status."""
        ...

    def queue_position(self, job_id: str) -> int | None:
        """1 for the next queued job to run; None if the job is not queued."""
        ...


@runtime_checkable
class EventStore(EventLog, JobProjections, Protocol):
    """The log and its projections, in one store."""

    def ping(self) -> None:
        """Raise if the store cannot take a write now."""
        ...

    def close(self) -> None:
        """Release what the store holds open (connections, files)."""
        ...


@runtime_checkable
class Notifying(Protocol):
    """An optional capability: a store that announces commits (PostgreSQL's LISTEN/NOTIFY), so a
    follower wakes when events are stored instead of polling for them. Without it, followers poll."""

    def wait_for_events(self, timeout_s: float) -> bool:
        """Block until a transaction (of any process) stores events, or `timeout_s` passes: True
        when woken. The first call returns True at once (what committed before it listened is read,
        not waited for)."""
        ...
