"""Logs written before a field existed still read: new fields are optional, with defaults."""

from __future__ import annotations

import json

from h3core.domain.events import Submitted, body_from_json
from h3core.domain.state import JobState
from h3core.domain.state import extend as extend
from tests.factories import submitted

OLD_SUBMITTED = json.dumps(
    {
        "type": "submitted",
        "request": {"prompt": "a fox", "width": 64, "height": 64, "frames": 24, "steps": 4},
        "priority": 0,
        "retry": {"max_attempts": 2, "retry_on": ["interrupted"]},
        "warnings": [],
        "idempotency_key": None,
    }
)


def test_a_submitted_body_from_before_remixes_reads_with_no_source():
    body = body_from_json(OLD_SUBMITTED)
    assert isinstance(body, Submitted) and body.remixed_from is None


def test_a_stored_job_state_from_before_remixes_reads_with_no_source():
    from datetime import UTC, datetime

    state, _ = extend(None, "j", [submitted()], datetime(2026, 1, 1, tzinfo=UTC))
    old = state.model_dump(mode="json")
    del old["remixed_from"]
    assert JobState.model_validate_json(json.dumps(old)).remixed_from is None


def test_a_remix_source_round_trips_through_json():
    body = Submitted(request=submitted().request, remixed_from="job0")
    assert body_from_json(body.model_dump_json()) == body
