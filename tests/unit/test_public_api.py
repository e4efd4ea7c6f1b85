"""The public surface, snapshotted: the names `h3core` and `h3core.testing`'s modules export with
their signatures, and the service's OpenAPI document in both roles, byte for byte.

A change to either fails here until the snapshot is written again on purpose:
`H3_UPDATE_SNAPSHOTS=1 ./scripts/test tests/unit/test_public_api.py -n 0`, and the diff is read in review.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parents[1] / "golden"
UPDATE = os.environ.get("H3_UPDATE_SNAPSHOTS") == "1"
# The modules whose `__all__` is the public surface (h3core.testing's are imported one by one).
MODULES = [
    "h3core",
    "h3core.testing.artifacts",
    "h3core.testing.executor",
    "h3core.testing.factories",
    "h3core.testing.nodes",
    "h3core.testing.store",
    "h3core.testing.uploads",
    "h3core.testing.webhooks",
]


def _signature(obj: object) -> str:
    try:
        text = str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    return re.sub(r" at 0x[0-9a-f]+", "", text)  # a default's repr may carry its address


def _annotation(annotation: object) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return re.sub(r"typing[.]|h3core[.][a-z_.]*[.]", "", str(annotation))


def _members(cls: type) -> list[str]:
    """Every public attribute callers reach, wherever in the class's bases it is defined."""
    fields = getattr(cls, "__pydantic_fields__", None) or {}  # a model's fields are its surface too
    out = [f"    {name}: {_annotation(f.annotation)}" for name, f in fields.items()]
    for name in sorted(dir(cls)):
        if (name.startswith("_") and name != "__init__") or name in fields:
            continue
        member = inspect.getattr_static(cls, name)
        owner = next((k for k in cls.__mro__ if name in vars(k)), object)
        if owner.__module__.split(".")[0] != "h3core" and name != "__init__":
            continue  # pydantic's, Protocol's, Exception's: theirs, not h3core's surface
        if isinstance(member, property):
            out.append(f"    .{name}: property")
        elif isinstance(member, staticmethod | classmethod):
            out.append(f"    .{name}{_signature(member.__func__)}")
        elif inspect.isfunction(member):
            out.append(f"    .{name}{_signature(member)}")
    return out


def _kinds(cls: type) -> str:
    """What the class is to a caller: the well-known bases it has (not its private ones)."""
    known = ("BaseModel", "Protocol", "Exception", "ValueError", "RuntimeError", "KeyError", "LookupError")
    return ", ".join(k.__name__ for k in cls.__mro__[1:] if k.__name__ in known) or "object"


def surface() -> str:
    lines = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in sorted(module.__all__):
            obj = getattr(module, name)
            if inspect.isclass(obj):
                lines.append(f"{module_name}.{name}: class({_kinds(obj)})")
                lines += _members(obj)
            elif callable(obj):
                lines.append(f"{module_name}.{name}{_signature(obj)}")
            else:
                lines.append(f"{module_name}.{name}: {type(obj).__name__}")
    return "\n".join(lines) + "\n"


def _check(path: Path, now: bytes) -> None:
    if UPDATE:
        path.write_bytes(now)
    assert path.exists(), f"no snapshot {path.name}: write it with H3_UPDATE_SNAPSHOTS=1"
    assert now == path.read_bytes(), f"{path.name} changed: read the diff, then write it with H3_UPDATE_SNAPSHOTS=1"


def test_the_public_names_and_their_signatures_are_the_snapshot():
    _check(GOLDEN / "public_api.txt", surface().encode())


@pytest.mark.parametrize("role", ["all", "api"])
def test_the_openapi_document_is_the_snapshot(tmp_path, monkeypatch, role):
    from litestar.testing import TestClient

    from h3core.runtime.settings import Settings
    from h3core.service.app import create_app

    for name in [k for k in os.environ if k.startswith("H3_")]:  # another test's settings (tokens, a config file)
        monkeypatch.delenv(name)
    settings = Settings(db=tmp_path / "h3.db", artifacts=tmp_path / "a", uploads=tmp_path / "u", executor="fake", role=role)
    # Litestar makes the examples of a response without any (/readyz's 503) from a seeded random
    # source shared by every app in the process: as a fresh process first makes them.
    from litestar._openapi.schema_generation.examples import ExampleFactory

    ExampleFactory.seed_random(10)
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8100") as client:
        document = client.get("/schema/openapi.json").content
    _check(GOLDEN / f"openapi-{role}.json", document)
