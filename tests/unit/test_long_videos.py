"""A video longer than the model's window, run as segments by the runner with the fake: each
segment made once and logged, continued from the frame the one before kept last, joined into one
video of exactly the frames and sound asked."""

from __future__ import annotations

import anyio
import av
import numpy as np
import pytest

from h3core import FakeLimits, FakePlan, RetryPolicy, SQLiteEventStore
from h3core.adapters.artifacts import sha256_file
from h3core.adapters.uploads import LocalUploadStore
from h3core.domain.checkpoints import CheckpointPolicy
from h3core.executors.fake import _preview_size
from tests.factories import request
from tests.unit.conftest import wait_until

pytestmark = pytest.mark.anyio

WINDOW = FakeLimits(
    max_seconds=2.0, continues_segments=True
)  # 39 frames a call (17n + 5 within 2 s): 120 frames are four segments
LONG = {"frames": 120, "steps": 3, "width": 96, "height": 64, "seed": 7}


def ended(runner, *job_ids):
    return lambda: all(runner.store.get(j).terminal for j in job_ids)


def decode(path):
    """The video's frames (RGB) and its sound's length in seconds."""
    with av.open(str(path)) as f:
        frames = [fr.to_ndarray(format="rgb24") for fr in f.decode(video=0)]
    with av.open(str(path)) as f:
        samples = sum(fr.samples for fr in f.decode(audio=0))
        rate = f.streams.audio[0].rate
    return np.stack(frames), samples / rate


def colour(frame):
    """A frame's base colour: each channel's median (the fake's bar is two columns wide)."""
    return np.median(frame.reshape(-1, 3), axis=0)


@pytest.fixture
def uploads(tmp_path):
    return LocalUploadStore(tmp_path / "uploads")


async def test_a_long_video_is_made_as_segments_each_continuing_the_last_and_joined_exactly(make_runner, uploads):
    async with make_runner(limits=WINDOW, uploads=uploads) as runner:
        job = await runner.submit(request(**LONG))
        await wait_until(ended(runner, job.job_id), timeout=60)
    state = runner.store.get(job.job_id)
    assert state.status == "done", state.error
    plan = state.plan
    assert plan is not None and len(plan.segments) == 4 and plan.frames == 120
    kinds = [e.type for e in runner.store.events(job.job_id)]
    assert kinds == ["submitted", "admitted", "planned", "running"] + (["progress"] * 3 + ["segment_done"]) * 4 + ["done"]
    made = [e.body for e in runner.store.events(job.job_id) if e.type == "segment_done"]
    assert [m.index for m in made] == [0, 1, 2, 3]
    assert [m.artifact.frames for m in made] == [s.keep for s in plan.segments]

    video = runner.executor.artifacts.resolve(state.artifact.path)
    assert state.artifact.frames == 120 and state.artifact.sha256 == sha256_file(video)
    frames, seconds = decode(video)
    assert frames.shape[0] == 120
    assert abs(seconds - 5.0) < 0.05, seconds  # AAC ends on a whole 1024-sample frame
    # Conditioned: every segment goes on in the colour the first one had (the frame it continues
    # from), where the seeds alone (seed + index) draw another colour for each.
    first = colour(frames[0])
    for s in plan.segments[1:]:
        assert np.abs(colour(frames[s.start]) - first).max() <= 6, (s.index, colour(frames[s.start]), first)
    alone = [np.random.default_rng(i).integers(0, 256, size=3) for i in (7, 8)]
    assert np.abs(alone[0] - alone[1]).max() > 6  # what the check above would have caught
    # The bar moves 3 pixels a frame across each joint as within a segment.
    w, _ = _preview_size(96, 64)
    for j in plan.joints:
        left = [int(np.argmax(frames[i][:, :, 0].mean(axis=0) > 250)) for i in (j - 1, j)]
        assert (left[0] + 3) % w == left[1], (j, left)

    # Its segment files go once the video is joined; the frames it continued from were uploads.
    assert runner.executor.artifacts.segment_files(job.job_id) == []
    assert runner.executor.runs == 4


async def test_a_retry_goes_on_from_the_first_segment_not_made_and_makes_the_same_video(make_runner, uploads):
    def plans(spec):  # the second segment's first attempt loses its executor at step 2
        if spec.segment is not None and spec.segment.index == 1 and spec.request.prompt == "retried":
            return FakePlan(fail_at=2, kind="executor_lost", fail_attempts=1)
        return None

    async with make_runner(limits=WINDOW, uploads=uploads, plans=plans) as runner:
        whole = await runner.submit(request(**LONG))
        await wait_until(ended(runner, whole.job_id), timeout=60)
        runs = runner.executor.runs
        retried = await runner.submit(request(**LONG, prompt="retried"))
        await wait_until(ended(runner, retried.job_id), timeout=60)
    state = runner.store.get(retried.job_id)
    assert state.status == "done" and state.attempt == 2, state.error
    events = runner.store.events(retried.job_id)
    kinds = [e.type for e in events]
    assert kinds.count("segment_done") == 4 and kinds.count("attempt_failed") == 1
    # Attempt 2 starts at the second segment: the first is made once.
    second = kinds.index("running", kinds.index("attempt_failed"))
    assert [e.body.index for e in events[second:] if e.type == "segment_done"] == [1, 2, 3]
    assert runner.executor.runs - runs == 5  # segments 1, 2 (failed), 2 again, 3, 4
    assert state.artifact.sha256 == runner.store.get(whole.job_id).artifact.sha256


