"""Turns on PostgreSQL: the `Turns` of a `PostgresEventStore` (its `turns`), each a row of the
store's `turns` table (schema version 6): the turn's name, its holder (host and pid, for people),
the token of this hold, the holder's lease length and when it last renewed, by the server's clock.

A take is one conditional upsert: it inserts the row, or overwrites one whose holder has not
renewed within its own lease; two takers of one free turn meet on the row's lock, and the second
finds it renewed. A renewal updates the row only while it carries this hold's token and is not
yet past its lease, so a holder that comes back after its lease ran out renews nothing, whether
or not another took the turn meanwhile. The turn's statements go over the store's pool, outside
its write lock (a renewal must not wait behind a group commit).
"""

from __future__ import annotations

import os
import socket
import time
import uuid

from h3core.adapters.store._postgres import Connections
from h3core.adapters.store.nodes import HeldTurn

__all__ = ["PostgresTurns"]

_TAKE = (
    "INSERT INTO turns AS t (name, holder, token, lease_s, renewed_at) VALUES (%s, %s, %s, %s, now()) "
    "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, token = excluded.token, lease_s = excluded.lease_s, "
    "renewed_at = now() WHERE t.renewed_at + make_interval(secs => t.lease_s) < now() RETURNING token"
)
_RENEW = (
    "UPDATE turns SET renewed_at = now() WHERE name = %s AND token = %s AND renewed_at + make_interval(secs => lease_s) >= now()"
)
_RELEASE = "DELETE FROM turns WHERE name = %s AND token = %s"


class PostgresTurns:
    """Named turns in the store's database (`h3core.adapters.store.nodes` states the contract)."""

    def __init__(self, db: Connections) -> None:
        """`db`: the store's connections."""
        self._db = db

    def take_turn(self, name: str, lease_s: float) -> _RowTurn | None:
        """Hold the turn `name` for `lease_s` if its row is absent or past its holder's lease; None if not."""
        since = time.monotonic()
        token = uuid.uuid4().hex
        holder = f"{socket.gethostname()}:{os.getpid()}"
        rows = self._db.at_once(lambda conn: conn.execute(_TAKE, (name, holder, token, lease_s)).fetchall())
        return _RowTurn(self._db, name, token, lease_s, since) if rows else None


class _RowTurn(HeldTurn):
    """A turn held under one token (`PostgresTurns.take_turn`)."""

    def __init__(self, db: Connections, name: str, token: str, lease_s: float, since: float) -> None:
        super().__init__(name, token, lease_s, since)
        self._db = db

    def _renewed(self) -> bool:
        return self._db.at_once(lambda conn: conn.execute(_RENEW, (self.name, self.token)).rowcount) == 1

    def _released(self) -> None:
        self._db.at_once(lambda conn: conn.execute(_RELEASE, (self.name, self.token)))
