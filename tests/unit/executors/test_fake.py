import hashlib

import pytest

from h3core.executors.base import ExecutorFailure, classify
from h3core.executors.fake import FakePlan, OutOfMemoryError


def test_plans_parse_from_prompt_directives():
    plan = FakePlan.parse("step=0.5 fail_at=3 kind=oom fail_attempts=1 no_result")
    assert plan == FakePlan(step_seconds=0.5, fail_at=3, kind="oom", fail_attempts=1, no_result=True)


@pytest.mark.parametrize("text", ["bogus=1", "kind=gremlins", "fail_at=x"])
def test_bad_directives_are_refused(text):
    with pytest.raises(ValueError):
        FakePlan.parse(text)


def test_classify_recognises_oom_the_way_torch_raises_it():
    assert classify(OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))[0] == "oom"
    assert classify(MemoryError())[0] == "oom"
    host = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
        "allocate 4611686018427387904 bytes. Error code 12 (Cannot allocate memory)"
    )
    assert classify(host)[0] == "oom" and classify(RuntimeError("can't allocate a rotary table"))[0] == "executor_error"
    kind, message, _ = classify(ValueError("bad shape"))
    assert (kind, message) == ("executor_error", "ValueError: bad shape")
    assert classify(ExecutorFailure("executor_lost", "gone", "rank 1"))[0:3] == ("executor_lost", "gone", "rank 1")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("encoding", "suffix", "media_type", "audio"),
    [("mp4", ".mp4", "video/mp4", True), ("y4m", ".y4m", "video/x-yuv4mpeg2", False)],
)
async def test_the_fake_writes_a_real_video_with_the_requested_frames_in_either_encoding(
    tmp_path, encoding, suffix, media_type, audio
):
    """y4m is what the core install (no PyAV) writes; PyAV decodes it here to show it is a real video."""
    import av

    from h3core import LocalArtifactStore
    from h3core.executors.base import JobSpec, Result
    from h3core.executors.fake import FakeExecutor
    from tests.factories import request

    artifacts = LocalArtifactStore(tmp_path)
    fake = FakeExecutor(artifacts, encoding=encoding)
    r = request(frames=30, width=448, height=256, steps=2)
    async with fake.running():
        updates = [u async for u in fake.run(JobSpec(job_id="a" * 32, attempt=1, request=r))]
    artifact = updates[-1].artifact if isinstance(updates[-1], Result) else None
    assert artifact is not None and artifact.path.endswith(suffix) and artifact.media_type == media_type
    path = artifacts.resolve(artifact.path)
    assert artifacts.committed("a" * 32, 1).recorded == artifact
    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert bool(container.streams.audio) is audio
    assert len(frames) == 30 and frames[0].shape == (72, 128, 3)  # the request's aspect, 128 wide
    moving = [int(f[36].argmax(axis=0)[0]) for f in frames[:3]]  # the bright bar's column, per frame
    assert moving[0] < moving[1] < moving[2]


def test_the_default_encoding_is_y4m_without_pyav(monkeypatch):
    from h3core.executors import fake

    assert fake.default_encoding() == "mp4"  # the test venv has PyAV
    real = fake.find_spec
    monkeypatch.setattr(fake, "find_spec", lambda name: None if name == "av" else real(name))
    assert fake.default_encoding() == "y4m"


@pytest.mark.anyio
async def test_the_fake_serves_steps_from_its_cache_at_faster_levels_and_makes_another_video(tmp_path):
    """`exact` computes every step (its video is the one the fake always made); `balanced` and
    `fast` serve steps from the simulated cache, never the last, and their videos differ."""
    from h3core import LocalArtifactStore
    from h3core.executors.base import JobSpec, Result
    from h3core.executors.fake import FakeExecutor, _chain_start, _step
    from tests.factories import request

    artifacts = LocalArtifactStore(tmp_path)
    fake = FakeExecutor(artifacts, encoding="y4m")
    results: dict[str, Result] = {}
    async with fake.running():
        for i, level in enumerate(("exact", "balanced", "fast")):
            spec = JobSpec(job_id=f"{i:032x}", attempt=1, request=request(frames=4, steps=7, quality=level))
            updates = [u async for u in fake.run(spec)]
            assert isinstance(updates[-1], Result)
            results[level] = updates[-1]
            assert fake.info(spec)["quality"] == level and ("cache" in fake.info(spec)) == (level != "exact")
    counts = {level: (r.steps.computed, r.steps.cached) for level, r in results.items() if r.steps is not None}
    assert counts == {"exact": (7, 0), "balanced": (5, 2), "fast": (4, 3)}
    shas = {level: r.artifact.sha256 for level, r in results.items()}
    assert len(set(shas.values())) == 3, "a cached step changes the video"
    # exact's chain is the one the fake made before levels existed, so its videos are unchanged.
    chain = _chain_start(JobSpec(job_id="x", attempt=1, request=request(steps=7)))
    assert _step(chain, 1) == hashlib.sha256(f"{chain}:1".encode()).hexdigest() != _step(chain, 1, cached=True)
