"""Loading a model folder: what is missing is named; the tiny model loads the way weights do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("diffusers")

from h3core.executors.pipeline.model import FACTS_FILE, ModelError, ModelFacts, load_model  # noqa: E402
from h3core.executors.pipeline.tiny import make_tiny  # noqa: E402


def test_a_missing_folder_or_component_is_named(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load_model(tmp_path / "nope")
    (tmp_path / "transformer").mkdir()
    with pytest.raises(ModelError, match="lacks vae, audio_vae, scheduler, audio_scheduler, text_encoder, tokenizer, processor"):
        load_model(tmp_path)


def test_a_broken_component_is_named(tiny_model, tmp_path):
    root = Path(shutil.copytree(tiny_model, tmp_path / "m"))
    (root / "vae" / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="cannot load vae from"):
        load_model(root)


def test_the_tiny_model_loads_from_local_files_with_its_facts(tiny_model):
    root = tiny_model
    model = load_model(root)
    assert model.facts == ModelFacts(name="minimax-h3-tiny", min_seconds=0.0, max_seconds=15.0)
    assert model.has("transformer_ref") and set(model.load_seconds) >= {"transformer", "text_encoder", "vae"}
    assert model.components["text_encoder"].config.text_config.num_hidden_layers == 51


def test_facts_default_to_the_released_models_window_and_bad_facts_are_named(tmp_path):
    assert ModelFacts.read(tmp_path) == ModelFacts(name="minimax-h3", min_seconds=5.0, max_seconds=15.0)
    (tmp_path / FACTS_FILE).write_text(json.dumps({"min_seconds": 1, "colour": "red"}))
    with pytest.raises(ModelError, match="colour"):
        ModelFacts.read(tmp_path)


def test_make_tiny_refuses_a_folder_with_something_in_it(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        make_tiny(tmp_path)


def test_the_text_encoder_and_vaes_can_be_placed_and_each_stage_runs_where_its_part_is(tiny_model):
    import torch

    from h3core.executors.pipeline.attention import AttentionPlan
    from h3core.executors.pipeline.generate import STAGE_PART, Generator

    root = tiny_model
    with pytest.raises(ModelError, match="placement: only text_encoder, vae can be placed apart, not transformer"):
        load_model(root, placement={"transformer": "cpu"})
    model = load_model(root, placement={"text_encoder": "cpu", "vae": "cpu"})
    assert model.placement == {}  # the same device as the transformer is no placement at all
    model.placement = {"text_encoder": torch.device("meta")}  # a second device, as a GPU box has one
    generator = Generator(model, AttentionPlan("flash", "flash", "cpu"))
    assert generator.stages["text_encoder"]._execution_device == torch.device("meta")
    for stage in ("before_encode", "vae_encoder", "denoise", "decode"):
        assert generator.stages[stage]._execution_device == torch.device("cpu"), stage
    assert set(STAGE_PART.values()) == {"transformer", "text_encoder", "vae"}


def test_diffusers_is_given_the_frame_count_the_model_makes(tiny_model):
    """diffusers' ref2va blocks snap the count for the encoder but not for the denoiser, which then
    refused every ref2va job whose length was not 17n + 5 (found by the admission contract test)."""
    from h3core.domain.request import GenerationRequest
    from h3core.executors.pipeline.attention import Target, plan_for
    from h3core.executors.pipeline.generate import Generator, Media

    generator = Generator(load_model(tiny_model), plan_for("flash", Target.detect("cpu", "float32", 2, 32)))
    for frames, snapped in ((1, 5), (6, 22), (22, 22), (48, 56)):
        request = GenerationRequest(mode="t2va", prompt="p", width=32, height=32, frames=frames)
        assert generator._inputs(request, Media())["num_frames"] == snapped
