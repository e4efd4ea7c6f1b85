"""A test's H3_* variables end with it (tests/conftest.py `h3_environment_restored`): one the CLI
set in the process's environment (`--config` sets H3_CONFIG) is gone for the next test, one that
was there before is back as it was."""

from __future__ import annotations

import os

pytest_plugins = ["pytester"]

INNER_CONFTEST = """
from tests.conftest import h3_environment_restored  # noqa: F401 - the fixture under test
"""

INNER_TESTS = """
import os

def test_a_sets_and_changes():
    os.environ["H3_CONFIG"] = "/tmp/somewhere.toml"  # as `--config` does
    os.environ["H3_KEPT"] = "changed"

def test_b_sees_neither():
    assert "H3_CONFIG" not in os.environ and os.environ["H3_KEPT"] == "before"
"""


def test_a_variable_set_by_one_test_is_gone_for_the_next(pytester, monkeypatch):
    monkeypatch.delenv("H3_CONFIG", raising=False)
    monkeypatch.setenv("H3_KEPT", "before")
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(INNER_TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    assert "H3_CONFIG" not in os.environ
