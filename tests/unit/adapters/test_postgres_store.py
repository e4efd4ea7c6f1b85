"""What only the PostgreSQL store promises beyond the contract (tests/unit/adapters/test_store.py
runs the contract on it): a follower misses nothing while several writers commit at once, the
schema is versioned, the log is append-only in the database itself, and a client frozen inside a
write transaction does not hold every other writer up."""

from __future__ import annotations

import os
import socket
import threading
from datetime import UTC, datetime

import psycopg
import pytest

from h3core.adapters.store import SchemaTooNew
from h3core.adapters.store.postgres import SCHEMA_VERSION, PostgresEventStore
from h3core.domain.events import Admitted, Progress, Running
from tests.factories import submitted

WRITERS = 4
APPENDS = 175  # per writer, in jobs of 5 appends (15 events): 2,100 events


def test_a_follower_sees_every_event_once_while_several_writers_commit_at_once(pg_url):
    """Positions are commit order (the events lock): a follower that moves its cursor to the
    highest position it has read never skips an event that commits later with a lower one."""
    stores = [PostgresEventStore(pg_url) for _ in range(WRITERS)]
    follower = PostgresEventStore(pg_url)
    done = threading.Event()
    seen: list[tuple[int, str, int]] = []
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            store = stores[w]
            for i in range(APPENDS):
                job = f"w{w}-{i // 5}"
                if i % 5 == 0:
                    store.append(job, [submitted(), Admitted()])
                elif i % 5 == 1:
                    store.append_batch([(job, [Running(attempt=1, executor="x")], None)])
                else:
                    step = 4 * (i % 5 - 2)
                    store.append(job, [Progress(step=step + k, total=12) for k in range(1, 5)])
        except BaseException as exc:
            errors.append(exc)

    def follow() -> None:
        cursor = 0
        while True:
            last = done.is_set()  # read after the writers ended: this pass sees everything
            for position, event in follower.events_after(cursor, limit=500):
                seen.append((position, event.job_id, event.seq))
                cursor = position
            if last:
                return

    threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    reader = threading.Thread(target=follow)
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join()
    assert not errors, errors
    everything = [(p, e.job_id, e.seq) for p, e in follower.events_after(0, limit=100_000)]
    assert len(everything) == WRITERS * APPENDS // 5 * 15
    assert len(set(seen)) == len(seen), "an event was followed twice"
    missed = sorted(set(everything) - set(seen))
    assert not missed, f"the follower skipped {len(missed)} events, first {missed[:5]}"
    assert seen == everything  # in position order, each job's events in seq order
    for s in [*stores, follower]:
        s.close()


def test_the_schema_is_versioned_and_a_newer_one_is_refused(pg_url):
    store = PostgresEventStore(pg_url)
    assert store.schema_version() == SCHEMA_VERSION
    store.close()
    PostgresEventStore(pg_url).close()  # opening again migrates nothing
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE schema_version SET version = version + 1")
    with pytest.raises(SchemaTooNew, match="schema version"):
        PostgresEventStore(pg_url)


def test_queued_jobs_of_a_version_2_store_get_the_columns_a_nodes_claim_filters_by(pg_url):
    from h3core.domain.admission import QueueFilter

    store = PostgresEventStore(pg_url)
    for job, frames, tokens in (("long", 400, 9000), ("short", 50, 900)):
        store.append(job, [submitted(frames=frames), Admitted(tokens=tokens)])
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # back to version 2's shape
        conn.execute("ALTER TABLE nodes DROP COLUMN drain_since, DROP COLUMN drain_by")  # version 7's
        conn.execute("DROP INDEX jobs_deletions")
        conn.execute("ALTER TABLE jobs DROP COLUMN video_deleted_pos")  # version 6's
        conn.execute("DROP INDEX jobs_videos")
        conn.execute("ALTER TABLE jobs DROP COLUMN video_deleted_at")
        conn.execute("DROP INDEX jobs_queue")
        conn.execute("ALTER TABLE jobs DROP COLUMN frames, DROP COLUMN tokens")
        conn.execute("ALTER TABLE events DROP COLUMN node")  # version 4's
        conn.execute("DROP TABLE turns")  # version 5's
        conn.execute("CREATE INDEX jobs_queue ON jobs (priority DESC, queue_order) WHERE status = 'queued'")
        conn.execute("UPDATE schema_version SET version = 2")
    store = PostgresEventStore(pg_url)
    try:
        assert store.schema_version() == SCHEMA_VERSION == 8
        assert [s.job_id for s in store.queued()] == ["long", "short"]
        assert [s.job_id for _, s in store.list_videos()] == ["short", "long"]  # version 4: none marked deleted
        assert [s.job_id for s in store.queued(fits=QueueFilter(max_frames=200))] == ["short"]
        assert [s.job_id for s in store.queued(fits=QueueFilter(max_tokens=1000))] == ["short"]
    finally:
        store.close()


