from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import pytest

pytest.importorskip("diffusers", reason="the pipeline extra is not installed")

from h3core import LocalArtifactStore, Runner, RunnerConfig, SQLiteEventStore  # noqa: E402
from h3core.adapters.uploads import LocalUploadStore  # noqa: E402
from h3core.domain.request import GenerationRequest  # noqa: E402
from h3core.executors.pipeline.executor import PipelineExecutor, PipelineSettings  # noqa: E402
from tests.waiting import ended, until  # noqa: E402, F401 - this package's tests take them from here


@pytest.fixture(scope="session")
def attention_cache(tmp_path_factory):
    """The attention probe's cache, as `serve` keeps one beside its store: each distinct probe
    (kernel asked, libraries, device) is measured once in this process, not once per executor."""
    return tmp_path_factory.mktemp("attention") / "h3-attention-cache.json"


@pytest.fixture
def make_runner(tmp_path, tiny_model, attention_cache):
    uploads = LocalUploadStore(tmp_path / "uploads")

    @asynccontextmanager
    async def make(*, loaded: bool = True, **settings) -> AsyncIterator[Runner]:
        executor = PipelineExecutor(
            PipelineSettings(**{"model_dir": tiny_model, "attention_cache": attention_cache, **settings}),
            LocalArtifactStore(tmp_path / "artifacts"),
            lambda upload_id: uploads.path(uploads.get(upload_id)),
        )
        store = SQLiteEventStore(tmp_path / "h3.db", durable=False)
        runner = Runner(store, executor, RunnerConfig(stall_timeout_s=60.0, cancel_grace_s=30.0, poll_interval_s=0.05))
        runner.uploads = uploads
        async with anyio.create_task_group() as tg:
            await tg.start(runner.run)
            if loaded:
                await until(
                    lambda: executor.capabilities().ready or "model did not load" in "".join(executor.capabilities().problems())
                )
            yield runner
            tg.cancel_scope.cancel()

    return make


def req(**kw) -> GenerationRequest:
    return GenerationRequest(
        **{"prompt": "a red fox in snow", "width": 64, "height": 64, "frames": 22, "steps": 4, "seed": 7, **kw}
    )


def wrap_forward(runner: Runner, around: Callable[[Callable, tuple, dict], object]) -> Callable[[], None]:
    """Instrument the loaded transformer's (guarded) forward; returns the undo."""
    transformer = runner.executor.generator.model.components["transformer"]
    inner = transformer.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        return around(inner, args, kwargs)

    transformer.forward = forward
    return lambda: setattr(transformer, "forward", inner)


def slow(seconds: float):
    def around(inner, args, kwargs):
        time.sleep(seconds)
        return inner(*args, **kwargs)

    return around
