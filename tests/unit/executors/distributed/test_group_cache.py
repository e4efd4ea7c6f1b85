"""The step cache on a group: two ranks (FSDP2 + Ulysses, gloo, spawned processes) take the same skip
decision at every step, so jobs at every level run in a row without a hang, and each makes the video
and the step counts of the single-device run at its level."""

from __future__ import annotations

import functools

import numpy as np
import pytest

pytest.importorskip("diffusers", reason="the pipeline extra is not installed")

from h3core.executors.pipeline.attention import AttentionPlan  # noqa: E402
from h3core.executors.pipeline.generate import Control, Generator, Media  # noqa: E402
from h3core.executors.pipeline.model import load_model  # noqa: E402
from tests.unit.executors.distributed.cache_case import LEVELS, REQUEST, cache_case  # noqa: E402
from tests.unit.executors.distributed.spawned import run_ranks  # noqa: E402


@pytest.mark.slow  # two spawned ranks, each loading the tiny model
def test_two_ranks_take_the_single_device_decisions_at_every_level_in_a_row(tiny_model, tmp_path):
    one = Generator(load_model(tiny_model), AttentionPlan("flash", "flash", "cpu"), cache_size=4)
    expected = {}
    for level in dict.fromkeys(LEVELS):
        out = one.run(REQUEST.model_copy(update={"quality": level}), Media(), Control(keep_raw=True))
        expected[level] = (out.cache, out.raw, out.audio)
    assert expected["fast"][0].cached > 0 and expected["balanced"][0].cached > 0, "the case must skip steps"
    target = functools.partial(cache_case, str(tiny_model), LEVELS)
    got = run_ranks(target, tmp_path / "store", timeout_s=600)  # a bound on a loaded machine, not a measure
    (rank0, jobs0), (rank1, jobs1) = got
    assert (rank0, rank1) == (0, 1) and len(jobs0) == len(jobs1) == len(LEVELS)
    for (level, cache0, raw, audio, tokens), (_, cache1, *_rest) in zip(jobs0, jobs1, strict=True):
        counts, want_raw, want_audio = expected[level]
        assert cache0 == cache1 == counts, (level, cache0, cache1, counts)
        assert np.abs(raw - want_raw).max() <= 1e-5, level
        assert np.abs(audio - want_audio).max() <= 1e-5, level
        assert tokens % 2 == 1, "an even sequence: Ulysses' uneven slices are untested"
