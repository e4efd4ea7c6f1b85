"""Golden logs: every set of logs an earlier h3core wrote keeps replaying to the states it recorded.

Each folder is one set (see write.py): `store.db` as that version's store left it, the
`h3core export` file of it, and `states.json`, the states they folded to then.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic_core import to_jsonable_python

from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.domain.events import VERSIONS, Event, event_from_json
from h3core.domain.failures import FAILURE_KINDS
from h3core.domain.request import GenerationRequest
from h3core.domain.state import fold

HERE = Path(__file__).parent
SETS = sorted(p for p in HERE.iterdir() if (p / "states.json").is_file())
LATEST = SETS[-1]


def expected(folder: Path) -> dict[str, dict]:
    return json.loads((folder / "states.json").read_text())


def exported(folder: Path) -> dict[str, list[Event]]:
    logs: dict[str, list[Event]] = {}
    for line in (folder / "export.jsonl").read_text().splitlines():
        event = event_from_json(line)
        logs.setdefault(event.job_id, []).append(event)
    return logs


def dumped(state, recorded: dict) -> dict:
    """The state as JSON, to compare with the `recorded` one: a field the state gained after the
    set was written (`webhook`, schema 3; `checkpoints`, schema 4) is left out, once it holds its
    default, as a log of then folds it; so is one the request gained (`quality`, schema 5)."""
    out = _left_out(state.model_dump(mode="json"), recorded, type(state))
    if isinstance(out.get("request"), dict) and isinstance(recorded.get("request"), dict):
        out["request"] = _left_out(out["request"], recorded["request"], GenerationRequest)
    return out


def _left_out(out: dict, recorded: dict, cls) -> dict:
    added = set(out) - set(recorded)
    defaults = _defaults(cls)
    assert all(out[k] == defaults[k] for k in added), {k: out[k] for k in added}
    return {k: v for k, v in out.items() if k not in added}


def _defaults(cls) -> dict:
    """Each field's default as JSON (fields without one are never added later)."""
    fields = cls.model_fields.items()
    return {name: to_jsonable_python(f.get_default(call_default_factory=True)) for name, f in fields if not f.is_required()}


@pytest.fixture(params=SETS, ids=[p.name for p in SETS])
def golden(request) -> Path:
    return request.param


def test_an_export_file_replays_to_the_states_it_recorded(golden):
    logs = exported(golden)
    assert set(logs) == set(expected(golden))
    for job_id, events in logs.items():
        assert dumped(fold(events), expected(golden)[job_id]) == expected(golden)[job_id], job_id


def test_a_store_file_opens_and_reads_to_the_states_it_recorded(golden, tmp_path):
    shutil.copy(golden / "store.db", tmp_path / "store.db")
    store = SQLiteEventStore(tmp_path / "store.db")  # migrated, its projection refolded if need be
    try:
        for job_id, state in expected(golden).items():
            assert dumped(store.get(job_id), state) == state, job_id
            assert dumped(fold(store.events(job_id)), state) == state, job_id
    finally:
        store.close()


def test_an_export_file_imports_into_a_fresh_store_once(golden, tmp_path):
    events = [e for log in exported(golden).values() for e in log]
    store = SQLiteEventStore(tmp_path / "fresh.db")
    try:
        assert store.import_events(events) == len(events)
        assert store.import_events(events) == 0  # the same events again: already there, not a conflict
        for job_id, state in expected(golden).items():
            assert dumped(store.get(job_id), state) == state, job_id
    finally:
        store.close()


def test_the_latest_set_holds_every_event_type_and_failure_kind_at_the_versions_written_today():
    """A new event type, failure kind or version needs a new golden set (docs/events.md)."""
    bodies = [json.loads(line)["body"] for line in (LATEST / "export.jsonl").read_text().splitlines()]
    assert {b["type"] for b in bodies} == set(VERSIONS)
    assert {b["kind"] for b in bodies if b["type"] == "failed"} == set(FAILURE_KINDS)
    assert {(b["type"], b["v"]) for b in bodies} == set(VERSIONS.items())


def test_the_first_set_predates_versions():
    first = SETS[0]
    bodies = [json.loads(line)["body"] for line in (first / "export.jsonl").read_text().splitlines()]
    assert not any("v" in b for b in bodies)
