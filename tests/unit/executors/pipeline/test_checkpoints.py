"""Denoising checkpoints of the real pipeline (tiny random model, CPU): a job continued from a
checkpoint makes exactly the video of an uninterrupted run, and a checkpoint of another request
is refused."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("diffusers")

from h3core.domain.checkpoints import CheckpointPolicy  # noqa: E402
from h3core.domain.request import GenerationRequest  # noqa: E402
from h3core.executors.base import ExecutorFailure  # noqa: E402
from h3core.executors.pipeline.attention import Target, plan_for  # noqa: E402
from h3core.executors.pipeline.generate import (  # noqa: E402
    Control,
    Generator,
    Media,
    StopRequested,
    load_checkpoint,
    save_checkpoint,
)
from h3core.executors.pipeline.model import load_model  # noqa: E402


@pytest.fixture(scope="module")
def generator(tiny_model) -> Generator:
    return Generator(load_model(tiny_model), plan_for("flash", Target.detect("cpu", "float32", 2, 32)), cache_size=0)


REQUEST = GenerationRequest(mode="t2va", prompt="a fox in snow", width=64, height=32, frames=22, steps=6, seed=11)


def run(generator: Generator, request: GenerationRequest, **control) -> tuple[object, list[dict], list[int]]:
    saved: list[dict] = []
    steps: list[int] = []
    c = Control(on_step=lambda step, total: steps.append(step), on_checkpoint=saved.append, **control)
    out = generator.run(request, Media(), c)
    return out, saved, steps


def test_a_job_continued_from_any_checkpoint_makes_the_uninterrupted_video(generator):
    whole, saved, steps = run(generator, REQUEST, checkpoints=CheckpointPolicy(every_steps=2))
    assert steps == [1, 2, 3, 4, 5, 6]
    assert [s["step"] for s in saved] == [2, 4], "every 2 steps, never after the last"
    for held in saved:
        again, more, resumed_steps = run(generator, REQUEST, resume=load_checkpoint(save_checkpoint(held)))
        assert resumed_steps == list(range(held["step"] + 1, 7)), "the steps the checkpoint holds are not computed again"
        assert np.array_equal(again.frames, whole.frames), f"continued from step {held['step']}: other frames"
        assert np.array_equal(again.audio, whole.audio)
        assert more == []


def test_a_continued_job_differs_if_the_state_put_back_is_not_the_one_saved(generator):
    """The comparison above can fail: a checkpoint whose latents were disturbed gives other frames."""
    whole, saved, _ = run(generator, REQUEST, checkpoints=CheckpointPolicy(every_steps=3))
    held = load_checkpoint(save_checkpoint(saved[0]))
    held["latents"] = held["latents"] + 0.5
    other, _, _ = run(generator, REQUEST, resume=held)
    assert not np.array_equal(other.frames, whole.frames)


def test_a_stop_hands_over_a_checkpoint_of_the_last_step_reached(generator):
    c = Control(save_on_stop=True, checkpoints=CheckpointPolicy())
    saved: list[dict] = []
    c.on_checkpoint = saved.append

    def stop_at_three(step: int, total: int) -> None:
        if step == 3:
            c.stop.set()

    c.on_step = stop_at_three
    with pytest.raises(StopRequested):
        generator.run(REQUEST, Media(), c)
    assert [s["step"] for s in saved] == [3]
    whole, _, _ = run(generator, REQUEST)
    again, _, steps = run(generator, REQUEST, resume=saved[0])
    assert steps == [4, 5, 6] and np.array_equal(again.frames, whole.frames)


def test_a_checkpoint_of_another_request_or_format_is_refused(generator):
    _, saved, _ = run(generator, REQUEST, checkpoints=CheckpointPolicy(every_steps=3))
    with pytest.raises(ExecutorFailure, match="not of this request"):
        run(generator, REQUEST.model_copy(update={"seed": 12}), resume=saved[0])
    held = dict(saved[0], fingerprint={**saved[0]["fingerprint"], "format": 0})
    with pytest.raises(ExecutorFailure, match="not one this version reads"):
        load_checkpoint(save_checkpoint(held))


def test_the_decode_stage_says_it_is_alive_while_it_runs_not_only_as_it_starts(generator):
    """A long clip's decode has no steps and may outlast the stall timeout on a slow box: each
    forward of a VAE's module is a sign of life (here unthrottled, to count them)."""
    stages: list[str] = []
    run(generator, REQUEST, on_stage=stages.append, alive_every_s=0.0)
    assert stages.index("denoise") < stages.index("decode") and stages.count("decode") > 10
    quiet: list[str] = []
    run(generator, REQUEST, on_stage=quiet.append)  # throttled: at most one a second
    assert quiet.count("decode") < stages.count("decode")


def test_encoding_a_video_says_it_is_alive_each_second_of_video(tmp_path):
    from h3core.adapters.video import write_mp4

    beats: list[int] = []
    write_mp4(tmp_path / "v.mp4", np.zeros((50, 16, 16, 3), np.uint8), fps=24, preset="ultrafast", alive=lambda: beats.append(1))
    assert len(beats) == 2, "after frames 24 and 48"
