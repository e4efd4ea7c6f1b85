"""The artifact-store contract: where finished videos live, addressed by job id and attempt only,
so that no client path reaches the storage.

Every implementation keeps these promises (`h3core.testing.artifacts.ArtifactStoreContract`
checks them; run it against yours):

- **Staging.** `staging(job_id, attempt)` is a fresh local path the executor writes the video to.
  Nothing staged is a committed video: `committed` answers None for it, and `files` lists it as
  `partial`. A job id that is not a safe name never reaches the storage: `staging` refuses it (`ValueError`),
  and a read refuses it or finds nothing.
- **Commit.** `commit(staged, ...)` records what it commits (size and sha256 of the staged bytes,
  under the final name) durably, then makes the video visible at that name atomically, and
  returns that `Artifact`. A complete video always has its record, whatever moment a crash picks.
- **Adoption.** `committed(job_id, attempt)` reads an attempt's record back with the video as it
  is now (`FoundArtifact`: recorded size and sha256 beside the measured ones), for recovery to
  adopt a video committed before a crash; None where nothing was committed.
- **A finished encode is never redone.** A crash may stop a commit before its record, the staged
  video already whole. `committed(job_id, attempt, expect=...)` (what recovery asks: the frames
  and rate of the attempt's whole video) then makes that commit: a staged video with no record
  that reads whole with exactly those frames and that length (an mp4 or mov whole box by box, a
  YUV4MPEG2 frame by frame) is recorded with its true size and sha256 and renamed into place, and
  read back as any committed video. A staged file cut short, holding other frames, or of a
  container whose cut cannot be told, is never committed: None, and it stays staged.
- **Listing and cleanup.** `attempt_files` lists an attempt's files with size and sha256, `discard`
  removes them all and says what they were, `files` lists every attempt file with its job and
  attempt, `remove(path)` deletes one (a missing one is no error). `staged_here` lists the staged
  files only this process can see (a store whose staging folder is the node's own, as an object
  store's: no other node's `discard` or `gc` reaches them), for the node's recovery to clear those
  of attempts it no longer runs; a store that stages inside itself lists none.
- **Checkpoints.** `put_checkpoint(job_id, attempt, step, data)` stores a denoising checkpoint
  crash-safe (staged, synced, then renamed: a crash leaves the whole checkpoint or none at its
  name) and returns its (path, size, sha256); `read_checkpoint(path)` gives its bytes back
  (FileNotFoundError once gone); `checkpoint_files(job_id)` lists the job's, oldest step first.
  Checkpoints belong to the job, not to an attempt: `attempt_files` and `discard` leave them;
  `files` lists them with their step; `remove` deletes one.
- **Segments.** `put_segment(staged, job_id=, attempt=, index=, frames=, duration_s=)` stores a
  long video's segment, staged as a video is (`staging(job_id, attempt)`), crash-safe at
  `<job>/segment-<attempt>-<index>.mp4` (its size and sha256 measured from the staged bytes, then
  moved into place atomically: a crash leaves the whole segment at its name or none; the staged
  file is gone afterwards; the same name put again is replaced) and returns its `Artifact`.
  `segment_files(job_id)` lists the job's, by index then attempt. Segments belong to the job, as
  checkpoints do: `attempt_files` and `discard` leave them; `files` lists them with their index;
  `remove` deletes one; every read below takes them as any file.
- **Reading.** `measure(path)` is a file's size and sha256 now ((None, None) for no file; sha256
  None unless `hashed`); `stat(path)` its size and a `version` that changes whenever its bytes
  may have (None for no file), without reading it; `read(path, start, end)` its bytes `start`..`end`
  (inclusive; to the end with `end` None) in chunks, as they are read (FileNotFoundError where it
  is gone); `local_file(path)` a local file holding them while the context lasts (the file itself
  where the store is a folder, a temporary copy otherwise); `url(path, expires_s)` an address a
  client may fetch them from directly for `expires_s` seconds, where the store has one (None
  otherwise). Each refuses (`ValueError`) a path that would leave the store.
- **Deletion on purpose.** `delete(path)` records when, then removes the video; `deleted_at` tells
  a deleted video (its time) from a lost one (None). `delete_video(job_id)` records that a job's
  video is deleted as a whole (OpenAI's Videos API: the object is gone, finished or not), read
  back by `video_deleted_at`. Both keep the first time they recorded. The job's log is untouched.
"""

from __future__ import annotations

import hashlib
import mimetypes
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

