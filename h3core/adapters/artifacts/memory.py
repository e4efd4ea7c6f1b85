"""`MemoryArtifactStore`: a fake that honours the artifact-store contract while its process lives.

Executors write to paths, so the videos are files under `root`; the records and the deletion marks
are kept in memory instead of beside them, and nothing is fsynced. Nothing of it survives the
process (as nothing of `MemoryEventStore` does): for tests of what is built on the contract, and
a second implementation beside `LocalArtifactStore` that the shipped contract tests run against.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from h3core.adapters.artifacts._folder import AttemptFolders
from h3core.domain.events import Artifact
from h3core.domain.retention import StoredFile

__all__ = ["MemoryArtifactStore"]


class MemoryArtifactStore(AttemptFolders):
    """Videos under `root`, their records and deletion marks in memory (see the module)."""

    def __init__(self, root: str | Path) -> None:
        super().__init__(root)
        self._records: dict[tuple[str, int], Artifact] = {}
        self._deleted: dict[str, datetime] = {}
        self._videos_deleted: dict[str, datetime] = {}

    def commit(
        self, staged: Path, *, job_id: str, attempt: int, frames: int, duration_s: float, media_type: str = "video/mp4"
    ) -> Artifact:
        """Record the staged video in memory, then rename it into place."""
        self._dir(job_id)  # a job id that is no safe name is refused before anything is recorded
        final, artifact = self._record_of(staged, frames=frames, duration_s=duration_s, media_type=media_type)
        self._records[(job_id, attempt)] = artifact
        os.replace(staged, final)
        return artifact

    def _recorded(self, job_id: str, attempt: int) -> Artifact | None:
        """The record kept in memory (`committed` measures it as it is now)."""
        self._dir(job_id)
        return self._records.get((job_id, attempt))

    def discard(self, job_id: str, attempt: int) -> list[StoredFile]:
        """Remove the attempt's files and forget its record."""
        removed = super().discard(job_id, attempt)
        self._records.pop((job_id, attempt), None)
        return removed

    def delete(self, rel_path: str) -> datetime:
        """Mark the video deleted (the first time kept), then remove it."""
        path = self.resolve(rel_path)
        when = self._deleted.setdefault(rel_path, datetime.now(UTC))
        path.unlink(missing_ok=True)
        return when

    def deleted_at(self, rel_path: str) -> datetime | None:
        """When `delete` removed the video; None if it never did."""
        self.resolve(rel_path)
        return self._deleted.get(rel_path)

    def delete_video(self, job_id: str) -> datetime:
        """Record the job's video deleted as a whole (the first time kept)."""
        self._dir(job_id)
        return self._videos_deleted.setdefault(job_id, datetime.now(UTC))

    def video_deleted_at(self, job_id: str) -> datetime | None:
        """When `delete_video` recorded the job's video deleted; None if it never did."""
        self._dir(job_id)
        return self._videos_deleted.get(job_id)
