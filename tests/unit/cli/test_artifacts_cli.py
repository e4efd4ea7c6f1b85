"""`h3core verify` checks every done job's video against its Done event; `h3core gc` removes the
files no job needs; `h3core import` refuses a job id that is not one."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from h3core.adapters.artifacts import LocalArtifactStore
from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.cli import app
from h3core.domain.events import Admitted, AttemptFailed, Done, Event, Running
from tests.factories import submitted


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"H3_DB": None, "H3_ARTIFACTS": None})


def commit(videos: LocalArtifactStore, job_id: str, attempt: int, data: bytes):
    staged = videos.staging(job_id, attempt)
    staged.write_bytes(data)
    return videos.commit(staged, job_id=job_id, attempt=attempt, frames=24, duration_s=1.0)


@pytest.fixture
def setup(tmp_path) -> tuple[Path, Path, LocalArtifactStore]:
    db, root = tmp_path / "h3.db", tmp_path / "artifacts"
    videos = LocalArtifactStore(root)
    store = SQLiteEventStore(db, durable=False)
    for job_id in ("one", "two"):
        artifact = commit(videos, job_id, 1, f"the video of {job_id}".encode() * 100)
        store.append(job_id, [submitted(), Admitted(), Running(attempt=1, executor="fake"), Done(artifact=artifact)])
    store.close()
    return db, root, videos


def broken_lines(result) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("BROKEN")]


def test_verify_checks_each_done_jobs_video_size_and_sha256(setup):
    db, root, _ = setup
    result = run("verify", "--db", db, "--artifacts", root)
    assert result.exit_code == 0, result.output
    assert "checked 2 videos" in result.stdout and "size and sha256" in result.stdout
    assert "every video is as recorded" in result.stdout


def test_verify_names_a_deleted_a_truncated_and_a_corrupted_video(setup):
    db, root, _ = setup
    (root / "one/attempt-1.mp4").unlink()
    result = run("verify", "--db", db, "--artifacts", root)
    assert result.exit_code == 1
    assert broken_lines(result) == ["BROKEN one: its video one/attempt-1.mp4 is missing"]

    two = root / "two/attempt-1.mp4"
    data = two.read_bytes()
    two.write_bytes(data[:-1] + b"!")  # same size, other bytes: only the hash tells
    result = run("verify", "--db", db, "--artifacts", root)
    assert "BROKEN two: its video two/attempt-1.mp4 does not match the recorded sha256" in broken_lines(result)
    quick = run("verify", "--db", db, "--artifacts", root, "--quick")
    assert broken_lines(quick) == ["BROKEN one: its video one/attempt-1.mp4 is missing"], "--quick compares sizes only"

    two.write_bytes(data[:10])
    result = run("verify", "--db", db, "--artifacts", root, "--quick")
    assert f"BROKEN two: its video two/attempt-1.mp4 has 10 bytes, {len(data)} were recorded" in broken_lines(result)
    assert run("verify", "--db", db, "--artifacts", root, "--logs-only").exit_code == 0


def test_verify_and_gc_take_a_video_deleted_on_purpose_as_it_is(setup):
    """DELETE /v1/videos/{id} removes a done job's file and records when: not a broken store."""
    db, root, videos = setup
    videos.delete("one/attempt-1.mp4")
    result = run("verify", "--db", db, "--artifacts", root)
    assert result.exit_code == 0 and broken_lines(result) == [], result.output
    dry = run("gc", "--db", db, "--artifacts", root, "--dry-run")
    assert dry.exit_code == 0 and "attempt-1.mp4.deleted" not in dry.stdout, dry.stdout


def test_verify_and_replay_report_a_deleted_video_as_deleted_not_as_recorded(setup):
    db, root, videos = setup
    before = run("replay", "one", "--db", db, "--artifacts", root)
    assert before.exit_code == 0 and "video: one/attempt-1.mp4 in " in before.stdout and "as recorded" in before.stdout
    videos.delete("one/attempt-1.mp4")  # what DELETE /v1/videos/one does to a finished video

    result = run("verify", "--db", db, "--artifacts", root)
    assert result.exit_code == 0, result.output
    assert "checked 2 videos in" in result.stdout and "1 of them deleted" in result.stdout
    deleted = [line for line in result.stdout.splitlines() if line.startswith("DELETED")]
    assert len(deleted) == 1 and deleted[0].startswith("DELETED one: its video one/attempt-1.mp4 was deleted at ")
    assert "every video is as recorded" not in result.stdout
    assert "every video left is as recorded (1 deleted)" in result.stdout

    after = run("replay", "one", "--db", db, "--artifacts", root)
    assert after.exit_code == 0, after.output
    assert "state: done" in after.stdout and "video deleted" in after.stdout
    assert "video: one/attempt-1.mp4 was deleted at " in after.stdout and "(DELETE /v1/videos/one)" in after.stdout
    assert "as recorded" not in after.stdout

    (root / "two/attempt-1.mp4").unlink()  # gone without a deletion: not the same thing
    lost = run("replay", "two", "--db", db, "--artifacts", root)
    assert "video missing" in lost.stdout and "video: its video two/attempt-1.mp4 is missing" in lost.stdout
    elsewhere = run("replay", "two", "--db", db, "--artifacts", root / "nowhere")
    assert "video: not looked for: no artifact store at" in elsewhere.stdout


