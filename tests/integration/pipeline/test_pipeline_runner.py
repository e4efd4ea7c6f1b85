"""The in-process MiniMax-H3 executor through the runner, on a CPU, with the tiny random model
written by `h3core model make-tiny` and loaded the way real weights are."""

from __future__ import annotations

import av
import pytest
import torch

from h3core import Refused
from tests.integration.pipeline.conftest import ended, req, slow, until, wrap_forward

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


def types(runner, job_id):
    return [e.type for e in runner.store.events(job_id)]


def video_of(runner, state):
    return runner.executor.artifacts.resolve(state.artifact.path)


async def test_a_job_reports_every_step_and_writes_video_with_stereo_audio(make_runner):
    async with make_runner() as runner:
        job = await runner.submit(req(frames=20, steps=5))  # 20 frames snap up to 22 (17n + 5)
        state = await ended(runner, job.job_id)
    assert state.status == "done", state.error
    assert types(runner, job.job_id) == ["submitted", "admitted", "running"] + ["progress"] * 5 + ["done"]
    steps = [(e.body.step, e.body.total) for e in runner.store.events(job.job_id) if e.type == "progress"]
    assert steps == [(i, 5) for i in range(1, 6)]
    assert state.artifact.frames == 22 and state.artifact.duration_s == pytest.approx(22 / 24)
    with av.open(str(video_of(runner, state))) as c:
        video, audio = c.streams.video[0], c.streams.audio[0]
        assert (video.codec_context.name, video.average_rate, video.width, video.height) == ("h264", 24, 64, 64)
        assert (audio.codec_context.name, audio.channels, audio.rate) == ("aac", 2, 32000)
        assert sum(1 for _ in c.decode(video=0)) == 22
    running = runner.store.events(job.job_id)[2].body
    assert running.executor == "pipeline" and running.info["attention"] == "flash (asked auto)"
    assert runner.executor.capabilities().max_tokens is None
    assert [r.verdict for r in runner.executor.attention_report() if r.kernel == "flash"] == ["chosen"]


async def test_the_same_seed_gives_the_same_video_and_another_seed_does_not(make_runner):
    async with make_runner() as runner:
        a = await ended(runner, (await runner.submit(req(seed=11))).job_id)
        b = await ended(runner, (await runner.submit(req(seed=11))).job_id)
        c = await ended(runner, (await runner.submit(req(seed=12))).job_id)
        d = await ended(runner, (await runner.submit(req(seed=11, steps=8, quality="fast"))).job_id)
    assert a.artifact.sha256 == b.artifact.sha256 != c.artifact.sha256
    # A faster level: the level and its cache in `running`, the steps computed and served in `done`.
    assert d.status == "done" and d.artifact.sha256 != a.artifact.sha256
    log = runner.store.events(d.job_id)
    info = next(e.body.info for e in log if e.type == "running")
    assert info["quality"] == "fast" and "FirstBlockCacheConfig(threshold=0.1)" in info["cache"]
    steps = log[-1].body.steps
    assert steps.quality == "fast" and steps.computed + steps.cached == 8 and steps.cached > 0, steps
    exact = runner.store.events(a.job_id)[-1].body.steps
    assert (exact.quality, exact.computed, exact.cached) == ("exact", 4, 0)


async def test_the_model_stays_loaded_and_a_repeated_prompt_is_not_encoded_again(make_runner):
    async with make_runner() as runner:
        for prompt in ("a red fox in snow", "a red fox in snow", "a heron at dawn"):
            state = await ended(runner, (await runner.submit(req(prompt=prompt))).job_id)
            assert state.status == "done"
        ex = runner.executor
        assert ex.counters.loads == 1 and ex.counters.jobs == 3
        assert (ex.generator.encodes, ex.generator.cache_hits) == (2, 1)


async def test_cancel_stops_within_a_step_and_the_next_job_is_unaffected(make_runner):
    async with make_runner() as runner:
        reference = await ended(runner, (await runner.submit(req(steps=8))).job_id)
        undo = wrap_forward(runner, slow(0.3))
        job = await runner.submit(req(steps=8))
        await until(lambda: (runner.store.get(job.job_id).step or 0) >= 2)
        k = runner.store.get(job.job_id).step
        await runner.cancel(job.job_id)
        state = await ended(runner, job.job_id)
        undo()
        after = await ended(runner, (await runner.submit(req(steps=8))).job_id)
    assert state.status == "cancelled"
    steps = [e.body.step for e in runner.store.events(job.job_id) if e.type == "progress"]
    assert max(steps) <= k + 1 < 8
    # The scheduler starts clean: the same request after a cancelled one gives the same video.
    assert after.status == "done" and after.artifact.sha256 == reference.artifact.sha256


