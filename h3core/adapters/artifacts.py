"""Where finished videos live. Addressed by job id only: no client path reaches the disk.

Contract (`ArtifactStore`): `staging(job_id, attempt)` gives a fresh path to write to;
`commit(...)` moves it into place atomically and returns the `Artifact` (size and sha256 of
what is on disk); `resolve(artifact.path)` gives the file back, refusing any path that would
leave the store's root. `delete(artifact.path)` removes a committed file on purpose and records
when, so that `deleted_at` tells a deleted file from a lost one; the job's log is untouched.
"""

from __future__ import annotations

import hashlib
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

from h3core.domain.events import Artifact

_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_DELETED = ".deleted"  # beside the file's name: when it was deleted on purpose (ISO 8601)


@runtime_checkable
class ArtifactStore(Protocol):
    def staging(self, job_id: str, attempt: int, suffix: str = ".mp4") -> Path: ...

    def commit(
        self, staged: Path, *, job_id: str, attempt: int, frames: int, duration_s: float, media_type: str = "video/mp4"
    ) -> Artifact: ...

    def resolve(self, rel_path: str) -> Path: ...

    def delete(self, rel_path: str) -> datetime:
        """Remove the file; return when it was deleted (the first deletion's time, if deleted before)."""
        ...

    def deleted_at(self, rel_path: str) -> datetime | None:
        """When `delete` removed the file; None if it never did."""
        ...


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class LocalArtifactStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _dir(self, job_id: str) -> Path:
        if not _SAFE.fullmatch(job_id):
            raise ValueError(f"job id {job_id!r} is not a safe artifact name")
        return self.root / job_id

    def staging(self, job_id: str, attempt: int, suffix: str = ".mp4") -> Path:
        d = self._dir(job_id)
        d.mkdir(parents=True, exist_ok=True)
        return d / f"attempt-{attempt}{suffix}.part"

    def commit(
        self, staged: Path, *, job_id: str, attempt: int, frames: int, duration_s: float, media_type: str = "video/mp4"
    ) -> Artifact:
        final = staged.with_name(staged.name.removesuffix(".part"))
        with open(staged, "rb") as f:
            os.fsync(f.fileno())
        os.replace(staged, final)
        return Artifact(
            path=str(final.relative_to(self.root)),
            bytes=final.stat().st_size,
            sha256=sha256_file(final),
            frames=frames,
            duration_s=duration_s,
            media_type=media_type,
        )

    def resolve(self, rel_path: str) -> Path:
        path = (self.root / rel_path).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"artifact path {rel_path!r} leaves the artifact store")
        return path

    def delete(self, rel_path: str) -> datetime:
        path = self.resolve(rel_path)
        when = self.deleted_at(rel_path)
        if when is None:
            # The record first, then the file: no file is ever gone without saying it was deleted.
            when = datetime.now(UTC)
            marker = path.with_name(path.name + _DELETED)
            part = marker.with_name(marker.name + ".part")
            marker.parent.mkdir(parents=True, exist_ok=True)
            with open(part, "w") as f:
                f.write(when.isoformat())
                f.flush()
                os.fsync(f.fileno())
            os.replace(part, marker)
        path.unlink(missing_ok=True)
        return when

    def deleted_at(self, rel_path: str) -> datetime | None:
        path = self.resolve(rel_path)
        try:
            return datetime.fromisoformat(path.with_name(path.name + _DELETED).read_text())
        except FileNotFoundError:
            return None
