"""Copy a folder artifact store into an object store, every file checked: what `h3core
migrate-artifacts` does when a deployment moves its videos to a bucket.

Committed videos go with their records (as the objects' metadata), checkpoints and segments as
they are (a segment's record is its job's log), and the marks of deleted videos with their times.
A video is copied only where its file is still the one its record describes (a damaged one is
reported, not spread); each copy is read back from the bucket and its sha256 compared with the
source's. A file already in the bucket with the same sha256 is skipped, so a migration cut short
is run again. Staged files (`.part`) are a node's unfinished work and stay behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from h3core.adapters.artifacts.local import LocalArtifactStore
from h3core.adapters.artifacts.s3 import S3ArtifactStore
from h3core.domain.adoption import mismatch
from h3core.domain.ids import is_job_id

__all__ = ["Migration", "migrate"]


@dataclass
class Migration:
    """What a migration did: each list holds (path, a word on it)."""

    copied: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


def migrate(source: LocalArtifactStore, target: S3ArtifactStore, *, dry_run: bool = False) -> Migration:
    """Copy every committed video, checkpoint, segment and deletion mark of `source` into `target`,
    verifying each copy's sha256 (the module says what is copied and what is not)."""
    out = Migration()
    files = [f for f in source.files() if not f.partial]
    for job_id, attempt in sorted({(f.job_id, f.attempt) for f in files if f.checkpoint is None and f.segment is None}):
        found = source.committed(job_id, attempt)
        if found is None:
            continue  # no record: nothing this attempt committed
        a = found.recorded
        if source.video_deleted_at(job_id) is not None:
            continue  # deleted as a whole (its mark is copied below): no video of it is served again
        if (when := source.deleted_at(a.path)) is not None:
            if target.deleted_at(a.path) is not None:
                out.skipped.append((a.path + ".deleted", "already in the bucket"))
            else:
                _copy_mark(out, a.path + ".deleted", dry_run, lambda when=when, path=a.path: target.mark_deleted(path, when))
            continue
        if problem := mismatch(a, found.size, found.sha256):
            out.failed.append((a.path, f"not copied: {problem} in {source.root}"))
            continue
        there = target.recorded(a.path)
        if there is not None and there.sha256 == a.sha256:
            out.skipped.append((a.path, "already in the bucket with its record"))
            continue
        if not dry_run:
            target.put_committed(source.resolve(a.path), a)
            _check(out, target, a.path, a.bytes, a.sha256)
        else:
            out.copied.append((a.path, f"would copy {a.bytes} bytes"))
    for f in files:
        if f.checkpoint is None and f.segment is None:
            continue
        size, sha = source.measure(f.path)
        if size is None or sha is None:
            continue  # removed meanwhile
        if target.measure(f.path) == (size, sha):
            out.skipped.append((f.path, "already in the bucket"))
        elif dry_run:
            out.copied.append((f.path, f"would copy {size} bytes"))
        else:
            if f.checkpoint is not None:
                target.put_checkpoint(f.job_id, f.attempt, f.checkpoint, source.read_checkpoint(f.path))
            else:
                target.put_file(source.resolve(f.path), f.path)
            _check(out, target, f.path, size, sha)
    for job_id in sorted(d.name for d in source.root.iterdir() if d.is_dir() and is_job_id(d.name)):
        if (when := source.video_deleted_at(job_id)) is None:
            continue
        if target.video_deleted_at(job_id) is not None:
            out.skipped.append((f"{job_id}/video.deleted", "already in the bucket"))
        else:
            _copy_mark(
                out, f"{job_id}/video.deleted", dry_run, lambda when=when, job=job_id: target.mark_video_deleted(job, when)
            )
    return out


def _check(out: Migration, target: S3ArtifactStore, path: str, size: int, sha: str) -> None:
    """Read the copy back: it counts as copied only with the source's size and sha256."""
    now = target.measure(path)
    if now == (size, sha):
        out.copied.append((path, f"{size} bytes, sha256 {sha[:12]}... verified"))
    else:
        out.failed.append((path, f"the copy reads back as {now[0]} bytes, sha256 {now[1]}, not {size} and {sha}"))


def _copy_mark(out: Migration, path: str, dry_run: bool, write) -> None:
    if dry_run:
        out.copied.append((path, "would record the deletion"))
    else:
        out.copied.append((path, f"deleted at {write().isoformat()}"))
