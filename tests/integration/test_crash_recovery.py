"""A real worker process killed and stopped: no job is lost, none is left running.

Every wait polls the store (or the worker's log) against a deadline; nothing sleeps in place of
synchronisation.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from h3core.adapters.artifacts import LocalArtifactStore, sha256_file
from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.domain.events import AttemptFailed, Done, Recovered, Running
from h3core.domain.state import fold
from tests.integration.conftest import clean_env, cli, enqueue, poll
from tests.integration.crashing_worker import WHOLE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def paths(tmp_path) -> tuple[Path, Path]:
    return tmp_path / "h3.db", tmp_path / "artifacts"


@pytest.fixture
def store(paths):
    s = SQLiteEventStore(paths[0], durable=False)
    yield s
    s.close()


def running_with_progress(store: SQLiteEventStore):
    return [s for s in store.unfinished() if s.status == "running" and s.step is not None]


def test_sigkill_mid_job_then_restart_recovers_every_job_in_order(paths, store, workers):
    db, artifacts = paths
    ids = enqueue(db, 5, steps=10)

    first = workers.start(db, artifacts, "--fake-step-seconds", "0.2")
    victim = poll(lambda: running_with_progress(store), 60, "a running job with progress", first.log)[0]
    first.signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL

    # A dead process leaves its job exactly as it was: running, not ended.
    assert victim.job_id == ids[0], "the oldest job runs first"
    stuck = store.get(victim.job_id)
    assert stuck is not None and stuck.status == "running" and stuck.attempt == 1
    assert [store.get(j).status for j in ids[1:]] == ["queued"] * 4

    second = workers.start(db, artifacts, "--fake-step-seconds", "0.2")
    poll(
        lambda: all(store.get(j).terminal for j in ids),
        60,
        "every job to end",
        lambda: second.log() + "\n" + repr({j: store.get(j).status for j in ids}),
    )

    assert store.job_ids() == ids, "no job lost, none added"
    logs = {j: store.events(j) for j in ids}
    for job_id, events in logs.items():
        state = fold(events)
        assert state == store.get(job_id)
        assert state.status == "done", (job_id, state.error)
        assert isinstance(events[-1].body, Done)
        path = artifacts / state.artifact.path
        assert path.stat().st_size == state.artifact.bytes

    # The killed attempt is recorded as interrupted, then retried as attempt 2, which finished.
    bodies = [e.body for e in logs[victim.job_id]]
    failed = [i for i, b in enumerate(bodies) if isinstance(b, AttemptFailed)]
    assert len(failed) == 1
    interrupted = bodies[failed[0]]
    assert (interrupted.kind, interrupted.attempt) == ("interrupted", 1)
    after = bodies[failed[0] + 1]
    assert isinstance(after, Running) and after.attempt == 2
    assert store.get(victim.job_id).attempt == 2
    for job_id in ids[1:]:  # the others ran once, untouched by the crash
        assert [b.attempt for b in (e.body for e in logs[job_id]) if isinstance(b, Running)] == [1]

    # FIFO across the crash: the recovered job first, then the queued ones in submission order.
    starts = sorted((e.at, e.job_id, e.body.attempt) for events in logs.values() for e in events if isinstance(e.body, Running))
    assert [(job, attempt) for _, job, attempt in starts] == [(ids[0], 1), (ids[0], 2), *[(j, 1) for j in ids[1:]]]

    verified = cli("verify", "--db", db, "--artifacts", artifacts)
    assert verified.exit_code == 0, verified.output
    assert "checked 5 jobs" in verified.stdout and "done 5" in verified.stdout
    assert not [f for f in LocalArtifactStore(artifacts).files() if f.partial], "no partial file is left"

    second.signal(signal.SIGTERM)
    assert second.wait(10) == 0, second.log()
    assert "worker: stopped (SIGTERM)" in second.log()


# What each kill leaves of the attempt: a whole video, staged or at its name, recorded or not.
LEFT = {
    "before_commit": ["attempt-1.mp4.part"],
    "before_record": ["attempt-1.mp4.part"],
    "after_record": ["attempt-1.mp4.part", "attempt-1.record.json"],
    "after_commit": ["attempt-1.mp4", "attempt-1.record.json"],
}


@pytest.mark.parametrize("at", WHOLE)
def test_a_sigkill_after_the_encode_ends_the_job_done_by_adoption_never_by_a_rerun(paths, store, workers, at):
    """Killed anywhere between the encoder closing the video and the runner's Done (before the
    commit, inside it before or after its record, after it): the next start adopts that video,
    the job ends done on attempt 1 with it, the encode is not redone and nothing is discarded."""
    db, artifacts = paths
    [job] = enqueue(db, 1, steps=3)
    crashed = workers.start_crashing(at, db, artifacts, "--fake-step-seconds", "0")
    assert crashed.wait(60) == -signal.SIGKILL, crashed.log()
    left = store.get(job)
    assert (left.status, left.attempt, left.step) == ("running", 1, 3), "it died after the last step, before Done"
    files = {Path(f.path).name: f for f in LocalArtifactStore(artifacts).attempt_files(job, 1)}
    assert sorted(files) == LEFT[at]
    [written] = [f.sha256 for name, f in files.items() if not name.endswith(".record.json")]

    worker = workers.start(db, artifacts)
    done = poll(lambda: store.get(job).terminal and store.get(job), 30, "the job to end", worker.log)
    assert (done.status, done.attempt) == ("done", 1), worker.log()
    assert done.artifact.path == f"{job}/attempt-1.mp4" and done.artifact.frames == 12
    assert done.artifact.sha256 == written == sha256_file(artifacts / done.artifact.path), "the video the encoder wrote"
    bodies = [e.body for e in store.events(job)]
    assert [b.attempt for b in bodies if isinstance(b, Running)] == [1], "the encode was not redone"
    assert not [b for b in bodies if isinstance(b, AttemptFailed)], "nothing was discarded"
    assert isinstance(bodies[-2], Recovered) and isinstance(bodies[-1], Done)
    # The worker prints what it wrote after writing it: on a loaded machine, a moment after the store has it.
    line = f"{job} #{done.last_seq - 1} recovered attempt=1"
    poll(lambda: line in worker.log(), 30, f"the worker to print {line!r}", worker.log)

    verified = cli("verify", "--db", db, "--artifacts", artifacts)
    assert verified.exit_code == 0, verified.output
    gc = cli("gc", "--db", db, "--artifacts", artifacts, "--dry-run")
    assert gc.exit_code == 0 and "0 not needed" in gc.stdout, gc.output
    replayed = cli("replay", job, "--db", db)
    assert "recovery found the video intact" in replayed.stdout
    worker.signal(signal.SIGTERM)
    assert worker.wait(10) == 0, worker.log()


def test_a_video_cut_short_by_a_sigkill_is_cleared_and_the_attempt_runs_again(paths, store, workers):
    """Killed while the encoder wrote: the `.part` is not a whole video, so it is never adopted;
    the log names it as discarded (size, sha256) and attempt 2 makes the video."""
    db, artifacts = paths
    [job] = enqueue(db, 1, steps=3)
    crashed = workers.start_crashing("mid_write", db, artifacts, "--fake-step-seconds", "0")
    assert crashed.wait(60) == -signal.SIGKILL, crashed.log()
    videos = LocalArtifactStore(artifacts)
    assert [(f.path, f.partial) for f in videos.files()] == [(f"{job}/attempt-1.mp4.part", True)]
    part = sha256_file(artifacts / job / "attempt-1.mp4.part")

    worker = workers.start(db, artifacts)
    done = poll(lambda: store.get(job).terminal and store.get(job), 30, "the job to end", worker.log)
    assert (done.status, done.attempt, done.recovered) == ("done", 2, None), worker.log()
    assert [f.path for f in videos.files()] == [f"{job}/attempt-2.mp4", f"{job}/attempt-2.record.json"]
    # Nothing went without the log saying what it was.
    [interrupted] = [e.body for e in store.events(job) if isinstance(e.body, AttemptFailed)]
    assert interrupted.kind == "interrupted" and f"{job}/attempt-1.mp4.part" in interrupted.detail
    assert f"sha256 {part}" in interrupted.detail and part != done.artifact.sha256
    assert cli("verify", "--db", db, "--artifacts", artifacts).exit_code == 0
    worker.signal(signal.SIGTERM)
    assert worker.wait(10) == 0, worker.log()


def test_a_finished_video_with_no_record_is_adopted_not_run_again(paths, store, workers):
    """The case a commit that wrote its record second left when killed between its rename and its
    record: a complete attempt-1.mp4 and no record. Planted from a real worker's complete staged
    file; the next start reads the video itself and ends the job done on attempt 1 with it."""
    db, artifacts = paths
    [job] = enqueue(db, 1, steps=3)
    crashed = workers.start_crashing("before_commit", db, artifacts, "--fake-step-seconds", "0")
    assert crashed.wait(60) == -signal.SIGKILL, crashed.log()
    staged = artifacts / job / "attempt-1.mp4.part"
    final = staged.with_name("attempt-1.mp4")
    staged.rename(final)
    planted = sha256_file(final)

    worker = workers.start(db, artifacts)
    done = poll(lambda: store.get(job).terminal and store.get(job), 30, "the job to end", worker.log)
    assert (done.status, done.attempt) == ("done", 1), worker.log()
    assert done.artifact.sha256 == planted and done.artifact.path == f"{job}/attempt-1.mp4"
    assert done.artifact.frames == 12, "read from the video itself"
    bodies = [e.body for e in store.events(job)]
    assert [b.attempt for b in bodies if isinstance(b, Running)] == [1], "the attempt did not run again"
    assert isinstance(bodies[-2], Recovered) and isinstance(bodies[-1], Done)
    assert cli("verify", "--db", db, "--artifacts", artifacts).exit_code == 0
    worker.signal(signal.SIGTERM)
    assert worker.wait(10) == 0, worker.log()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_graceful_stop_hands_the_running_attempt_back_checkpointed_not_failed(paths, store, workers, sig):
    db, artifacts = paths
    ids = enqueue(db, 2, steps=50)
    worker = workers.start(db, artifacts, "--fake-step-seconds", "0.2")
    victim = poll(lambda: running_with_progress(store), 60, "a running job with progress", worker.log)[0]

    worker.signal(sig)
    assert worker.wait(10) == 0, worker.log()

    assert not [s for s in store.unfinished() if s.status == "running"], "nothing left running"
    state = store.get(victim.job_id)
    assert (state.status, state.attempt, state.released, state.spent, state.attempt_errors) == ("queued", 1, 1, 0, ())
    events = store.events(victim.job_id)
    assert [e.type for e in events[-2:]] == ["checkpointed", "released"], "checkpointed where it stopped"
    assert events[-2].body.checkpoint.step == state.checkpoint.step == max(e.body.step for e in events if e.type == "progress")
    assert f"{victim.job_id} #{state.last_seq} released attempt=1" in worker.log()
    other = store.get(ids[1])
    assert other.status == "queued" and other.attempt == 0
    assert cli("verify", "--db", db, "--artifacts", artifacts).exit_code == 0


def test_three_graceful_restarts_during_one_job_spend_no_attempt_and_redo_no_step(paths, store, workers):
    """Deploys (SIGTERM) during a long job, even with a policy of one attempt: each hands the job
    back checkpointed, the next start continues after that step, and it ends done."""
    db, artifacts = paths
    (job_id,) = enqueue(db, 1, steps=30, max_attempts=1)
    reached = 0
    for restart in range(3):
        worker = workers.start(db, artifacts, "--fake-step-seconds", "0.2", "--max-attempts", "1")
        poll(lambda r=reached: (store.get(job_id).step or 0) >= r + 3, 60, f"progress after restart {restart}", worker.log)
        worker.signal(signal.SIGTERM)
        assert worker.wait(10) == 0, worker.log()
        state = store.get(job_id)
        assert (state.status, state.released, state.attempt_errors) == ("queued", restart + 1, ())
        reached = state.checkpoint.step
    worker = workers.start(db, artifacts, "--fake-step-seconds", "0.01", "--max-attempts", "1")
    done = poll(lambda: store.get(job_id) if store.get(job_id).status == "done" else None, 60, "the job done", worker.log)
    assert (done.attempt, done.released, done.spent, done.attempt_errors) == (4, 3, 1, ())
    events = store.events(job_id)
    steps = [e.body.step for e in events if e.type == "progress"]
    assert len(steps) <= 30 + 3, f"{len(steps)} steps logged for a 30-step job and 3 restarts"
    assert sorted(set(steps)) == list(range(1, 31))
    restored = [e.body.checkpoint.step for e in events if e.type == "restored"]
    assert len(restored) == 3 and restored == sorted(restored)
    worker.signal(signal.SIGTERM)
    worker.wait(10)


LONG = ("--steps", 2, "--frames", 72, "--width", 64, "--height", 64, "--seed", 5)  # four 1-second segments


def _enqueue_long(db: Path, prompt: str) -> str:
    result = cli("enqueue", "--db", db, "--prompt", prompt, *LONG)
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


@pytest.mark.parametrize("at", ["in_segment", "segment_unlogged"])
def test_a_sigkill_during_a_long_video_loses_no_segment_it_logged_and_makes_the_same_video(paths, store, workers, at):
    """Killed as the third segment goes into the store (two logged before it), or after the second
    one's file is stored but before its `segment_done`: the next start makes only the segments
    the log does not hold, each once, and the video is the one an uninterrupted run makes."""
    db, artifacts = paths
    window = ("--fake-window-seconds", "1", "--fake-step-seconds", "0")
    crashed = workers.start_crashing(at, db, artifacts, *window)
    crashed.wait_ready()  # the window it states plans the job as segments
    job = _enqueue_long(db, "killed")
    assert crashed.wait(60) == -signal.SIGKILL, crashed.log()
    left = store.get(job)
    logged = {"in_segment": 2, "segment_unlogged": 1}[at]
    assert (left.status, len(left.plan.segments), len(left.segments)) == ("running", 4, logged)

    worker = workers.start(db, artifacts, *window)
    done = poll(lambda: store.get(job).terminal and store.get(job), 60, "the job to end", worker.log)
    assert done.status == "done", worker.log()
    events = store.events(job)
    made = [e.body.index for e in events if e.type == "segment_done"]
    assert made == [0, 1, 2, 3], "each segment logged once, in order"
    restarted = [i for i, e in enumerate(events) if e.type == "running"][-1]
    assert [e.body.index for e in events[restarted:] if e.type == "segment_done"] == list(range(logged, 4))
    assert done.artifact.frames == 72 and sha256_file(artifacts / done.artifact.path) == done.artifact.sha256

    whole = _enqueue_long(db, "whole")
    again = poll(lambda: store.get(whole).terminal and store.get(whole), 60, "the uninterrupted job", worker.log)
    assert again.status == "done" and again.artifact.sha256 == done.artifact.sha256, "the same video"
    assert LocalArtifactStore(artifacts).segment_files(job) == [], "its segment files went with the join"
    verified = cli("verify", "--db", db, "--artifacts", artifacts)
    assert verified.exit_code == 0, verified.output
    worker.signal(signal.SIGTERM)
    assert worker.wait(10) == 0, worker.log()


def test_a_second_worker_on_the_same_store_exits_3_while_the_first_runs(paths, store, workers):
    db, artifacts = paths
    first = workers.start(db, artifacts, "--fake-step-seconds", "0.2")
    first.wait_ready()

    second = subprocess.run(
        [sys.executable, "-m", "h3core.cli", "worker", "--db", str(db), "--artifacts", str(artifacts), "--executor", "fake"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert second.returncode == 3, second.stderr
    assert "another h3core already runs on" in second.stderr
    assert f"process {first.pid}" in second.stderr
    assert "Traceback" not in second.stderr
    assert first.proc.poll() is None, "the first worker is unaffected"

    first.signal(signal.SIGTERM)
    assert first.wait(10) == 0
    # The lock went with the process: a new worker starts.
    third = workers.start(db, artifacts)
    third.wait_ready()
    third.signal(signal.SIGTERM)
    assert third.wait(10) == 0
