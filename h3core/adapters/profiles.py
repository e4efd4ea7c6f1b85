"""Capacity profiles on disk: TOML files an operator edits; one ships as the default."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from h3core.domain.capacity import CapacityProfile

DEFAULT_PROFILE = "4x2080ti-sage-fp16"


class ProfileError(ValueError):
    """A profile file that cannot be used, with the file and field named."""


def load_profile(path: str | Path | None = None) -> CapacityProfile:
    """The profile at `path`, or the built-in default when `path` is None."""
    if path is None:
        text = resources.files("h3core.profiles").joinpath(f"{DEFAULT_PROFILE}.toml").read_text()
        where = f"built-in profile {DEFAULT_PROFILE}"
    else:
        where = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ProfileError(f"cannot read capacity profile {where}: {exc}") from exc
    try:
        return CapacityProfile.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{where}: not valid TOML: {exc}") from exc
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ProfileError(f"{where}: {fields}") from exc
