"""Properties of every event store: it stores exactly what the fold accepts, nothing else."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h3core.adapters.store import (
    Conflict,
    MemoryEventStore,
    SQLiteEventStore,
    UnknownJob,
)
from h3core.domain.state import IllegalEvent, fold
from tests.conftest import STORE_KINDS, open_kind
from tests.pgserver import PgServer
from tests.profiles import examples
from tests.strategies import bodies_for


@pytest.fixture(scope="module")
def pg_store(pg_server):
    """One PostgreSQL store for the module, emptied for each example (a schema per example costs more)."""
    from h3core.adapters.store.postgres import PostgresEventStore

    url = pg_server.fresh_schema()
    s = PostgresEventStore(url)
    s.close = lambda: PgServer.empty(url)  # each example's end empties it for the next
    yield s
    PostgresEventStore.close(s)


@settings(max_examples=examples(25))
@given(st.data())
def test_store_keeps_exactly_the_legal_events_and_its_projection_equals_replay(data):
    _keeps_exactly_the_legal_events(SQLiteEventStore(Path(tempfile.mkdtemp()) / "h3.db", durable=False), data)


# Fewer examples: each costs a server round trip per statement (the same property, the same drawing).
@settings(max_examples=examples(10), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_the_postgres_store_keeps_exactly_the_legal_events_and_its_projection_equals_replay(pg_store, data):
    _keeps_exactly_the_legal_events(pg_store, data)


def _keeps_exactly_the_legal_events(real, data) -> None:
    stores = [real, MemoryEventStore()]
    jobs = ["a", "b", "c"]
    for _ in range(data.draw(st.integers(10, 50))):
        job = data.draw(st.sampled_from(jobs))
        state = stores[0].get(job)
        batch = [data.draw(bodies_for(state))]
        if data.draw(st.booleans()):
            batch.append(data.draw(bodies_for(None if state is None else state)))
        before = [s.events(job) for s in stores]
        outcomes = []
        for s in stores:
            try:
                s.append(job, batch)
                outcomes.append("ok")
            except (IllegalEvent, UnknownJob, Conflict) as exc:
                outcomes.append(type(exc).__name__)
        assert outcomes[0] == outcomes[1], "both stores decide the same way"
        if outcomes[0] != "ok":
            # Rejected: not one event of the batch was stored, in either store.
            assert [s.events(job) for s in stores] == before
    for job in jobs:
        logs = [s.events(job) for s in stores]
        assert [[(e.seq, e.body) for e in log] for log in logs][0] == [(e.seq, e.body) for e in logs[1]]
        for s, log in zip(stores, logs, strict=True):
            # Replaying the log gives exactly the live projection.
            assert fold(log) == s.get(job)
    for s in stores:
        assert sorted(s.counts().items()) == sorted(
            {st_: sum(1 for j in jobs if s.get(j) and s.get(j).status == st_) for st_ in s.counts()}.items()
        )
        s.close()


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_import_of_exported_logs_reproduces_the_store(kind, request, tmp_path):
    from tests.factories import done_log

    src = SQLiteEventStore(tmp_path / "src.db", durable=False)
    for i in range(5):
        src.append(f"j{i}", done_log(steps=i + 1))
    events = list(src.all_events())
    dst = open_kind(kind, request, tmp_path)
    assert dst.import_events(events) == len(events)
    assert dst.import_events(events) == 0  # idempotent
    assert list(dst.all_events()) == events
    for i in range(5):
        assert dst.get(f"j{i}") == src.get(f"j{i}")
