"""Every placement of the model's parts runs a job, on simulated GPUs (tests/fakes/devices.py).

On a CPU the hand-off between stages cannot go wrong for real: every tensor is on the one
device. The simulator gives each part its own device and checks every torch call the way CUDA
does, so a tensor left on (or moved to) the wrong device fails here as it fails on a GPU
("Expected all tensors to be on the same device"): the host bookkeeping `text_token_tags`
moved to the transformer's GPU, or the text encoder's output left on the host.
"""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from h3core.domain.request import GenerationRequest  # noqa: E402
from h3core.executors.pipeline.attention import AttentionPlan  # noqa: E402
from h3core.executors.pipeline.generate import MODEL_INPUTS, Control, Generator, Media, hand_off  # noqa: E402
from h3core.executors.pipeline.model import load_model  # noqa: E402
from tests.factories import png  # noqa: E402
from tests.fakes.devices import DeviceMismatch, SimulatedDevices, place_model  # noqa: E402

PLACEMENTS = {
    "all on one GPU": {"transformer": "cuda:0", "text_encoder": "cuda:0", "vae": "cuda:0"},
    "text encoder on the host": {"transformer": "cuda:0", "text_encoder": "cpu", "vae": "cuda:0"},
    "text encoder and VAEs on the host": {"transformer": "cuda:0", "text_encoder": "cpu", "vae": "cpu"},
    "two GPUs": {"transformer": "cuda:0", "text_encoder": "cuda:1", "vae": "cuda:1"},
    "three devices": {"transformer": "cuda:0", "text_encoder": "cpu", "vae": "cuda:1"},
}


@pytest.fixture(scope="module")
def model(tiny_model):
    return load_model(tiny_model)


def placed(model, placement: dict[str, str]) -> tuple[Generator, SimulatedDevices]:
    """The loaded model's parts put on simulated devices, and a generator over them."""
    sim = place_model(model, placement)
    generator = Generator(model, AttentionPlan("flash", "flash", "cpu"))
    # A reference image is encoded at a 2048-pixel short edge, a minute of the tiny VAE on a CPU; the
    # hand-off is the same at 64.
    generator.stages["before_encode"].register_to_config(reference_image_short_edge=64)
    return generator, sim


def job(**kw) -> GenerationRequest:
    return GenerationRequest(**{"prompt": "a red fox", "width": 64, "height": 64, "frames": 22, "steps": 2, "seed": 3, **kw})


def wav(path, seconds: float = 1.0, rate: int = 32000):
    """A stereo tone at the audio VAE's own rate (resampling would need torchaudio)."""
    t = np.arange(int(seconds * rate)) / rate
    samples = np.repeat((np.sin(2 * np.pi * 440 * t) * 12000).astype("<i2"), 2)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    path.write_bytes(buf.getvalue())
    return path


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    (folder / "first.png").write_bytes(png(96, 64))
    (folder / "last.png").write_bytes(png(64, 64))
    return {
        "t2va": (job(), Media()),
        "fl2va": (
            job(mode="fl2va", keyframes={"first": "u1", "last": "u2"}),
            Media(first=folder / "first.png", last=folder / "last.png"),
        ),
        "ref2va": (
            job(mode="ref2va", references={"images": ["u1"], "audios": ["u3"]}),
            Media(images=(folder / "first.png",), audios=(wav(folder / "voice.wav"),)),
        ),
    }


def run(generator: Generator, sim: SimulatedDevices, request: GenerationRequest, media: Media):
    with sim:
        out = generator.run(request, media, Control(keep_raw=True))
    assert out.frames.shape == (22, 64, 64, 3) and np.isfinite(out.raw).all() and np.isfinite(out.audio).all()
    return out


@pytest.fixture(scope="module")
def on_the_cpu(model, media):
    return run(*placed(model, {"transformer": "cpu", "text_encoder": "cpu", "vae": "cpu"}), *media["t2va"])


@pytest.mark.parametrize("where", PLACEMENTS)
def test_a_text_job_runs_on_every_placement_and_equals_the_cpu_video(model, media, on_the_cpu, where):
    generator, sim = placed(model, PLACEMENTS[where])
    out = run(generator, sim, *media["t2va"])
    assert sim.checked > 1000  # the whole job ran under the simulator, not around it
    assert np.array_equal(out.frames, on_the_cpu.frames)  # placement moves tensors, it does not change numbers


def test_cached_embeddings_take_the_same_route_from_the_host(model, media, on_the_cpu):
    generator, sim = placed(model, PLACEMENTS["text encoder on the host"])
    run(generator, sim, *media["t2va"])
    again = run(generator, sim, *media["t2va"])
    assert not again.encoded and np.array_equal(again.frames, on_the_cpu.frames)


@pytest.mark.parametrize("mode", ["fl2va", "ref2va"])
def test_keyframe_and_reference_jobs_run_with_every_part_on_its_own_device(model, media, mode):
    run(*placed(model, PLACEMENTS["three devices"]), *media[mode])


def test_moving_every_tensor_to_the_next_stage_fails_as_it_did_on_the_gpu(model, media, monkeypatch):
    """What the simulator is for: the hand-off that moved the whole state (host bookkeeping included)
    and the one that moved nothing both fail here, with the errors a GPU gave them."""
    import h3core.executors.pipeline.generate as generate

    def move_everything(state, stage, device):
        for key, value in list(state.values.items()):
            if isinstance(value, torch.Tensor):
                state.values[key] = value.to(device)

    monkeypatch.setattr(generate, "hand_off", move_everything)
    with pytest.raises(DeviceMismatch, match=r"cpu and cuda:0.*__setitem__"):  # diffusers' build_packed_sequence
        run(*placed(model, PLACEMENTS["all on one GPU"]), *media["t2va"])
    monkeypatch.setattr(generate, "hand_off", lambda state, stage, device: None)
    with pytest.raises(DeviceMismatch, match=r"in linear"):  # the transformer's context embedder
        run(*placed(model, PLACEMENTS["text encoder on the host"]), *media["t2va"])


def test_the_hand_off_moves_only_what_the_next_stage_feeds_its_model():
    from diffusers.modular_pipelines import PipelineState

    sim = SimulatedDevices()
    with sim:
        state = PipelineState()
        state.set("prompt_embeds", torch.ones(1, 3, 4))
        state.set("text_token_tags", torch.ones(3, dtype=torch.long))
        state.set("height", 64)
        hand_off(state, "denoise", torch.device("cuda:0"))
        assert state.get("prompt_embeds").device == torch.device("cuda:0")
        assert state.get("text_token_tags").device == torch.device("cpu") and state.get("height") == 64
        hand_off(state, "vae_encoder", torch.device("cuda:1"))  # feeds its model nothing from the state
        assert state.get("prompt_embeds").device == torch.device("cuda:0")
    assert set(MODEL_INPUTS) <= {"before_encode", "text_encoder", "vae_encoder", "denoise", "decode"}
