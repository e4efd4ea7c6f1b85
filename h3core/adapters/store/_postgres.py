"""One PostgreSQL store's connections, shared by its parts (the event log and projections in
`postgres`, node leases in `postgres_leases`, turns in `postgres_turns`): the pool, this process's
write lock, the events lock a write of events takes, and sessions of their own outside the pool.

**No transaction waits on a stalled client.** A node frozen (SIGSTOP, a long pause) in the middle
of a write would hold the events lock, and every node's writes with it, until it thawed. So no
transaction on the pool's connections may sit idle on its client for longer than
`STALLED_TRANSACTION_S` (`idle_in_transaction_session_timeout`): past it the server ends the
session, the lock goes, and the frozen node's write fails, as a transient store failure
(`h3core.runtime.store_retry`), and is tried again when it thaws (then fenced: `nodes`). Only the
transactions that fold whole logs in Python (refold, import, migration: `unhurried`) are exempt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

__all__ = ["STALLED_TRANSACTION_S", "UNHURRIED", "Connections"]

# The longest a transaction may wait on its client between statements (the module docstring):
# far above a write's own pauses (milliseconds), far below a lease.
STALLED_TRANSACTION_S = 5.0
# Said first in a transaction that folds in Python, which may wait on its client far longer.
UNHURRIED = "SET LOCAL idle_in_transaction_session_timeout = 0"


class Connections:
    """The connections to the server at `url`: a pool of at most `pool_size`, opened here."""

    def __init__(self, url: str, *, pool_size: int, connect_timeout_s: float) -> None:
        import psycopg
        from psycopg_pool import ConnectionPool

        # Once, directly: an unreachable server or a refused login fails here at once, where the
        # pool would retry it for its whole timeout.
        psycopg.connect(url, connect_timeout=max(1, int(connect_timeout_s))).close()
        self.url = url
        self.committed_at = -float("inf")  # when a write of this store last committed (or a ping answered)
        self.pool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True},
            timeout=connect_timeout_s,
            open=False,
            name="h3core",
            configure=_configure,
        )
        self.pool.open(wait=True, timeout=connect_timeout_s)
        # One write transaction of this store at a time: they would only queue for the table lock.
        self._write_lock = threading.Lock()

    def committed_within(self, seconds: float) -> bool:
        """Did a write of this store commit (or a ping answer) within the last `seconds`?"""
        return time.monotonic() - self.committed_at < seconds

    def read(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        """The rows of one statement, on a pooled connection of its own: no read waits behind another."""
        with self.pool.connection() as conn:
            return conn.execute(sql, params).fetchall()

    def write(self, fn: Callable[[psycopg.Connection], Any], *, events: bool = True, unhurried: bool = False) -> Any:
        """`fn(conn)` in one transaction, behind this process's write lock; with `events`, holding
        the events table lock (the `postgres` module docstring: positions drawn in commit order);
        `unhurried`: one that folds in Python, exempt from the stalled-transaction timeout."""
        with self._write_lock, self.pool.connection() as conn:
            with conn.transaction():
                if unhurried:
                    conn.execute(UNHURRIED)
                if events:
                    conn.execute("LOCK TABLE events IN EXCLUSIVE MODE")
                out = fn(conn)
            self.committed_at = time.monotonic()
            return out

    def at_once(self, fn: Callable[[psycopg.Connection], Any]) -> Any:
        """`fn(conn)` in one transaction that writes no event, not behind this process's write lock:
        it must not wait for a group commit (a heartbeat)."""
        with self.pool.connection() as conn, conn.transaction():
            return fn(conn)

    def session(self, connect_timeout_s: float | None = None) -> psycopg.Connection:
        """A connection of its own, outside the pool (autocommit): for what lives as long as a
        session does (a LISTEN, a session advisory lock). The caller closes it."""
        import psycopg

        if connect_timeout_s is None:
            return psycopg.connect(self.url, autocommit=True)
        return psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, int(connect_timeout_s)))

    def close(self) -> None:
        """Close the pool."""
        self.pool.close()


def _configure(conn: psycopg.Connection) -> None:
    """Each new connection of the pool: no transaction waits on its client for long (the module docstring)."""
    conn.execute(f"SET idle_in_transaction_session_timeout = {round(STALLED_TRANSACTION_S * 1000)}")
