"""A long video on the tiny MiniMax-H3 (CPU), through the runner: a 30 s request past its 15 s
window is made as segments, each after the first conditioned on the last frame the one before
kept (what the model's fl2va stage is handed, read back here), and joined into exactly the frames
and sound asked."""

from __future__ import annotations

import anyio
import av
import numpy as np
import pytest

from h3core import LocalArtifactStore, Runner, RunnerConfig, SQLiteEventStore
from h3core.adapters.uploads import LocalUploadStore
from h3core.executors.pipeline.executor import PipelineExecutor, PipelineSettings
from h3core.executors.pipeline.generate import Generator
from tests.integration.pipeline.conftest import req, until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def frames_of(path) -> np.ndarray:
    with av.open(str(path)) as f:
        return np.stack([fr.to_ndarray(format="rgb24") for fr in f.decode(video=0)])


def seconds_of_sound(path) -> float:
    with av.open(str(path)) as f:
        return sum(fr.samples for fr in f.decode(audio=0)) / f.streams.audio[0].rate


async def test_a_30_s_video_on_the_tiny_model_is_three_segments_each_conditioned_on_the_last_joined_exactly(
    tmp_path, tiny_model, attention_cache, monkeypatch
):
    calls: list[tuple[str, np.ndarray | None]] = []  # each stage that takes fl2va's first image, and what it got
    stage = Generator._stage

    def watching(self, name, state, inputs, **kw):
        if "image" in self._stage_inputs[name]:
            image = inputs.get("image")
            calls.append((name, None if image is None else np.asarray(image)))
        return stage(self, name, state, inputs, **kw)

    monkeypatch.setattr(Generator, "_stage", watching)
    uploads = LocalUploadStore(tmp_path / "uploads")
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    executor = PipelineExecutor(
        PipelineSettings(model_dir=tiny_model, attention_cache=attention_cache),
        artifacts,
        lambda upload_id: uploads.path(uploads.get(upload_id)),
    )
    store = SQLiteEventStore(tmp_path / "h3.db", durable=False)
    config = RunnerConfig(stall_timeout_s=120.0, cancel_grace_s=30.0, poll_interval_s=0.05)
    runner = Runner(store, executor, config, artifacts=artifacts, uploads=uploads)
    async with anyio.create_task_group() as tg:
        await tg.start(runner.run)
        await until(lambda: executor.capabilities().ready, timeout=120)
        job = await runner.submit(req(frames=720, width=32, height=32, steps=2))
        await until(lambda: store.get(job.job_id).terminal, timeout=900)
        tg.cancel_scope.cancel()

    state = store.get(job.job_id)
    assert state.status == "done", state.error
    plan = state.plan
    assert plan is not None and len(plan.segments) >= 3
    video = artifacts.resolve(state.artifact.path)
    frames = frames_of(video)
    assert frames.shape[0] == 720 == state.artifact.frames
    assert abs(seconds_of_sound(video) - 30.0) < 0.05  # AAC ends on a whole 1024-sample frame

    # Each call after the first was handed, as fl2va's first image, the last frame its predecessor
    # kept: the segment file's last frame, which the joined video shows just before the joint.
    handed = [image for name, image in calls if name == calls[0][0]]  # one per call
    assert len(handed) == len(plan.segments) and handed[0] is None, [h is None for h in handed]
    for segment, image in zip(plan.segments[1:], handed[1:], strict=True):
        before = frames[segment.start - 1]
        assert image is not None and image.shape == before.shape
        assert np.abs(image.astype(int) - before.astype(int)).max() <= 2, segment.index  # decoded apart: rounding
