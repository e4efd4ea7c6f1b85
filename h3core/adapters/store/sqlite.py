"""The SQLite event store: an append-only `events` table and a `jobs` projection, in one file.

Why it cannot say "database is locked" (docs/design.md §2.3): WAL lets readers and the writer run
side by side; every write transaction starts with `BEGIN IMMEDIATE`, which takes the write lock
up front so a second writer waits out the busy timeout instead of failing on a lock upgrade;
and no read ever leaves a cursor open.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from h3core.adapters.store._sql import SQLITE, SQLReads, fold_fingerprint, refolded, unstored
from h3core.adapters.store.base import AppendOutcome, AppendRequest, Conflict, UnknownJob, precheck, utc_now
from h3core.domain.admission import QueueFilter
from h3core.domain.events import Body, Event, Submitted
from h3core.domain.state import IllegalEvent, JobState, extend
from h3core.domain.webhooks import Delivery

if TYPE_CHECKING:
    from sqlite_utils import Database

SCHEMA_VERSION = 9


class SchemaTooNew(RuntimeError):
    """The file was written by a newer h3core; this one must not touch it."""


def _v1(db: Database) -> None:
    db.table("events").create(
        {"id": int, "job_id": str, "seq": int, "type": str, "at": str, "body": str},
        pk="id",
        not_null=["job_id", "seq", "type", "at", "body"],
    )
    db.table("events").create_index(["job_id", "seq"], unique=True, index_name="events_job_seq")
    db.table("jobs").create(
        {
            "job_id": str,
            "queue_order": int,  # the Submitted event's row id: FIFO order, and the list cursor
            "status": str,
            "priority": int,
            "created_at": str,
            "updated_at": str,
            "last_seq": int,
            "idempotency_key": str,
            "state": str,
        },
        pk="job_id",
        not_null=["queue_order", "status", "priority", "created_at", "updated_at", "last_seq", "state"],
    )
    db.table("jobs").create_index(["queue_order"], unique=True, index_name="jobs_order")
    db.table("jobs").create_index(["status", "priority", "queue_order"], index_name="jobs_queue")
    db.table("jobs").create_index(["idempotency_key"], unique=True, index_name="jobs_idempotency")
    # Append-only, enforced by the database itself rather than by convention.
    for op in ("UPDATE", "DELETE"):
        db.execute(
            f"CREATE TRIGGER events_no_{op.lower()} BEFORE {op} ON events "
            f"BEGIN SELECT RAISE(ABORT, 'events are append-only: {op} refused'); END"
        )


def _v2(db: Database) -> None:
    # queued() orders by priority DESC, queue_order: an index in that order spares a sort of
    # the whole queue on every claim (bench/throughput/store.py: 9.5 ms -> 0.02 ms at 10k queued).
    db.execute("DROP INDEX jobs_queue")
    db.execute("CREATE INDEX jobs_queue ON jobs (status, priority DESC, queue_order)")


def _v3(db: Database) -> None:
    # GET /v1/jobs?status=...: newest first within a status, without sorting the whole status.
    db.execute("CREATE INDEX jobs_status_order ON jobs (status, queue_order)")


def _v4(db: Database) -> None:
    # What the `jobs` projection was folded with (see `_refold`): absent, it is rebuilt once.
    db.table("meta").create({"key": str, "value": str}, pk="key")


def _v5(db: Database) -> None:
    # Named readers' places in the log (subscriptions): what they have handled survives a restart.
    db.table("positions").create({"name": str, "position": int, "saved_at": str}, pk="name", not_null=["position", "saved_at"])


def _v6(db: Database) -> None:
    # What became of each webhook delivery (a record per job, seq and url), shown per job.
    db.table("deliveries").create(
        {"job_id": str, "seq": int, "url": str, "record": str}, pk=("job_id", "seq", "url"), not_null=["record"]
    )


def _v7(db: Database) -> None:
    # What a node's claim filters the queue by (mode, requested frames, tokens) as columns, in the
    # queue's index: a node walks past jobs it cannot run without parsing their states
    # (bench.throughput.nodes, claim: 131 ms with 25,000 such jobs at the head when read from the JSON).
    for column in ("mode TEXT", "frames INTEGER", "tokens INTEGER"):
        db.execute(f"ALTER TABLE jobs ADD COLUMN {column}")
    db.execute(
        "UPDATE jobs SET mode = json_extract(state, '$.request.mode'), frames = json_extract(state, '$.request.frames'), "
        "tokens = json_extract(state, '$.tokens')"
    )
    db.execute("DROP INDEX jobs_queue")
    db.execute("CREATE INDEX jobs_queue ON jobs (status, priority DESC, queue_order, mode, frames, tokens)")


def _v8(db: Database) -> None:
    # Videos deleted through /v1/videos, marked on their job's row, and an index of the rest: a page
    # of /v1/videos walked past every deleted one, reading its mark in the artifact store (issue 38:
    # 232-1,157 ms for ?limit=1 with 2,999 deleted). Marks made before are found while listing.
    db.execute("ALTER TABLE jobs ADD COLUMN video_deleted_at TEXT")
    db.execute("CREATE INDEX jobs_videos ON jobs (queue_order) WHERE video_deleted_at IS NULL")


def _v9(db: Database) -> None:
    # Deletions as a followable feed: each mark's position, in the order marked (the marks made
    # before, in submission order), and an index of the marked jobs by it: a node reads only the
    # deletions since it last looked (h3core.runtime.deletions).
    db.execute("ALTER TABLE jobs ADD COLUMN video_deleted_pos INTEGER")
    marked = [j for (j,) in db.execute("SELECT job_id FROM jobs WHERE video_deleted_at IS NOT NULL ORDER BY queue_order")]
    db.conn.executemany("UPDATE jobs SET video_deleted_pos = ? WHERE job_id = ?", [(i, j) for i, j in enumerate(marked, 1)])
    db.execute("CREATE INDEX jobs_deletions ON jobs (video_deleted_pos) WHERE video_deleted_pos IS NOT NULL")


# Index i migrates schema version i to i + 1. Add a function here, never edit an old one.
MIGRATIONS: tuple[Callable[[Database], None], ...] = (_v1, _v2, _v3, _v4, _v5, _v6, _v7, _v8, _v9)


_UPDATE_JOB = (
    "UPDATE jobs SET status = ?, updated_at = ?, last_seq = ?, state = ?, mode = ?, frames = ?, tokens = ?, priority = ? "
    "WHERE job_id = ?"
)


def _projection(state: JobState) -> tuple[str, str, int, str, str, int, int | None, int, str]:
    """A state's `jobs` columns, in `_UPDATE_JOB`'s order (the priority changes while queued)."""
    return (
        state.status,
        state.updated_at.isoformat(),
        state.last_seq,
        state.model_dump_json(),
        state.request.mode,
        state.request.frames,
        state.tokens,
        state.priority,
        state.job_id,
    )


def _until_not_busy(run: Callable[[], object], timeout_s: float) -> None:
    """`run`, again in short sleeps (0.1 to 2 ms) while SQLite answers busy, up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    pause = 0.0001
    while True:
        try:
            run()
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:  # extended codes too
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.002)


