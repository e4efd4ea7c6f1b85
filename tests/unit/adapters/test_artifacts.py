"""The local artifact store: a commit is a rename then a durable record; what recovery and gc read
back; a deletion on purpose leaves a record of when."""

from __future__ import annotations

import pytest

from h3core.adapters.artifacts import ArtifactStore, LocalArtifactStore, sha256_file


@pytest.fixture
def videos(tmp_path) -> LocalArtifactStore:
    return LocalArtifactStore(tmp_path / "artifacts")


def test_a_commit_records_what_it_committed_and_reads_it_back(videos):
    staged = videos.staging("job", 3)
    staged.write_bytes(b"a video")
    artifact = videos.commit(staged, job_id="job", attempt=3, frames=24, duration_s=1.0)
    assert not staged.exists() and artifact.path == "job/attempt-3.mp4"
    assert (artifact.bytes, artifact.sha256) == (7, sha256_file(videos.resolve(artifact.path)))
    found = videos.committed("job", 3)
    assert found is not None and found.recorded == artifact and (found.size, found.sha256) == (7, artifact.sha256)
    assert videos.committed("job", 2) is None and videos.committed("other", 3) is None


def test_a_staged_file_never_committed_has_no_record(videos):
    videos.staging("job", 1).write_bytes(b"half")
    assert videos.committed("job", 1) is None
    assert [(f.path, f.partial, f.attempt) for f in videos.files()] == [("job/attempt-1.mp4.part", True, 1)]


def test_discard_removes_one_attempts_files_only(videos):
    for attempt in (1, 10):
        staged = videos.staging("job", attempt)
        staged.write_bytes(b"v")
        videos.commit(staged, job_id="job", attempt=attempt, frames=1, duration_s=0.1)
    videos.staging("job", 1, ".webm").write_bytes(b"x")
    assert sorted(videos.discard("job", 1)) == ["job/attempt-1.mp4", "job/attempt-1.record.json", "job/attempt-1.webm.part"]
    assert [f.path for f in videos.files()] == ["job/attempt-10.mp4", "job/attempt-10.record.json"]


def test_measure_refuses_paths_outside_the_store_and_reports_what_is_not_a_file(videos):
    with pytest.raises(ValueError, match="leaves the artifact store"):
        videos.measure("../../etc/passwd")
    with pytest.raises(ValueError):
        videos.measure("/etc/passwd")
    assert videos.measure(".") == (None, None)
    assert videos.measure("nothing/here.mp4") == (None, None)


@pytest.mark.parametrize("job_id", ["../x", "a/b", ".", ""])
def test_no_job_id_that_is_a_path_gets_a_folder(videos, job_id):
    with pytest.raises(ValueError, match="not a safe artifact name"):
        videos.staging(job_id, 1)


# -- deleting a video on purpose (/v1/videos DELETE): the file goes, a record of when stays --------


@pytest.fixture
def committed(tmp_path):
    store = LocalArtifactStore(tmp_path / "artifacts")
    staged = store.staging("job1", 1)
    staged.write_bytes(b"\x00\x00\x00\x20ftypisom" + b"x" * 100)
    return store, store.commit(staged, job_id="job1", attempt=1, frames=24, duration_s=1.0)


def test_delete_removes_the_file_and_records_when(committed):
    store, artifact = committed
    assert isinstance(store, ArtifactStore)
    assert store.deleted_at(artifact.path) is None
    when = store.delete(artifact.path)
    assert not store.resolve(artifact.path).exists()
    assert store.deleted_at(artifact.path) == when
    assert store.delete(artifact.path) == when  # again: nothing more to do, the first time stands


def test_a_file_left_behind_by_an_interrupted_delete_goes_on_the_next_one(committed):
    store, artifact = committed
    path = store.resolve(artifact.path)
    kept = path.read_bytes()
    when = store.delete(artifact.path)
    path.write_bytes(kept)  # as if the process died between the record and the unlink
    assert store.deleted_at(artifact.path) == when
    assert store.delete(artifact.path) == when and not path.exists()


def test_a_file_missing_without_a_delete_is_not_reported_deleted(committed):
    store, artifact = committed
    store.resolve(artifact.path).unlink()
    assert store.deleted_at(artifact.path) is None


@pytest.mark.parametrize("escape", ["../outside.mp4", "/etc/passwd"])
def test_delete_never_leaves_the_store(committed, escape):
    store, _ = committed
    with pytest.raises(ValueError, match="leaves the artifact store"):
        store.delete(escape)
    with pytest.raises(ValueError, match="leaves the artifact store"):
        store.deleted_at(escape)
