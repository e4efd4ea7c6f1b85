import pytest
from pydantic import ValidationError

from h3core.domain.retry import RetryPolicy


def test_default_retries_only_machinery_failures_once():
    p = RetryPolicy()
    assert p.allows_retry("interrupted", 1) and p.allows_retry("executor_lost", 1)
    assert not p.allows_retry("interrupted", 2)
    assert not p.allows_retry("oom", 1) and not p.allows_retry("invalid", 1)


def test_unknown_kinds_are_refused():
    with pytest.raises(ValidationError, match="unknown failure kind"):
        RetryPolicy(retry_on=("gremlins",))


def test_an_attempt_that_never_started_is_retried_whatever_the_policy_and_does_not_count():
    from h3core.domain.retry import MAX_NOT_STARTED

    once = RetryPolicy(max_attempts=1, retry_on=())
    assert once.allows_retry("not_started", 1), "nothing ran: retried even where nothing else is"
    assert not once.allows_retry("executor_lost", 1)
    twice = RetryPolicy(max_attempts=2, retry_on=("executor_lost",))
    # attempt 3 failed executor_lost after two attempts that never started: it was the first that ran
    assert twice.allows_retry("executor_lost", 3, not_started=2)
    assert not twice.allows_retry("executor_lost", 4, not_started=2)
    assert not once.allows_retry("not_started", MAX_NOT_STARTED + 1, not_started=MAX_NOT_STARTED), "bounded"
