"""Where finished videos live. Addressed by job id only: no client path reaches the disk.

Contract (`ArtifactStore`): `staging(job_id, attempt)` gives a fresh path to write to;
`commit(...)` records what it commits (size and sha256, under the final name) durably, then moves
the file into place atomically, and returns that `Artifact`: a complete video always has its
record, whatever moment a crash picks. `committed(job_id, attempt)` reads an attempt's record back
with the file as it is now (for recovery to adopt a video committed before a crash): it finishes
a commit stopped between its record and its rename, and for a video at its final name with no
record (a commit that wrote the record second, as earlier versions did) it records what the file
itself holds, if it is a whole video. `discard` removes an attempt's files and says what they were
(size and sha256); `files` lists every file with the attempt it belongs to and `remove` deletes
one (`h3core gc`).
`measure(path)` gives a file's size and sha256 as they are now; `resolve(artifact.path)` gives a
file back, refusing any path that would leave the store's root. `delete(artifact.path)` removes a
committed video on purpose and records when, so that `deleted_at` tells a deleted file from a
lost one; the job's log is untouched. `delete_video(job_id)` records that a job's video was
deleted as a whole (OpenAI's Videos API: the object is gone, finished or not), read back by
`video_deleted_at`; the caller removes the file with `delete`.
"""

from __future__ import annotations

import hashlib
import mimetypes
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import ValidationError

from h3core.domain.adoption import FoundArtifact
from h3core.domain.events import Artifact
from h3core.domain.ids import is_job_id
from h3core.domain.retention import StoredFile

_ATTEMPT_FILE = re.compile(r"^attempt-(\d{1,9})\.")
_PART = ".part"
_RECORD = ".record.json"
_DELETED = ".deleted"  # beside a video's name: when it was deleted on purpose (ISO 8601)
_VIDEO_DELETED = "video.deleted"  # in a job's folder: when its video was deleted as a whole


@runtime_checkable
class ArtifactStore(Protocol):
    def staging(self, job_id: str, attempt: int, suffix: str = ".mp4") -> Path: ...

    def commit(
        self, staged: Path, *, job_id: str, attempt: int, frames: int, duration_s: float, media_type: str = "video/mp4"
    ) -> Artifact: ...

    def committed(self, job_id: str, attempt: int) -> FoundArtifact | None: ...

    def attempt_files(self, job_id: str, attempt: int) -> list[StoredFile]: ...

    def discard(self, job_id: str, attempt: int) -> list[StoredFile]: ...

    def files(self) -> list[StoredFile]: ...

    def remove(self, rel_path: str) -> None: ...

    def measure(self, rel_path: str, *, hashed: bool = True) -> tuple[int | None, str | None]: ...

    def resolve(self, rel_path: str) -> Path: ...

    def delete(self, rel_path: str) -> datetime:
        """Remove the file; return when it was deleted (the first deletion's time, if deleted before)."""
        ...

    def deleted_at(self, rel_path: str) -> datetime | None:
        """When `delete` removed the file; None if it never did."""
        ...

    def delete_video(self, job_id: str) -> datetime:
        """Record that the job's video is deleted; return when (the first time, if recorded before)."""
        ...

    def video_deleted_at(self, job_id: str) -> datetime | None:
        """When `delete_video` recorded the job's video deleted; None if it never did."""
        ...