async def test_an_out_of_memory_error_fails_the_job_as_oom_and_the_executor_recovers(make_runner):
    calls = []

    def oom_on_second_step(inner, args, kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return inner(*args, **kwargs)

    async with make_runner() as runner:
        undo = wrap_forward(runner, oom_on_second_step)
        job = await runner.submit(req())
        state = await ended(runner, job.job_id)
        undo()
        after = await ended(runner, (await runner.submit(req())).job_id)
    assert state.status == "failed" and state.error.kind == "oom"
    tokens = runner.executor.generator.last_tokens
    assert (
        f"out of memory on cpu at a {tokens}-token sequence" in state.error.message
        and "Tried to allocate 20.00 GiB" in state.error.message
    )
    assert [e.body.step for e in runner.store.events(job.job_id) if e.type == "progress"] == [1]
    assert after.status == "done" and runner.executor.counters.ooms == 1


async def test_the_hosts_memory_running_out_is_oom_naming_the_host_and_the_sequence(make_runner):
    def allocate_too_much(inner, args, kwargs):
        inner(*args, **kwargs)
        torch.empty(1 << 62, dtype=torch.uint8)  # the host allocator's real failure: a RuntimeError

    async with make_runner() as runner:
        undo = wrap_forward(runner, allocate_too_much)
        state = await ended(runner, (await runner.submit(req())).job_id)
        undo()
    tokens = runner.executor.generator.last_tokens
    assert state.status == "failed" and state.error.kind == "oom", state.error
    assert f"out of memory on the host (cpu memory; the model on cpu) at a {tokens}-token sequence" in state.error.message
    assert "DefaultCPUAllocator: can't allocate memory" in state.error.message


async def test_another_exception_is_an_executor_error_with_type_and_message(make_runner):
    def broken(inner, args, kwargs):
        raise KeyError("rotary table")

    async with make_runner() as runner:
        undo = wrap_forward(runner, broken)
        state = await ended(runner, (await runner.submit(req())).job_id)
        undo()
    assert (
        state.error.kind == "executor_error"
        and state.error.message.startswith("KeyError:")
        and "rotary table" in state.error.message
    )


async def test_a_kernel_this_machine_cannot_run_is_refused_at_start(tiny_model, tmp_path):
    from h3core.adapters.artifacts import LocalArtifactStore
    from h3core.executors.pipeline.attention import AttentionError
    from h3core.executors.pipeline.executor import PipelineExecutor, PipelineSettings

    # CPU SDPA has no memory-efficient kernel: it used to start, run jobs on MATH and record "efficient".
    with pytest.raises(AttentionError, match="attention 'efficient' cannot run here: efficient needs a CUDA device, not cpu"):
        PipelineExecutor(PipelineSettings(model_dir=tiny_model, attention="efficient"), LocalArtifactStore(tmp_path), str)


async def test_math_runs_only_as_named_recorded_as_math_and_within_its_bound(make_runner):
    async with make_runner(attention="math", math_max_tokens=100_000) as runner:
        job = await runner.submit(req())
        state = await ended(runner, job.job_id)
        assert runner.executor.capabilities().max_tokens == 100_000
    assert state.status == "done", state.error
    assert runner.store.events(job.job_id)[2].body.info["attention"] == "math (asked math; up to 100000 tokens)"
    async with make_runner(attention="math", math_max_tokens=64) as runner:  # the tiny job is ~120
        with pytest.raises(Refused) as refused:  # what the kernel cannot take is refused at submission
            await runner.submit(req())
    assert (
        refused.value.decision.reason == "vram" and "over the attention kernel's 64-token limit" in refused.value.decision.detail
    )


async def test_the_tiny_model_runs_with_sageattention_installed(make_runner, tmp_path, monkeypatch):
    """sageattention 1.0.6 as PyPI ships it imports triton at once (absent here, as on any CPU box); the CPU
    never imports it, auto never picks a sage kernel here, and the job runs."""
    import sys

    from h3core.executors.pipeline import attention

    site = tmp_path / "site"
    (site / "sageattention").mkdir(parents=True)
    (site / "sageattention" / "__init__.py").write_text("import triton  # as 1.0.6 does\nfrom .core import sageattn\n")
    (site / "sageattention-1.0.6.dist-info").mkdir()
    (site / "sageattention-1.0.6.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sageattention\nVersion: 1.0.6\n"
    )
    monkeypatch.syspath_prepend(str(site))
    attention.sage_build.cache_clear()
    try:
        async with make_runner() as runner:
            state = await ended(runner, (await runner.submit(req())).job_id)
            rows = {r.kernel: r for r in runner.executor.attention_report()}
        assert state.status == "done", state.error
        assert rows["flash"].verdict == "chosen" and rows["sage-triton"].note == "sage-triton needs a CUDA device, not cpu"
        assert "sageattention" not in sys.modules
        # Where it would be consulted (a GPU), the broken import is a reason, not a crash:
        assert "sageattention 1.0.6 does not import: ModuleNotFoundError" in attention.sage_build().error
    finally:
        attention.sage_build.cache_clear()


async def test_a_clip_past_the_longest_video_is_refused_at_submission(make_runner):
    """Past the model's window a video is made as segments (test_pipeline_segments.py), up to the bound."""
    from h3core import Refused

    async with make_runner() as runner:
        with pytest.raises(Refused) as refused:
            await runner.submit(req(frames=60 * 24 + 1))
        assert runner.store.job_ids() == []
    decision = refused.value.decision
    assert decision.reason == "api_limit" and decision.ceiling.max_frames == 60 * 24
    assert "a video made as segments is at most 60 s (1440 frames)" in decision.detail


async def test_keyframes_and_references_come_from_the_upload_store(make_runner, tmp_path):
    from tests.factories import png

    async def chunks(data):
        yield data

    async with make_runner() as runner:
        # A reference image is encoded at a 2048-pixel short edge: a minute of the tiny VAE on a shared CPU
        # (past this test's bound under load). What is tested is the route from the upload store, the same at 64.
        runner.executor.generator.stages["before_encode"].register_to_config(reference_image_short_edge=64)
        key = await runner.uploads.put("image/png", chunks(png(96, 64)))
        fl = await ended(runner, (await runner.submit(req(mode="fl2va", keyframes={"first": key.id}))).job_id)
        ref = await ended(runner, (await runner.submit(req(mode="ref2va", references={"images": [key.id]}))).job_id)
    assert fl.status == "done", fl.error
    assert ref.status == "done", ref.error


async def test_a_model_folder_whose_facts_widen_the_window_makes_a_clip_past_the_models_own(make_runner, tiny_model, tmp_path):
    """The window is the folder's fact: widened there (15 s to 20), the contract admits 19.3 s and
    diffusers' own window check (which reads the pipeline's min/max duration) lets it run."""
    import json
    import shutil

    from h3core import AdmissionRules
    from h3core.executors.pipeline.model import FACTS_FILE

    wide = tmp_path / "wide"
    shutil.copytree(tiny_model, wide)
    facts = json.loads((wide / FACTS_FILE).read_text())
    assert facts["max_seconds"] < 20.0
    (wide / FACTS_FILE).write_text(json.dumps({**facts, "max_seconds": 20.0}))
    async with make_runner(model_dir=wide) as runner:
        contract = AdmissionRules(runner.executor.capabilities())
        one_call = contract.decide(req(width=32, height=32, frames=464))  # 17 * 27 + 5: 19.33 s
        assert one_call.admitted and one_call.plan is None
        assert contract.decide(req(width=32, height=32, frames=465)).plan is not None, "past it: segments"
        job = await runner.submit(req(width=32, height=32, frames=464, steps=1))
        state = await ended(runner, job.job_id, timeout=120)
    assert state.status == "done", state.error
    assert state.artifact.frames == 464 and state.artifact.duration_s == pytest.approx(464 / 24)


async def test_a_kernel_that_kills_the_probes_process_is_failed_in_readiness_and_a_job_still_runs(make_runner, monkeypatch):
    """The start-up probe in a child (as on CUDA): one planted kernel segfaults its process, one exits it,
    one raises a CUDA error; each is a failed row with its error, auto runs flash, a job ends done."""
    from h3core.executors.pipeline.kernel_probe import STAND_INS_ENV
    from h3core.service.views import AttentionRowView
    from tests.fakes.kernels import SPEC

    monkeypatch.setenv(STAND_INS_ENV, SPEC)
    async with make_runner(probe_in_child=True, attention_cache=None) as runner:
        rows = runner.executor.attention_report()
        readiness = {r.kernel: AttentionRowView.model_validate(r, from_attributes=True) for r in rows}
        job = await runner.submit(req())
        state = await ended(runner, job.job_id)
    assert state.status == "done", state.error
    assert runner.store.events(job.job_id)[2].body.info["attention"] == "flash (asked auto)"
    assert readiness["flash"].verdict == "chosen"
    assert readiness["sage-fp16"].verdict == "failed" and "killed by SIGSEGV while running it" in readiness["sage-fp16"].note
    assert readiness["sage-triton"].verdict == "failed" and "exited 70 while running it" in readiness["sage-triton"].note
    assert readiness["sage-fp8"].verdict == "failed" and "illegal memory access" in readiness["sage-fp8"].note
