"""The suite's hang guard (pytest-timeout) stretches with the load as each test starts
(tests/conftest.py), as the suite's waits do: on a machine loaded three times over, a test marked
10 s gets 30 s and the ini's guard three times its own; an idle machine keeps both as written."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["pytester"]

INNER_CONFTEST = """
from tests.conftest import pytest_runtest_protocol  # noqa: F401 - the hook under test
"""

INNER_TESTS = """
import pytest

@pytest.mark.timeout(10)
def test_marked(request):
    assert request.node.get_closest_marker("timeout").args[0] == pytest.approx(10 * EXPECTED)

def test_by_the_ini(request):
    marked = request.node.get_closest_marker("timeout")
    assert (marked.args[0] if marked else 300) == pytest.approx(300 * EXPECTED)
"""


@pytest.mark.parametrize(
    ("load_per_core", "factor"), [(3.0, 3.0), (0.5, 1.0), (9.0, 4.0)], ids=["loaded", "idle", "past-the-most"]
)
def test_the_hang_guard_stretches_with_the_load_as_each_test_starts(pytester, monkeypatch, load_per_core, factor):
    # The inner run is in this process: the load it reads is this one, put back after the test.
    monkeypatch.setattr(os, "getloadavg", lambda: (load_per_core * (os.cpu_count() or 1),) * 3)
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(INNER_TESTS.replace("EXPECTED", repr(factor)))
    pytester.makeini("[pytest]\ntimeout = 300\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
