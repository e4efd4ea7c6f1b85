"""The `h3core` command itself: its version, and counts said in words that agree with them."""

from __future__ import annotations

from importlib.metadata import version

from typer.testing import CliRunner

from h3core.cli import app
from h3core.cli.common import plural


def test_version_prints_the_installed_version_and_runs_nothing():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"h3core {version('h3core')}"


def test_a_count_of_one_is_singular_and_any_other_plural():
    assert plural(1, "job") == "1 job"
    assert [plural(n, "video") for n in (0, 2, 14)] == ["0 videos", "2 videos", "14 videos"]
    assert plural(3, "index", "indexes") == "3 indexes" and plural(1, "index", "indexes") == "1 index"
