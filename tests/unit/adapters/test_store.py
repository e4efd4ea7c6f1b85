"""The event-store contract (`h3core.testing.store`) run against both stores, and what only
the SQLite store promises."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

import pytest

from h3core.adapters.store import MemoryEventStore, SchemaTooNew, SQLiteEventStore
from h3core.adapters.store.sqlite import SCHEMA_VERSION
from h3core.domain.events import Admitted, Running
from h3core.testing.store import EventStoreContract
from tests.factories import done_log, submitted


class TestSQLiteEventStore(EventStoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        s = SQLiteEventStore(tmp_path / "h3.db", durable=False)
        yield s
        s.close()


class TestMemoryEventStore(EventStoreContract):
    @pytest.fixture
    def store(self):
        return MemoryEventStore()


class TestPostgresEventStore(EventStoreContract):
    @pytest.fixture
    def store(self, pg_url):
        from h3core.adapters.store.postgres import PostgresEventStore

        s = PostgresEventStore(pg_url)
        yield s
        s.close()


# -- SQLite specifics ---------------------------------------------------------------------


def test_sqlite_refuses_update_and_delete_of_events(tmp_path):
    store = SQLiteEventStore(tmp_path / "h3.db")
    store.append("j", [submitted()])
    conn = sqlite3.connect(tmp_path / "h3.db")
    for sql in ("UPDATE events SET type = 'done'", "DELETE FROM events"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute(sql)
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 1


def test_sqlite_uses_wal_and_records_its_schema_version(tmp_path):
    store = SQLiteEventStore(tmp_path / "h3.db")
    assert store.schema_version() == SCHEMA_VERSION
    conn = sqlite3.connect(tmp_path / "h3.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()
    # Reopening an up-to-date file migrates nothing and keeps the data.
    store = SQLiteEventStore(tmp_path / "h3.db")
    assert store.schema_version() == SCHEMA_VERSION


def test_sqlite_refuses_a_file_from_a_newer_schema(tmp_path):
    SQLiteEventStore(tmp_path / "h3.db").close()
    conn = sqlite3.connect(tmp_path / "h3.db")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaTooNew, match="schema version"):
        SQLiteEventStore(tmp_path / "h3.db")


def test_sqlite_survives_a_second_connection_reading_while_it_writes(tmp_path):
    """docs/design.md §2.3: a reader on another connection never makes a write fail."""
    store = SQLiteEventStore(tmp_path / "h3.db", busy_timeout_s=5)
    for i in range(50):
        store.append(f"j{i}", [submitted(), Admitted()])
    other = sqlite3.connect(tmp_path / "h3.db")
    cursor = other.execute("SELECT * FROM events")  # a read left open on purpose
    cursor.fetchone()
    for state in store.unfinished():
        store.append(state.job_id, [Running(attempt=1, executor="x")])
    assert store.counts() == {"running": 50}
    cursor.close()


def test_a_version_1_file_is_migrated_forward(tmp_path):
    from sqlite_utils import Database

    from h3core.adapters.store.sqlite import MIGRATIONS

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    MIGRATIONS[0](Database(conn))  # what h3core 0.1 (schema 1) wrote
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    store = SQLiteEventStore(path)
    assert store.schema_version() == SCHEMA_VERSION == 9
    plan = (
        sqlite3.connect(path)
        .execute("EXPLAIN QUERY PLAN SELECT state FROM jobs WHERE status = 'queued' ORDER BY priority DESC, queue_order LIMIT 5")
        .fetchall()
    )
    assert not any("TEMP B-TREE" in row[-1] for row in plan), plan  # the v2 index serves the queue order
    plan = (
        sqlite3.connect(path)
        .execute("EXPLAIN QUERY PLAN SELECT queue_order, state FROM jobs WHERE status = 'done' ORDER BY queue_order DESC LIMIT 5")
        .fetchall()
    )
    assert not any("TEMP B-TREE" in row[-1] for row in plan), plan  # v3: listing by status
    store.append("j", [submitted(), Admitted()])
    assert [s.job_id for s in store.queued()] == ["j"]


def test_queued_jobs_of_a_version_6_file_get_the_columns_a_nodes_claim_filters_by(tmp_path):
    from h3core.domain.admission import QueueFilter

    path = tmp_path / "v6.db"
    store = SQLiteEventStore(path)
    for job, frames, tokens in (("long", 400, 9000), ("short", 50, 900)):
        store.append(job, [submitted(frames=frames), Admitted(tokens=tokens)])
    store.close()
    # Back to version 6's shape: the jobs table without the columns versions 7 and 8 add.
    conn = sqlite3.connect(path, isolation_level=None)
    _drop_v8(conn)
    conn.execute("DROP INDEX jobs_queue")
    for column in ("mode", "frames", "tokens"):
        conn.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
    conn.execute("CREATE INDEX jobs_queue ON jobs (status, priority DESC, queue_order)")
    conn.execute("PRAGMA user_version = 6")
    conn.close()
    store = SQLiteEventStore(path)
    assert store.schema_version() == SCHEMA_VERSION
    assert [s.job_id for s in store.queued()] == ["long", "short"]
    assert [s.job_id for s in store.queued(fits=QueueFilter(max_frames=200))] == ["short"]
    assert [s.job_id for s in store.queued(fits=QueueFilter(max_tokens=1000))] == ["short"]
    assert [s.job_id for s in store.queued(modes=["fl2va"])] == []
    assert [s.job_id for s in store.queued(modes=["t2va"], fits=QueueFilter(max_frames=500))] == ["long", "short"]
    store.close()


def _drop_v8(conn: sqlite3.Connection) -> None:
    conn.execute("DROP INDEX jobs_deletions")
    conn.execute("ALTER TABLE jobs DROP COLUMN video_deleted_pos")  # version 8's
    conn.execute("DROP INDEX jobs_videos")
    conn.execute("ALTER TABLE jobs DROP COLUMN video_deleted_at")


def test_the_jobs_of_a_version_7_file_are_listed_as_videos_until_one_is_marked_deleted(tmp_path):
    path = tmp_path / "v7.db"
    store = SQLiteEventStore(path)
    for job in ("a", "b"):
        store.append(job, [submitted(), Admitted()])
    store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    _drop_v8(conn)
    conn.execute("PRAGMA user_version = 7")
    conn.close()
    store = SQLiteEventStore(path)
    assert store.schema_version() == SCHEMA_VERSION
    assert [s.job_id for _, s in store.list_videos()] == ["b", "a"] and store.video_deleted_at("a") is None
    store.mark_video_deleted("b", datetime(2026, 1, 1, tzinfo=UTC))
    assert [s.job_id for _, s in store.list_videos()] == ["a"]
    store.close()


def test_the_videos_a_version_8_file_marked_deleted_follow_in_submission_order(tmp_path):
    path = tmp_path / "v8.db"
    store = SQLiteEventStore(path)
    for job in ("a", "b", "c"):
        store.append(job, [submitted(), Admitted()])
    for job in ("c", "a"):
        store.mark_video_deleted(job, datetime(2026, 1, 1, tzinfo=UTC))
    store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP INDEX jobs_deletions")
    conn.execute("ALTER TABLE jobs DROP COLUMN video_deleted_pos")
    conn.execute("PRAGMA user_version = 8")
    conn.close()
    store = SQLiteEventStore(path)
    assert [d[:2] for d in store.video_deletions()] == [(1, "a"), (2, "c")]
    store.mark_video_deleted("b", datetime(2026, 1, 2, tzinfo=UTC))
    assert [d[:2] for d in store.video_deletions(after=2)] == [(3, "b")]
    store.close()


def test_a_writer_waits_for_another_processs_write_lock_up_to_its_busy_timeout(tmp_path):
    import threading

    path = tmp_path / "h3.db"
    patient, hasty = SQLiteEventStore(path, busy_timeout_s=30), SQLiteEventStore(path, busy_timeout_s=0.2)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another process writing
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        hasty.append("j", [submitted()])
    threading.Timer(0.3, lambda: holder.execute("COMMIT")).start()
    patient.append("j", [submitted()])  # waits out the other writer, then writes
    assert hasty.get("j").status == "submitted"


def test_a_projection_folded_by_other_code_is_refolded_from_the_log_on_open(tmp_path):
    path = tmp_path / "s.db"
    store = SQLiteEventStore(path)
    store.append("j", done_log())
    truth = store.get("j")
    store.close()

    def tamper(fingerprint: str) -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        stale = truth.model_copy(update={"status": "queued", "artifact": None}).model_dump_json()
        conn.execute("UPDATE jobs SET status = 'queued', state = ? WHERE job_id = 'j'", (stale,))
        conn.execute("UPDATE meta SET value = ? WHERE key = 'fold'", (fingerprint,))
        conn.close()

    # The same code folded it: the projection is trusted as it is (no refold on every open).
    current = sqlite3.connect(path).execute("SELECT value FROM meta WHERE key = 'fold'").fetchone()[0]
    tamper(current)
    reopened = SQLiteEventStore(path)
    assert reopened.get("j").status == "queued"
    reopened.close()
    # Other code folded it (the state or an event changed since): rebuilt from the events.
    tamper("written by an older h3core")
    reopened = SQLiteEventStore(path)
    assert reopened.get("j") == truth
    assert [s.job_id for s in reopened.queued(limit=5)] == []
    reopened.close()


def test_a_saved_position_survives_reopening_the_file(tmp_path):
    store = SQLiteEventStore(tmp_path / "h3.db")
    store.save_position("webhooks", 42)
    store.close()
    reopened = SQLiteEventStore(tmp_path / "h3.db")
    assert reopened.position("webhooks") == 42 and reopened.position("other") is None
    reopened.close()
