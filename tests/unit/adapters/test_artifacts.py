"""The artifact store's deletion: the file goes, a record of when stays, the log is not its business."""

from __future__ import annotations

import pytest

from h3core.adapters.artifacts import ArtifactStore, LocalArtifactStore


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
