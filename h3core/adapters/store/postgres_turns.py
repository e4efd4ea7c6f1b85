"""Turns on PostgreSQL: the `Turns` of a `PostgresEventStore` (its `turns`), each a session
advisory lock named in the store's schema, so several stores in one database keep theirs apart.

A turn holds a connection of its own, outside the pool: the server ends the lock with the
session, so a killed holder's turn is free once its socket closes, and a pooled connection handed
back with the lock still held would give the turn to whoever borrows it next.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from h3core.adapters.store._postgres import Connections
from h3core.adapters.store.nodes import Turn

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresTurns"]


class PostgresTurns:
    """Named turns in the store's database (`h3core.adapters.store.nodes` states the contract)."""

    def __init__(self, db: Connections) -> None:
        """`db`: the store's connections (a turn opens a session of its own from them)."""
        self._db = db

    def take_turn(self, name: str) -> Turn | None:
        """Hold the turn `name` (a session advisory lock) if no other session does; None if one does."""
        conn = self._db.session(connect_timeout_s=10)
        try:
            row = conn.execute("SELECT pg_try_advisory_lock(hashtext(current_schema() || '.h3core.turn.' || %s))", (name,))
            (taken,) = row.fetchone() or (False,)
        except BaseException:
            conn.close()
            raise
        if not taken:
            conn.close()
            return None
        return _SessionTurn(conn)


class _SessionTurn:
    """A turn held by one database session (`PostgresTurns.take_turn`)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn

    def held(self) -> bool:
        try:
            self._conn.execute("SELECT 1")
        except Exception:  # the session is gone, and its lock with it
            return False
        return True

    def release(self) -> None:
        self._conn.close()