class SQLiteEventStore(SQLReads):
    """The event store in the SQLite file at `path`, made and migrated when opened. `durable`: every
    commit reaches the disk (else it survives a process crash only); `busy_timeout_s`: how long a
    write waits for another process's to finish."""

    # `cursor`/`events_after` (SQLReads) take row ids for positions: one write transaction at a time
    # (BEGIN IMMEDIATE) and no deletes, so a later commit never holds a smaller id, and `id > cursor`
    # never skips one.
    _sql = SQLITE

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_s: float = 30.0,
        durable: bool = True,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.path = str(path)
        self._clock = clock
        self._lock = threading.RLock()  # one writer per process; the file lock orders processes
        self._committed_at = -float("inf")  # monotonic time of the last commit (`committed_within`)
        self._rlock = threading.Lock()
        self._busy_timeout_s = busy_timeout_s
        self._w = self._connect(busy_timeout_s, durable)
        self._migrate()
        self._refold()
        self._r = self._connect(busy_timeout_s, durable)
        # Point reads (one row by key) get their own connection, so they never wait behind a
        # scan on `_r` (a listing, a count): the service answers them on its event loop.
        self._p = self._connect(busy_timeout_s, durable)
        self._plock = threading.Lock()

    def _connect(self, busy_timeout_s: float, durable: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        # Switching a new file to WAL, or opening one while another process rebuilds its index,
        # can answer SQLITE_BUSY without calling the busy handler (sqlite.org/wal.html): wait here.
        _until_not_busy(lambda: conn.execute("PRAGMA journal_mode = WAL"), busy_timeout_s)
        # FULL: a returned append has reached the disk. NORMAL survives a process crash only.
        conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    def _begin(self) -> None:
        """BEGIN IMMEDIATE: the write lock, waited for in short sleeps up to the busy timeout.

        Not in SQLite's busy handler, whose sleeps grow to 100 ms: with a second writing process
        (an API beside a runner) that made a commit wait tens of ms for a lock held a fraction of
        one. Every other statement keeps the handler (a CI run once saw one need it)."""
        self._w.execute("PRAGMA busy_timeout = 0")
        try:
            _until_not_busy(lambda: self._w.execute("BEGIN IMMEDIATE"), self._busy_timeout_s)
        finally:
            self._w.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._begin()
            try:
                yield self._w
                self._w.execute("COMMIT")
                self._committed_at = time.monotonic()
            except BaseException:
                # A failed COMMIT (busy) leaves the transaction open; an I/O error may have ended
                # it already. Either way none of it is stored, and the next write starts clean.
                if self._w.in_transaction:
                    self._w.execute("ROLLBACK")
                raise

    def _read(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        with self._rlock:
            return self._r.execute(sql, params).fetchall()

    def _point(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        with self._plock:
            return self._p.execute(sql, params).fetchall()

    # -- schema ---------------------------------------------------------------------------

    def schema_version(self) -> int:
        """The file's schema version (SQLite's `user_version`)."""
        return self._w.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self) -> None:
        with self._write() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise SchemaTooNew(
                    f"{self.path} has schema version {version}; this h3core knows up to "
                    f"{len(MIGRATIONS)}. Upgrade h3core, or restore the backup taken before the upgrade."
                )
            # Imported here: sqlite_utils imports numpy and pandas when they are installed, and
            # `import h3core` must not load them.
            from sqlite_utils import Database

            db = Database(conn)
            for i in range(version, len(MIGRATIONS)):
                MIGRATIONS[i](db)
            conn.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")

    def _refold(self) -> None:
        """The `jobs` projection is derived: where it was folded by other code (an upgrade that
        changed the state or an event), fold it again from the log, in one transaction."""
        fingerprint = fold_fingerprint()
        with self._write() as conn:
            if conn.execute(SQLITE.fold).fetchall() == [(fingerprint,)]:
                return
            conn.executemany(_UPDATE_JOB, [_projection(state) for state in refolded(conn, SQLITE)])
            conn.execute(SQLITE.save_fold, (fingerprint,))

    # -- writes ---------------------------------------------------------------------------

    def _state_in(self, conn: sqlite3.Connection, job_id: str) -> JobState | None:
        row = conn.execute(SQLITE.state, (job_id,)).fetchone()
        return JobState.model_validate_json(row[0]) if row else None

    def _store(self, conn: sqlite3.Connection, state: JobState, events: Sequence[Event]) -> None:
        first_id = None
        for e in events:
            try:
                cur = conn.execute(
                    "INSERT INTO events (job_id, seq, type, at, body) VALUES (?, ?, ?, ?, ?)",
                    (e.job_id, e.seq, e.type, e.at.isoformat(), e.body.model_dump_json()),
                )
            except sqlite3.IntegrityError as exc:  # UNIQUE(job_id, seq): the last-line check
                raise Conflict(f"job {e.job_id} already has an event #{e.seq}") from exc
            if first_id is None:
                first_id = cur.lastrowid
        row = _projection(state)
        if isinstance(events[0].body, Submitted):
            try:
                conn.execute(
                    "INSERT INTO jobs (status, updated_at, last_seq, state, mode, frames, tokens, priority, job_id, "
                    "queue_order, created_at, idempotency_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*row, first_id, state.created_at.isoformat(), state.idempotency_key),
                )
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"idempotency key {state.idempotency_key!r} is already in use") from exc
        else:
            conn.execute(_UPDATE_JOB, row)

    def append(
        self, job_id: str, bodies: Sequence[Body], *, expected_seq: int | None = None
    ) -> tuple[JobState, tuple[Event, ...]]:
        """Check and fold `bodies` onto the job's state and store them, in one write transaction (`EventLog.append`)."""
        with self._write() as conn:
            new_state, events = self._append_in(conn, job_id, bodies, expected_seq)
        return new_state, events

    def _append_in(
        self, conn: sqlite3.Connection, job_id: str, bodies: Sequence[Body], expected_seq: int | None
    ) -> tuple[JobState, tuple[Event, ...]]:
        state = self._state_in(conn, job_id)
        precheck(state, job_id, bodies, expected_seq)
        new_state, events = extend(state, job_id, bodies, self._clock())
        self._store(conn, new_state, events)
        return new_state, events

    def append_batch(self, items: Sequence[AppendRequest]) -> list[AppendOutcome]:
        """Every item in one transaction (one fsync), each in a savepoint: a refused item leaves no
        trace and is returned as its exception, in place."""
        # One transaction, one fsync for the lot (group commit); each item in its own savepoint,
        # so a refused item leaves no trace and does not stop the others.
        outcomes: list[AppendOutcome] = []
        with self._write() as conn:
            for job_id, bodies, expected_seq in items:
                conn.execute("SAVEPOINT item")
                try:
                    outcomes.append(self._append_in(conn, job_id, bodies, expected_seq))
                except (IllegalEvent, Conflict, UnknownJob, ValueError) as exc:
                    conn.execute("ROLLBACK TO item")
                    outcomes.append(exc)
                conn.execute("RELEASE item")
        return outcomes

    def import_events(self, events: Sequence[Event]) -> int:
        """Store events made elsewhere, in one transaction, each job's checked by folding it; how
        many were new (`EventLog.import_events`)."""
        by_job: dict[str, list[Event]] = {}
        for e in events:
            by_job.setdefault(e.job_id, []).append(e)
        added = 0
        with self._write() as conn:
            for job_id, evs in by_job.items():
                state, fresh = unstored(conn, SQLITE, self._state_in(conn, job_id), evs)
                if fresh:
                    assert state is not None
                    self._store(conn, state, fresh)
                    added += len(fresh)
        return added

    # -- reads ----------------------------------------------------------------------------

    def queued(
        self,
        limit: int = 100,
        exclude: Collection[str] = (),
        modes: Collection[str] | None = None,
        fits: QueueFilter | None = None,
    ) -> list[JobState]:
        """Queued jobs by priority, then submission order, filtered in SQL as `JobProjections.queued` says."""
        skip = f" AND job_id NOT IN ({', '.join('?' * len(exclude))})" if exclude else ""
        only = f" AND mode IN ({', '.join('?' * len(modes))})" if modes is not None else ""
        node, bounds = SQLITE.fits(fits) if fits is not None else ("", ())
        rows = self._read(
            f"SELECT state FROM jobs WHERE status = 'queued'{skip}{only}{node} ORDER BY priority DESC, queue_order LIMIT ?",
            (*exclude, *(modes or ()), *bounds, limit),
        )
        return [JobState.model_validate_json(s) for (s,) in rows]

    def ping(self) -> None:
        """Take the write lock and release it: raises unless the file takes a write now."""
        with self._write():  # takes the write lock and releases it: the file is writable now
            pass

    def committed_within(self, seconds: float) -> bool:
        """Did this store commit a write (a `ping` included) within the last `seconds`? As good as
        a ping that long ago, and it takes no lock: /readyz asks it under load."""
        return time.monotonic() - self._committed_at < seconds

    def event_at_or_before(self, position: int) -> tuple[str, int] | None:
        """(job_id, seq) of the newest event at or before `position`; None if there is none."""
        rows = self._point("SELECT job_id, seq FROM events WHERE id <= ? ORDER BY id DESC LIMIT 1", (position,))
        return rows[0] if rows else None

    def save_position(self, name: str, position: int) -> None:
        """Keep `position` under `name`, committed before it returns."""
        with self._write() as conn:
            conn.execute(SQLITE.save_position, (name, position, self._clock().isoformat()))

    def save_deliveries(self, records: Sequence[Delivery]) -> None:
        """Keep the records, each replacing the one of its (job, seq, url), in one transaction."""
        with self._write() as conn:
            conn.executemany(SQLITE.save_delivery, [(r.job_id, r.seq, r.url, r.model_dump_json()) for r in records])

    def mark_video_deleted(self, job_id: str, at: datetime) -> None:
        """Mark the job's video deleted (the first time kept), committed before it returns."""
        with self._write() as conn:
            if conn.execute(SQLITE.mark_video_deleted, (at.isoformat(), job_id)).rowcount == 0:
                raise UnknownJob(job_id)

    def close(self) -> None:
        """Close the store's connections, once no read or write of this process is using them."""
        with self._lock, self._rlock, self._plock:
            self._p.close()
            self._r.close()
            self._w.close()
