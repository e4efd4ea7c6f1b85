"""Capacity profiles on disk: TOML files an operator edits; the measured ones ship built in.

Each built-in profile names the executors it describes (`match`); the service applies the first
that describes an executor's hardware, kernel and group size, and none where nothing matches
(no memory budget is invented for hardware nobody measured)."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from h3core.domain.capacity import CapacityProfile

DEFAULT_PROFILE = "4x2080ti-sage-fp16"


class ProfileError(ValueError):
    """A profile file that cannot be used, with the file and field named."""


def builtin_profiles() -> list[CapacityProfile]:
    """Every profile shipped with h3core, by name."""
    folder = resources.files("h3core.profiles")
    names = sorted(e.name.removesuffix(".toml") for e in folder.iterdir() if e.name.endswith(".toml"))
    return [load_profile(name=n) for n in names]


def load_profile(path: str | Path | None = None, *, name: str = DEFAULT_PROFILE) -> CapacityProfile:
    """The profile at `path`, or the built-in one called `name` when `path` is None."""
    if path is None:
        try:
            text = resources.files("h3core.profiles").joinpath(f"{name}.toml").read_text()
        except FileNotFoundError as exc:
            raise ProfileError(f"no built-in capacity profile {name!r}") from exc
        where = f"built-in profile {name}"
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


def dump_profile(profile: CapacityProfile, *, header: str = "") -> str:
    """The profile as the TOML `load_profile` reads back (defaults left out), under `header` as comments."""
    import tomli_w

    data = profile.model_dump(mode="json", exclude_defaults=True, exclude_none=True)
    comments = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return comments + ("\n" if comments else "") + tomli_w.dumps(data)


def load_profile_ref(ref: str | Path) -> CapacityProfile:
    """A profile named by an operator: a TOML file's path, or a built-in profile's name."""
    text = str(ref)
    if Path(text).exists() or text.endswith(".toml") or "/" in text:
        return load_profile(text)
    return load_profile(name=text)
