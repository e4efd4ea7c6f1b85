"""The job id format: every log holds only ids that are safe as a file name, a URL segment and a
command-line argument; the check is the same for appends and imports (both validate an Event)."""

from __future__ import annotations

import string
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from h3core.domain.events import Event
from h3core.domain.ids import is_job_id
from tests.factories import submitted

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SAFE = string.ascii_letters + string.digits + "_-"


def event(job_id: str) -> Event:
    return Event(job_id=job_id, seq=1, at=T0, body=submitted())


def accepted(job_id: str) -> bool:
    try:
        event(job_id)
    except ValidationError:
        return False
    return True


def expected(s: str) -> bool:
    return 1 <= len(s) <= 64 and s[0] in string.ascii_letters + string.digits and all(c in SAFE for c in s)


@given(st.one_of(st.text(max_size=70), st.text(alphabet=SAFE + "./\\ \n%", max_size=70)))
def test_an_event_accepts_exactly_the_ids_of_the_format(s):
    assert accepted(s) == expected(s) == is_job_id(s)


@pytest.mark.parametrize("ok", ["4f6d0e2a9b7c41d38e5f60a1b2c3d4e5", "job-1", "A", "x" * 64, "a_b-C9"])
def test_minted_and_ordinary_ids_are_accepted(ok):
    assert accepted(ok)


@pytest.mark.parametrize("bad", ["../../tmp/x", "", ".", "..", "a/b", "-rf", "_x", "x" * 65, "a b", "a\n", "é"])
def test_paths_options_and_oversized_ids_are_refused(bad):
    assert not accepted(bad)
