from __future__ import annotations

import re

from typer.testing import CliRunner

from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.cli import app
from h3core.domain.events import Admitted, Done, Failed, Running
from tests.factories import artifact, submitted

cli = CliRunner()


def test_show_prints_the_default_ceilings_with_reasons():
    result = cli.invoke(app, ["capacity", "show"])
    assert result.exit_code == 0, result.output
    rows = dict(
        (m.group(1), (int(m.group(2)), m.group(3)))
        for m in re.finditer(r"(\d+x\d+)\s+│ t2va\s+│\s+(\d+) │\s+[\d.]+ │ (\w+)", result.output)
    )
    assert rows == {"832x480": (1127, "vram"), "1024x576": (753, "vram"), "1344x768": (430, "vram"), "448x256": (1200, "quality")}
    assert "133,236" in result.output and "134,546" in result.output


def test_show_names_a_bad_profile_and_its_field(tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text('name = "x"\n')
    result = cli.invoke(app, ["capacity", "show", "--profile", str(bad)])
    assert result.exit_code == 2 and "hardware" in result.output


def _job(store, job_id, tokens, outcome, **req):
    store.append(job_id, [submitted(**req), Admitted(tokens=tokens), Running(attempt=1, executor="x")])
    if outcome == "ran":
        store.append(job_id, [Done(artifact=artifact(), tokens=tokens)])
    else:
        store.append(job_id, [Failed(kind="oom", message="CUDA out of memory", tokens=tokens)])


def test_fit_proposes_a_budget_and_names_the_jobs_that_bound_it(tmp_path):
    db = tmp_path / "h3.db"
    store = SQLiteEventStore(db)
    _job(store, "small", 90_000, "ran", width=1344, height=768, frames=300)
    _job(store, "big", 120_000, "ran", width=832, height=480, frames=1000)
    _job(store, "toobig", 125_000, "oom", width=1024, height=576, frames=720)
    _job(store, "huge", 150_000, "oom")
    store.close()
    result = cli.invoke(app, ["capacity", "fit", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "2 done, 2 out of memory" in result.output
    assert "job big (t2va 832x480x1000): 120,000 tokens" in result.output
    assert "job toobig (t2va 1024x576x720): 125,000 tokens" in result.output
    assert "proposed budget: 120,000 tokens (profile now: 133,236; -13,236)" in result.output
    assert 'width = 832, height = 480, frames = 1000, outcome = "ran"' in result.output


def test_fit_flags_evidence_that_contradicts_one_budget(tmp_path):
    db = tmp_path / "h3.db"
    store = SQLiteEventStore(db)
    _job(store, "ok", 130_000, "ran")
    _job(store, "odd", 100_000, "oom")
    store.close()
    result = cli.invoke(app, ["capacity", "fit", "--db", str(db)])
    assert "CONTRADICTION" in result.output and "job odd" in result.output
