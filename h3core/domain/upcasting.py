"""Upcasters: how a body written at an older schema version becomes the current one.

Each upcaster takes a body (a JSON object, as stored) at one version of one type and returns it at
the next version; reading applies them in order until the body is at the version this code
defines (the default of each body's `v`). They are pure functions over plain data and are never edited once
released: a log written by any earlier version of h3core must keep reading the same way.

A body at a version newer than this code's is refused (`NewerBody`): it was written by a newer
h3core, and guessing at it would rewrite history. See docs/events.md for the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

# (type as stored, version) -> the function taking that body to version + 1.
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


class NewerBody(ValueError):
    """A body written by a newer h3core than this one."""


def upcaster(type_: str, version: int) -> Callable[[Upcaster], Upcaster]:
    """Register `fn` as taking a `type_` body from `version` to `version + 1`."""

    def register(fn: Upcaster) -> Upcaster:
        if (type_, version) in UPCASTERS:
            raise ValueError(f"an upcaster for {type_} version {version} exists already")
        UPCASTERS[(type_, version)] = fn
        return fn

    return register


def unchanged(body: dict[str, Any]) -> dict[str, Any]:
    """The step for a version that only added a field with a default: the old body reads as is."""
    return body


def upcast(body: Mapping[str, Any], current: Mapping[str, int]) -> dict[str, Any]:
    """`body` at the version `current` names for its type (`current`: type -> version)."""
    out = dict(body)
    version = int(out.pop("v", 1))
    while True:
        kind = str(out.get("type"))
        target = current.get(kind)
        if target is not None and version == target:
            return {**out, "v": version}
        if target is not None and version > target:
            raise NewerBody(f"a {kind!r} body of version {version}: this h3core reads up to version {target}; upgrade h3core")
        step = UPCASTERS.get((kind, version))
        if step is None:
            raise ValueError(f"no upcaster takes {kind!r} bodies from version {version}")
        out = dict(step(out))
        version += 1


# The upcasters of h3core's own bodies, oldest first.

# 2: `done` gained `cancel_too_late` (False before: a log of then says nothing of a late cancel).
upcaster("done", 1)(unchanged)
# 2: the failure kind `not_started`; older logs hold none.
upcaster("attempt_failed", 1)(unchanged)
upcaster("failed", 1)(unchanged)
# 2: `submitted` gained `webhook` (None before: no job of then had one).
upcaster("submitted", 1)(unchanged)
# 3: `submitted` gained `retry_of` and `by`, and its request `quality` ("exact" before: every step
# computed); `cancel_requested` and `cancelled` gained `by` (None before: no one named).
upcaster("submitted", 2)(unchanged)
upcaster("cancel_requested", 1)(unchanged)
upcaster("cancelled", 1)(unchanged)
# 3: `done` gained `steps` (None before: nothing counted).
upcaster("done", 2)(unchanged)
