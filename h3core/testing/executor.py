"""The executor contract as tests, for any implementation of `h3core.Executor`.

Subclass `ExecutorContract` and override its `executor` fixture: a new executor (not yet
running) that commits to the `artifacts` fixture's store (by default a local one). Override
`job_request` where the default (64x64, 22 frames, 6 steps) is not a small job of several steps
for your executor (the cancellation test stops it after its first step). Then pytest runs every
contract test against it, each inside the executor's `running()`:

    class TestMyExecutor(ExecutorContract):
        @pytest.fixture
        def executor(self, artifacts):
            return MyExecutor(artifacts)

h3core's own suite runs it against the fake, the pipeline on a tiny model, a group of Ray ranks
and the ComfyUI executor on the fake ComfyUI. Needs pytest and anyio's pytest plugin.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from pydantic import ValidationError

from h3core.adapters.artifacts.base import ArtifactStore
from h3core.adapters.artifacts.local import LocalArtifactStore
from h3core.domain.admission import AdmissionRules, Refuse
from h3core.domain.capabilities import Capabilities
from h3core.domain.checkpoints import CheckpointPolicy
from h3core.domain.events import Progress
from h3core.domain.request import GenerationRequest
from h3core.domain.segments import plan_segments
from h3core.executors.base import (
    Checkpointing,
    CheckpointSaved,
    Executor,
    FinishedBeforeStop,
    Heartbeat,
    JobSpec,
    Result,
    Resume,
    StoppedWithCheckpoint,
    Update,
)
from h3core.executors.reports import DeviceMemory
from h3core.runtime.admission import LocalAdmission

__all__ = ["ExecutorContract"]

# Bounds on a loaded machine, not measures: each is far beyond what a small job takes.
READY_S = 300.0
RUN_S = 300.0


def _spec(request: GenerationRequest, attempt: int = 1, **more) -> JobSpec:
    return JobSpec(job_id=uuid.uuid4().hex, attempt=attempt, request=request, **more)


async def _drain(executor: Executor, job: JobSpec) -> list[Update]:
    with anyio.fail_after(RUN_S):
        return [update async for update in executor.run(job)]


@pytest.mark.anyio
class ExecutorContract:
    """What every executor must do (the contract in `h3core.executors.base`)."""

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture
    def executor(self) -> Executor:
        raise NotImplementedError("override the `executor` fixture: return a new executor, not yet running")

    @pytest.fixture
    def artifacts(self, tmp_path) -> ArtifactStore:
        """The artifact store the executor commits to: by default a local one in the test's folder."""
        return LocalArtifactStore(tmp_path / "artifacts")

    @pytest.fixture
    def job_request(self) -> GenerationRequest:
        """A small request of several steps: by default 64x64, 22 frames, 6 steps."""
        return GenerationRequest(prompt="a red fox in snow", width=64, height=64, frames=22, steps=6, seed=7)

    @asynccontextmanager
    async def running(self, executor: Executor) -> AsyncIterator[Executor]:
        """The executor inside its `running()`, once its capabilities say it can start a job."""
        async with executor.running():
            with anyio.fail_after(READY_S):
                while not executor.capabilities().ready:
                    await anyio.sleep(0.05)
            yield executor

    async def test_it_is_an_executor_with_a_name(self, executor):
        assert isinstance(executor, Executor) and isinstance(executor.name, str) and executor.name

    async def test_its_device_memory_is_unknown_or_each_device_s_free_part_of_its_total(self, executor):
        async with self.running(executor):
            with anyio.fail_after(READY_S):
                devices = await executor.device_memory()
        assert devices is None or len(devices) >= 1, "None where it does not know, else each device"
        for d in devices or ():
            assert isinstance(d, DeviceMemory) and d.name and 0 <= d.free_bytes <= d.total_bytes, d
            assert d.held_bytes is None or 0 <= d.held_bytes <= d.total_bytes, d

    async def test_progress_rises_and_exactly_one_result_ends_the_run(self, executor, artifacts, job_request):
        job = _spec(job_request)
        async with self.running(executor):
            executor.check(job)
            updates = await _drain(executor, job)
        assert updates and isinstance(updates[-1], Result), "a run ends with its result"
        assert sum(isinstance(u, Result) for u in updates) == 1, "exactly one result, nothing after it"
        assert all(isinstance(u, Progress | Heartbeat | Result) for u in updates), "no checkpoint unless asked"
        steps = [u for u in updates if isinstance(u, Progress)]
        assert [p.step for p in steps] == sorted({p.step for p in steps}), "steps strictly increasing"
        assert len({p.total for p in steps}) <= 1, "one total within an attempt"
        assert all(1 <= p.step <= p.total for p in steps)
        artifact = updates[-1].artifact
        found = artifacts.committed(job.job_id, job.attempt)
        assert found is not None and found.recorded == artifact, "committed through the artifact store"
        assert (found.size, found.sha256) == (artifact.bytes, artifact.sha256)

    @pytest.mark.parametrize("index", [0, 1], ids=["first segment", "a later segment"])
    async def test_a_segment_is_written_as_its_file_its_kept_frames_and_their_sound(
        self, executor, artifacts, job_request, index
    ):
        """Where it continues segments: one segment of a long video (a later one leaves out the joint
        frame it repeats) committed as the job's segment file, the frames it keeps and their sound."""
        if not executor.capabilities().continues_segments:
            pytest.skip("it does not continue segments")
        import av

        plan = plan_segments(2 * job_request.frames - 1, job_request.frames)
        segment = plan.segments[index]
        job = _spec(job_request.model_copy(update={"frames": segment.frames}), segment=segment)
        async with self.running(executor):
            executor.check(job)
            updates = await _drain(executor, job)
        artifact = updates[-1].artifact
        assert isinstance(updates[-1], Result) and artifact.frames == segment.keep
        [stored] = artifacts.segment_files(job.job_id)
        assert (stored.path, stored.bytes, stored.segment) == (artifact.path, artifact.bytes, index)
        assert artifacts.committed(job.job_id, job.attempt) is None, "a segment, not the job's video"
        with artifacts.local_file(artifact.path) as local, av.open(str(local)) as f:
            frames = sum(1 for _ in f.decode(video=0))
        with artifacts.local_file(artifact.path) as local, av.open(str(local)) as f:
            seconds = sum(fr.samples for fr in f.decode(audio=0)) / f.streams.audio[0].rate
        assert frames == segment.keep, "the frames it keeps, the model's extra tail and the joint frame left out"
        assert abs(seconds - segment.frames / job_request.fps) < 0.01, "the sound of every frame asked"

    async def test_a_cancelled_run_stops_leaves_no_video_and_frees_the_executor(
        self, executor: Executor, artifacts: ArtifactStore, job_request: GenerationRequest
    ) -> None:
        job = _spec(job_request)
        finished: list[Result] = []
        async with self.running(executor):
            with anyio.fail_after(RUN_S):
                async with anyio.create_task_group() as tg:

                    async def run() -> None:
                        try:
                            async for update in executor.run(job):
                                if isinstance(update, Progress):
                                    tg.cancel_scope.cancel()  # as the runner stops a job
                        except FinishedBeforeStop as done:  # its work ended before the stop took
                            finished.append(done.result)

                    tg.start_soon(run)
            if not finished:
                assert artifacts.committed(job.job_id, job.attempt) is None, "a stopped attempt commits nothing"
            again = await _drain(executor, _spec(job_request))
        assert isinstance(again[-1], Result), "the stopped attempt released what it held"

    async def test_checkpoints_come_as_the_policy_says_and_a_continued_run_makes_the_same_video(
        self, executor, artifacts, job_request
    ):
        """Where the capabilities say it keeps checkpoints: each stored after its step's progress,
        never after the last step; continued from one, the run starts after its step and its video
        is the uninterrupted one, byte for byte. Where they do not: it never yields one."""
        job = _spec(job_request, checkpoints=CheckpointPolicy(every_steps=2))
        async with self.running(executor):
            keeps = executor.capabilities().checkpoints
            updates = await _drain(executor, job)
            saved = [u for u in updates if isinstance(u, CheckpointSaved)]
            if not keeps:
                assert saved == [], "an executor without checkpoints stores none"
                return
            total = job_request.steps
            assert [s.checkpoint.step for s in saved] == list(range(2, total, 2))
            for s in saved:
                before = updates[: updates.index(s)]
                assert any(isinstance(u, Progress) and u.step == s.checkpoint.step for u in before), "after its step"
                assert (s.checkpoint.attempt, s.checkpoint.total) == (job.attempt, total)
                assert artifacts.measure(s.checkpoint.path) == (s.checkpoint.bytes, s.checkpoint.sha256)
            whole = updates[-1]
            assert isinstance(whole, Result)
            cp = saved[-1].checkpoint
            again = JobSpec(job.job_id, 2, job_request, resume=Resume(cp, artifacts.read_checkpoint(cp.path)))
            continued = await _drain(executor, again)
        steps = [u.step for u in continued if isinstance(u, Progress)]
        assert steps == list(range(cp.step + 1, total + 1)), "it starts after the checkpoint's step"
        result = continued[-1]
        assert isinstance(result, Result) and result.artifact.sha256 == whole.artifact.sha256, "the uninterrupted video"

    async def test_a_stop_asked_to_checkpoint_stores_one_where_it_stops(self, executor, artifacts, job_request):
        """Where it keeps checkpoints: `save_on_stop` then a cancel after a step ends the run with
        `StoppedWithCheckpoint`, of a step it reached, stored as recorded."""
        async with self.running(executor):
            if not executor.capabilities().checkpoints:
                return
            saver = executor
            assert isinstance(saver, Checkpointing), "an executor that keeps checkpoints takes `save_on_stop`"
            job = _spec(job_request, checkpoints=CheckpointPolicy())
            stopped: list[StoppedWithCheckpoint] = []
            reached: list[int] = []
            with anyio.fail_after(RUN_S):
                async with anyio.create_task_group() as tg:

                    async def run() -> None:
                        try:
                            async for update in executor.run(job):
                                if isinstance(update, Progress):
                                    reached.append(update.step)
                                    saver.save_on_stop(job)
                                    tg.cancel_scope.cancel()
                        except StoppedWithCheckpoint as exc:
                            stopped.append(exc)
                        except FinishedBeforeStop:
                            pass  # it had finished: nothing to continue

                    tg.start_soon(run)
        if stopped:
            cp = stopped[0].saved.checkpoint
            assert 1 <= cp.step < job_request.steps and cp.step >= reached[0]
            assert artifacts.measure(cp.path) == (cp.bytes, cp.sha256)

    async def test_what_the_capabilities_admit_the_check_passes(self, executor, job_request):
        async with self.running(executor):
            contract = LocalAdmission(executor.capabilities)
            for request in _variants(job_request):
                decision = contract.decide(request)
                if isinstance(decision, Refuse):
                    continue
                if decision.plan is None:
                    executor.check(_spec(request))  # raises ExecutorFailure("invalid") on a breach
                for segment in decision.plan.segments if decision.plan is not None else ():
                    part = AdmissionRules.segment_request(request, decision.plan, segment)
                    executor.check(_spec(part, segment=segment))  # each call of a long video

    async def test_the_cheap_calls_are_cheap_and_agree(self, executor, job_request):
        async with self.running(executor):
            caps = executor.capabilities()
            assert isinstance(caps, Capabilities) and caps == executor.capabilities()
            assert caps.executor == executor.name
            job = _spec(job_request)
            reference = executor.reference(job)
            assert reference is None or isinstance(reference, str)
            info = executor.info(job)
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in info.items())
            for report in (executor.health(), executor.head(), executor.attention_report()):
                assert report is None or report is not False


def _variants(request: GenerationRequest) -> list[GenerationRequest]:
    """The request and its neighbours in frames and size, some of which capabilities refuse."""
    changes = [{"frames": n} for n in (1, 5, 22, 48, 124, 361)] + [{"width": n, "height": n} for n in (32, 64, 96, 4096)]
    out = [request]
    for change in changes:
        try:
            out.append(GenerationRequest.model_validate({**request.model_dump(), **change}))
        except ValidationError:
            continue  # not a request at all: nothing to admit
    return out
