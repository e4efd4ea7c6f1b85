"""Every setting has a `serve` flag and the H3_* variable of its name, as the README says; the
secrets (the tokens, the webhook secret) come from the environment only (a flag would show them in `ps`)."""

from __future__ import annotations

import typer.main

from h3core.cli.app import app
from h3core.runtime.settings import Settings


def _serve_options() -> dict[str, list[str]]:
    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    return {p.name: p.envvar if isinstance(p.envvar, list) else [p.envvar] for p in command.params}


SECRETS = {"api_tokens", "webhook_secret"}


def test_every_setting_but_the_secrets_has_a_serve_flag_and_its_variable():
    options = _serve_options()
    settings = set(Settings.model_fields)
    assert settings - set(options) == SECRETS, "settings without a flag"
    for name in settings - SECRETS:
        assert options[name] == [f"H3_{name.upper()}"], name
