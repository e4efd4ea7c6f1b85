"""A PostgreSQL store chosen by `H3_DB`/`--db postgresql://...`: the settings keep the URL whole,
`Jobs` and the store commands open it, and no runner lock is taken (runner nodes share its queue)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from typer.testing import CliRunner

from h3core import FakeExecutor, FakePlan, Jobs, LocalArtifactStore, RunnerConfig
from h3core.adapters.store.location import local_dir, parse_location, runner_lock_for
from h3core.adapters.store.postgres import PostgresEventStore
from h3core.cli import app
from h3core.runtime.settings import Settings
from tests.factories import request


def test_a_postgres_url_stays_whole_and_takes_no_runner_lock(monkeypatch, tmp_path):
    url = "postgresql://h3@127.0.0.1:5432/h3?options=-csearch_path%3Dq"
    monkeypatch.setenv("H3_DB", url)
    assert Settings().db == url  # a Path would have folded `//` into `/`
    assert Settings(db="jobs.db").db == Path("jobs.db")
    assert parse_location(url) == url and runner_lock_for(url) is None
    assert runner_lock_for(tmp_path / "h3.db") == Path(f"{tmp_path / 'h3.db'}.runner.lock")
    monkeypatch.chdir(tmp_path)
    assert local_dir(url) == tmp_path


@pytest.mark.anyio
async def test_jobs_runs_a_job_to_done_on_a_postgres_url_and_the_cli_reads_it(pg_url, tmp_path):
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    config = RunnerConfig(poll_interval_s=0.05)
    async with Jobs(
        pg_url, FakeExecutor(artifacts, default=FakePlan(step_seconds=0)), artifacts=artifacts, config=config
    ) as jobs:
        job = await jobs.submit(request(steps=3))
        with anyio.fail_after(30):
            assert (await jobs.wait(job.job_id)).status == "done"
    store = PostgresEventStore(pg_url)
    assert store.get(job.job_id).status == "done"
    store.close()
    cli = CliRunner()
    verified = cli.invoke(app, ["verify", "--db", pg_url, "--artifacts", str(tmp_path / "artifacts")])
    assert verified.exit_code == 0, verified.output
    replayed = cli.invoke(app, ["replay", job.job_id, "--db", pg_url])
    assert replayed.exit_code == 0 and "done" in replayed.output, replayed.output


def test_an_unreachable_server_is_one_clear_line(tmp_path):
    result = CliRunner().invoke(app, ["verify", "--db", "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"])
    assert result.exit_code == 2 and "cannot open the store at postgresql://" in result.output, result.output