async def test_a_cancel_between_segments_ends_the_job_cancelled_and_keeps_no_segment(make_runner, uploads):
    async with make_runner(limits=WINDOW, uploads=uploads, plan=FakePlan(step_seconds=0.05)) as runner:
        job = await runner.submit(request(**LONG))
        await wait_until(lambda: len(runner.store.get(job.job_id).segments) == 1, timeout=60)
        await runner.cancel(job.job_id)
        await wait_until(ended(runner, job.job_id), timeout=60)
        state = runner.store.get(job.job_id)
        assert state.status == "cancelled" and 1 <= len(state.segments) < 4
        await anyio.sleep(0)
    assert runner.executor.artifacts.segment_files(job.job_id) == []


async def test_each_segment_s_call_has_the_attempt_deadline_and_a_call_past_it_fails_keeping_the_segments_made(
    make_runner, uploads
):
    """Two segments of two 0.4 s steps outlast a 1.5 s deadline together, not each: the third, hung,
    fails the attempt `deadline` and the two stay made."""

    def plans(spec):
        return FakePlan(step_seconds=0.4, hang_at=1 if spec.segment.index == 2 else None)

    async with make_runner(
        limits=WINDOW, uploads=uploads, plans=plans, attempt_deadline_s=1.5, retry=RetryPolicy(max_attempts=1)
    ) as runner:
        job = await runner.submit(request(**{**LONG, "steps": 2}))
        await wait_until(ended(runner, job.job_id), timeout=60)
    state = runner.store.get(job.job_id)
    assert state.status == "failed" and state.error.kind == "deadline", state.error
    assert len(state.segments) == 2
    made = [e.at for e in runner.store.events(job.job_id) if e.type in ("running", "segment_done")]
    assert (made[-1] - made[0]).total_seconds() >= 1.6, "the attempt ran past the deadline, each call within it"


@pytest.mark.parametrize(("kind", "says"), [("oom", "out of memory"), ("invalid", "'invalid' at step 1")])
async def test_a_segment_that_fails_oom_or_invalid_fails_the_job_naming_it(make_runner, uploads, kind, says):
    def plans(spec):
        return FakePlan(fail_at=1, kind=kind) if spec.segment.index == 1 else None

    async with make_runner(limits=WINDOW, uploads=uploads, plans=plans) as runner:
        job = await runner.submit(request(**LONG))
        await wait_until(ended(runner, job.job_id), timeout=60)
    state = runner.store.get(job.job_id)
    assert (state.status, state.error.kind, state.attempt, len(state.segments)) == ("failed", kind, 1, 1)
    assert state.error.message.startswith("segment 2 of 4: ") and says in state.error.message, state.error.message


async def test_a_deploy_inside_a_segment_goes_on_from_that_segment_s_checkpoint(make_runner, uploads, tmp_path):
    """h3core stopped gracefully in the second segment: the attempt is handed back checkpointed, and
    the next start makes neither the first segment again nor the second's steps before its checkpoint,
    and the video is the one an uninterrupted run makes."""
    store = SQLiteEventStore(tmp_path / "shared.db", durable=False)
    policy = CheckpointPolicy(every_steps=2)
    long = {**LONG, "steps": 8}
    async with make_runner(
        limits=WINDOW, uploads=uploads, plan=FakePlan(step_seconds=0.05), store=store, checkpoints=policy
    ) as runner:
        job = await runner.submit(request(**long))
        await wait_until(lambda: len(store.get(job.job_id).segments) == 1 and (store.get(job.job_id).step or 0) >= 5)
    stopped = store.get(job.job_id)
    assert stopped.status == "queued" and stopped.released == 1 and len(stopped.segments) == 1
    assert stopped.checkpoint is not None and stopped.checkpoint.step >= 5
    async with make_runner(limits=WINDOW, uploads=uploads, store=store, checkpoints=policy) as runner:
        await wait_until(ended(runner, job.job_id), timeout=60)
        whole = await runner.submit(request(**{**long, "prompt": "uninterrupted"}))
        await wait_until(ended(runner, whole.job_id), timeout=60)
    done = store.get(job.job_id)
    assert done.status == "done" and done.attempt == 2, done.error
    events = store.events(job.job_id)
    second = [i for i, e in enumerate(events) if e.type == "running"][-1]
    after = events[second:]
    assert after[1].type == "restored" and after[1].body.checkpoint == stopped.checkpoint
    assert [e.body.index for e in after if e.type == "segment_done"] == [1, 2, 3], "the first segment is not made again"
    first_steps = [e.body.step for e in after if e.type == "progress"][: 8 - stopped.checkpoint.step]
    assert first_steps == list(range(stopped.checkpoint.step + 1, 9)), "the second segment goes on after its checkpoint"
    assert done.artifact.sha256 == store.get(whole.job_id).artifact.sha256
