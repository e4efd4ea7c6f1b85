from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from h3core import (
    FakeExecutor,
    FakePlan,
    LocalArtifactStore,
    Runner,
    RunnerConfig,
    SQLiteEventStore,
)
from tests.waiting import until as wait_until  # noqa: F401 - the unit tests' name for it


@pytest.fixture
def make_runner(tmp_path):
    @asynccontextmanager
    async def make(
        plan: FakePlan | None = None, plans=None, store=None, limits=None, uploads=None, **config
    ) -> AsyncIterator[Runner]:
        """`uploads`: an upload store the runner and the fake share (a long video's segments continue through it)."""
        store = store or SQLiteEventStore(tmp_path / "h3.db", durable=False)
        artifacts = LocalArtifactStore(tmp_path / "artifacts")
        path = None if uploads is None else (lambda upload_id: uploads.path(uploads.get(upload_id)))
        executor = FakeExecutor(artifacts, default=plan, plans=plans, limits=limits, upload_path=path)
        cfg = {"stall_timeout_s": 5.0, "cancel_grace_s": 2.0, "poll_interval_s": 0.05, **config}
        runner = Runner(store, executor, RunnerConfig(**cfg), artifacts=artifacts, uploads=uploads)
        async with anyio.create_task_group() as tg:
            await tg.start(runner.run)
            yield runner
            tg.cancel_scope.cancel()

    return make
