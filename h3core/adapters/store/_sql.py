"""What the SQLite and PostgreSQL stores share, written once: the statements over their common
tables (`events`, `jobs`, `meta`, `positions`, `deliveries`), the decoding of an event row, the
fingerprint of the code that folds `jobs`, the import check, and the reads both answer alike
(`SQLReads`).

The statements are written with `?` placeholders and built once per store at import
(`SQLITE`, `POSTGRES`). What really differs stays in each store: how events and the projection
are written (SQLite row by row, PostgreSQL in arrays under a table lock), locking, NOTIFY,
schemas, and `queued()` but its node's pre-filter (`Statements.fits`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Collection, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, ClassVar, Protocol

from h3core.adapters.store.base import Conflict, VideoDeletion
from h3core.domain.admission import QueueFilter
from h3core.domain.events import VERSIONS, Event, body_from_json, event_from_json
from h3core.domain.state import JobState, Status, apply, fold
from h3core.domain.webhooks import Delivery

__all__ = [
    "POSTGRES",
    "SQLITE",
    "Connection",
    "SQLReads",
    "Statements",
    "event_of_row",
    "fold_fingerprint",
    "unstored",
    "refolded",
]


class Statements:
    """The SQL both stores run, in one driver's placeholder style."""

    def __init__(self, placeholder: str, bytewise: str, artifact_path: str) -> None:
        """`placeholder`: the driver's (`?`, `%s`); `bytewise`: what makes a text column order by
        its bytes (SQLite's default BINARY does: ""; PostgreSQL's default follows the locale);
        `artifact_path`: the expression that reads a state's video path from its JSON."""

        def q(sql: str) -> str:
            return sql.replace("?", placeholder)

        self.placeholder = placeholder
        self.artifact_path = artifact_path
        self.state = q("SELECT state FROM jobs WHERE job_id = ?")
        self.by_key = q("SELECT state FROM jobs WHERE idempotency_key = ?")
        self.cursor_of = q("SELECT queue_order FROM jobs WHERE job_id = ?")
        # A range of the primary key: ids are ASCII letters, digits, `_` and `-`, all below DEL.
        self.ids_starting = q(f"SELECT job_id FROM jobs WHERE job_id >= ? AND job_id < ? ORDER BY job_id{bytewise} LIMIT ?")
        self.job_ids = "SELECT job_id FROM jobs ORDER BY queue_order"
        self.unfinished = (
            "SELECT state FROM jobs WHERE status IN ('submitted', 'queued', 'running') ORDER BY priority DESC, queue_order"
        )
        self.counts = "SELECT status, count(*) FROM jobs GROUP BY status"
        # Two ranges of the queue's index, so the count steps only over the jobs ahead (one range
        # with an OR stepped over every queued job: 7 ms at 50,000 queued, for the first as the last).
        self.queue_position = q(
            "SELECT (SELECT count(*) FROM jobs o WHERE o.status = 'queued' AND o.priority > j.priority) + "
            "(SELECT count(*) FROM jobs o WHERE o.status = 'queued' AND o.priority = j.priority "
            "AND o.queue_order <= j.queue_order) FROM jobs j WHERE j.job_id = ? AND j.status = 'queued'"
        )
        self.events = q("SELECT job_id, seq, at, body FROM events WHERE job_id = ? AND seq > ? ORDER BY seq")
        self.stored_bodies = q("SELECT seq, body FROM events WHERE job_id = ? AND seq <= ?")
        self.all_events = q(
            "SELECT e.job_id, e.seq, e.at, e.body, j.queue_order FROM events e JOIN jobs j ON j.job_id = e.job_id "
            "WHERE (j.queue_order, e.seq) > (?, ?) ORDER BY j.queue_order, e.seq LIMIT ?"
        )
        self.cursor = "SELECT coalesce(max(id), 0) FROM events"
        self.events_after = q("SELECT job_id, seq, at, body, id FROM events WHERE id > ? ORDER BY id LIMIT ?")
        self.fold = "SELECT value FROM meta WHERE key = 'fold'"
        self.save_fold = q(
            "INSERT INTO meta (key, value) VALUES ('fold', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        )
        self.position = q("SELECT position FROM positions WHERE name = ?")
        self.positions = "SELECT name, position FROM positions ORDER BY name"
        self.save_position = q(
            "INSERT INTO positions (name, position, saved_at) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET position = excluded.position, saved_at = excluded.saved_at"
        )
        self.save_delivery = q(
            "INSERT INTO deliveries (job_id, seq, url, record) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (job_id, seq, url) DO UPDATE SET record = excluded.record"
        )
        self.deliveries = q(f"SELECT record FROM deliveries WHERE job_id = ? ORDER BY seq, url{bytewise}")
        self.video_deleted_at = q("SELECT video_deleted_at FROM jobs WHERE job_id = ?")
        # The first time stays: a second DELETE (or a listing that finds an older record) changes nothing.
        # The first mark takes the next deletion position: run inside the store's write turn (one
        # writer at a time), so positions are drawn in commit order and `video_deletions` skips none.
        self.mark_video_deleted = q(
            "UPDATE jobs SET video_deleted_at = coalesce(video_deleted_at, ?), video_deleted_pos = coalesce("
            "video_deleted_pos, (SELECT coalesce(max(video_deleted_pos), 0) + 1 FROM jobs WHERE video_deleted_pos IS NOT NULL)"
            ") WHERE job_id = ?"
        )
        self.video_deletions = q(
            f"SELECT video_deleted_pos, job_id, status, {artifact_path} FROM jobs WHERE video_deleted_pos > ? "
            "ORDER BY video_deleted_pos LIMIT ?"
        )

    def jobs_page(
        self,
        status: Status | None,
        before: int | None,
        after: int | None,
        oldest_first: bool,
        limit: int,
        *,
        videos: bool = False,
    ) -> tuple[str, tuple[object, ...]]:
        """`list_jobs`' query and its parameters: the filters given, keyset cursors on queue order;
        `videos`: `list_videos`', which walks the index of the jobs whose video is not deleted."""
        where, params = (["video_deleted_at IS NULL"] if videos else []), []
        for clause, value in (("status = ?", status), ("queue_order < ?", before), ("queue_order > ?", after)):
            if value is not None:
                where.append(clause.replace("?", self.placeholder))
                params.append(value)
        sql = "SELECT queue_order, state FROM jobs" + (" WHERE " + " AND ".join(where) if where else "")
        sql += f" ORDER BY queue_order {'ASC' if oldest_first else 'DESC'} LIMIT {self.placeholder}"
        return sql, (*params, limit)

    def fits(self, fits: QueueFilter) -> tuple[str, tuple[int | None, ...]]:
        """`queued`'s pre-filter for a node (`QueueFilter`) on the queue index's columns, and its
        parameters: the rows it drops are never parsed. (The casts type a NULL bound for PostgreSQL.)"""
        clause = (
            " AND frames >= ? AND (CAST(? AS integer) IS NULL OR frames <= ?)"
            " AND (CAST(? AS integer) IS NULL OR tokens IS NULL OR tokens <= ?)"
        )
        return clause.replace("?", self.placeholder), (
            fits.min_frames,
            fits.max_frames,
            fits.max_frames,
            fits.max_tokens,
            fits.max_tokens,
        )


SQLITE = Statements("?", "", "json_extract(state, '$.artifact.path')")
POSTGRES = Statements("%s", ' COLLATE "C"', "state::json -> 'artifact' ->> 'path'")


class _Rows(Protocol):
    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    """What both drivers' connections answer (sqlite3's and psycopg's)."""

    def execute(self, sql: Any, params: Any = ..., /) -> _Rows: ...


def event_of_row(row: Sequence[Any]) -> Event:
    """The event of a row that starts (job_id, seq, at, body)."""
    job_id, seq, at, body = row[:4]
    # Splice the stored JSON body in rather than parse it twice.
    return event_from_json(f'{{"job_id":{json.dumps(job_id)},"seq":{seq},"at":"{at}","body":{body}}}')


@functools.cache  # the code cannot change within a process; the schema takes ~5 ms to build
def fold_fingerprint() -> str:
    """Names the code that folds events into `jobs.state`: the state's shape and the event
    versions read. A store folded by other code has its projection rebuilt from the log."""
    spec = {"state": JobState.model_json_schema(), "events": VERSIONS}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def refolded(conn: Connection, sql: Statements) -> list[JobState]:
    """Every job's state folded again from its log (the `jobs` projection, rebuilt)."""
    states = []
    for (job_id,) in conn.execute("SELECT job_id FROM jobs").fetchall():
        state = fold(event_of_row(r) for r in conn.execute(sql.events, (job_id, 0)).fetchall())
        assert state is not None  # a jobs row is written with its Submitted event
        states.append(state)
    return states


def unstored(
    conn: Connection, sql: Statements, state: JobState | None, events: Iterable[Event]
) -> tuple[JobState | None, list[Event]]:
    """One job's `events` (any order) against its log at `state`: those already stored must be
    the same (else `Conflict`); the rest, in seq order, and the state they fold `state` to."""
    evs = sorted(events, key=lambda e: e.seq)
    have = state.last_seq if state else 0
    stored: dict[int, str] = {}
    if have and evs:
        stored = dict(conn.execute(sql.stored_bodies, (evs[0].job_id, min(have, evs[-1].seq))).fetchall())
    fresh = []
    for e in evs:
        if e.seq <= have:
            # Compared as bodies, not text: the stored one may predate versions (no `v`).
            if e.seq not in stored or body_from_json(stored[e.seq]) != e.body:
                raise Conflict(f"job {e.job_id} event #{e.seq} differs from the stored one")
            continue
        state = apply(state, e)
        fresh.append(e)
    return state, fresh


def _state(rows: Sequence[tuple[str]]) -> JobState | None:
    return JobState.model_validate_json(rows[0][0]) if rows else None


class SQLReads:
    """The reads both SQL stores answer alike, over `_read` (a scan) and `_point` (one row by key:
    SQLite answers those on a connection of their own)."""

    _sql: ClassVar[Statements]

    def _read(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        raise NotImplementedError

    def _point(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        raise NotImplementedError

    def get(self, job_id: str) -> JobState | None:
        return _state(self._point(self._sql.state, (job_id,)))

    def by_idempotency_key(self, key: str) -> JobState | None:
        return _state(self._point(self._sql.by_key, (key,)))

    def cursor_of(self, job_id: str) -> int | None:
        rows = self._point(self._sql.cursor_of, (job_id,))
        return rows[0][0] if rows else None

    def ids_starting(self, prefix: str, limit: int = 10) -> list[str]:
        """Up to `limit` job ids that start with `prefix`, in id order."""
        return [j for (j,) in self._point(self._sql.ids_starting, (prefix, prefix + "\x7f", limit))]

    def list_jobs(
        self,
        *,
        status: Status | None = None,
        limit: int = 50,
        before: int | None = None,
        after: int | None = None,
        oldest_first: bool = False,
    ) -> list[tuple[int, JobState]]:
        rows = self._read(*self._sql.jobs_page(status, before, after, oldest_first, limit))
        return [(order, JobState.model_validate_json(s)) for order, s in rows]

    def list_videos(
        self, *, limit: int = 50, before: int | None = None, after: int | None = None, oldest_first: bool = False
    ) -> list[tuple[int, JobState]]:
        rows = self._read(*self._sql.jobs_page(None, before, after, oldest_first, limit, videos=True))
        return [(order, JobState.model_validate_json(s)) for order, s in rows]

    def video_deleted_at(self, job_id: str) -> datetime | None:
        rows = self._point(self._sql.video_deleted_at, (job_id,))
        return datetime.fromisoformat(rows[0][0]) if rows and rows[0][0] is not None else None

    def videos_deleted_at(self, job_ids: Collection[str]) -> dict[str, datetime]:
        ids, out = list(dict.fromkeys(job_ids)), {}
        for i in range(0, len(ids), 500):  # under any driver's limit on parameters
            part = ids[i : i + 500]
            marks = ", ".join([self._sql.placeholder] * len(part))
            sql = f"SELECT job_id, video_deleted_at FROM jobs WHERE job_id IN ({marks}) AND video_deleted_at IS NOT NULL"
            out.update({job_id: datetime.fromisoformat(at) for job_id, at in self._read(sql, part)})
        return out

    def video_deletions(self, after: int = 0, limit: int = 1000) -> list[VideoDeletion]:
        return [VideoDeletion(*row) for row in self._read(self._sql.video_deletions, (after, limit))]

    def unfinished(self) -> list[JobState]:
        return [JobState.model_validate_json(s) for (s,) in self._read(self._sql.unfinished)]

    def counts(self) -> dict[str, int]:
        return dict(self._read(self._sql.counts))

    def queue_position(self, job_id: str) -> int | None:
        rows = self._point(self._sql.queue_position, (job_id,))
        return rows[0][0] if rows else None

    def job_ids(self) -> list[str]:
        return [j for (j,) in self._read(self._sql.job_ids)]

    def events(self, job_id: str, after_seq: int = 0) -> list[Event]:
        return [event_of_row(r) for r in self._read(self._sql.events, (job_id, after_seq))]

    def all_events(self, batch: int = 10_000) -> Iterator[Event]:
        # Keyset pagination over (queue_order, seq): each batch is fetched whole, so no cursor
        # stays open between batches while the caller (or another connection) writes.
        last_order, last_seq = -1, 0
        while True:
            rows = self._read(self._sql.all_events, (last_order, last_seq, batch))
            if not rows:
                return
            for r in rows:
                yield event_of_row(r)
            last_order, last_seq = rows[-1][4], rows[-1][1]

    def cursor(self) -> int:
        return self._point(self._sql.cursor)[0][0]

    def events_after(self, cursor: int, limit: int = 1000) -> list[tuple[int, Event]]:
        return [(r[4], event_of_row(r)) for r in self._read(self._sql.events_after, (cursor, limit))]

    def position(self, name: str) -> int | None:
        rows = self._point(self._sql.position, (name,))
        return rows[0][0] if rows else None

    def positions(self) -> dict[str, int]:
        """Every saved position, by name (what `h3core migrate` carries over)."""
        return dict(self._read(self._sql.positions))

    def deliveries(self, job_id: str) -> list[Delivery]:
        return [Delivery.model_validate_json(r) for (r,) in self._read(self._sql.deliveries, (job_id,))]