from h3core.domain.adoption import Expected, FoundArtifact
from h3core.domain.events import Artifact
from h3core.domain.retention import StoredFile

__all__ = ["ArtifactStore", "FileStat", "media_type", "sha256_file"]

CHUNK = 1 << 20  # what `read` yields at a time: bounded memory per request, few calls per video


@dataclass(frozen=True)
class FileStat:
    """A stored file's size, and a version that changes whenever its bytes may have (a local
    file's inode, size and modification time; an object's ETag): what was verified once need not
    be read again while its version stands."""

    size: int
    version: str


@runtime_checkable
class ArtifactStore(Protocol):
    """Where an executor stages and commits videos and the service reads them (the contract above)."""

    def staging(self, job_id: str, attempt: int, suffix: str = ".mp4") -> Path:
        """A fresh local path to write the attempt's video to (its folder made); `suffix`: the
        container's extension."""
        ...

    def commit(
        self, staged: Path, *, job_id: str, attempt: int, frames: int, duration_s: float, media_type: str = "video/mp4"
    ) -> Artifact:
        """Record the staged video (size, sha256, frames, duration) durably, then make it visible
        under its final name atomically; the record, as `Artifact` (its `path` relative to the store)."""
        ...

    def committed(self, job_id: str, attempt: int, *, expect: Expected | None = None) -> FoundArtifact | None:
        """The attempt's committed video as recorded and as it is now, or None if none was
        committed (finishing, where the store can, a commit a crash stopped after its record; with
        `expect`, one it stopped before its record, where the staged video reads whole as `expect` says)."""
        ...

    def attempt_files(self, job_id: str, attempt: int) -> list[StoredFile]:
        """Every file of the attempt (staged, committed, record), each with its size and sha256."""
        ...

    def discard(self, job_id: str, attempt: int) -> list[StoredFile]:
        """Remove every file of the attempt; what each one was (as `attempt_files` said)."""
        ...

    def files(self) -> list[StoredFile]:
        """Every attempt file, checkpoint and segment in the store, with its job, attempt, size,
        whether it is partial, a checkpoint's step and a segment's index."""
        ...

    def staged_here(self) -> list[StoredFile]:
        """The staged files only this process sees (a node-local staging folder), each partial;
        none where staged files are in the store itself."""
        ...

    def put_checkpoint(self, job_id: str, attempt: int, step: int, data: bytes) -> tuple[str, int, str]:
        """Store a checkpoint of `attempt` at `step` crash-safe; its (path, size, sha256)."""
        ...

    def read_checkpoint(self, rel_path: str) -> bytes:
        """A checkpoint's bytes as stored; FileNotFoundError where it is gone."""
        ...

    def checkpoint_files(self, job_id: str) -> list[StoredFile]:
        """The job's checkpoint files (partial ones too), oldest step first."""
        ...

    def put_segment(self, staged: Path, *, job_id: str, attempt: int, index: int, frames: int, duration_s: float) -> Artifact:
        """Store the staged segment file (a path from `staging(job_id, attempt, ".mp4")`, written
        by the executor) crash-safe as `<job>/segment-<attempt>-<index>.mp4`: its size and sha256
        measured from the staged bytes, then moved into place atomically (a crash leaves the whole
        file at its name or none). The staged file is gone afterwards. Its `Artifact` (path
        relative to the store, media type "video/mp4"); putting the same name again replaces it."""
        ...

    def segment_files(self, job_id: str) -> list[StoredFile]:
        """The job's segment files, by index then attempt."""
        ...

    def remove(self, rel_path: str) -> None:
        """Delete one file (`StoredFile.path`); a missing one is no error."""
        ...

    def measure(self, rel_path: str, *, hashed: bool = True) -> tuple[int | None, str | None]:
        """The file's (size, sha256) now; (None, None) if it is not there; sha256 None unless `hashed`."""
        ...

    def stat(self, rel_path: str) -> FileStat | None:
        """The file's size and version now, without reading it; None if it is not there."""
        ...

    def read(self, rel_path: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """The file's bytes `start`..`end` (inclusive; `end` None: to its end), chunk by chunk."""
        ...

    def local_file(self, rel_path: str) -> AbstractContextManager[Path]:
        """A local file with the file's bytes while the context lasts (FileNotFoundError: none)."""
        ...

    def url(self, rel_path: str, expires_s: int) -> str | None:
        """An address to fetch the file from directly for `expires_s` seconds; None where the store has none."""
        ...

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


def sha256_file(path: Path, chunk: int = CHUNK) -> str:
    """The file's sha256, hex, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