def test_the_database_refuses_update_delete_and_truncate_of_events(pg_url):
    store = PostgresEventStore(pg_url)
    store.append("j", [submitted()])
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for sql in ("UPDATE events SET type = 'done'", "DELETE FROM events", "TRUNCATE events"):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(sql)


def test_a_turn_outlives_its_holders_sessions_and_passes_only_with_its_lease(pg_url):
    """Unlike a session advisory lock, a turn is not freed when the server ends its holder's
    connections: a frozen holder's sessions may live on, and a live holder's may be cut."""
    a = PostgresEventStore(pg_url, pool_size=1)
    try:
        held = a.turns.take_turn("webhooks", 30.0)
        assert held is not None
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid()")
            (row,) = admin.execute("SELECT holder, lease_s FROM turns").fetchall()
        assert row == (f"{socket.gethostname()}:{os.getpid()}", 30.0)  # who holds it, for people
        b = PostgresEventStore(pg_url)
        assert b.turns.take_turn("webhooks", 30.0) is None
        b.close()
    finally:
        a.close()


def test_a_write_transaction_whose_client_froze_is_ended_by_the_server_and_others_write_on(pg_url, monkeypatch):
    """A node stopped (SIGSTOP) inside a write would hold the events lock until it thawed; the server
    ends its transaction once it has waited on the client for `STALLED_TRANSACTION_S`."""
    from h3core.adapters.store import _postgres
    from h3core.runtime.store_retry import transient

    monkeypatch.setattr(_postgres, "STALLED_TRANSACTION_S", 0.5)
    frozen, live = PostgresEventStore(pg_url), PostgresEventStore(pg_url)
    live.append("j", [submitted()])
    locked, thaw, outcome = threading.Event(), threading.Event(), []

    def freeze() -> None:
        try:
            with frozen._db.pool.connection() as conn, conn.transaction():
                conn.execute("LOCK TABLE events IN EXCLUSIVE MODE")  # as a write begins
                locked.set()
                thaw.wait(60)  # the client is stopped; the server waits on it
        except psycopg.Error as exc:
            outcome.append(exc)

    stopped = threading.Thread(target=freeze)
    stopped.start()
    assert locked.wait(30)
    live.append("j", [Admitted()])  # waits for the lock: given up by the server, not by the frozen client
    assert not thaw.is_set()
    thaw.set()
    stopped.join(30)
    # Its write failed, as one the runner tries again (h3core.runtime.store_retry) when it thaws.
    assert outcome and "idle-in-transaction" in str(outcome[0]) and transient(outcome[0]), outcome
    frozen.append("j", [Running(attempt=1, executor="x")])  # and its store writes again, on a fresh connection
    assert [e.type for e in live.events("j")] == ["submitted", "admitted", "running"]
    frozen.close()
    live.close()


def test_the_videos_a_version_6_store_marked_deleted_follow_in_submission_order(pg_url):
    store = PostgresEventStore(pg_url)
    for job in ("a", "b", "c"):
        store.append(job, [submitted(), Admitted()])
    for job in ("c", "a"):
        store.mark_video_deleted(job, datetime(2026, 1, 1, tzinfo=UTC))
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # back to version 6's shape
        conn.execute("ALTER TABLE nodes DROP COLUMN drain_since, DROP COLUMN drain_by")  # version 7's
        conn.execute("DROP INDEX jobs_deletions")
        conn.execute("ALTER TABLE jobs DROP COLUMN video_deleted_pos")
        conn.execute("UPDATE schema_version SET version = 6")
    store = PostgresEventStore(pg_url)
    try:
        assert [d[:2] for d in store.video_deletions()] == [(1, "a"), (2, "c")]
        store.mark_video_deleted("b", datetime(2026, 1, 2, tzinfo=UTC))
        assert [d[:2] for d in store.video_deletions(after=2)] == [(3, "b")]
    finally:
        store.close()
