"""The ComfyUI executor as the service's settings build it: templates named per mode, the
concurrency that bounds the runner, what a stop does, and every bad value refused naming it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from h3core.adapters.artifacts import LocalArtifactStore
from h3core.adapters.uploads import LocalUploadStore
from h3core.runtime.executor_factory import make_executor
from h3core.runtime.runner import Runner
from h3core.runtime.settings import Settings, SettingsError


def build(tmp_path, **kw):
    settings = Settings(executor="comfyui", comfyui_url="http://127.0.0.1:9", db=tmp_path / "h3.db", **kw)
    return settings, make_executor(settings, LocalArtifactStore(tmp_path / "a"), LocalUploadStore(tmp_path / "u"))


def test_a_template_named_for_a_mode_serves_it_and_the_other_modes_keep_their_built_ins(tmp_path):
    settings, executor = build(
        tmp_path,
        comfyui_template="t2va=core-nodes-t2va",
        comfyui_concurrency=2,
        comfyui_on_stop="interrupt",
        comfyui_stop_wait=120,
    )
    assert settings.comfyui_template == {"t2va": "core-nodes-t2va"}
    assert executor._pick("t2va").name == "core-nodes-t2va" and executor._pick("fl2va").name == "minimax-h3-fl2va-single-gpu"
    assert executor.settings.on_stop == "interrupt" and executor.capabilities().concurrency == 2
    # A stopped prompt is followed that long, and the runner told so: it waits for the prompt's end.
    assert executor.settings.stop_wait_s == 120 and executor.capabilities().stop_wait_s == 120


def test_the_template_setting_comes_from_the_environment_too(tmp_path, monkeypatch):
    monkeypatch.setenv("H3_COMFYUI_TEMPLATE", "t2va=core-nodes-t2va, fl2va=minimax-h3-fl2va-single-gpu")
    assert Settings().comfyui_template == {"t2va": "core-nodes-t2va", "fl2va": "minimax-h3-fl2va-single-gpu"}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("t2v=core-nodes-t2va", "unknown mode(s) ['t2v']"),
        ("core-nodes-t2va", "is not mode=template"),
        ("t2va=", "is not mode=template"),
    ],
)
def test_a_malformed_template_setting_is_refused_naming_it(value, message):
    with pytest.raises(ValidationError) as err:
        Settings(comfyui_template=value)
    assert err.value.errors()[0]["loc"] == ("comfyui_template",) and message in str(err.value)


def test_a_named_template_that_is_not_there_or_serves_another_mode_stops_the_start(tmp_path):
    with pytest.raises(SettingsError, match="comfyui_template: no template named 'house-t2va' for mode 't2va'"):
        build(tmp_path, comfyui_template="t2va=house-t2va")
    with pytest.raises(SettingsError, match="'core-nodes-t2va' is a t2va template, not ref2va"):
        build(tmp_path, comfyui_template="ref2va=core-nodes-t2va")


def test_an_added_file_is_used_once_named(tmp_path):
    import json

    from h3core.executors.comfyui.templates import builtin_templates

    data = json.loads(builtin_templates()["core-nodes-t2va"].model_dump_json())
    data["name"] = "house-t2va"
    folder = tmp_path / "templates"
    folder.mkdir()
    (folder / "house.json").write_text(json.dumps(data))
    _, unnamed = build(tmp_path, comfyui_templates=folder)
    _, named = build(tmp_path, comfyui_templates=folder, comfyui_template="t2va=house-t2va")
    assert unnamed._pick("t2va").name == "minimax-h3-t2va-single-gpu" and named._pick("t2va").name == "house-t2va"


def test_comfyuis_concurrency_bounds_the_runners_slots(tmp_path):
    settings, executor = build(tmp_path, slots=4)
    assert settings.runner_config().slots == 4 and settings.comfyui_concurrency == 1
    assert Runner(None, executor, settings.runner_config()).slot_count() == 1  # type: ignore[arg-type]
    settings, executor = build(tmp_path, slots=2, comfyui_concurrency=3)
    assert Runner(None, executor, settings.runner_config()).slot_count() == 2  # type: ignore[arg-type]
