"""A node's sweep of deleted videos (`DeletionSweep`): it removes the files it holds of videos the
store records deleted, reads only the deletions since its last sweep, and comes back to a job deleted
while it ran once the job has ended."""

from __future__ import annotations

from datetime import UTC, datetime

from h3core.adapters.artifacts import LocalArtifactStore
from h3core.adapters.store import MemoryEventStore
from h3core.domain.events import Admitted, Done, Running
from h3core.runtime.deletions import DeletionSweep
from tests.factories import artifact, submitted

AT = datetime(2026, 12, 1, tzinfo=UTC)


def done(store: MemoryEventStore, files: LocalArtifactStore | None, job: str) -> str:
    """A finished job whose video (a file where `files` is given: this node holds it) is at its path."""
    path = f"{job}/attempt-1.mp4"
    if files is not None:
        (files.root / job).mkdir()
        (files.root / path).write_bytes(b"video")
    store.append(job, [submitted(), Admitted(), Running(attempt=1, executor="fake"), Done(artifact=artifact(path))])
    return path


class Counted(MemoryEventStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[int] = []

    def video_deletions(self, after=0, limit=1000):
        self.reads.append(after)
        return super().video_deletions(after, limit)


def test_a_sweep_removes_this_nodes_files_of_deleted_videos_reading_only_what_is_new(tmp_path):
    store, files = Counted(), LocalArtifactStore(tmp_path / "artifacts")
    here, elsewhere, kept = done(store, files, "here"), done(store, None, "elsewhere"), done(store, files, "kept")
    for job in ("here", "elsewhere"):
        store.mark_video_deleted(job, AT)
    sweep = DeletionSweep(store, files, batch=1)
    assert sweep.sweep() == [here]  # the other node's video is not here: nothing to remove
    assert store.reads == [0, 1, 2], "pages of one, from the start, until a short one"
    assert not files.resolve(here).exists() and files.deleted_at(here) is not None and files.video_deleted_at("here")
    assert files.resolve(kept).exists()
    store.reads.clear()
    assert sweep.sweep() == [] and store.reads == [2], "nothing new: one read past the last position"
    assert files.deleted_at(elsewhere) is None


def test_a_video_deleted_while_its_job_runs_is_removed_once_the_job_ends_with_it(tmp_path):
    store, files = MemoryEventStore(), LocalArtifactStore(tmp_path / "artifacts")
    store.append("late", [submitted(), Admitted(), Running(attempt=1, executor="fake")])
    store.mark_video_deleted("late", AT)  # the cancel is on its way; the job finishes first
    sweep = DeletionSweep(store, files)
    assert sweep.sweep() == [] and sweep.position == 1
    (files.root / "late").mkdir()
    (files.root / "late/attempt-1.mp4").write_bytes(b"video")
    store.append("late", [Done(artifact=artifact("late/attempt-1.mp4"))])
    assert sweep.sweep() == ["late/attempt-1.mp4"] and not files.resolve("late/attempt-1.mp4").exists()
    assert sweep.sweep() == [], "looked at until it ended, then no more"
