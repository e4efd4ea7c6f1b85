"""The checkpoint writer's background: a checkpoint serialised elsewhere (a group's rank 0) is
fetched and stored in the writer's thread, reported with what it cost that loop, and a failure to
fetch or store it is raised where the job's thread next waits for the writer, never over the
job's own failure."""

from __future__ import annotations

import threading

import pytest

from h3core.adapters.artifacts.local import LocalArtifactStore
from h3core.domain.request import GenerationRequest
from h3core.executors.base import CheckpointSaved, JobSpec
from h3core.executors.pipeline.driver import Background, CheckpointWriter

JOB = JobSpec(job_id="a" * 32, attempt=2, request=GenerationRequest(prompt="a fox", width=64, height=64, frames=22, steps=6))


def test_a_checkpoint_serialised_elsewhere_is_fetched_and_stored_off_the_callers_thread(tmp_path):
    store = LocalArtifactStore(tmp_path / "artifacts")
    saved: list[CheckpointSaved] = []
    writer = CheckpointWriter(store, JOB, saved.append)
    caller = threading.current_thread()
    fetched_on: list[threading.Thread] = []

    def fetch() -> bytes:
        fetched_on.append(threading.current_thread())
        return b"state after step 2"

    writer.hand_serialised(2, 6, fetch, paused_s=0.001, made_s=0.25)
    last = writer.drain()
    assert saved == [last] and last is not None
    assert fetched_on and fetched_on[0] is not caller, "fetched in the writer's thread"
    cp = last.checkpoint
    assert (cp.attempt, cp.step, cp.total) == (2, 2, 6)
    assert store.read_checkpoint(cp.path) == b"state after step 2"
    assert store.measure(cp.path) == (cp.bytes, cp.sha256)
    assert last.paused_s == 0.001, "the pause is the loop's, where it was made"
    assert last.write_s >= 0.25, "the write counts from when it was being made"


def test_a_fetch_that_fails_is_raised_by_the_next_drain_and_only_once(tmp_path):
    writer = CheckpointWriter(LocalArtifactStore(tmp_path / "artifacts"), JOB, lambda saved: None)

    def gone() -> bytes:
        raise ConnectionError("rank 0 is gone")

    writer.hand_serialised(2, 6, gone, paused_s=0.0, made_s=0.0)
    with pytest.raises(ConnectionError, match="rank 0 is gone"):
        writer.drain()
    assert writer.drain() is None, "raised once; nothing was stored"


class Stop(BaseException):
    """A stop between steps (as `StopRequested`)."""


def failing() -> None:
    raise OSError("disk full")


def test_leaving_a_block_raises_what_the_work_raised_unless_the_block_failed_itself():
    work = Background("test")
    work.begin(failing)
    with pytest.raises(OSError, match="disk full"), work.finishing():
        pass  # ended well: the work's failure is the one
    work.begin(failing)
    with pytest.raises(OSError, match="disk full"), work.finishing():
        raise Stop  # a stop may have asked for that work: its failure is the one
    work.begin(failing)
    with pytest.raises(ValueError, match="the model's"), work.finishing():
        raise ValueError("the model's")  # the root cause, not what failed with it
    work.drain()  # drained on the way out: nothing left to raise
