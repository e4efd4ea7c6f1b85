"""`h3core worker` builds the executor its settings name, as `serve` does; the fake only when asked."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from h3core.cli import app
from h3core.runtime import node
from h3core.runtime.settings import Settings, SettingsError


def invoke(*args: object, env: dict[str, str] | None = None):
    clean: dict[str, str | None] = {k: None for k in os.environ if k.startswith("H3_")}
    return CliRunner().invoke(app, [str(a) for a in args], env={**clean, "H3_CONFIG": None, **(env or {})})


@pytest.fixture
def built(monkeypatch) -> list[Settings]:
    """make_executor, recording the settings it was given and stopping the worker there (exit 2)."""
    seen: list[Settings] = []

    def make(settings, artifacts, uploads):
        seen.append(settings)
        raise SettingsError(f"stopped by the test at executor {settings.executor}")

    monkeypatch.setattr(node, "make_executor", make)  # the composition root the worker builds with
    return seen


@pytest.mark.parametrize(
    ("args", "env", "config", "expected"),
    [
        ((), {}, None, Settings.model_fields["executor"].default),  # serve's default, not the fake
        ((), {"H3_EXECUTOR": "comfyui"}, None, "comfyui"),
        ((), {}, 'executor = "comfyui"\ncomfyui_url = "http://127.0.0.1:9"\n', "comfyui"),
        (("--executor", "fake"), {"H3_EXECUTOR": "comfyui"}, None, "fake"),
    ],
)
def test_the_worker_builds_the_executor_its_settings_name(tmp_path, built, args, env, config, expected):
    if config is not None:
        (tmp_path / "h3.toml").write_text(config)
        args = (*args, "--config", tmp_path / "h3.toml")
    result = invoke("worker", "--db", tmp_path / "h3.db", "--artifacts", tmp_path / "art", *args, env=env)
    assert result.exit_code == 2, result.output
    assert f"stopped by the test at executor {expected}" in result.stderr
    assert [s.executor for s in built] == [expected]
    assert expected != "fake" or args  # the fake only when asked


def test_the_configured_executor_is_really_built_and_its_problems_stop_the_worker(tmp_path):
    """No monkeypatch: H3_EXECUTOR=comfyui without its URL is refused as `serve` refuses it."""
    result = invoke("worker", "--db", tmp_path / "h3.db", "--artifacts", tmp_path / "art", env={"H3_EXECUTOR": "comfyui"})
    assert result.exit_code == 2
    assert "executor 'comfyui' needs H3_COMFYUI_URL" in result.stderr
    assert "Traceback" not in result.output


def test_a_bad_setting_is_named(tmp_path):
    result = invoke("worker", "--db", tmp_path / "h3.db", "--executor", "gpu")
    assert result.exit_code == 2 and "invalid setting: executor" in result.stderr
