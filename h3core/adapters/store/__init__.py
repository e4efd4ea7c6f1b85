"""Event stores: the contract (`base`: the log and the projections), SQLite (the real one, one
node), PostgreSQL (several nodes; the `postgres` extra, loaded when a store is opened) and memory
(the fake). A store shared by nodes has parts of its own (`nodes`: the node-lease contract), on
PostgreSQL (`postgres_leases`, `postgres_turns`) and in the fake (`memory_leases`)."""

from h3core.adapters.store.base import (
    Conflict,
    EventLog,
    EventStore,
    JobProjections,
    Notifying,
    UnknownJob,
    VideoDeletion,
    precheck,
)
from h3core.adapters.store.memory import MemoryEventStore
from h3core.adapters.store.memory_leases import MemoryNodeLeases, MemoryNodesEventStore
from h3core.adapters.store.postgres import PostgresEventStore
from h3core.adapters.store.sqlite import SchemaTooNew, SQLiteEventStore

__all__ = [
    "Conflict",
    "EventLog",
    "EventStore",
    "JobProjections",
    "MemoryEventStore",
    "MemoryNodeLeases",
    "MemoryNodesEventStore",
    "Notifying",
    "PostgresEventStore",
    "SQLiteEventStore",
    "SchemaTooNew",
    "UnknownJob",
    "VideoDeletion",
    "precheck",
]
