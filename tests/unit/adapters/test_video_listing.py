"""`list_videos` reads no more rows with many videos marked deleted than with none (issue 38: a
page of /v1/videos walked past every deleted one), counted in each SQL store's own terms: SQLite's
virtual-machine steps, PostgreSQL's rows scanned and removed by a filter (EXPLAIN ANALYZE)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from h3core.adapters.store import SQLiteEventStore
from h3core.adapters.store._sql import POSTGRES
from h3core.domain.events import Admitted
from tests.factories import submitted

AT = datetime(2026, 12, 1, tzinfo=UTC)
DELETED = 600


def stored(store, prefix: str, n: int) -> list[str]:
    ids = [f"{prefix}{i}" for i in range(n)]
    store.append_batch([(job, [submitted(), Admitted()], None) for job in ids])
    return ids


def sqlite_steps(store: SQLiteEventStore, **page) -> tuple[list[str], int]:
    """The ids `list_videos` answers and the SQLite virtual-machine steps its query took."""
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0  # go on

    store._r.set_progress_handler(count, 1)
    try:
        ids = [s.job_id for _, s in store.list_videos(**page)]
    finally:
        store._r.set_progress_handler(None, 1)
    return ids, steps[0]


def test_sqlite_steps_the_same_with_many_videos_deleted_as_with_none(tmp_path):
    store = SQLiteEventStore(tmp_path / "h3.db", durable=False)
    kept = stored(store, "k", 3)
    newer = stored(store, "d", DELETED)
    assert sqlite_steps(store, limit=3)[0] == newer[::-1][:3]
    before = sqlite_steps(store, limit=3)[1]
    for job in newer:
        store.mark_video_deleted(job, AT)
    ids, after = sqlite_steps(store, limit=3)
    assert ids == kept[::-1]
    assert after == before, f"{after} steps with {DELETED} deleted against {before} with none"
    # Paged from a deleted one, oldest first: the same again.
    assert sqlite_steps(store, limit=3, oldest_first=True, after=store.cursor_of(kept[0]))[0] == kept[1:]
    store.close()


def scanned(plan: dict) -> tuple[int, int]:
    """(rows the plan's scans returned, rows their filters removed), over every node."""
    rows = removed = 0
    for node in plan.get("Plans", []):
        r, f = scanned(node)
        rows, removed = rows + r, removed + f
    if "Scan" in plan["Node Type"]:
        rows += plan["Actual Rows"]
    return rows, removed + plan.get("Rows Removed by Filter", 0)


def test_postgres_scans_the_same_rows_with_many_videos_deleted_as_with_none(pg_url):
    from h3core.adapters.store.postgres import PostgresEventStore

    store = PostgresEventStore(pg_url)

    def work(**page) -> tuple[int, int]:
        sql, params = POSTGRES.jobs_page(None, page.get("before"), page.get("after"), False, page["limit"], videos=True)
        return scanned(store._read("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)[0][0][0]["Plan"])

    try:
        kept = stored(store, "k", 3)
        newer = stored(store, "d", DELETED)
        before = work(limit=3)
        for job in newer:
            store.mark_video_deleted(job, AT)
        after = work(limit=3)
        assert [s.job_id for _, s in store.list_videos(limit=3)] == kept[::-1]
        # (rows scanned, rows a filter removed): the page's rows only, however many were deleted.
        assert after == before == (3, 0), f"{after} with {DELETED} deleted, {before} with none"
    finally:
        store.close()


@pytest.mark.parametrize("oldest_first", [False, True])
def test_sqlite_walks_the_index_of_videos_not_deleted(tmp_path, oldest_first):
    store = SQLiteEventStore(tmp_path / "h3.db", durable=False)
    before, after = (None, 5) if oldest_first else (5, None)
    sql, params = store._sql.jobs_page(None, before, after, oldest_first, 2, videos=True)
    plan = " ".join(row[3] for row in store._read("EXPLAIN QUERY PLAN " + sql, params))
    assert "jobs_videos" in plan, plan
    store.close()
