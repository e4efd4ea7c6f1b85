"""Upcasting: a body is read at the version it was written at and brought, step by step, to the
version this code defines; never past it, never guessed."""

from __future__ import annotations

import json

import pytest

from h3core.domain import upcasting
from h3core.domain.events import VERSIONS, Admitted, Event, body_from_json, event_from_json
from h3core.domain.upcasting import NewerBody, upcast, upcaster


@pytest.fixture
def registry(monkeypatch):
    """Upcasters registered by a test stay in that test."""
    monkeypatch.setattr(upcasting, "UPCASTERS", dict(upcasting.UPCASTERS))
    return upcasting.UPCASTERS


def test_every_body_is_written_with_its_version():
    for body in (Admitted(), Admitted(tokens=3)):
        assert json.loads(body.model_dump_json())["v"] == VERSIONS["admitted"] == body.v


def test_a_body_without_a_version_is_version_1():
    assert upcast({"type": "admitted", "tokens": 3}, {"admitted": 1}) == {"type": "admitted", "tokens": 3, "v": 1}
    assert body_from_json('{"type": "admitted", "tokens": 3}') == Admitted(tokens=3)


def test_upcasters_apply_in_order_until_the_current_version(registry):
    upcaster("probe", 1)(lambda b: {**{k: v for k, v in b.items() if k != "old"}, "a": b["old"]})
    upcaster("probe", 2)(lambda b: {**b, "b": b["a"] * 2})
    assert upcast({"type": "probe", "old": 4}, {"probe": 3}) == {"type": "probe", "a": 4, "b": 8, "v": 3}
    assert upcast({"type": "probe", "v": 2, "a": 1}, {"probe": 3}) == {"type": "probe", "a": 1, "b": 2, "v": 3}
    assert upcast({"type": "probe", "v": 3, "a": 1, "b": 5}, {"probe": 3})["b"] == 5  # current: untouched


def test_a_missing_step_is_an_error_naming_it(registry):
    upcaster("probe", 1)(lambda b: b)
    with pytest.raises(ValueError, match="no upcaster takes 'probe' bodies from version 2"):
        upcast({"type": "probe"}, {"probe": 3})


def test_one_step_has_one_upcaster(registry):
    upcaster("probe", 1)(lambda b: b)
    with pytest.raises(ValueError, match="exists already"):
        upcaster("probe", 1)(lambda b: b)


def test_a_body_from_a_newer_h3core_is_refused_not_guessed():
    newer = VERSIONS["admitted"] + 1
    with pytest.raises(NewerBody, match=f"version {newer}: this h3core reads up to version {VERSIONS['admitted']}"):
        body_from_json(json.dumps({"v": newer, "type": "admitted", "tokens": 3}))
    line = json.dumps({"job_id": "j", "seq": 2, "at": "2026-12-01T00:00:00Z", "body": {"v": newer, "type": "admitted"}})
    with pytest.raises(NewerBody):
        event_from_json(line)


def test_a_model_refuses_a_stale_version_given_directly():
    """Only the reader upcasts: a body built or validated at another version is an error."""
    with pytest.raises(ValueError, match="upcast it"):
        Admitted(v=VERSIONS["admitted"] + 1)


def test_an_event_reads_the_same_whichever_version_wrote_it(registry, monkeypatch):
    """A bump to version 2 (in the registry only): old lines upcast, the current one reads in one pass."""
    upcaster("admitted", 1)(lambda b: {**b, "tokens": (b.get("tokens") or 0) + 1})
    monkeypatch.setitem(VERSIONS, "admitted", 2)
    monkeypatch.setattr(Admitted.model_fields["v"], "default", 2)
    monkeypatch.setattr(Admitted, "_version", 2)  # what defining the class with `v: int = 2` sets
    Admitted.model_rebuild(force=True)
    try:
        line = '{"job_id":"j","seq":2,"at":"2026-12-01T00:00:00Z","body":%s}'
        for old in ('{"type":"admitted","tokens":3}', '{"v":1,"type":"admitted","tokens":3}'):
            event = event_from_json(line % old)
            assert isinstance(event, Event) and event.body.tokens == 4 and event.body.v == 2
        assert event_from_json(line % '{"v":2,"type":"admitted","tokens":3}').body.tokens == 3
    finally:
        monkeypatch.undo()
        Admitted.model_rebuild(force=True)


def test_each_body_checks_the_version_its_v_field_defaults_to():
    """The version a body class checks is kept per class: it must be its `v` default, in every one."""
    from typing import get_args

    from h3core.domain.events import Body

    classes = get_args(get_args(Body)[0])
    assert len(classes) == len(VERSIONS) >= 10
    for cls in classes:
        assert cls.version() == cls.model_fields["v"].default == VERSIONS[cls.model_fields["type"].default], cls
    assert (VERSIONS["done"], VERSIONS["failed"], VERSIONS["submitted"]) == (3, 2, 3), "bumped bodies check their bump"