def test_verify_with_an_artifacts_folder_that_is_not_there_names_the_folder_not_every_video(setup, tmp_path):
    db, _, _ = setup
    wrong = tmp_path / "not-the-artifacts"
    result = run("verify", "--db", db, "--artifacts", wrong)
    assert result.exit_code == 2, result.output
    assert broken_lines(result) == []
    assert f"no artifact store at {wrong}" in " ".join(result.stderr.split())
    assert run("verify", "--db", db, "--artifacts", wrong, "--logs-only").exit_code == 0, "the logs alone need no folder"
    assert not wrong.exists(), "verify creates nothing"
    wrong.mkdir()  # a folder, but not the service's: every video missing says so once
    result = run("verify", "--db", db, "--artifacts", wrong)
    assert result.exit_code == 1 and len(broken_lines(result)) == 2
    assert f"none of the 2 videos is in {wrong}" in result.stdout


def test_verify_refuses_a_done_event_whose_path_leaves_the_store(tmp_path):
    db, root = tmp_path / "h3.db", tmp_path / "artifacts"
    store = SQLiteEventStore(db, durable=False)
    outside = commit(LocalArtifactStore(tmp_path / "elsewhere"), "x", 1, b"video")
    escaped = outside.model_copy(update={"path": "../elsewhere/x/attempt-1.mp4"})
    store.append("x", [submitted(), Admitted(), Running(attempt=1, executor="fake"), Done(artifact=escaped)])
    store.close()
    root.mkdir()
    result = run("verify", "--db", db, "--artifacts", root)
    assert result.exit_code == 1
    assert "leaves the artifact store" in broken_lines(result)[0]


def test_gc_lists_then_removes_exactly_the_files_no_job_needs(setup):
    db, root, videos = setup
    store = SQLiteEventStore(db, durable=False)
    # A job retried after a crash: attempt 1's partial file and an unverified video are garbage,
    # attempt 2 (running) keeps its partial file and the segment it wrote. A folder of a job the
    # store does not know; a segment of a job that is done.
    store.append("three", [submitted(), Admitted(), Running(attempt=1, executor="fake")])
    store.append("three", [AttemptFailed(kind="interrupted", message="m", attempt=1), Running(attempt=2, executor="fake")])
    store.close()
    for job_id, attempt in (("three", 2), ("one", 1)):
        staged = videos.staging(job_id, attempt)
        staged.write_bytes(b"a segment")
        videos.put_segment(staged, job_id=job_id, attempt=attempt, index=0, frames=24, duration_s=1.0)
    videos.staging("three", 1).write_bytes(b"half")
    videos.staging("three", 2).write_bytes(b"being written")
    commit(videos, "ghost", 1, b"nobody's")
    videos.staging("one", 2).write_bytes(b"left over")
    keep = {
        "one/attempt-1.mp4",
        "one/attempt-1.record.json",
        "two/attempt-1.mp4",
        "two/attempt-1.record.json",
        "three/attempt-2.mp4.part",
        "three/segment-2-0.mp4",
    }
    gone = {
        "three/attempt-1.mp4.part",
        "ghost/attempt-1.mp4",
        "ghost/attempt-1.record.json",
        "one/attempt-2.mp4.part",
        "one/segment-1-0.mp4",
    }

    dry = run("gc", "--db", db, "--artifacts", root, "--dry-run")
    assert dry.exit_code == 0, dry.output
    listed = {line.split()[2] for line in dry.stdout.splitlines() if line.startswith("would remove")}
    assert listed == gone
    assert {f.path for f in videos.files()} == keep | gone, "a dry run removes nothing"

    done = run("gc", "--db", db, "--artifacts", root)
    assert done.exit_code == 0, done.output
    assert {f.path for f in videos.files()} == keep
    assert "5 not needed" in done.stdout and "one/segment-1-0.mp4 (9 bytes): a segment of a job that ended 'done'" in done.stdout
    assert run("verify", "--db", db, "--artifacts", root).exit_code == 0


def test_import_refuses_a_job_id_that_is_a_path_and_stores_nothing(tmp_path):
    at = datetime(2026, 1, 1, tzinfo=UTC).isoformat()
    good = Event(job_id="fine", seq=1, at=datetime.fromisoformat(at), body=submitted()).model_dump_json()
    bad = json.loads(good) | {"job_id": "../../tmp/x"}
    dump = tmp_path / "evil.jsonl"
    dump.write_text(good + "\n" + json.dumps(bad) + "\n")
    db = tmp_path / "h3.db"
    result = run("import", dump, "--db", db)
    assert result.exit_code == 1, result.output
    assert "line 2 is not an event: job_id" in result.stderr and "nothing was imported" in result.stderr
    assert not db.exists() or SQLiteEventStore(db).job_ids() == []
