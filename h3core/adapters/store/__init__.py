"""Event stores: the contract (`base`: the log and the projections), SQLite (the real one, one
node), PostgreSQL (several nodes; the `postgres` extra, loaded when a store is opened) and memory
(the fake)."""

from h3core.adapters.store.base import Conflict, EventLog, EventStore, JobProjections, Notifying, UnknownJob, precheck
from h3core.adapters.store.memory import MemoryEventStore
from h3core.adapters.store.postgres import PostgresEventStore
from h3core.adapters.store.sqlite import SchemaTooNew, SQLiteEventStore

__all__ = [
    "Conflict",
    "EventLog",
    "EventStore",
    "JobProjections",
    "MemoryEventStore",
    "Notifying",
    "PostgresEventStore",
    "SQLiteEventStore",
    "SchemaTooNew",
    "UnknownJob",
    "precheck",
]
