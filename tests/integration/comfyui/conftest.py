from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from h3core import LocalArtifactStore, Runner, RunnerConfig, SQLiteEventStore
from h3core.adapters.uploads import LocalUploadStore
from h3core.executors.comfyui.executor import ComfyUIExecutor, ComfyUISettings
from h3core.executors.comfyui.templates import builtin_templates
from h3core.testing.comfyui import FakeComfyUI
from tests import waiting


@pytest.fixture
async def comfy(tmp_path) -> AsyncIterator[FakeComfyUI]:
    async with FakeComfyUI(tmp_path / "comfyui") as fake:
        fake.step_seconds = 0.02
        yield fake


@pytest.fixture
def make_runner(tmp_path, comfy):
    uploads = LocalUploadStore(tmp_path / "uploads")

    @asynccontextmanager
    async def make(
        store: SQLiteEventStore | None = None, *, comfyui: dict | None = None, segments: bool = False, **config
    ) -> AsyncIterator[Runner]:
        """A runner on the ComfyUI executor; `comfyui` overrides its settings (on_stop, templates);
        `segments`: the runner holds the artifact and upload stores a long video's segments need."""
        store = store or SQLiteEventStore(tmp_path / "h3.db", durable=False)
        settings = ComfyUISettings(
            **{
                "url": comfy.url,
                "client_id": "h3core-test",
                "poll_min_s": 0.05,
                "poll_max_s": 0.3,
                "lost_after_s": 1.0,
                "unreachable_after_s": 2.0,
                "stop_wait_s": 5.0,
                "log_path": comfy.log_path,
                **(comfyui or {}),
            }
        )
        artifacts = LocalArtifactStore(tmp_path / "artifacts")
        executor = ComfyUIExecutor(
            settings, builtin_templates(), artifacts, lambda upload_id: uploads.path(uploads.get(upload_id))
        )
        cfg = {"stall_timeout_s": 30.0, "cancel_grace_s": 10.0, "poll_interval_s": 0.05, **config}
        stores = {"artifacts": artifacts, "uploads": uploads} if segments else {}
        runner = Runner(store, executor, RunnerConfig(**cfg), **stores)
        runner.uploads = uploads  # for tests that upload keyframes first
        async with anyio.create_task_group() as tg:
            await tg.start(runner.run)
            yield runner
            tg.cancel_scope.cancel()

    return make


def types(runner: Runner, job_id: str) -> list[str]:
    return [e.type for e in runner.store.events(job_id)]


# The fake ComfyUI's jobs take a fraction of a second: a shorter deadline than the suite's.
async def ended(runner: Runner, job_id: str, timeout: float = 20.0):
    return await waiting.ended(runner, job_id, timeout)


async def until(predicate, timeout: float = 20.0) -> None:
    await waiting.until(predicate, timeout)


def png_path(tmp: Path) -> Path:
    from tests.factories import png

    path = tmp / "key.png"
    path.write_bytes(png(64, 64))
    return path
