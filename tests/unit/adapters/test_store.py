"""The event-store contract, run against every implementation (see the `store` fixture)."""

from __future__ import annotations

import sqlite3

import pytest

from h3core.adapters.store import Conflict, SchemaTooNew, SQLiteEventStore, UnknownJob
from h3core.adapters.store.sqlite import SCHEMA_VERSION
from h3core.domain.events import Admitted, AttemptFailed, Progress, Running
from h3core.domain.retry import RetryPolicy
from h3core.domain.state import IllegalEvent
from tests.factories import done_log, submitted


def _queue(store, job, priority=0, **kw):
    body = submitted(**kw).model_copy(update={"priority": priority})
    return store.append(job, [body, Admitted()])[0]


def test_append_assigns_seq_and_returns_the_new_state(store):
    state, events = store.append("j", [submitted(), Admitted()])
    assert [e.seq for e in events] == [1, 2]
    assert state.status == "queued" and store.get("j") == state
    assert store.events("j", after_seq=1) == [events[1]]


def test_an_illegal_batch_stores_nothing(store):
    store.append("j", [submitted(), Admitted()])
    with pytest.raises(IllegalEvent) as err:
        store.append("j", [Running(attempt=1, executor="x"), Progress(step=2, total=1)])
    assert err.value.code == "step_over_total"
    assert [e.type for e in store.events("j")] == ["submitted", "admitted"]
    assert store.get("j").status == "queued"


def test_expected_seq_is_the_optimistic_concurrency_check(store):
    store.append("j", [submitted()], expected_seq=0)
    with pytest.raises(Conflict):
        store.append("j", [submitted()], expected_seq=0)
    with pytest.raises(Conflict):
        store.append("j", [Admitted()], expected_seq=5)
    store.append("j", [Admitted()], expected_seq=1)


def test_appending_to_an_unknown_job_is_refused(store):
    with pytest.raises(UnknownJob):
        store.append("nope", [Admitted()])


def test_idempotency_keys_are_unique(store):
    a = submitted().model_copy(update={"idempotency_key": "k1"})
    store.append("a", [a])
    assert store.by_idempotency_key("k1").job_id == "a"
    with pytest.raises(Conflict):
        store.append("b", [a])
    assert store.get("b") is None


def test_queue_order_is_priority_then_fifo_and_a_retry_keeps_its_place(store):
    for job, prio in [("a", 0), ("b", 0), ("c", 5), ("d", 0)]:
        _queue(store, job, prio, retry=RetryPolicy(max_attempts=2))
    store.append("a", [Running(attempt=1, executor="x")])
    assert [s.job_id for s in store.queued()] == ["c", "b", "d"]
    assert [store.queue_position(j) for j in "abcd"] == [None, 2, 1, 3]
    store.append("a", [AttemptFailed(kind="interrupted", message="m", attempt=1)])
    assert [s.job_id for s in store.queued()] == ["c", "a", "b", "d"]
    assert [s.job_id for s in store.queued(2, exclude={"a", "c"})] == ["b", "d"]
    assert [s.job_id for s in store.queued(1, exclude=["zz"])] == ["c"]
    assert [s.job_id for s in store.unfinished()] == ["c", "a", "b", "d"]


def test_listing_is_newest_first_with_a_cursor_and_a_status_filter(store):
    for i in range(5):
        _queue(store, f"j{i}")
    store.append("j1", [Running(attempt=1, executor="x")])
    page = store.list_jobs(limit=2)
    assert [s.job_id for _, s in page] == ["j4", "j3"]
    page2 = store.list_jobs(limit=10, before=page[-1][0])
    assert [s.job_id for _, s in page2] == ["j2", "j1", "j0"]
    assert [s.job_id for _, s in store.list_jobs(status="running")] == ["j1"]
    assert store.counts() == {"queued": 4, "running": 1}
    assert store.job_ids() == [f"j{i}" for i in range(5)]


