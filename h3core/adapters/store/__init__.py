"""Event stores: the contract (`base`), SQLite (the real one) and memory (the fake)."""

from h3core.adapters.store.base import Conflict, EventStore, UnknownJob
from h3core.adapters.store.memory import MemoryEventStore
from h3core.adapters.store.sqlite import SchemaTooNew, SQLiteEventStore

__all__ = ["Conflict", "EventStore", "MemoryEventStore", "SQLiteEventStore", "SchemaTooNew", "UnknownJob"]
