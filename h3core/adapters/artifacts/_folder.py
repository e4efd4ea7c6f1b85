"""What every artifact store on a folder shares: one folder per job under a root, an attempt's
files named `attempt-N.*`, a job's checkpoints and segments named apart from them, paths checked
to stay under the root."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from h3core.adapters.artifacts.base import CHUNK, FileStat, media_type, sha256_file
from h3core.domain.adoption import Expected, FoundArtifact
from h3core.domain.events import Artifact
from h3core.domain.ids import is_job_id
from h3core.domain.retention import StoredFile

ATTEMPT_FILE = re.compile(r"^attempt-(\d{1,9})\.")
# A denoising checkpoint: `checkpoint-<attempt>-<step>.ckpt`, apart from the attempt's own files so
# that discarding a failed attempt keeps what the next one continues from.
CHECKPOINT_FILE = re.compile(r"^checkpoint-(\d{1,9})-(\d{1,9})\.ckpt(\.part)?$")
# A long video's segment: `segment-<attempt>-<index>.mp4`, the job's as checkpoints are (a retry
# continues after the segments done, which a final join reads).
SEGMENT_FILE = re.compile(r"^segment-(\d{1,9})-(\d{1,9})\.mp4(\.part)?$")
PART = ".part"  # a staged file's suffix: not a video until its commit renames it


def fsync_dir(path: Path) -> None:
    """Make the names in folder `path` durable (a rename into it, a file made in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AttemptFolders:
    """Staging, listing, measuring and resolving the files of attempts under `root`."""

    def __init__(self, root: str | Path, *, create: bool = True) -> None:
        self.root = Path(root).resolve()
        if create:
            self.root.mkdir(parents=True, exist_ok=True)

    def _dir(self, job_id: str) -> Path:
        if not is_job_id(job_id):
            raise ValueError(f"job id {job_id!r} is not a safe artifact name")
        return self.root / job_id

    def staging(self, job_id: str, attempt: int, suffix: str = ".mp4") -> Path:
        d = self._dir(job_id)
        d.mkdir(parents=True, exist_ok=True)
        return d / f"attempt-{attempt}{suffix}{PART}"

    def _record_of(self, staged: Path, *, frames: int, duration_s: float, media_type: str) -> tuple[Path, Artifact]:
        """Where a staged video goes when committed, and the record of what it holds there."""
        final = staged.with_name(staged.name.removesuffix(PART))
        artifact = Artifact(
            path=str(final.relative_to(self.root)),
            bytes=staged.stat().st_size,
            sha256=sha256_file(staged),
            frames=frames,
            duration_s=duration_s,
            media_type=media_type,
        )
        return final, artifact

    def commit(
        self, staged: Path, *, job_id: str, attempt: int, frames: int, duration_s: float, media_type: str = "video/mp4"
    ) -> Artifact:
        """Each store records and renames in its own way (`LocalArtifactStore`, `MemoryArtifactStore`)."""
        raise NotImplementedError

    def committed(self, job_id: str, attempt: int, *, expect: Expected | None = None) -> FoundArtifact | None:
        """The recorded video (`_recorded`, each store's own) with what its file holds now; with
        `expect`, a whole staged video a crash left before its record, committed first; None if
        none was committed."""
        recorded = self._recorded(job_id, attempt)
        if recorded is None and expect is not None:
            recorded = self._commit_whole_staged(job_id, attempt, expect)
        if recorded is None:
            return None
        size, sha = self.measure(recorded.path)
        return FoundArtifact(attempt=attempt, recorded=recorded, size=size, sha256=sha)

    def _recorded(self, job_id: str, attempt: int) -> Artifact | None:
        """Each store keeps its records in its own way."""
        raise NotImplementedError

    def _commit_whole_staged(self, job_id: str, attempt: int, expect: Expected) -> Artifact | None:
        """The commit a crash stopped before its record, made now: the attempt's staged video,
        where it reads whole with the frames and length `expect` says (its encoder closed it), is
        recorded with its true size and sha256 and renamed into place. None where no staged file
        does: one cut short stays staged, for recovery to discard."""
        from h3core.adapters.video_probe import ENDS_CHECKED, probe_video  # PyAV, where installed

        for number, rel in self._attempt_files(self._dir(job_id)):
            name = rel.removesuffix(PART)
            suffix = Path(name).suffix
            # Only a container whose structure shows a cut: a file of another kind (or a record's
            # own staging) might read as whole where it is not.
            if number != attempt or name == rel or suffix not in ENDS_CHECKED:
                continue
            staged = self.root / rel
            probed = probe_video(staged, suffix)
            if probed is None or not expect.holds(*probed):
                continue
            return self.commit(
                staged,
                job_id=job_id,
                attempt=attempt,
                frames=expect.frames,
                duration_s=expect.duration_s,
                media_type=media_type(name),
            )
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
                out.append(StoredFile(job_id, attempt, rel, path.stat().st_size, rel.endswith(PART), sha256_file(path)))
            except FileNotFoundError:
                continue  # removed meanwhile
        return out

    def discard(self, job_id: str, attempt: int) -> list[StoredFile]:
        """Remove every file of the attempt (partial, committed or record); what each one was."""
        removed = self.attempt_files(job_id, attempt)
        for f in removed:
            self.remove(f.path)
        return removed

    def put_checkpoint(self, job_id: str, attempt: int, step: int, data: bytes) -> tuple[str, int, str]:
        """Write a checkpoint crash-safe: staged, fsynced, renamed into place, its folder synced.
        (path, size, sha256) of what is now durably there."""
        d = self._dir(job_id)
        d.mkdir(parents=True, exist_ok=True)
        final = d / f"checkpoint-{attempt}-{step}.ckpt"
        staged = final.with_name(final.name + PART)
        with open(staged, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staged, final)
        fsync_dir(d)
        return str(final.relative_to(self.root)), len(data), hashlib.sha256(data).hexdigest()

    def read_checkpoint(self, rel_path: str) -> bytes:
        """A checkpoint's bytes as stored (FileNotFoundError where it is gone)."""
        path = self.resolve(rel_path)
        if CHECKPOINT_FILE.match(path.name) is None or path.name.endswith(PART):
            raise ValueError(f"{rel_path!r} is not a checkpoint")
        return path.read_bytes()

    def checkpoint_files(self, job_id: str) -> list[StoredFile]:
        """The job's checkpoint files (written or being written), oldest step first."""
        return self._numbered(job_id, CHECKPOINT_FILE)

    def put_segment(self, staged: Path, *, job_id: str, attempt: int, index: int, frames: int, duration_s: float) -> Artifact:
        """Move the staged segment into place crash-safe: measured, fsynced, renamed, its folder
        synced (a crash leaves the whole segment at its name, or none). What is now there."""
        artifact = self._segment_of(staged, job_id=job_id, attempt=attempt, index=index, frames=frames, duration_s=duration_s)
        with open(staged, "rb") as f:
            os.fsync(f.fileno())
        final = self.root / artifact.path
        os.replace(staged, final)
        fsync_dir(final.parent)
        return artifact

    def _segment_of(self, staged: Path, *, job_id: str, attempt: int, index: int, frames: int, duration_s: float) -> Artifact:
        """The record of the staged segment under its own name (`SEGMENT_FILE`), measured from its bytes."""
        self._dir(job_id)
        if attempt < 0 or index < 0:  # a name `SEGMENT_FILE` would not list: a file no one would ever remove
            raise ValueError(f"segment {index} of attempt {attempt}: both must be at least 0")
        return Artifact(
            path=f"{job_id}/segment-{attempt}-{index}.mp4",
            bytes=staged.stat().st_size,
            sha256=sha256_file(staged),
            frames=frames,
            duration_s=duration_s,
            media_type="video/mp4",
        )

    def segment_files(self, job_id: str) -> list[StoredFile]:
        """The job's segment files, by index then attempt."""
        return self._numbered(job_id, SEGMENT_FILE)

    def _numbered(self, job_id: str, pattern: re.Pattern[str]) -> list[StoredFile]:
        """The job's files `pattern` names (`CHECKPOINT_FILE`: a step; `SEGMENT_FILE`: an index),
        by that number then attempt."""
        d = self._dir(job_id)
        try:
            names = sorted(e.name for e in os.scandir(d) if e.is_file(follow_symlinks=False))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if (m := pattern.match(name)) is None:
                continue
            try:
                size = (d / name).stat().st_size
            except FileNotFoundError:
                continue  # removed meanwhile
            attempt, number = int(m.group(1)), int(m.group(2))
            step, index = (number, None) if pattern is CHECKPOINT_FILE else (None, number)
            found = StoredFile(job_id, attempt, f"{job_id}/{name}", size, name.endswith(PART), checkpoint=step, segment=index)
            out.append((number, attempt, found))
        return [f for _, _, f in sorted(out, key=lambda t: t[:2])]

    def _attempt_files(self, d: Path) -> list[tuple[int, str]]:
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except FileNotFoundError:
            return []
        out = []
        for e in entries:
            m = ATTEMPT_FILE.match(e.name)
            if m is not None and e.is_file(follow_symlinks=False):
                out.append((int(m.group(1)), f"{d.name}/{e.name}"))
        return out

    def files(self) -> list[StoredFile]:
        """Every attempt file, checkpoint and segment under a job's folder; anything else in the
        store is not ours to judge."""
        out = []
        for d in sorted(self.root.iterdir()):
            if not (d.is_dir() and not d.is_symlink() and is_job_id(d.name)):
                continue
            for attempt, rel in self._attempt_files(d):
                try:
                    size = (self.root / rel).stat().st_size
                except FileNotFoundError:
                    continue  # removed meanwhile
                out.append(StoredFile(job_id=d.name, attempt=attempt, path=rel, bytes=size, partial=rel.endswith(PART)))
            out += self.checkpoint_files(d.name) + self.segment_files(d.name)
        return out

    def staged_here(self) -> list[StoredFile]:
        """None: a folder store stages in its own folder, where `files`, `discard` and gc see it."""
        return []

    def remove(self, rel_path: str) -> None:
        self.resolve(rel_path).unlink(missing_ok=True)

    def resolve(self, rel_path: str) -> Path:
        """The local file of `rel_path`; `ValueError` for a path leaving the store."""
        path = (self.root / rel_path).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"artifact path {rel_path!r} leaves the artifact store")
        return path

    def stat(self, rel_path: str) -> FileStat | None:
        """Size and version (inode, size, modification time) of a regular file; None for none."""
        try:
            st = self.resolve(rel_path).stat()
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return FileStat(st.st_size, f"{st.st_ino}-{st.st_size}-{st.st_mtime_ns}")

    def read(self, rel_path: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """The file's bytes `start`..`end` (inclusive), read a chunk at a time as they are taken."""
        path = self.resolve(rel_path)
        f = open(path, "rb")  # opened here, not at the first `next`: a missing file raises now

        def chunks() -> Iterator[bytes]:
            with f:
                f.seek(start)
                remaining = None if end is None else end - start + 1
                while remaining is None or remaining > 0:
                    block = f.read(CHUNK if remaining is None else min(CHUNK, remaining))
                    if not block:
                        return
                    if remaining is not None:
                        remaining -= len(block)
                    yield block

        return chunks()

    @contextmanager
    def local_file(self, rel_path: str) -> Iterator[Path]:
        """The file itself (it is local)."""
        path = self.resolve(rel_path)
        if not path.is_file():
            raise FileNotFoundError(rel_path)
        yield path

    def url(self, rel_path: str, expires_s: int) -> str | None:
        """None: a folder has no address of its own (the service sends its files)."""
        self.resolve(rel_path)
        return None
