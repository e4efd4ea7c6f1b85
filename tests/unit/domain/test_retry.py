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
