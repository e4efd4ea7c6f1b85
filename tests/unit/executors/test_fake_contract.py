"""The executor contract (`h3core.testing.executor`) held against the fake executor."""

from __future__ import annotations

import anyio
import pytest

from h3core import FakeExecutor, FakeLimits, FakePlan, GenerationRequest, LocalArtifactStore
from h3core.executors.reports import DeviceMemory
from h3core.testing.executor import ExecutorContract


class TestFakeExecutor(ExecutorContract):
    @pytest.fixture
    def executor(self, artifacts):
        return FakeExecutor(artifacts, default=FakePlan(step_seconds=0.01), limits=FakeLimits(continues_segments=True))


class _TwoResults(FakeExecutor):
    async def run(self, job):
        async for update in super().run(job):
            yield update
        yield update  # the result again: a second end


class _DeafToCancel(FakeExecutor):
    async def run(self, job):
        with anyio.CancelScope(shield=True):  # finishes and commits whatever the runner says
            updates = [u async for u in super().run(job)]
        for update in updates:
            yield update


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("broken", "test"),
    [
        (_TwoResults, ExecutorContract.test_progress_rises_and_exactly_one_result_ends_the_run),
        (_DeafToCancel, ExecutorContract.test_a_cancelled_run_stops_leaves_no_video_and_frees_the_executor),
    ],
)
async def test_the_contract_fails_an_executor_that_breaks_it(tmp_path, broken, test):
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    executor = broken(artifacts, default=FakePlan(step_seconds=0.01))
    request = GenerationRequest(prompt="a red fox in snow", width=64, height=64, frames=22, steps=6, seed=7)
    with pytest.raises(AssertionError):
        await test(ExecutorContract(), executor, artifacts, request)


class _MoreFreeThanThere(FakeExecutor):
    async def device_memory(self):
        return (DeviceMemory("cuda:0", total_bytes=2**30, free_bytes=2**31),)


class _NoDevicesButNotNone(FakeExecutor):
    async def device_memory(self):
        return ()


@pytest.mark.anyio
@pytest.mark.parametrize("broken", [_MoreFreeThanThere, _NoDevicesButNotNone])
async def test_the_contract_fails_device_memory_that_cannot_be(tmp_path, broken):
    executor = broken(LocalArtifactStore(tmp_path / "artifacts"), default=FakePlan(step_seconds=0.01))
    with pytest.raises(AssertionError):
        await ExecutorContract().test_its_device_memory_is_unknown_or_each_device_s_free_part_of_its_total(executor)
