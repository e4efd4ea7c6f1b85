"""The PostgreSQL event store: the SQLite store's tables on a server, so several nodes share one
durable queue (the `postgres` extra: psycopg 3 and its pool; bench/RESULTS.md, pg_driver, says why that driver).

**Followable without gaps.** A sequence's values are not commit order in PostgreSQL: a writer can
take position 10, another 11 and commit first, and a follower that read 11 would move past 10
for good. So every transaction that writes events takes `LOCK TABLE events IN EXCLUSIVE MODE`
first (as eventsourcing's recorder does) and holds it to its commit: writers of events take turns,
positions are drawn in commit order, and `id > cursor` never skips one. Readers are not blocked
(EXCLUSIVE does not conflict with the ACCESS SHARE a SELECT takes), and a write transaction is a
handful of statements for a whole group commit (`append_batch`: one read of the states, one
insert of the events, one upsert of the projection), so the turn is short. The lock also makes
each write see the states it folds onto as of its turn: no `SELECT ... FOR UPDATE`, no deadlock
between batches that touch the same jobs in different orders, and a claim's `running` (written
with the job's last seq expected, checked in the turn) can never hand one job to two nodes.

A commit's effects are visible before its locks are released (PostgreSQL ends the transaction in
the proc array first), so a reader that sees position n sees every position below it.

Positions, deliveries and nodes' heartbeats are written without the events lock: they write no event.
No transaction waits long on a stalled client (`_postgres`: a frozen node would hold the events
lock), but those that fold whole logs in Python: refold, import and migration.

Each event row records the node that wrote it (`events.node`; NULL for a store opened without a
node id, and for imported events): who wrote what onto a job, for an audit of fencing.

**Its parts.** The store is the event log and its projections, with two more parts for the nodes
that share it, over the same connections (`_postgres.Connections`: one pool, one write lock):
`leases` (`postgres_leases.PostgresNodeLeases`, the nodes and their leases) and `turns`
(`postgres_turns.PostgresTurns`, leased rows of the `turns` table). One coupling is kept on
purpose: an append checks and moves the leases of the jobs it writes inside its own transaction
(`PostgresNodeLeases.fence` and `settle`), under the events lock: a check made before the write
would let a node whose lease another append moved meanwhile write onto the attempt.

The schema, the parts' tables included, is versioned as SQLite's is (`MIGRATIONS`; the version in
`schema_version`), migrated under an advisory lock so nodes starting together migrate once.
Everything lives in the connection's `search_path` schema: one database can hold several stores.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from h3core.adapters.store._postgres import UNHURRIED, Connections
from h3core.adapters.store._sql import POSTGRES, SQLReads, fold_fingerprint, refolded, unstored
from h3core.adapters.store.base import AppendOutcome, AppendRequest, Conflict, UnknownJob, precheck, utc_now
from h3core.adapters.store.postgres_leases import PostgresNodeLeases
from h3core.adapters.store.postgres_turns import PostgresTurns
from h3core.adapters.store.sqlite import SchemaTooNew
from h3core.domain.admission import QueueFilter
from h3core.domain.events import Body, Event, Submitted
from h3core.domain.state import IllegalEvent, JobState, extend
from h3core.domain.webhooks import Delivery

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresEventStore"]


def _v1(cur: psycopg.Cursor) -> None:
    cur.execute(
        "CREATE TABLE events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, job_id text NOT NULL, "
        "seq integer NOT NULL, type text NOT NULL, at text NOT NULL, body text NOT NULL)"
    )
    cur.execute("CREATE UNIQUE INDEX events_job_seq ON events (job_id, seq)")
    cur.execute(
        "CREATE TABLE jobs (job_id text PRIMARY KEY, queue_order bigint NOT NULL UNIQUE, status text NOT NULL, "
        "priority integer NOT NULL, mode text NOT NULL, created_at text NOT NULL, updated_at text NOT NULL, "
        "last_seq integer NOT NULL, idempotency_key text UNIQUE, state text NOT NULL)"
    )
    # queued(): the queue's head without a sort; listings by status, newest first.
    cur.execute("CREATE INDEX jobs_queue ON jobs (priority DESC, queue_order) WHERE status = 'queued'")
    cur.execute("CREATE INDEX jobs_status_order ON jobs (status, queue_order)")
    cur.execute("CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL)")
    cur.execute("CREATE TABLE positions (name text PRIMARY KEY, position bigint NOT NULL, saved_at text NOT NULL)")
    cur.execute(
        "CREATE TABLE deliveries (job_id text NOT NULL, seq integer NOT NULL, url text NOT NULL, record text NOT NULL, "
        "PRIMARY KEY (job_id, seq, url))"
    )
    # Append-only, enforced by the database itself rather than by convention.
    cur.execute(
        "CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'events are append-only: % refused', TG_OP; END $$"
    )
    cur.execute(
        "CREATE TRIGGER events_no_change BEFORE UPDATE OR DELETE ON events FOR EACH ROW EXECUTE FUNCTION events_append_only()"
    )
    cur.execute("CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events EXECUTE FUNCTION events_append_only()")


def _v2(cur: psycopg.Cursor) -> None:
    # Runner nodes and the lease each holds on a running attempt (h3core.adapters.store.nodes).
    cur.execute(
        "CREATE TABLE nodes (node_id text PRIMARY KEY, info text NOT NULL, lease_s real NOT NULL, "
        "started_at timestamptz NOT NULL, beat_at timestamptz NOT NULL, left_at timestamptz)"
    )
    cur.execute(
        "CREATE TABLE leases (job_id text PRIMARY KEY, attempt integer NOT NULL, node_id text NOT NULL, "
        "renewed_at timestamptz NOT NULL)"
    )
    cur.execute("CREATE INDEX leases_node ON leases (node_id)")


def _v3(cur: psycopg.Cursor) -> None:
    # What a node's claim filters the queue by, as columns in the queue's index: a node walks past
    # jobs it cannot run without parsing their states (bench.throughput.nodes, claim: 805 ms with 25,000
    # such jobs at the head when read from the JSON).
    cur.execute("ALTER TABLE jobs ADD COLUMN frames integer, ADD COLUMN tokens integer")
    cur.execute("UPDATE jobs SET frames = (state::json->'request'->>'frames')::int, tokens = (state::json->>'tokens')::int")
    cur.execute("DROP INDEX jobs_queue")
    cur.execute(
        "CREATE INDEX jobs_queue ON jobs (priority DESC, queue_order) INCLUDE (mode, frames, tokens) WHERE status = 'queued'"
    )


def _v4(cur: psycopg.Cursor) -> None:
    # Videos deleted through /v1/videos, marked on their job's row, and an index of the rest (as
    # SQLite's schema 8): a page of /v1/videos no longer walks past every deleted one.
    cur.execute("ALTER TABLE jobs ADD COLUMN video_deleted_at text")
    cur.execute("CREATE INDEX jobs_videos ON jobs (queue_order) WHERE video_deleted_at IS NULL")


def _v5(cur: psycopg.Cursor) -> None:
    # Which node wrote each event (NULL before, and for a store opened without a node id).
    cur.execute("ALTER TABLE events ADD COLUMN node text")


def _v6(cur: psycopg.Cursor) -> None:
    # Turns with a lease (postgres_turns): a holder frozen or cut off from the server loses its
    # turn once its lease passes, however long its session lives.
    cur.execute(
        "CREATE TABLE turns (name text PRIMARY KEY, holder text NOT NULL, token text NOT NULL, "
        "lease_s double precision NOT NULL, renewed_at timestamptz NOT NULL)"
    )


def _v7(cur: psycopg.Cursor) -> None:
    # Deletions as a followable feed (as SQLite's schema 9): each mark's position, the marks made
    # before numbered in submission order, and an index of the marked jobs by it.
    cur.execute("ALTER TABLE jobs ADD COLUMN video_deleted_pos bigint")
    cur.execute(
        "UPDATE jobs SET video_deleted_pos = m.n FROM (SELECT job_id, row_number() OVER (ORDER BY queue_order) AS n "
        "FROM jobs WHERE video_deleted_at IS NOT NULL) m WHERE jobs.job_id = m.job_id"
    )
    cur.execute("CREATE INDEX jobs_deletions ON jobs (video_deleted_pos) WHERE video_deleted_pos IS NOT NULL")


def _v8(cur: psycopg.Cursor) -> None:
    # A node marked draining (h3core.adapters.store.nodes): since when and by whom; NULL: it takes
    # new jobs. Columns of their own, not in `info`: a node's beat rewrites its info.
    cur.execute("ALTER TABLE nodes ADD COLUMN drain_since timestamptz, ADD COLUMN drain_by text")


# Index i migrates schema version i to i + 1. Add a function here, never edit an old one.
MIGRATIONS: tuple[Callable[[psycopg.Cursor], None], ...] = (_v1, _v2, _v3, _v4, _v5, _v6, _v7, _v8)
SCHEMA_VERSION = len(MIGRATIONS)

_UPSERT_JOBS = (
    "INSERT INTO jobs (job_id, queue_order, status, priority, mode, created_at, updated_at, last_seq, idempotency_key, state, "
    "frames, tokens) "
    "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::int[], %s::text[], %s::text[], %s::text[], %s::int[], "
    "%s::text[], %s::text[], %s::int[], %s::int[]) "
    "ON CONFLICT (job_id) DO UPDATE SET status = excluded.status, updated_at = excluded.updated_at, "
    "last_seq = excluded.last_seq, state = excluded.state, tokens = excluded.tokens, priority = excluded.priority"
)
_INSERT_EVENTS = (
    "INSERT INTO events (job_id, seq, type, at, body, node) "
    "SELECT j, s, t, a, b, %s::text FROM unnest(%s::text[], %s::int[], %s::text[], %s::text[], %s::text[]) "
    "WITH ORDINALITY AS x(j, s, t, a, b, n) ORDER BY n RETURNING id, job_id, seq"
)


class PostgresEventStore(SQLReads):
    """The event store on the PostgreSQL server at `url`, shared by several nodes (the module
    docstring), over a pool of at most `pool_size` connections; migrated when opened. Its
    `leases` and `turns` are its parts for nodes (`WithNodeLeases`, `WithTurns`)."""

    _sql = POSTGRES

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        connect_timeout_s: float = 30.0,
        clock: Callable[[], datetime] = utc_now,
        node: str | None = None,
    ) -> None:
        """`node`: this process's node id when it runs jobs beside other nodes: its writes are
        fenced by leases and its `running` events take one (`leases.node_id`; h3core.adapters.store.nodes)."""
        self._db = Connections(url, pool_size=pool_size, connect_timeout_s=connect_timeout_s)
        self.url = url
        self.path = url  # what messages name the store by (as SQLite's path)
        self._clock = clock
        self._leases = PostgresNodeLeases(self._db, node)
        self._turns = PostgresTurns(self._db)
        self._listener: psycopg.Connection | None = None  # LISTENs for other writers' commits
        self._listen_lock = threading.Lock()
        try:
            self._migrate()
            # Commits of events are announced on a channel of this store's schema (one database may hold several).
            self._channel = "h3core_events." + self._read("SELECT current_schema()")[0][0]
            self._refold()
        except BaseException:
            self._db.close()
            raise

    @property
    def leases(self) -> PostgresNodeLeases:
        """The nodes and their leases (`NodeLeases`), which fence this store's appends."""
        return self._leases

    @property
    def turns(self) -> PostgresTurns:
        """Named turns, one holder each across the deployment (`Turns`)."""
        return self._turns

    # -- connections (SQLReads reads through these) -----------------------------------------

    def _read(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        return self._db.read(sql, params)

    _point = _read  # every read takes a pooled connection of its own: none waits behind a scan

    # -- schema ---------------------------------------------------------------------------

    def schema_version(self) -> int:
        """The schema version the database is at."""
        return self._read("SELECT version FROM schema_version")[0][0]

    def _migrate(self) -> None:
        with self._db.connection() as conn, conn.transaction():
            conn.execute(UNHURRIED)  # first: a node waits for another's migration, however long it takes
            # Nodes starting together: one migrates, the others wait and find it done.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.h3core.migrate'))")
            schema = conn.execute("SELECT current_schema()").fetchone()
            assert schema is not None  # a SELECT without FROM returns one row
            if schema[0] is None:
                raise RuntimeError(f"{self.url}: no schema to create the store in (its search_path names none that exists)")
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version integer NOT NULL)")
            row = conn.execute("SELECT version FROM schema_version").fetchone()
            version = row[0] if row else 0
            if version > len(MIGRATIONS):
                raise SchemaTooNew(
                    f"{self.url} has schema version {version}; this h3core knows up to {len(MIGRATIONS)}. Upgrade h3core."
                )
            with conn.cursor() as cur:
                for i in range(version, len(MIGRATIONS)):
                    MIGRATIONS[i](cur)
            if row is None:
                conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (len(MIGRATIONS),))
            else:
                conn.execute("UPDATE schema_version SET version = %s", (len(MIGRATIONS),))

    def _refold(self) -> None:
        """The `jobs` projection is derived: folded by other code (an upgrade), fold it again."""
        fingerprint = fold_fingerprint()
        if self._read(POSTGRES.fold) == [(fingerprint,)]:
            return

        def refold(conn: psycopg.Connection) -> None:
            _upsert(conn, refolded(conn, POSTGRES), {})
            conn.execute(POSTGRES.save_fold, (fingerprint,))

        self._db.write(refold, unhurried=True)

    # -- writes ---------------------------------------------------------------------------

    def append(
        self, job_id: str, bodies: Sequence[Body], *, expected_seq: int | None = None
    ) -> tuple[JobState, tuple[Event, ...]]:
        """One append, as a batch of one (`append_batch`); raises what refused it."""
        (outcome,) = self.append_batch([(job_id, bodies, expected_seq)])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def append_batch(self, items: Sequence[AppendRequest]) -> list[AppendOutcome]:
        """Every item folded onto the states read once, then written in one transaction that holds
        the events lock; a refused item writes nothing and is returned as its exception, in
        place."""
        return self._db.write(lambda conn: self._append_in(conn, items))

    def _append_in(self, conn: psycopg.Connection, items: Sequence[AppendRequest]) -> list[AppendOutcome]:
        """Every item folded in memory onto the states read once, then written in a few statements.
        A refused item writes nothing (it is checked whole before anything is written). The leases
        are read, checked and written back in this transaction (the module docstring)."""
        states = _states(conn, {job_id for job_id, _, _ in items})
        keys = [b.idempotency_key for _, bodies, _ in items for b in bodies[:1] if isinstance(b, Submitted) and b.idempotency_key]
        taken = set(_key_owners(conn, keys))
        fence = self._leases.fence(conn, states)
        at = self._clock()
        outcomes: list[AppendOutcome] = []
        written: list[Event] = []
        for job_id, bodies, expected_seq in items:
            try:
                state = states.get(job_id)
                precheck(state, job_id, bodies, expected_seq)
                fence.check(state, bodies)
                new_state, events = extend(state, job_id, bodies, at)
                if state is None and new_state.idempotency_key is not None:
                    if new_state.idempotency_key in taken:
                        raise Conflict(f"idempotency key {new_state.idempotency_key!r} is already in use")
                    taken.add(new_state.idempotency_key)
            except (IllegalEvent, Conflict, UnknownJob, ValueError) as exc:
                outcomes.append(exc)
                continue
            states[job_id] = new_state
            written.extend(events)
            outcomes.append((new_state, events))
            fence.record(new_state, bodies)
        if written:
            _store(conn, written, {s.job_id: s for s in states.values() if s is not None}, self._leases.node_id)
            conn.execute("SELECT pg_notify(%s, '')", (self._channel,))  # delivered at commit, to `wait_for_events`
            self._leases.settle(conn, fence, {e.job_id for e in written})
        return outcomes

    def import_events(self, events: Sequence[Event]) -> int:
        """As the contract says; the new events take positions in the order given."""
        by_job: dict[str, list[Event]] = {}
        for e in events:
            by_job.setdefault(e.job_id, []).append(e)

        def imported(conn: psycopg.Connection) -> int:
            states = _states(conn, set(by_job))
            fresh: list[Event] = []
            for job_id, evs in by_job.items():
                states[job_id], new = unstored(conn, POSTGRES, states.get(job_id), evs)
                fresh.extend(new)
            if fresh:
                order = {id(e): i for i, e in enumerate(events)}
                fresh.sort(key=lambda e: order[id(e)])  # stored in the order given (a migration keeps the source's)
                submitted = {e.job_id: states[e.job_id] for e in fresh if isinstance(e.body, Submitted)}
                keys = {s.idempotency_key: s.job_id for s in submitted.values() if s is not None and s.idempotency_key}
                for key, owner in _key_owners(conn, list(keys)).items():
                    if owner != keys[key]:
                        raise Conflict(f"idempotency key {key!r} is already in use")
                _store(conn, fresh, {s.job_id: s for s in states.values() if s is not None}, None)
                conn.execute("SELECT pg_notify(%s, '')", (self._channel,))
            return len(fresh)

        return self._db.write(imported, unhurried=True)

    # -- reads ----------------------------------------------------------------------------

    def queued(
        self,
        limit: int = 100,
        exclude: Collection[str] = (),
        modes: Collection[str] | None = None,
        fits: QueueFilter | None = None,
    ) -> list[JobState]:
        """Queued jobs by priority, then submission order, filtered in SQL as `JobProjections.queued` says."""
        only, bounds = POSTGRES.fits(fits) if fits is not None else ("", ())
        rows = self._read(
            "SELECT state FROM jobs WHERE status = 'queued' AND NOT job_id = ANY(%s) AND (%s::text[] IS NULL OR mode = ANY(%s))"
            f"{only} ORDER BY priority DESC, queue_order LIMIT %s",
            (list(exclude), None if modes is None else list(modes), None if modes is None else list(modes), *bounds, limit),
        )
        return [JobState.model_validate_json(s) for (s,) in rows]

    def ping(self) -> None:
        """Raise unless the server answers and takes writes (a standby does not)."""
        if self._read("SHOW transaction_read_only") != [("off",)]:
            raise RuntimeError(f"{self.url} is read-only (a standby?)")
        self._db.committed_at = time.monotonic()

    def committed_within(self, seconds: float) -> bool:
        """Did this store commit (or ping) within the last `seconds`? (/readyz, as SQLite's.)"""
        return self._db.committed_within(seconds)

    def wait_for_events(self, timeout_s: float) -> bool:
        """Block until a transaction (of any process) stores events, or `timeout_s` passes: True
        when woken (LISTEN/NOTIFY; the followers' wake-up, `h3core.runtime.tail`). The first call
        returns True at once: what committed before it listened is read, not waited for. After any
        error the listening session is dropped, and the next call is a first call again."""
        import psycopg

        with self._listen_lock:
            try:
                if self._listener is None or self._listener.closed:
                    self._drop_listener()
                    self._listener = self._db.session()
                    self._listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self._channel)))
                    return True
                for _ in self._listener.notifies(timeout=timeout_s, stop_after=1):
                    return True
                return False
            except BaseException:
                # Whatever failed, the next call listens on a new session (and returns True at once:
                # what was announced meanwhile is read, not waited for).
                self._drop_listener()
                raise

    def _drop_listener(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(Exception):  # a session already gone closes without a word
                self._listener.close()
            self._listener = None

    def orphans(self) -> list[str]:
        """Job ids with events but no `jobs` row (invisible to the store API): what `verify` reports."""
        rows = self._read("SELECT DISTINCT job_id FROM events WHERE job_id NOT IN (SELECT job_id FROM jobs) ORDER BY job_id")
        return [j for (j,) in rows]

    def position_of(self, job_id: str, seq: int) -> int:
        """The position of the job's event #seq (0 if absent)."""
        rows = self._read("SELECT id FROM events WHERE job_id = %s AND seq = %s", (job_id, seq))
        return rows[0][0] if rows else 0

    def save_position(self, name: str, position: int) -> None:
        """Keep `position` under `name`, committed before it returns (without the events lock)."""
        self._db.write(
            lambda conn: conn.execute(POSTGRES.save_position, (name, position, self._clock().isoformat())),
            events=False,
        )

    def save_deliveries(self, records: Sequence[Delivery]) -> None:
        """Keep the records, each replacing the one of its (job, seq, url), in one transaction."""

        def save(conn: psycopg.Connection) -> None:
            with conn.cursor() as cur:
                cur.executemany(
                    POSTGRES.save_delivery,
                    [(r.job_id, r.seq, r.url, r.model_dump_json()) for r in records],
                )

        self._db.write(save, events=False)

    def mark_video_deleted(self, job_id: str, at: datetime) -> None:
        """Mark the job's video deleted (the first time kept), committed before it returns. No event,
        but under the events lock: the first mark's deletion position is drawn in commit order, as
        an event's is, so `video_deletions` skips none (the projection's upsert leaves the columns alone)."""

        def mark(conn: psycopg.Connection) -> None:
            if conn.execute(POSTGRES.mark_video_deleted, (at.isoformat(), job_id)).rowcount == 0:
                raise UnknownJob(job_id)

        self._db.write(mark)

    def close(self) -> None:
        """Close the listening connection and the pool."""
        with self._listen_lock:
            self._drop_listener()
        self._db.close()


def _states(conn: psycopg.Connection, job_ids: Collection[str]) -> dict[str, JobState | None]:
    rows = conn.execute("SELECT job_id, state FROM jobs WHERE job_id = ANY(%s)", (list(job_ids),)).fetchall()
    return {job_id: JobState.model_validate_json(s) for job_id, s in rows}


def _key_owners(conn: psycopg.Connection, keys: Sequence[str]) -> dict[str, str]:
    if not keys:
        return {}
    return dict(
        conn.execute("SELECT idempotency_key, job_id FROM jobs WHERE idempotency_key = ANY(%s)", (list(keys),)).fetchall()
    )


def _store(conn: psycopg.Connection, events: Sequence[Event], states: dict[str, JobState], node: str | None) -> None:
    """Insert `events` in order (positions drawn in that order), each recording `node` as its
    writer, and bring the jobs they belong to to `states`; a new job's queue order is its
    `Submitted` event's position."""
    rows = conn.execute(
        _INSERT_EVENTS,
        (
            node,
            [e.job_id for e in events],
            [e.seq for e in events],
            [e.type for e in events],
            [e.at.isoformat() for e in events],
            [e.body.model_dump_json() for e in events],
        ),
    ).fetchall()
    submitted_at = {job_id: pos for pos, job_id, seq in rows if seq == 1}
    touched = list(dict.fromkeys(e.job_id for e in events))
    _upsert(conn, [states[j] for j in touched], submitted_at)


def _upsert(conn: psycopg.Connection, states: Sequence[JobState], queue_order: dict[str, int]) -> None:
    """Each state's `jobs` row: inserted for a new job (at `queue_order[job_id]`), else updated."""
    if not states:
        return
    conn.execute(
        _UPSERT_JOBS,
        (
            [s.job_id for s in states],
            [queue_order.get(s.job_id, 0) for s in states],
            [s.status for s in states],
            [s.priority for s in states],
            [s.request.mode for s in states],
            [s.created_at.isoformat() for s in states],
            [s.updated_at.isoformat() for s in states],
            [s.last_seq for s in states],
            [s.idempotency_key for s in states],
            [s.model_dump_json() for s in states],
            [s.request.frames for s in states],
            [s.tokens for s in states],
        ),
    )
