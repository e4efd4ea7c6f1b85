"""Where a store is: a SQLite file (a path) or a PostgreSQL server (a `postgresql://` URL), as
`--db`/`H3_DB` name it, and what follows from which: how it is opened, whether a runner lock
keeps a second runner out (SQLite only: on PostgreSQL several runner nodes share the queue), and
where the files a deployment keeps beside its store go (beside the SQLite file; for PostgreSQL,
the working folder)."""

from __future__ import annotations

from pathlib import Path

from h3core.adapters.store.base import EventStore

__all__ = ["StoreLocation", "is_postgres_url", "local_dir", "open_store_at", "parse_location", "runner_lock_for"]

# A path (SQLite) or a postgresql:// URL (a str: a Path would fold its `//`).
StoreLocation = Path | str


def is_postgres_url(db: object) -> bool:
    """Does `db` name a PostgreSQL store rather than a SQLite file?"""
    return isinstance(db, str) and db.startswith(("postgresql://", "postgres://"))


def parse_location(value: str | Path) -> StoreLocation:
    """`--db`/`H3_DB` as given: a URL stays a str, anything else is a path."""
    return value if is_postgres_url(value) else Path(value)


def open_store_at(db: StoreLocation, **kwargs: object) -> EventStore:
    """The store at `db`, opened (and migrated): `SQLiteEventStore` or `PostgresEventStore`."""
    if is_postgres_url(db):
        from h3core.adapters.store.postgres import PostgresEventStore

        return PostgresEventStore(str(db), **kwargs)  # type: ignore[arg-type]
    from h3core.adapters.store.sqlite import SQLiteEventStore

    return SQLiteEventStore(db, **kwargs)  # type: ignore[arg-type]


def runner_lock_for(db: StoreLocation) -> Path | None:
    """The lock file one runner of a SQLite store holds; None for PostgreSQL (many runner nodes)."""
    if is_postgres_url(db):
        return None
    from h3core.adapters.lock import runner_lock_path

    return runner_lock_path(db)


def local_dir(db: StoreLocation) -> Path:
    """Where files kept beside the store go: the SQLite file's folder, or the working folder."""
    return Path.cwd() if is_postgres_url(db) else Path(db).resolve().parent
