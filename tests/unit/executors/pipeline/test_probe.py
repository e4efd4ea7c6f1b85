"""The capacity probe's measurements: random weights as `from_pretrained` lays them out, and the
packed sequence a real job of the same shape has."""

from __future__ import annotations

import pytest

pytest.importorskip("diffusers")

import torch  # noqa: E402

from h3core.domain.geometry import count_tokens  # noqa: E402
from h3core.domain.probe import Measurement  # noqa: E402
from h3core.domain.request import GenerationRequest  # noqa: E402
from h3core.executors.pipeline.probe import Bench, ProbeSpec, _serve, random_model, search  # noqa: E402


@pytest.fixture
def tiny(tiny_model):
    return tiny_model


def layout(model) -> dict[str, tuple]:
    return {n: (tuple(t.shape), t.dtype) for n, t in [*model.named_parameters(), *model.named_buffers()]}


def test_random_weights_have_the_shapes_and_dtypes_from_pretrained_gives(tiny):
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel

    dtypes = {}
    for part, cls in (
        ("transformer", MiniMaxH3Transformer3DModel),
        ("vae", AutoencoderKLMiniMaxH3),
        ("audio_vae", AutoencoderKLMiniMaxH3Audio),
    ):
        loaded = cls.from_pretrained(tiny / part, local_files_only=True, torch_dtype=torch.bfloat16)
        built = random_model(cls, dict(cls.load_config(tiny / part)), device="cpu", dtype=torch.bfloat16)
        assert layout(built) == layout(loaded), part
        assert all(not p.is_meta and not p.requires_grad for p in built.parameters())
        dtypes[part] = {d for _, d in layout(built).values()}
    # Not a plain cast: the modules diffusers keeps in float32 stay so (the whole audio VAE does).
    assert dtypes == {
        "transformer": {torch.bfloat16, torch.float32},
        "vae": {torch.bfloat16, torch.float32},
        "audio_vae": {torch.float32},
    }


def test_a_probe_point_has_the_sequence_of_a_real_job_of_that_shape(tiny):
    from h3core.executors.pipeline.attention import Target
    from h3core.executors.pipeline.generate import Control, Generator, Media
    from h3core.executors.pipeline.kernel_probe import decide
    from h3core.executors.pipeline.model import load_model

    request = GenerationRequest(prompt="a red fox running through snow", width=64, height=64, frames=22, steps=1)
    plan = decide("auto", Target.detect("cpu", "float32", 2, 32)).plan  # the tiny geometry's heads
    real = Generator(load_model(tiny), plan)
    real.run(request, Media(), Control(decode=False))  # the sequence is known once it has denoised
    text_rows = real.last_tokens - count_tokens(request).total
    assert text_rows > 0

    bench = Bench(ProbeSpec(model_dir=str(tiny), text_tokens=text_rows))
    point = bench.measure(64, 64, 22)
    assert point.outcome == "ran" and point.sequence == real.last_tokens
    assert point.step_seconds > 0 and point.decode_seconds > 0 and point.step_peak_bytes > 0 and point.decode_peak_bytes > 0
    assert bench.identity.model == "minimax-h3-tiny" and bench.identity.kernel == plan.kernel


def test_a_memory_cap_below_the_built_model_is_refused_naming_both():
    replies = []
    _serve(ProbeSpec(geometry="tiny", memory_cap_gib=0.01), iter(()), replies.append)
    assert len(replies) == 1 and "memory cap 0.01 GiB is below what the built model already takes" in replies[0]["error"]


def test_search_measures_each_canvas_until_its_boundary():
    fits = {(1344, 768): 243, (832, 480): 600}
    asked = []

    def measure(width, height, frames):
        asked.append((width, height, frames))
        return Measurement(width=width, height=height, frames=frames, outcome="ran" if frames <= fits[(width, height)] else "oom")

    points = search(measure, fits, max_frames=1200, start=124)
    assert [(m.width, m.height, m.frames) for m in points] == asked
    for canvas, boundary in fits.items():
        mine = [m for m in points if (m.width, m.height) == canvas]
        assert max(m.frames for m in mine if m.outcome == "ran") == boundary
        assert min(m.frames for m in mine if m.outcome == "oom") == boundary + 17
