from __future__ import annotations

import pytest

from h3core.adapters.store import MemoryEventStore, SQLiteEventStore


@pytest.fixture(params=["sqlite", "memory"])
def store(request, tmp_path):
    """Every store implementation, so one contract test covers them all."""
    s = SQLiteEventStore(tmp_path / "h3.db", durable=False) if request.param == "sqlite" else MemoryEventStore()
    yield s
    s.close()


@pytest.fixture
def anyio_backend():
    return "asyncio"