def media_type(path: Path | str) -> str:
    """A video's media type by its name (mimetypes knows no YUV4MPEG2, the fake's core-install video)."""
    if Path(path).suffix == ".y4m":
        return "video/x-yuv4mpeg2"
    return mimetypes.guess_type(Path(path).name)[0] or "application/octet-stream"


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


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalArtifactStore:
    def __init__(self, root: str | Path, *, create: bool = True) -> None:
        self.root = Path(root).resolve()
        if create:
            self.root.mkdir(parents=True, exist_ok=True)

    def _dir(self, job_id: str) -> Path:
        if not is_job_id(job_id):
            raise ValueError(f"job id {job_id!r} is not a safe artifact name")
        return self.root / job_id

    def _record(self, job_id: str, attempt: int) -> Path:
        return self._dir(job_id) / f"attempt-{attempt}{_RECORD}"

    def staging(self, job_id: str, attempt: int, suffix: str = ".mp4") -> Path:
        d = self._dir(job_id)
        d.mkdir(parents=True, exist_ok=True)
        return d / f"attempt-{attempt}{suffix}{_PART}"

    def commit(
        self, staged: Path, *, job_id: str, attempt: int, frames: int, duration_s: float, media_type: str = "video/mp4"
    ) -> Artifact:
        final = staged.with_name(staged.name.removesuffix(_PART))
        with open(staged, "rb") as f:
            os.fsync(f.fileno())
        artifact = Artifact(
            path=str(final.relative_to(self.root)),
            bytes=staged.stat().st_size,
            sha256=sha256_file(staged),
            frames=frames,
            duration_s=duration_s,
            media_type=media_type,
        )
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

    def committed(self, job_id: str, attempt: int) -> FoundArtifact | None:
        try:
            recorded = Artifact.model_validate_json(self._record(job_id, attempt).read_bytes())
        except FileNotFoundError:
            recorded = self._record_unrecorded(job_id, attempt)
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

    def measure(self, rel_path: str, *, hashed: bool = True) -> tuple[int | None, str | None]:
        """(size, sha256) of a file now; (None, None) when it is not a regular file; sha256 None
        unless `hashed`. A path leaving the store is a ValueError."""
        path = self.resolve(rel_path)
        try:
            if not path.is_file():
                return None, None
            return path.stat().st_size, sha256_file(path) if hashed else None
        except FileNotFoundError:
            return None, None

    def attempt_files(self, job_id: str, attempt: int) -> list[StoredFile]:
        """Every file of the attempt, each with its size and sha256 (what `discard` would remove)."""
        out = []
        for number, rel in self._attempt_files(self._dir(job_id)):
            if number != attempt:
                continue
            path = self.root / rel
            try:
                out.append(StoredFile(job_id, attempt, rel, path.stat().st_size, rel.endswith(_PART), sha256_file(path)))
            except FileNotFoundError:
                continue  # removed meanwhile
        return out

    def discard(self, job_id: str, attempt: int) -> list[StoredFile]:
        """Remove every file of the attempt (partial, committed or record); what each one was."""
        removed = self.attempt_files(job_id, attempt)
        for f in removed:
            self.remove(f.path)
        return removed

    def _attempt_files(self, d: Path) -> list[tuple[int, str]]:
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except FileNotFoundError:
            return []
        out = []
        for e in entries:
            m = _ATTEMPT_FILE.match(e.name)
            if m is not None and e.is_file(follow_symlinks=False):
                out.append((int(m.group(1)), f"{d.name}/{e.name}"))
        return out

    def files(self) -> list[StoredFile]:
        """Every attempt file under a job's folder; anything else in the store is not ours to judge."""
        out = []
        for d in sorted(self.root.iterdir()):
            if not (d.is_dir() and not d.is_symlink() and is_job_id(d.name)):
                continue
            for attempt, rel in self._attempt_files(d):
                try:
                    size = (self.root / rel).stat().st_size
                except FileNotFoundError:
                    continue  # removed meanwhile
                out.append(StoredFile(job_id=d.name, attempt=attempt, path=rel, bytes=size, partial=rel.endswith(_PART)))
        return out

    def remove(self, rel_path: str) -> None:
        self.resolve(rel_path).unlink(missing_ok=True)

    def resolve(self, rel_path: str) -> Path:
        path = (self.root / rel_path).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"artifact path {rel_path!r} leaves the artifact store")
        return path

    def delete(self, rel_path: str) -> datetime:
        path = self.resolve(rel_path)
        # The record first, then the file: no file is ever gone without saying it was deleted.
        when = _mark(path.with_name(path.name + _DELETED))
        path.unlink(missing_ok=True)
        return when

    def deleted_at(self, rel_path: str) -> datetime | None:
        path = self.resolve(rel_path)
        return _marked(path.with_name(path.name + _DELETED))

    def delete_video(self, job_id: str) -> datetime:
        return _mark(self._dir(job_id) / _VIDEO_DELETED)

    def video_deleted_at(self, job_id: str) -> datetime | None:
        return _marked(self._dir(job_id) / _VIDEO_DELETED)
