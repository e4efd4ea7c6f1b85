"""Where a setting comes from: what the command line gives, then `H3_*` variables, then the TOML
file H3_CONFIG names, then the default; a named file that cannot be used stops the process, naming it."""

from __future__ import annotations

import os

import pytest

from h3core.runtime.settings import Settings, SettingsError


@pytest.fixture
def config(tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("H3_")]:
        monkeypatch.delenv(name)
    path = tmp_path / "h3.toml"
    monkeypatch.setenv("H3_CONFIG", str(path))
    return path


def test_given_wins_over_the_environment_which_wins_over_the_file(config, monkeypatch):
    config.write_text('slots = 3\nfake_step_seconds = 0.01\nretry_on = ["oom"]\ngroup_budgets = {1 = 5}\n')
    assert (Settings().slots, Settings().fake_step_seconds, Settings().retry_on, Settings().group_budgets) == (
        3,
        0.01,
        ["oom"],
        {1: 5},
    )
    monkeypatch.setenv("H3_SLOTS", "5")
    assert (Settings().slots, Settings(slots=7).slots, Settings().fake_step_seconds) == (5, 7, 0.01)
    monkeypatch.setenv("H3_CONFIG", "")
    assert Settings().fake_step_seconds == Settings.model_fields["fake_step_seconds"].default


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (None, "No such file or directory"),  # a file named is a file read: none there is an error
        ("slots = \n", "Invalid value (at line 1, column 9)"),
        ("slots = 3\nbogus = 1\nSLOTS = 2\n", "unknown setting(s) ['SLOTS', 'bogus']"),  # names as they are spelt
    ],
)
def test_a_file_that_cannot_be_used_is_named_with_why(config, text, error):
    if text is not None:
        config.write_text(text)
    with pytest.raises(SettingsError) as raised:
        Settings()
    assert str(raised.value).startswith(f"H3_CONFIG={config}: ") and error in str(raised.value)


def test_a_folder_is_not_a_settings_file(config):
    config.mkdir()
    with pytest.raises(SettingsError, match="Is a directory"):
        Settings()


def test_artifacts_are_a_folder_or_an_s3_url_and_anything_else_is_refused_by_name(config, monkeypatch):
    from pathlib import Path

    from pydantic import ValidationError

    config.write_text("")
    assert Settings().artifacts == Path("artifacts")
    monkeypatch.setenv("H3_ARTIFACTS", "s3://videos/h3/prod")
    assert Settings().artifacts == "s3://videos/h3/prod"
    monkeypatch.setenv("H3_ARTIFACTS", "/srv/h3/artifacts")
    assert Settings().artifacts == Path("/srv/h3/artifacts")
    for bad in ("s3://", "s3:/videos", "https://bucket.example/x", "s3://videos/x?versionId=1"):
        monkeypatch.setenv("H3_ARTIFACTS", bad)
        with pytest.raises(ValidationError, match="artifacts"):
            Settings()
