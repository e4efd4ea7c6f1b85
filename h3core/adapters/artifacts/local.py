"""`LocalArtifactStore`: the artifact store on a local (or shared) file system, crash-safe.

Each job has a folder under the root; an attempt's files are `attempt-N.<ext>` (the video),
`attempt-N.<ext>.part` (staged) and `attempt-N.record.json` (what its commit recorded). A commit
fsyncs the staged file, writes its record durably, then renames the video into place: a crash at
any moment leaves either no record, or a record whose video is whole (at its final name, or still
staged, which `committed` renames). A video at its final name with no record (a commit of an
earlier version, which wrote the record second) is recorded from what the file holds; so is a
staged video with no record that reads whole as recovery expects it (the encoder closed it, the
crash came before the record), whose commit `committed` then makes.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from h3core.adapters.artifacts._folder import PART, AttemptFolders, fsync_dir
from h3core.adapters.artifacts.base import media_type, sha256_file
from h3core.domain.adoption import Expected, FoundArtifact
from h3core.domain.events import Artifact

__all__ = ["LocalArtifactStore"]

_PART = PART
_RECORD = ".record.json"
_DELETED = ".deleted"  # beside a video's name: when it was deleted on purpose (ISO 8601)
_VIDEO_DELETED = "video.deleted"  # in a job's folder: when its video was deleted as a whole


def _mark(marker: Path) -> datetime:
    """Write the time now to `marker`, durably, unless it holds one; return the time it holds."""
    when = _marked(marker)
    if when is None:
        when = datetime.now(UTC)
        part = marker.with_name(marker.name + _PART)
        marker.parent.mkdir(parents=True, exist_ok=True)
        with open(part, "w") as f:
            f.write(when.isoformat())
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, marker)
        _fsync_dir(marker.parent)
    return when


def _marked(marker: Path) -> datetime | None:
    try:
        return datetime.fromisoformat(marker.read_text())
    except FileNotFoundError:
        return None


_fsync_dir = fsync_dir


class LocalArtifactStore(AttemptFolders):
    """The artifact store under `root` (made unless `create` is False); see the module for its layout."""

    def _record(self, job_id: str, attempt: int) -> Path:
        return self._dir(job_id) / f"attempt-{attempt}{_RECORD}"

    def commit(
        self, staged: Path, *, job_id: str, attempt: int, frames: int, duration_s: float, media_type: str = "video/mp4"
    ) -> Artifact:
        """Fsync the staged video, write its record durably, then rename it into place (the module's
        order: no crash leaves a whole video without its record)."""
        with open(staged, "rb") as f:
            os.fsync(f.fileno())
        final, artifact = self._record_of(staged, frames=frames, duration_s=duration_s, media_type=media_type)
        # The record first: a crash before the rename leaves a complete `.part` that its record
        # names (recovery finishes the rename), never a complete video that nothing records. One
        # fsync of the folder makes both names durable; were the video's name to land without
        # the record's, recovery records the whole video from the file (`_record_unrecorded`).
        self._write_record(job_id, attempt, artifact, sync_name=False)
        os.replace(staged, final)
        _fsync_dir(final.parent)
        return artifact

    def _write_record(self, job_id: str, attempt: int, artifact: Artifact, *, sync_name: bool = True) -> None:
        record = self._record(job_id, attempt)
        part = record.with_name(record.name + _PART)
        with open(part, "w", encoding="utf-8") as f:
            f.write(artifact.model_dump_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, record)
        if sync_name:
            _fsync_dir(record.parent)

    def committed(self, job_id: str, attempt: int, *, expect: Expected | None = None) -> FoundArtifact | None:
        """The recorded video with what its file holds now, after finishing a rename a crash cut
        short, recording a whole video a commit left unrecorded, or (with `expect`) committing a
        whole staged video a crash left before its record; None if nothing was committed or its
        record cannot be read."""
        recorded: Artifact | None
        try:
            recorded = Artifact.model_validate_json(self._record(job_id, attempt).read_bytes())
        except FileNotFoundError:
            recorded = self._record_unrecorded(job_id, attempt)
            if recorded is None and expect is not None:
                recorded = self._commit_whole_staged(job_id, attempt, expect)
            if recorded is None:
                return None  # no record and no whole video: nothing was committed
        except (OSError, ValidationError, ValueError):
            return None  # a record we cannot trust: nothing was committed
        try:
            self._finish_rename(recorded)
            size, sha = self.measure(recorded.path)
        except (OSError, ValueError):
            return None
        return FoundArtifact(attempt=attempt, recorded=recorded, size=size, sha256=sha)

    def _finish_rename(self, recorded: Artifact) -> None:
        """A commit stopped between its record and its rename: the staged file is the recorded
        video, byte for byte, so the rename it did not make is made now."""
        final = self.resolve(recorded.path)
        staged = final.with_name(final.name + _PART)
        if final.exists() or not staged.is_file():
            return
        if staged.stat().st_size == recorded.bytes and sha256_file(staged) == recorded.sha256:
            os.replace(staged, final)
            _fsync_dir(final.parent)

    def _record_unrecorded(self, job_id: str, attempt: int) -> Artifact | None:
        """The record of a whole video at the attempt's final name that has none, from what the
        file holds; written, so the adoption that follows reads what every commit leaves."""
        from h3core.adapters.video_probe import probe_video  # PyAV, where installed

        for number, rel in self._attempt_files(self._dir(job_id)):
            path = self.root / rel
            if number != attempt or path.name.endswith((_PART, _RECORD, _DELETED)):
                continue
            probed = probe_video(path)
            if probed is None:
                continue
            frames, seconds = probed
            artifact = Artifact(
                path=rel,
                bytes=path.stat().st_size,
                sha256=sha256_file(path),
                frames=frames,
                duration_s=round(seconds, 3),
                media_type=media_type(path),
            )
            self._write_record(job_id, attempt, artifact)
            return artifact
        return None

    def delete(self, rel_path: str) -> datetime:
        """Mark the video deleted beside it, durably (the first time kept), then remove it."""
        path = self.resolve(rel_path)
        # The record first, then the file: no file is ever gone without saying it was deleted.
        when = _mark(path.with_name(path.name + _DELETED))
        path.unlink(missing_ok=True)
        return when

    def deleted_at(self, rel_path: str) -> datetime | None:
        """When `delete` removed the video, as its mark says; None if it never did."""
        path = self.resolve(rel_path)
        return _marked(path.with_name(path.name + _DELETED))

    def delete_video(self, job_id: str) -> datetime:
        """Mark the job's video deleted as a whole, in its folder, durably (the first time kept)."""
        return _mark(self._dir(job_id) / _VIDEO_DELETED)

    def video_deleted_at(self, job_id: str) -> datetime | None:
        """When `delete_video` marked the job's video deleted; None if it never did."""
        return _marked(self._dir(job_id) / _VIDEO_DELETED)
