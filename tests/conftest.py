from __future__ import annotations

import pytest
from hypothesis import settings

from h3core.adapters.store import MemoryEventStore, SQLiteEventStore

# Hypothesis' per-example deadline is a timed assertion: on a loaded 2-core machine it fails
# examples that are merely slow. Time is measured by bench/, not by tests.
settings.register_profile("h3core", deadline=None)
settings.load_profile("h3core")


@pytest.fixture(params=["sqlite", "memory"])
def store(request, tmp_path):
    """Every store implementation, so one contract test covers them all."""
    s = SQLiteEventStore(tmp_path / "h3.db", durable=False) if request.param == "sqlite" else MemoryEventStore()
    yield s
    s.close()


@pytest.fixture
def anyio_backend():
    return "asyncio"
