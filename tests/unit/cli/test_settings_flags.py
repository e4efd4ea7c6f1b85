"""The settings' flags are made from the settings model: each flag's help is its field's description
with the field's default, and a flag given wins over its variable, which wins over the TOML file."""

from __future__ import annotations

import os
from typing import Any

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from h3core.cli.flags import flag_help, settings_flags
from h3core.runtime.settings import Settings

FIELDS = Settings.model_fields


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("port", "Port \\[8100]."),
        ("stall_timeout", "Seconds without progress before a job is stalled \\[600]."),  # 600.0 as it is typed
        ("retry_on", "Retry policy: failure kinds retried \\[executor_lost,interrupted]."),  # a list as the flag takes it
        ("db", "The store: a SQLite file or a postgresql:// URL \\[h3core.db]."),
        ("metrics_port", "Serve /metrics on this port instead of the API's \\[unset]."),  # None: the description says
        ("comfyui_url", "ComfyUI server (comfyui executor)."),
    ],
)
def test_a_flags_help_is_its_description_with_the_default(name, shown):
    assert flag_help(FIELDS[name]) == shown


def test_a_command_may_say_more_than_the_description_and_keeps_the_default():
    assert flag_help(FIELDS["executor"], "pipeline, comfyui or fake, as `serve` runs it.") == (
        "pipeline, comfyui or fake, as `serve` runs it \\[pipeline]."
    )


def _app(seen: list[Settings]) -> typer.Typer:
    app = typer.Typer(add_completion=False)

    @app.command()
    @settings_flags("slots", "executor", "fake_step_seconds")
    def run(given: dict[str, Any], verbose: bool = False) -> None:
        seen.append(Settings(**given))

    return app


def test_a_flag_wins_over_its_variable_which_wins_over_the_file(tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("H3_")] + ["H3_CONFIG"]:
        monkeypatch.delenv(name, raising=False)  # restored after, H3_CONFIG too (--config sets it)
    monkeypatch.setenv("H3_EXECUTOR", "fake")
    config = tmp_path / "h3.toml"
    config.write_text('slots = 3\nexecutor = "comfyui"\nfake_step_seconds = 0.01\n')
    seen: list[Settings] = []
    result = CliRunner().invoke(_app(seen), ["--slots", "7", "--config", str(config)])
    assert result.exit_code == 0, result.output
    [settings] = seen
    assert (settings.slots, settings.executor, settings.fake_step_seconds, settings.device) == (7, "fake", 0.01, "cpu")


def test_the_flags_follow_the_commands_own_parameters():
    command = typer.main.get_command(_app([]))
    assert [p.name for p in command.params] == ["verbose", "slots", "executor", "fake_step_seconds", "config"]
    assert [p.envvar for p in command.params][1:] == ["H3_SLOTS", "H3_EXECUTOR", "H3_FAKE_STEP_SECONDS", "H3_CONFIG"]
