"""`h3core worker` (or `serve`) on a store whose disk fails every write of a `done` event, inside the real
write transaction (after the rows, before the commit): the store stays unusable for the attempt's end.

    python tests/integration/failing_store_worker.py {worker|serve} --db ... [args]
"""

from __future__ import annotations

import sqlite3

from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.cli import app

_store = SQLiteEventStore._store


def _failing(self, conn, state, events):
    _store(self, conn, state, events)
    if any(e.type == "done" for e in events):
        raise sqlite3.OperationalError("disk I/O error")


if __name__ == "__main__":
    SQLiteEventStore._store = _failing
    app()
