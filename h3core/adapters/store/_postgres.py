"""One PostgreSQL store's connections, shared by its parts (the event log and projections in
`postgres`, node leases in `postgres_leases`, turns in `postgres_turns`): the pool, this process's
write lock, the events lock a write of events takes, and sessions of their own outside the pool.

**A frozen or cut-off node stalls the others at most ~2 s.** A node frozen (SIGSTOP, a long pause)
or cut off from the server in the middle of a write would hold the events lock, and every node's
writes with it, until it thawed. So every session h3core opens (pooled, or of its own: `session`)
is set up (`session_settings`) so that no transaction sits idle on its client for longer than
`STALLED_TRANSACTION_S` (`idle_in_transaction_session_timeout`): past it the server ends the
session, the lock goes, the others' writes go on, and the frozen node's write fails as a transient
store failure (`h3core.runtime.store_retry`), tried again when it thaws (then fenced: `nodes`).
Backstops besides: no statement waits longer than `LOCK_WAIT_S` for a lock (`lock_timeout`) nor
runs longer than `STATEMENT_S` (`statement_timeout`), both failing as transient too. Only the
transactions that fold whole logs in Python (refold, import, migration: `UNHURRIED`) are exempt.

**A vanished server, or client, is noticed.** TCP keepalives and `tcp_user_timeout` on both ends
(libpq's and the session's): a server that went away without closing its connections (a partition,
a power cut) fails the statement waiting on it within about 10 s rather than the kernel's 15
minutes, and the server ends the session of a client that vanished likewise (its session advisory
locks with it). A new connection gives up after `CONNECT_S` (a frozen postmaster accepts it but
never answers).

**Broken connections are replaced.** A restart of the server or a `pg_terminate_backend` leaves
every pooled connection dead. Before one is lent it is checked (`_check`): one the server wrote to
while it sat idle (a termination notice, its end of the socket closed) is tried with a round trip,
and one that fails, or breaks while lent, drops every idle one with it (they went down together),
so the next call gets a new connection rather than a dead one each. The check costs no round trip
otherwise (bench/studies/pg_faults.py). Reconnecting is left to the calls that need a connection:
the pool's own reconnection gives up after `RECONNECT_S` (its pauses double without bound: after an
outage of 8 s it would come back 7 s late), and a call waits `CHECKOUT_S` for a connection before it
fails, to be tried again by its caller (`store_retry`).
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "CHECKOUT_S",
    "CLIENT_TCP",
    "CONNECT_S",
    "LOCK_WAIT_S",
    "RECONNECT_S",
    "STALLED_TRANSACTION_S",
    "STATEMENT_S",
    "UNHURRIED",
    "Connections",
    "configure",
    "session_settings",
]

# The longest a transaction may wait on its client between statements (the module docstring): far
# above a write's own pauses (milliseconds), far below a lease; the stall a frozen node can cause.
STALLED_TRANSACTION_S = 2.0
# Backstops: a statement waiting longer for a lock (a holder that is busy, not idle: an unhurried
# fold), or running longer, fails as a transient failure and is tried again by its caller.
LOCK_WAIT_S = 10.0
STATEMENT_S = 60.0
# How long a call waits for a pooled connection; how long the pool keeps reconnecting on its own;
# how long a new connection may take (libpq's connect_timeout: whole seconds, at least 2).
CHECKOUT_S = 2.0
RECONNECT_S = 2.0
CONNECT_S = 5
# Dead peers: keepalive probes after 5 s idle, every 2 s, 3 unanswered end the connection (~11 s);
# data unacknowledged for 10 s ends it too.
_KEEPALIVE = (5, 2, 3)
_USER_TIMEOUT_MS = 10_000
# libpq's side of every connection, unless the store's URL sets a parameter itself.
CLIENT_TCP: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": _KEEPALIVE[0],
    "keepalives_interval": _KEEPALIVE[1],
    "keepalives_count": _KEEPALIVE[2],
    "tcp_user_timeout": _USER_TIMEOUT_MS,
}
# Said first in a transaction that folds in Python, which may wait on its client, and take, far longer.
UNHURRIED = (
    "SELECT set_config('idle_in_transaction_session_timeout', '0', true), set_config('lock_timeout', '0', true), "
    "set_config('statement_timeout', '0', true)"
)


class Connections:
    """The connections to the server at `url`: a pool of at most `pool_size`, opened here."""

    def __init__(self, url: str, *, pool_size: int, connect_timeout_s: float) -> None:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo
        from psycopg_pool import ConnectionPool

        given = conninfo_to_dict(url)
        self._conninfo = make_conninfo(url, **{k: v for k, v in CLIENT_TCP.items() if k not in given})
        # Once, directly: an unreachable server or a refused login fails here at once, where the
        # pool would retry it for its whole timeout.
        psycopg.connect(self._conninfo, connect_timeout=max(2, int(connect_timeout_s))).close()
        self.url = url
        self.committed_at = -float("inf")  # when a write of this store last committed (or a ping answered)
        self.pool = ConnectionPool(
            self._conninfo,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True, "connect_timeout": CONNECT_S},
            timeout=CHECKOUT_S,
            reconnect_timeout=RECONNECT_S,
            open=False,
            name="h3core",
            configure=configure,
            check=self._check,
        )
        self.pool.open(wait=True, timeout=connect_timeout_s)
        # One write transaction of this store at a time: they would only queue for the table lock.
        self._write_lock = threading.Lock()

    def committed_within(self, seconds: float) -> bool:
        """Did a write of this store commit (or a ping answer) within the last `seconds`?"""
        return time.monotonic() - self.committed_at < seconds

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection, lent for the block. One that breaks while lent (the server went away)
        drops the idle ones too: they went down with it."""
        with self.pool.connection() as conn:
            try:
                yield conn
            except BaseException:
                if conn.broken:
                    self.pool.drain()
                raise

    def read(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        """The rows of one statement, on a pooled connection of its own: no read waits behind another."""
        with self.connection() as conn:
            return conn.execute(sql, params).fetchall()

    def write(self, fn: Callable[[psycopg.Connection], Any], *, events: bool = True, unhurried: bool = False) -> Any:
        """`fn(conn)` in one transaction, behind this process's write lock; with `events`, holding
        the events table lock (the `postgres` module docstring: positions drawn in commit order);
        `unhurried`: one that folds in Python, exempt from the session's timeouts."""
        with self._write_lock, self.connection() as conn:
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
        with self.connection() as conn, conn.transaction():
            return fn(conn)

    def session(self, connect_timeout_s: float = CONNECT_S) -> psycopg.Connection:
        """A connection of its own, outside the pool (autocommit), set up as the pool's are: for what
        lives as long as a session does (a LISTEN, a session advisory lock). The caller closes it."""
        import psycopg

        conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=max(2, int(connect_timeout_s)))
        try:
            configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        """Close the pool."""
        self.pool.close()

    def _check(self, conn: psycopg.Connection) -> None:
        """Before a pooled connection is lent (the module docstring): raise if it is dead, dropping
        the idle ones with it; no round trip unless the server wrote to it while it sat idle."""
        import psycopg
        from psycopg_pool import ConnectionPool

        if conn.closed:
            raise psycopg.OperationalError("the connection is closed")
        idle = select.poll()  # not select(): a serving process holds thousands of descriptors
        idle.register(conn.fileno(), select.POLLIN)
        if not idle.poll(0):
            return
        try:
            ConnectionPool.check_connection(conn)
        except Exception:
            self.pool.drain()
            raise


def session_settings() -> dict[str, str]:
    """The server's side of every session h3core opens (the module docstring), set when it connects."""
    return {
        "idle_in_transaction_session_timeout": str(round(STALLED_TRANSACTION_S * 1000)),
        "lock_timeout": str(round(LOCK_WAIT_S * 1000)),
        "statement_timeout": str(round(STATEMENT_S * 1000)),
        "tcp_keepalives_idle": str(_KEEPALIVE[0]),
        "tcp_keepalives_interval": str(_KEEPALIVE[1]),
        "tcp_keepalives_count": str(_KEEPALIVE[2]),
        "tcp_user_timeout": str(_USER_TIMEOUT_MS),
    }


def configure(conn: psycopg.Connection) -> None:
    """Set a new session up (`session_settings`), in one round trip."""
    settings = session_settings()
    conn.execute("SELECT " + ", ".join("set_config(%s, %s, false)" for _ in settings), [v for kv in settings.items() for v in kv])