def test_listing_pages_both_ways_from_a_jobs_cursor(store):
    for i in range(5):
        _queue(store, f"j{i}")
    assert store.cursor_of("nope") is None
    at = store.cursor_of("j1")
    assert [s.job_id for _, s in store.list_jobs(oldest_first=True, after=at, limit=2)] == ["j2", "j3"]
    assert [s.job_id for _, s in store.list_jobs(oldest_first=True)] == [f"j{i}" for i in range(5)]
    assert [s.job_id for _, s in store.list_jobs(before=store.cursor_of("j3"), after=at)] == ["j2"]
    newest = store.list_jobs(before=store.cursor_of("j3"))
    assert [s.job_id for _, s in newest] == ["j2", "j1", "j0"] and newest[0][0] == store.cursor_of("j2")


def test_a_writable_store_answers_ping(store):
    store.ping()


def test_all_events_walks_every_log_in_order_across_batches(store):
    for i in range(4):
        store.append(f"j{i}", done_log(steps=2))
    events = list(store.all_events(batch=3))
    assert len(events) == 4 * 6
    assert [(e.job_id, e.seq) for e in events] == [(f"j{i}", s) for i in range(4) for s in range(1, 7)]


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
    """Field notes §2.3: a reader on another connection never makes a write fail."""
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
    assert store.schema_version() == SCHEMA_VERSION == 4
    plan = sqlite3.connect(path).execute(
        "EXPLAIN QUERY PLAN SELECT state FROM jobs WHERE status = 'queued' ORDER BY priority DESC, queue_order LIMIT 5"
    ).fetchall()
    assert not any("TEMP B-TREE" in row[-1] for row in plan), plan  # the v2 index serves the queue order
    plan = sqlite3.connect(path).execute(
        "EXPLAIN QUERY PLAN SELECT queue_order, state FROM jobs WHERE status = 'done' ORDER BY queue_order DESC LIMIT 5"
    ).fetchall()
    assert not any("TEMP B-TREE" in row[-1] for row in plan), plan  # v3: listing by status
    store.append("j", [submitted(), Admitted()])
    assert [s.job_id for s in store.queued()] == ["j"]


def test_a_batch_commits_each_append_or_returns_its_refusal_in_place(store):
    store.append("a", [submitted(), Admitted()])
    outcomes = store.append_batch(
        [
            ("a", [Running(attempt=1, executor="x")], 2),
            ("b", [submitted()], 0),
            ("a", [Progress(step=3, total=2)], None),  # illegal: refused, the others stand
            ("c", [Admitted()], None),  # unknown job
            ("b", [Admitted()], 5),  # stale expectation
            ("a", [Progress(step=1, total=2)], None),
        ]
    )
    kinds = [type(o).__name__ if isinstance(o, Exception) else o[0].status for o in outcomes]
    assert kinds == ["running", "submitted", "IllegalEvent", "UnknownJob", "Conflict", "running"]
    assert [e.type for e in store.events("a")] == ["submitted", "admitted", "running", "progress"]
    assert [e.type for e in store.events("b")] == ["submitted"]
    assert store.get("c") is None


def test_events_after_follows_every_job_in_the_order_stored(store):
    assert store.cursor() == 0 and store.events_after(0) == []
    store.append("a", [submitted(), Admitted()])
    start = store.cursor()
    store.append("b", [submitted()])
    store.append("a", [Running(attempt=1, executor="x")])
    with pytest.raises(IllegalEvent):  # refused: leaves no position behind
        store.append("b", [Running(attempt=1, executor="x")])
    store.append_batch([("b", [Admitted()], None), ("a", [Progress(step=1, total=4)], None)])
    rows = store.events_after(start)
    assert [(e.job_id, e.type) for _, e in rows] == [
        ("b", "submitted"), ("a", "running"), ("b", "admitted"), ("a", "progress"),
    ]  # fmt: skip
    positions = [p for p, _ in rows]
    assert positions == sorted(positions) and positions[0] > start and store.cursor() == positions[-1]
    assert store.events_after(positions[1], limit=2) == rows[2:4]
    assert [e for _, e in rows if e.job_id == "a"] == store.events("a", after_seq=2)


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
