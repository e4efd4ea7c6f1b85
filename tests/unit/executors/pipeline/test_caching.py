"""Quality levels on the real pipeline (tiny random model, CPU): `exact` is untouched by a faster
job run before it, the faster levels serve steps from diffusers' First Block Cache, and the cache's
hooks are gone after every job, however it ended."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("diffusers")

from h3core.domain.quality import StepCounts  # noqa: E402
from h3core.domain.request import GenerationRequest  # noqa: E402
from h3core.executors.pipeline.attention import Target, plan_for  # noqa: E402
from h3core.executors.pipeline.caching import THRESHOLDS, quality_info  # noqa: E402
from h3core.executors.pipeline.generate import Control, Generator, Media, Output, StopRequested  # noqa: E402
from h3core.executors.pipeline.model import load_model  # noqa: E402


@pytest.fixture(scope="module")
def generator(tiny_model) -> Generator:
    # The prompt is encoded once (the prompt cache): each job here costs its steps and its decode.
    return Generator(load_model(tiny_model), plan_for("flash", Target.detect("cpu", "float32", 2, 32)), cache_size=4)


# Enough steps for the tiny model's first-block residual to settle below both thresholds.
STEPS = 8


def request(quality: str) -> GenerationRequest:
    return GenerationRequest(prompt="a fox in snow", width=64, height=32, frames=22, steps=STEPS, seed=11, quality=quality)


def hooks(generator: Generator) -> list[str]:
    """Every diffusers hook left on the denoiser's blocks but the context-parallel ones."""
    blocks = generator.model.components["transformer"].transformer_blocks
    return [name for b in blocks if hasattr(b, "_diffusers_hook") for name in b._diffusers_hook.hooks if "cp_" not in name]


@pytest.fixture(scope="module")
def runs(generator) -> dict[str, Output]:
    """exact, fast, balanced, then exact again, on one warm model."""
    out = {"before": generator.run(request("exact"), Media(), Control())}
    for level in ("fast", "balanced"):
        out[level] = generator.run(request(level), Media(), Control())
    out["after"] = generator.run(request("exact"), Media(), Control())
    return out


def test_exact_is_the_same_video_after_a_faster_job_and_the_faster_levels_skip_steps(generator, runs):
    before, after = runs["before"], runs["after"]
    assert before.cache == StepCounts(quality="exact", computed=STEPS, cached=0)
    assert np.array_equal(after.frames, before.frames) and np.array_equal(after.audio, before.audio)
    assert hooks(generator) == [], "the cache's hooks are removed after the job"
    for level in ("fast", "balanced"):
        out = runs[level]
        assert out.cache is not None and out.cache.quality == level
        assert out.cache.computed + out.cache.cached == STEPS, level
        assert out.cache.cached > 0 and out.cache.computed >= 1, (level, out.cache)
        assert not np.array_equal(out.frames, before.frames), f"{level}: a served step changes the video"
    assert runs["fast"].cache.cached >= runs["balanced"].cache.cached, "fast's threshold is the looser"
    assert quality_info("exact") == {"quality": "exact"}
    assert str(THRESHOLDS["fast"]) in quality_info("fast")["cache"]


def test_the_cache_is_removed_after_a_job_that_stopped_and_the_next_starts_empty(generator, runs):
    control = Control(on_step=lambda step, total: control.stop.set() if step == 3 else None)
    with pytest.raises(StopRequested):
        generator.run(request("fast"), Media(), control)
    assert hooks(generator) == []
    again = generator.run(request("fast"), Media(), Control())
    assert again.cache == runs["fast"].cache and np.array_equal(again.frames, runs["fast"].frames), "state left behind"
