"""The `h3core` command line, driven in-process with typer's CliRunner on real SQLite stores."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from h3core.adapters.lock import LockHeld, RunnerLock
from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.cli import app
from h3core.domain.events import (
    Admitted,
    Artifact,
    AttemptFailed,
    Body,
    Cancelled,
    Done,
    Failed,
    Planned,
    Progress,
    Running,
    SegmentDone,
    Submitted,
)
from h3core.domain.request import GenerationRequest
from h3core.domain.segments import plan_segments

SHA = "ab" * 32
OOM = "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB"


class StepClock:
    """A store clock that only moves when told, so timelines and their +Δ are exact."""

    def __init__(self, start: datetime = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def step_clock() -> StepClock:
    return StepClock()


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()


def run(cli: CliRunner, *args: str, **kw):
    return cli.invoke(app, [str(a) for a in args], **kw)


def submitted(prompt: str = "a red fox in snow", steps: int = 10) -> Submitted:
    return Submitted(request=GenerationRequest(prompt=prompt, steps=steps, frames=24, width=64, height=64))


def artifact(job_id: str, attempt: int = 1) -> Artifact:
    return Artifact(path=f"{job_id}/attempt-{attempt}.mp4", bytes=12345, sha256=SHA, frames=24, duration_s=1.0)


def write(store: SQLiteEventStore, clock, job_id: str, *steps: tuple[float, Body]) -> None:
    """Append each body `seconds` after the previous one."""
    for seconds, body in steps:
        clock.advance(seconds)
        store.append(job_id, [body])


def progress(first: int, last: int, total: int, every: float = 1.0) -> list[tuple[float, Body]]:
    return [(every, Progress(step=i, total=total)) for i in range(first, last + 1)]


def build(db: Path, clock) -> SQLiteEventStore:
    """One store with a job in every interesting shape."""
    store = SQLiteEventStore(db, durable=False, clock=clock)
    write(
        store,
        clock,
        "job-done",
        (0, submitted(steps=3)),
        (0, Admitted()),
        (2, Running(attempt=1, executor="fake", executor_ref="fake-job-done-1")),
        *progress(1, 3, 3),
        (0.5, Done(artifact=artifact("job-done"))),
    )
    write(
        store,
        clock,
        "job-oom",
        (1, submitted(steps=50)),
        (0, Admitted()),
        (1, Running(attempt=1, executor="fake")),
        *progress(1, 11, 50),
        (0.1, Failed(kind="oom", message=OOM, detail="OutOfMemoryError")),
    )
    write(
        store,
        clock,
        "job-retry",
        (1, submitted(steps=10)),
        (0, Admitted()),
        (1, Running(attempt=1, executor="fake", executor_ref="fake-job-retry-1")),
        *progress(1, 3, 10),
        (4, AttemptFailed(kind="executor_lost", message="the executor process went away", attempt=1)),
        (5, Running(attempt=2, executor="fake", executor_ref="fake-job-retry-2")),
        *progress(1, 10, 10),
        (1, Done(artifact=artifact("job-retry", 2))),
    )
    write(
        store,
        clock,
        "job-cancelled",
        (1, submitted()),
        (0, Admitted()),
        (3, Cancelled(reason="the user changed their mind")),
    )
    write(
        store,
        clock,
        "job-running",
        (1, submitted()),
        (0, Admitted()),
        (1, Running(attempt=1, executor="fake")),
        *progress(1, 4, 10),
    )
    write(store, clock, "job-queued", (1, submitted()), (0, Admitted()))
    return store


@pytest.fixture
def db(tmp_path, step_clock) -> Path:
    path = tmp_path / "h3.db"
    build(path, step_clock).close()
    return path


def insert_raw(db: Path, job_id: str, seq: int, body: Body, at: str = "2025-03-01T13:00:00+00:00") -> None:
    """Corrupt the store below the store API: triggers refuse UPDATE/DELETE, not INSERT."""
    conn = sqlite3.connect(db)
    try:
        conn.execute(
            "INSERT INTO events (job_id, seq, type, at, body) VALUES (?, ?, ?, ?, ?)",
            (job_id, seq, body.type, at, body.model_dump_json()),
        )
        conn.commit()
    finally:
        conn.close()


def stored(db: Path):
    store = SQLiteEventStore(db, durable=False)
    try:
        return list(store.all_events()), {j: store.get(j) for j in store.job_ids()}
    finally:
        store.close()


def event_type(line: str) -> str:
    """The type column of a timeline line: '#3   2025-03-01 12:00:02.000Z     +2.00s  running ...'."""
    match = re.match(r"^#\d+\s+\S+ \S+\s+(?:\+\S+\s+)?(\S+)", line)
    assert match, line
    return match.group(1)


# -- replay ---------------------------------------------------------------------------------------


def test_replay_done_job_shows_every_event_the_gaps_and_the_artifact(cli, db):
    result = run(cli, "replay", "job-done", "--db", db)
    assert result.exit_code == 0, result.output
    out = result.stdout
    lines = [line for line in out.splitlines() if line.startswith("#")]
    assert [event_type(line) for line in lines] == [
        "submitted",
        "admitted",
        "running",
        "progress",
        "progress",
        "progress",
        "done",
    ]
    assert "2025-03-01 12:00:00.000Z" in lines[0]
    # +Δ: the running event came 2 s after admission, the done 0.5 s after the last step.
    assert "+2.00s" in lines[2] and "attempt=1" in lines[2] and "executor=fake" in lines[2]
    assert "ref=fake-job-done-1" in lines[2]
    assert "step 3/3" in lines[5]
    assert "+0.50s" in lines[6]
    assert f"artifact=job-done/attempt-1.mp4  bytes=12345  sha256={SHA}" in lines[6]
    assert "state: done" in out
    assert "why: done after 1 attempt." in out
    assert "Attempt 1 ran 3.50s; 5.50s from submission to done" in out


def test_replay_failed_job_explains_kind_step_message_and_why_not_retried(cli, db):
    result = run(cli, "replay", "job-oom", "--db", db)
    assert result.exit_code == 0, result.output
    out = result.stdout
    failed = next(line for line in out.splitlines() if line.startswith("#") and " failed " in line)
    assert "kind=oom" in failed and OOM in failed and "detail='OutOfMemoryError'" in failed
    assert "state: failed" in out
    assert f"why: failed: oom after step 11/50 on attempt 1 — {OOM} (OutOfMemoryError)" in out
    assert "Not retried: the job's policy retries only executor_lost, interrupted" in out


def test_replay_retried_job_tells_the_first_attempt_and_the_second(cli, db):
    result = run(cli, "replay", "job-retry", "--db", db)
    assert result.exit_code == 0, result.output
    out = result.stdout
    af = next(line for line in out.splitlines() if "attempt_failed" in line)
    assert "attempt=1" in af and "kind=executor_lost" in af and "the executor process went away" in af
    assert "+4.00s" in af
    second = [line for line in out.splitlines() if " running " in line][1]
    assert "attempt=2" in second and "+5.00s" in second
    assert (
        "why: done after 2 attempts; attempt 1 failed executor_lost after step 3/10 — "
        "the executor process went away. Attempt 2 ran 11.0s" in out
    )
    assert "job-retry/attempt-2.mp4" in out


def test_replay_and_jobs_show_a_long_video_s_whole_progress_and_its_segment(cli, tmp_path, step_clock):
    plan = plan_segments(100, 40)  # three segments, 10 steps each: 30 in all
    made = Artifact(path="job-long/segment-0.mp4", bytes=1, sha256=SHA, frames=plan.segments[0].keep, duration_s=1.0)
    store = SQLiteEventStore(tmp_path / "long.db", durable=False, clock=step_clock)
    first = Submitted(request=GenerationRequest(prompt="a long fox", steps=10, frames=100, width=64, height=64))
    write(store, step_clock, "job-long", (0, first), (0, Admitted()), (0, Planned(plan=plan)))
    write(store, step_clock, "job-long", (1, Running(attempt=1, executor="fake")), *progress(1, 10, 10))
    write(store, step_clock, "job-long", (1, SegmentDone(index=0, artifact=made)), *progress(1, 2, 10))
    store.close()
    replayed = run(cli, "replay", "job-long", "--db", tmp_path / "long.db")
    assert replayed.exit_code == 0, replayed.output
    assert "state: running  attempt 1/2  segment 2 of 3, step 12/30" in replayed.stdout
    assert "at segment 2 of 3, step 12/30" in replayed.stdout
    listed = run(cli, "jobs", "--db", tmp_path / "long.db")
    assert listed.exit_code == 0, listed.output
    assert "segment 2 of 3, step 12/30" in listed.stdout


def test_replay_cancelled_running_and_queued_jobs(cli, db):
    cancelled = run(cli, "replay", "job-cancelled", "--db", db)
    assert cancelled.exit_code == 0
    assert "why: cancelled while queued: the user changed their mind" in cancelled.stdout

    running = run(cli, "replay", "job-running", "--db", db)
    assert running.exit_code == 0
    assert "state: running  attempt 1/2  step 4/10" in running.stdout
    assert "why: still running: attempt 1 on fake since 2025-03-01 " in running.stdout
    assert "at step 4/10" in running.stdout

    queued = run(cli, "replay", "job-queued", "--db", db)
    assert queued.exit_code == 0
    assert "why: still queued since 2025-03-01 " in queued.stdout
    assert "waiting for attempt 1" in queued.stdout


def test_replay_unknown_job_exits_2_with_a_message_on_stderr(cli, db):
    result = run(cli, "replay", "no-such-job", "--db", db)
    assert result.exit_code == 2
    assert "no job 'no-such-job'" in result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.output


def test_replay_takes_the_short_id_submit_watch_shows_and_names_an_ambiguous_one(cli, db, step_clock):
    store = SQLiteEventStore(db, durable=False, clock=step_clock)
    minted = "3f2c9a1b7d4e4c0f8a6b5d2e1f0a9b8c"  # a uuid4 hex, as the service mints
    write(store, step_clock, minted, (0, submitted()), (0, Admitted()))
    store.close()
    shown = minted[:12]  # what `submit --watch` puts on its progress bar
    result = run(cli, "replay", shown, "--db", db)
    assert result.exit_code == 0, result.output
    assert f"job {minted}" in result.stdout and "state: queued" in result.stdout

    ambiguous = run(cli, "replay", "job-", "--db", db)
    assert ambiguous.exit_code == 2 and ambiguous.stdout == ""
    assert "'job-' is the start of several jobs" in ambiguous.stderr and "job-cancelled, job-done" in ambiguous.stderr

    unknown = run(cli, "replay", "3f2d", "--db", db)
    assert unknown.exit_code == 2 and "no job '3f2d'" in unknown.stderr
    exported = run(cli, "export", "--db", db, "--job", shown)
    assert exported.exit_code == 0 and f'"job_id":"{minted}"' in exported.stdout


def test_replay_of_a_missing_store_exits_2_and_does_not_create_it(cli, tmp_path):
    missing = tmp_path / "nowhere.db"
    result = run(cli, "replay", "x", "--db", missing)
    assert result.exit_code == 2
    assert "no store at" in result.stderr
    assert not missing.exists()


def test_replay_json_prints_the_log_as_json_lines(cli, db):
    result = run(cli, "replay", "job-retry", "--db", db, "--json")
    assert result.exit_code == 0, result.output
    events, _ = stored(db)
    expected = [e.model_dump_json() for e in events if e.job_id == "job-retry"]
    assert result.stdout.splitlines() == expected


def test_replay_folds_the_log_and_reports_a_broken_rule(cli, db):
    # The projection still says "done"; only folding the log shows the event after the end.
    insert_raw(db, "job-done", 8, Progress(step=1, total=3))
    result = run(cli, "replay", "job-done", "--db", db)
    assert result.exit_code == 1
    assert "breaks a rule (after_terminal)" in result.stderr
    assert "job job-done event #8" in result.stderr
    assert "<- breaks a rule" in result.stdout


# -- verify ---------------------------------------------------------------------------------------


def test_verify_ok(cli, db):
    result = run(cli, "verify", "--db", db, "--logs-only")
    assert result.exit_code == 0, result.output
    assert "checked 6 jobs, 53 events: cancelled 1, done 2, failed 1, queued 1, running 1" in result.stdout
    assert "OK" in result.stdout
    assert "BROKEN" not in result.output


def test_verify_names_a_job_whose_log_breaks_a_rule(cli, db):
    insert_raw(db, "job-oom", 16, Progress(step=12, total=50))
    result = run(cli, "verify", "--db", db, "--logs-only")
    assert result.exit_code == 1
    broken = [line for line in result.stdout.splitlines() if line.startswith("BROKEN")]
    assert len(broken) == 1
    assert broken[0].startswith("BROKEN job-oom: the log breaks a rule (after_terminal)")
    assert "1 broken job(s)" in result.stderr


def test_verify_names_a_job_whose_projection_missed_an_event(cli, db):
    # A legal next event, but written without the projection: the fold and the jobs row differ.
    insert_raw(db, "job-running", 8, Progress(step=5, total=10))
    result = run(cli, "verify", "--db", db, "--logs-only")
    assert result.exit_code == 1
    broken = [line for line in result.stdout.splitlines() if line.startswith("BROKEN")]
    assert broken == ["BROKEN job-running: the log has events up to seq 8 but the jobs projection only up to seq 7"]


def test_verify_names_events_of_a_job_with_no_jobs_row(cli, db):
    insert_raw(db, "ghost", 1, submitted())
    result = run(cli, "verify", "--db", db, "--logs-only")
    assert result.exit_code == 1
    assert "BROKEN ghost: it has events but no jobs row" in result.stdout


def test_verify_names_an_unparseable_event(cli, db):
    conn = sqlite3.connect(db)
    conn.execute(
        "INSERT INTO events (job_id, seq, type, at, body) VALUES (?, ?, ?, ?, ?)",
        ("job-queued", 3, "running", "2025-03-01T13:00:00+00:00", '{"type": "running", "attempt": 0}'),
    )
    conn.commit()
    conn.close()
    result = run(cli, "verify", "--db", db, "--logs-only")
    assert result.exit_code == 1
    assert "BROKEN job-queued: a stored event does not parse" in result.stdout


# -- export / import ------------------------------------------------------------------------------


def test_export_import_round_trip_gives_identical_events_and_states(cli, db, tmp_path):
    dump = tmp_path / "dump.jsonl"
    exported = run(cli, "export", "--db", db, "-o", dump)
    assert exported.exit_code == 0, exported.output
    assert "exported 53 events of 6 jobs" in exported.stderr
    lines = dump.read_text().splitlines()
    assert len(lines) == 53 and all(json.loads(line)["job_id"] for line in lines)

    fresh = tmp_path / "fresh.db"
    imported = run(cli, "import", dump, "--db", fresh)
    assert imported.exit_code == 0, imported.output
    assert "imported 53 new events (0 already present) for 6 jobs" in imported.stdout
    assert stored(fresh) == stored(db)

    again = run(cli, "import", dump, "--db", fresh)
    assert again.exit_code == 0
    assert "imported 0 new events (53 already present)" in again.stdout
    assert stored(fresh) == stored(db)


def test_export_to_stdout_of_chosen_jobs_and_import_from_stdin(cli, db, tmp_path):
    exported = run(cli, "export", "--db", db, "--job", "job-retry", "--job", "job-oom")
    assert exported.exit_code == 0, exported.output
    lines = exported.stdout.splitlines()
    assert [json.loads(line)["job_id"] for line in lines] == ["job-retry"] * 19 + ["job-oom"] * 15

    fresh = tmp_path / "fresh.db"
    imported = run(cli, "import", "-", "--db", fresh, input=exported.stdout)
    assert imported.exit_code == 0, imported.output
    events, states = stored(fresh)
    original, original_states = stored(db)
    # Imported in the file's order, so job-retry was submitted first in the fresh store.
    assert events == [e for e in original if e.job_id == "job-retry"] + [e for e in original if e.job_id == "job-oom"]
    assert states == {j: original_states[j] for j in ("job-oom", "job-retry")}


def test_export_of_an_unknown_job_exits_2(cli, db):
    result = run(cli, "export", "--db", db, "--job", "nope")
    assert result.exit_code == 2
    assert "no job 'nope'" in result.stderr


def test_import_of_a_bad_line_exits_1_names_the_line_and_stores_nothing(cli, db, tmp_path):
    lines = run(cli, "export", "--db", db).stdout.splitlines()
    dump = tmp_path / "bad.jsonl"
    dump.write_text("\n".join([*lines[:3], '{"job_id": "x", "seq": "one"', *lines[3:]]) + "\n")
    fresh = tmp_path / "fresh.db"
    result = run(cli, "import", dump, "--db", fresh)
    assert result.exit_code == 1
    assert "line 4 is not an event" in result.stderr
    assert "nothing was imported" in result.stderr
    assert "Traceback" not in result.output
    if fresh.exists():
        assert stored(fresh) == ([], {})


def test_import_of_a_log_that_breaks_a_rule_exits_1_and_stores_nothing(cli, db, tmp_path):
    lines = run(cli, "export", "--db", db).stdout.splitlines()
    # Drop job-done's 'admitted' (line 2): its 'running' then follows 'submitted', which is illegal.
    dump = tmp_path / "gap.jsonl"
    dump.write_text("\n".join([lines[0], *lines[2:]]) + "\n")
    fresh = tmp_path / "fresh.db"
    result = run(cli, "import", dump, "--db", fresh)
    assert result.exit_code == 1
    assert "line 2: the log breaks a rule (seq_gap)" in result.stderr
    assert stored(fresh) == ([], {})


# -- jobs and enqueue -----------------------------------------------------------------------------


def test_jobs_lists_newest_first_with_status_progress_and_error(cli, db):
    result = run(cli, "jobs", "--db", db)
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if "job-" in line]
    order = [next(w for w in row.replace("│", " ").split() if w.startswith("job-")) for row in rows]
    assert order == ["job-queued", "job-running", "job-cancelled", "job-retry", "job-oom", "job-done"]
    oom = rows[order.index("job-oom")]
    assert "failed" in oom and "11/50" in oom and "oom" in oom and "1/2" in oom
    retry = rows[order.index("job-retry")]
    assert "done" in retry and "2/2" in retry and "retried: executor_lost" in retry
    assert "2025-03-01 12:00:" in rows[-1]


def test_jobs_filters_by_status_and_limits(cli, db):
    failed = run(cli, "jobs", "--db", db, "--status", "failed")
    assert failed.exit_code == 0
    assert "job-oom" in failed.stdout and "job-done" not in failed.stdout
    limited = run(cli, "jobs", "--db", db, "--limit", "2")
    assert [j for j in ("job-queued", "job-running", "job-cancelled") if j in limited.stdout] == [
        "job-queued",
        "job-running",
    ]
    bad = run(cli, "jobs", "--db", db, "--status", "sleeping")
    assert bad.exit_code == 2


def test_db_comes_from_the_environment(cli, db):
    result = run(cli, "jobs", env={"H3_DB": str(db)})
    assert result.exit_code == 0, result.output
    assert "job-oom" in result.stdout


def test_enqueue_stores_a_queued_job_and_prints_its_id(cli, tmp_path):
    db = tmp_path / "new.db"
    result = run(
        cli,
        "enqueue",
        "--db",
        db,
        "--prompt",
        "a [fake step=0.1] fox",
        "--steps",
        "10",
        "--frames",
        "12",
        "--width",
        "64",
        "--height",
        "96",
        "--seed",
        "7",
        "--priority",
        "3",
        "--max-attempts",
        "1",
    )
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    store = SQLiteEventStore(db, durable=False)
    try:
        state = store.get(job_id)
        events = store.events(job_id)
    finally:
        store.close()
    assert state is not None and state.status == "queued"
    assert [e.type for e in events] == ["submitted", "admitted"]
    r = state.request
    assert (r.prompt, r.steps, r.frames, r.width, r.height, r.seed) == ("a [fake step=0.1] fox", 10, 12, 64, 96, 7)
    assert state.priority == 3 and state.retry.max_attempts == 1
    assert not (tmp_path / "artifacts").exists()
    # No runner has said what it makes: no frame count is claimed (the fake makes the 12 asked).
    assert state.warnings == () and "snapped" not in result.output


def test_enqueue_warns_of_snapped_frames_once_a_runner_has_said_its_model_snaps_them(cli, tmp_path):
    from h3core.domain.capabilities import Capabilities
    from h3core.runtime.admission import CapabilityFile, capabilities_path

    db = tmp_path / "pipeline.db"
    CapabilityFile(capabilities_path(db)).publish(Capabilities(executor="pipeline"))  # as a pipeline runner publishes
    result = run(
        cli, "enqueue", "--db", db, "--prompt", "a fox", "--steps", "2", "--frames", "12", "--width", "64", "--height", "64"
    )
    assert result.exit_code == 0, result.output
    assert "12 frames snapped to 22" in result.output


def test_enqueue_refuses_an_invalid_request_without_a_traceback(cli, tmp_path):
    result = run(cli, "enqueue", "--db", tmp_path / "new.db", "--prompt", "x", "--width", "50")
    assert result.exit_code == 2
    assert "invalid job: width" in result.stderr
    assert "Traceback" not in result.output


# -- the worker's lock ----------------------------------------------------------------------------


def test_runner_lock_is_exclusive_and_released(tmp_path):
    path = tmp_path / "h3.db.runner.lock"
    with RunnerLock(path) as first:
        assert first.held
        with pytest.raises(LockHeld) as held:
            RunnerLock(path).acquire()
        assert held.value.holder is not None and held.value.holder.isdigit()
    with RunnerLock(path):  # released on exit: the next one gets it
        pass
    assert path.exists()  # never deleted (see the module docstring)


def test_the_lock_holder_can_be_seen_without_taking_the_lock(tmp_path):
    path = tmp_path / "h3.db.runner.lock"
    assert RunnerLock.holder(path) is None  # no file yet
    with RunnerLock(path):
        assert RunnerLock.holder(path) == str(os.getpid())
        assert RunnerLock.holder(path) == str(os.getpid())  # looking twice takes nothing
    assert RunnerLock.holder(path) is None
    with RunnerLock(path):  # a look just before does not keep it from being taken
        pass


def test_worker_refuses_a_store_another_worker_holds(cli, db):
    with RunnerLock(f"{db}.runner.lock"):
        result = run(cli, "worker", "--db", db, "--artifacts", db.parent / "art")
    assert result.exit_code == 3
    assert "another h3core already runs on" in result.stderr
    assert "Traceback" not in result.output


def test_backup_copies_a_store_in_use(tmp_path):
    from tests.factories import done_log

    db = tmp_path / "h3.db"
    store = SQLiteEventStore(db)
    store.append("a", done_log())
    result = CliRunner().invoke(app, ["backup", str(tmp_path / "copy.db"), "--db", str(db)])
    assert result.exit_code == 0, result.output
    copy = SQLiteEventStore(tmp_path / "copy.db")
    assert copy.events("a") == store.events("a")
    again = CliRunner().invoke(app, ["backup", str(tmp_path / "copy.db"), "--db", str(db)])
    assert again.exit_code == 2 and "already exists" in again.output


def test_serve_help_shows_every_default_even_a_word(cli):
    out = run(cli, "serve", "--help", env={"COLUMNS": "300"}).output
    for shown in ("[pipeline]", "[all]", "[h3core.db]", "[127.0.0.1]", "[0.5]"):
        assert shown in out, f"{shown} missing from serve --help"


def test_serve_freezes_what_start_up_made_so_full_collections_skip_it():
    import gc

    from h3core.cli.serve import _freeze_startup_objects

    before = gc.get_freeze_count()
    try:
        _freeze_startup_objects()
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()
