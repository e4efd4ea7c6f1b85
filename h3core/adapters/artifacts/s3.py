"""`S3ArtifactStore`: the artifact store in an S3-compatible object store, shared by every node.

Objects sit under `s3://bucket/prefix/` with the local store's names (`<job>/attempt-N.mp4`,
`<job>/checkpoint-A-S.ckpt`, `<job>/segment-A-I.mp4`), so a path recorded in an event means the
same file in either store. A video is staged on this node's disk (encoders write files; `staging`
is a local folder), and its commit uploads it with its record as the object's metadata: an object
store makes an object visible whole or not at all, so the video and its record appear together, at
any moment a crash picks (a segment goes up the same way, its record in its job's log). A crash in
the upload leaves a multipart upload that never completes: every commit, discard and
`abort_uploads` (gc) aborts those it finds, so no orphaned part stays billed. A crash after the
upload, before its event, is adopted by `committed`; one before the upload, the staged video whole
on this disk, is committed by `committed(expect=...)` as the local store does.

Deletion marks are objects beside the video (`….deleted`, `<job>/video.deleted`), the first time
kept. The client is boto3 (bench/RESULTS.md, s3_client): endpoint, region and credentials come
the way every AWS tool takes them (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_REGION`, a profile), large objects go up as multipart uploads streamed from the staged file.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from h3core.adapters.artifacts._folder import ATTEMPT_FILE, CHECKPOINT_FILE, PART, SEGMENT_FILE, AttemptFolders
from h3core.adapters.artifacts.base import CHUNK, FileStat, media_type
from h3core.adapters.s3 import client_for, is_missing, parse_s3_url
from h3core.domain.events import Artifact
from h3core.domain.ids import is_job_id
from h3core.domain.retention import StoredFile

__all__ = ["S3ArtifactStore"]

_RECORD_KEY = "h3-record"  # the object's metadata that holds its commit's record (JSON)
_DELETED = ".deleted"
_VIDEO_DELETED = "video.deleted"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
MULTIPART_BYTES = 16 << 20  # above this a video goes up in parts of this size, streamed from its file


class S3ArtifactStore(AttemptFolders):
    """Videos, checkpoints and segments in `s3://bucket/prefix`, staged under `staging` on this
    node's disk (see the module; none given: a temporary folder of its own). `client`: a boto3 S3
    client (default: one from the environment); a video larger than `part_bytes` goes up in parts
    of that size."""

    def __init__(
        self, url: str, staging: str | Path | None = None, *, client: Any = None, part_bytes: int = MULTIPART_BYTES
    ) -> None:
        # No staging folder (a command that stages nothing): one of this object's own, removed with it.
        self._own_staging = None
        if staging is None:
            self._own_staging = tempfile.TemporaryDirectory(prefix="h3core-staging-")
            staging = self._own_staging.name
        super().__init__(staging)
        self.bucket, self.prefix = parse_s3_url(url)
        self.url_text = url
        self.part_bytes = max(part_bytes, 5 << 20)  # S3's least part (but the last)
        self.s3 = client if client is not None else client_for()

    def present(self) -> bool:
        """Whether the bucket is there (and these credentials may read it)."""
        try:
            self.s3.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            if self._missing(exc) or "403" in str(exc) or "NoSuchBucket" in str(exc):
                return False
            raise
        return True

    def __repr__(self) -> str:
        return f"S3ArtifactStore({self.url_text!r}, staging={str(self.root)!r})"

    # -- names ------------------------------------------------------------------------------

    def _key(self, rel_path: str) -> str:
        """The object key of a store path `<job>/<name>`; ValueError for anything else."""
        job, sep, name = rel_path.partition("/")
        if not sep or not is_job_id(job) or _NAME.match(name) is None or name in (".", ".."):
            raise ValueError(f"artifact path {rel_path!r} leaves the artifact store")
        return self._job_prefix(job) + name

    def _job_prefix(self, job_id: str) -> str:
        if not is_job_id(job_id):
            raise ValueError(f"job id {job_id!r} is not a safe artifact name")
        return f"{self.prefix}/{job_id}/" if self.prefix else f"{job_id}/"

    def _rel(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def _staged(self, rel_path: str) -> bool:
        return rel_path.endswith(PART)

    # -- S3 calls ---------------------------------------------------------------------------

    def _missing(self, exc: Exception) -> bool:
        return is_missing(exc)

    def _head(self, key: str) -> dict[str, Any] | None:
        try:
            return self.s3.head_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            if self._missing(exc):
                return None
            raise

    def _list(self, prefix: str) -> Iterator[dict[str, Any]]:
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            yield from page.get("Contents", [])

    def _uploads(self, prefix: str) -> Iterator[dict[str, Any]]:
        """Multipart uploads begun under `prefix` and neither completed nor aborted."""
        for page in self.s3.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix):
            yield from page.get("Uploads", [])

    def _abort(self, upload: dict[str, Any]) -> None:
        try:
            self.s3.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        except Exception as exc:
            if not self._missing(exc):  # gone meanwhile: what was asked
                raise

    def _abort_unfinished(self, key: str) -> None:
        """Abort the unfinished uploads of exactly `key` (a crash's, before its name is written again)."""
        for upload in list(self._uploads(key)):
            if upload["Key"] == key:
                self._abort(upload)

    def abort_uploads(self, job_id: str | None = None) -> list[str]:
        """Abort every unfinished multipart upload (of one job, or of the whole store): what a
        crash in an upload left. The keys aborted, as store paths."""
        prefix = self._job_prefix(job_id) if job_id is not None else (f"{self.prefix}/" if self.prefix else "")
        aborted = []
        for upload in list(self._uploads(prefix)):
            self._abort(upload)
            aborted.append(self._rel(upload["Key"]))
        return aborted

    def _get(self, key: str, **ranged: str) -> Any:
        """The object's body (a stream to read and close); None where there is no such object."""
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=key, **ranged)["Body"]
        except Exception as exc:
            if self._missing(exc):
                return None
            raise

    def _sha256(self, key: str) -> str | None:
        h = hashlib.sha256()
        body = self._get(key)
        if body is None:
            return None
        with body:
            for block in body.iter_chunks(CHUNK):
                h.update(block)
        return h.hexdigest()

    # -- staging and commit -----------------------------------------------------------------

    def commit(
        self, staged: Path, *, job_id: str, attempt: int, frames: int, duration_s: float, media_type: str = "video/mp4"
    ) -> Artifact:
        """Upload the staged video with its record as the object's metadata (both appear at
        once), then remove the staged file. Unfinished uploads of the same name (a crash's) are
        aborted first."""
        self._job_prefix(job_id)
        final, artifact = self._record_of(staged, frames=frames, duration_s=duration_s, media_type=media_type)
        self._abort_unfinished(self._key(artifact.path))
        self.put_committed(staged, artifact)
        staged.unlink(missing_ok=True)
        return artifact

    def put_committed(self, local: Path, artifact: Artifact) -> None:
        """Upload `local` as the committed video `artifact` records (its record as the object's
        metadata): a commit's upload, or a video a folder store committed, copied here."""
        self._upload(local, self._key(artifact.path), artifact.media_type, {_RECORD_KEY: artifact.model_dump_json()})

    def put_file(self, local: Path, rel_path: str) -> None:
        """Upload `local` as the object at `rel_path`, as it is, `local` left where it is (a
        segment, whose record is its job's log: `put_segment`'s upload, or one a folder store
        holds, copied here). Unfinished uploads of the same name (a crash's) are aborted first."""
        key = self._key(rel_path)
        self._abort_unfinished(key)
        self._upload(local, key, media_type(rel_path))

    def _upload(self, local: Path, key: str, content_type: str, metadata: dict[str, str] | None = None) -> None:
        """`local` to `key`, in parts of `part_bytes` streamed from the file where it is larger."""
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(multipart_threshold=self.part_bytes, multipart_chunksize=self.part_bytes, max_concurrency=4)
        extra: dict[str, Any] = {"ContentType": content_type}
        if metadata is not None:
            extra["Metadata"] = metadata
        self.s3.upload_file(str(local), self.bucket, key, ExtraArgs=extra, Config=config)

    def recorded(self, rel_path: str) -> Artifact | None:
        """The record an object carries (None: no such object, or one without a record)."""
        head = self._head(self._key(rel_path))
        record = (head or {}).get("Metadata", {}).get(_RECORD_KEY)
        return Artifact.model_validate_json(record) if record else None

    def _recorded(self, job_id: str, attempt: int) -> Artifact | None:
        """The record in the metadata of the attempt's object (`committed` measures it as it is now)."""
        for obj in self._list(self._job_prefix(job_id) + f"attempt-{attempt}."):
            name = obj["Key"].rsplit("/", 1)[-1]
            if name.endswith(_DELETED):
                continue
            head = self._head(obj["Key"])
            record = (head or {}).get("Metadata", {}).get(_RECORD_KEY)
            if record is None:
                continue
            try:
                return Artifact.model_validate_json(record)
            except (ValidationError, ValueError):
                return None  # a record we cannot trust: nothing was committed
        return None

    # -- listing and cleanup ----------------------------------------------------------------

    def attempt_files(self, job_id: str, attempt: int) -> list[StoredFile]:
        """The attempt's objects (a video's sha256 from its record), unfinished uploads and staged files."""
        out = super().attempt_files(job_id, attempt)  # staged on this node
        for obj in self._list(self._job_prefix(job_id) + f"attempt-{attempt}."):
            rel = self._rel(obj["Key"])
            head = self._head(obj["Key"]) or {}
            record = head.get("Metadata", {}).get(_RECORD_KEY)
            sha = Artifact.model_validate_json(record).sha256 if record else self._sha256(obj["Key"])
            out.append(StoredFile(job_id, attempt, rel, obj["Size"], False, sha))
        for upload in self._uploads(self._job_prefix(job_id) + f"attempt-{attempt}."):
            out.append(StoredFile(job_id, attempt, self._rel(upload["Key"]) + PART, 0, True))
        return sorted(out, key=lambda f: f.path)

    def discard(self, job_id: str, attempt: int) -> list[StoredFile]:
        """Remove the attempt's objects, abort its unfinished uploads, remove its staged files."""
        removed = self.attempt_files(job_id, attempt)
        for f in removed:
            self.remove(f.path)
        return removed

    def files(self) -> list[StoredFile]:
        """Every attempt object, checkpoint and segment in the bucket under the prefix, every
        unfinished upload (partial, as `<path>.part`), and what this node has staged."""
        listed = self.staged_here() + self._listed(f"{self.prefix}/" if self.prefix else "")
        return sorted(listed, key=lambda f: (f.job_id, f.path))

    def _listed(self, prefix: str) -> list[StoredFile]:
        """The objects and unfinished uploads under `prefix` named as the store names its files."""
        objects = [self._parse(self._rel(obj["Key"]), obj["Size"]) for obj in self._list(prefix)]
        uploads = [self._parse(self._rel(upload["Key"]), 0, partial=True) for upload in self._uploads(prefix)]
        return [f for f in objects + uploads if f is not None]

    def staged_here(self) -> list[StoredFile]:
        """What this node has staged (its own folder, a folder per job as locally): no other node sees it."""
        out = []
        for d in sorted(self.root.iterdir()):
            if d.is_dir() and not d.is_symlink() and is_job_id(d.name):
                for attempt, rel in self._attempt_files(d):
                    size = self.measure(rel, hashed=False)[0]
                    if size is not None:
                        out.append(StoredFile(d.name, attempt, rel, size, True))
        return out

    def _parse(self, rel: str, size: int, *, partial: bool = False) -> StoredFile | None:
        """The file at store path `rel` (an unfinished upload's: `partial`, named `<rel>.part`);
        None for a name that is not one of the store's files (a deletion mark, another's object)."""
        job, sep, name = rel.partition("/")
        if not sep or not is_job_id(job) or name.endswith(_DELETED):
            return None
        path = rel + PART if partial else rel
        if m := CHECKPOINT_FILE.match(name):
            return StoredFile(job, int(m.group(1)), path, size, partial, checkpoint=int(m.group(2)))
        if m := SEGMENT_FILE.match(name):
            return StoredFile(job, int(m.group(1)), path, size, partial, segment=int(m.group(2)))
        if m := ATTEMPT_FILE.match(name):
            return StoredFile(job, int(m.group(1)), path, size, partial)
        return None

    def remove(self, rel_path: str) -> None:
        """Delete one object (an unfinished upload, named `<path>.part`: abort it; a staged file:
        remove it from this node's disk); a missing one is no error."""
        if self._staged(rel_path):
            super().remove(rel_path)
            self._abort_unfinished(self._key(rel_path.removesuffix(PART)))
            return
        self.s3.delete_object(Bucket=self.bucket, Key=self._key(rel_path))

    # -- checkpoints ------------------------------------------------------------------------

    def put_checkpoint(self, job_id: str, attempt: int, step: int, data: bytes) -> tuple[str, int, str]:
        """One PUT: the object appears whole or not at all."""
        rel = f"{job_id}/checkpoint-{attempt}-{step}.ckpt"
        self.s3.put_object(Bucket=self.bucket, Key=self._key(rel), Body=data)
        return rel, len(data), hashlib.sha256(data).hexdigest()

    def read_checkpoint(self, rel_path: str) -> bytes:
        """The checkpoint object's bytes (FileNotFoundError where it is gone)."""
        key = self._key(rel_path)
        if CHECKPOINT_FILE.match(rel_path.rsplit("/", 1)[-1]) is None or rel_path.endswith(PART):
            raise ValueError(f"{rel_path!r} is not a checkpoint")
        body = self._get(key)
        if body is None:
            raise FileNotFoundError(rel_path)
        with body:
            data: bytes = body.read()
        return data

    def checkpoint_files(self, job_id: str) -> list[StoredFile]:
        """The job's checkpoint objects, oldest step first."""
        found = self._listed(self._job_prefix(job_id) + "checkpoint-")
        return sorted((f for f in found if f.checkpoint is not None), key=lambda f: (f.checkpoint or 0, f.attempt))

    # -- segments ---------------------------------------------------------------------------

    def put_segment(self, staged: Path, *, job_id: str, attempt: int, index: int, frames: int, duration_s: float) -> Artifact:
        """Upload the staged segment (an object appears whole or not at all), then remove the
        staged file."""
        artifact = self._segment_of(staged, job_id=job_id, attempt=attempt, index=index, frames=frames, duration_s=duration_s)
        self.put_file(staged, artifact.path)
        staged.unlink(missing_ok=True)
        return artifact

    def segment_files(self, job_id: str) -> list[StoredFile]:
        """The job's segment objects and unfinished uploads of them (partial), by index then attempt."""
        found = self._listed(self._job_prefix(job_id) + "segment-")
        return sorted((f for f in found if f.segment is not None), key=lambda f: (f.segment or 0, f.attempt))

    # -- reading ----------------------------------------------------------------------------

    def measure(self, rel_path: str, *, hashed: bool = True) -> tuple[int | None, str | None]:
        """(size, sha256) of the object now, reading it for the sha256; a staged file's on this disk."""
        if self._staged(rel_path):
            return super().measure(rel_path, hashed=hashed)
        key = self._key(rel_path)
        head = self._head(key)
        if head is None:
            return None, None
        return int(head["ContentLength"]), self._sha256(key) if hashed else None

    def stat(self, rel_path: str) -> FileStat | None:
        """Size and ETag (a new one for every write of the key) from a HEAD."""
        head = self._head(self._key(rel_path))
        if head is None:
            return None
        return FileStat(int(head["ContentLength"]), str(head.get("ETag", "")).strip('"'))

    def read(self, rel_path: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """A ranged GET, its body read a chunk at a time as the chunks are taken."""
        key = self._key(rel_path)
        ranged = {"Range": f"bytes={start}-{'' if end is None else end}"} if start or end is not None else {}
        body = self._get(key, **ranged)
        if body is None:
            raise FileNotFoundError(rel_path)

        def chunks() -> Iterator[bytes]:
            with body:
                yield from body.iter_chunks(CHUNK)

        return chunks()

    @contextmanager
    def local_file(self, rel_path: str) -> Iterator[Path]:
        """The object downloaded into a temporary file on this node's disk, removed afterwards."""
        key = self._key(rel_path)
        (self.root / ".downloads").mkdir(exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.root / ".downloads", suffix=Path(rel_path).suffix)
        os.close(fd)
        path = Path(name)
        try:
            try:
                self.s3.download_file(self.bucket, key, name)
            except Exception as exc:
                if self._missing(exc):
                    raise FileNotFoundError(rel_path) from None
                raise
            yield path
        finally:
            path.unlink(missing_ok=True)

    def url(self, rel_path: str, expires_s: int) -> str | None:
        """A presigned GET of the object, valid for `expires_s` seconds."""
        url: str = self.s3.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self._key(rel_path)}, ExpiresIn=expires_s
        )
        return url

    def resolve(self, rel_path: str) -> Path:
        """Only staged files are local: ValueError for anything else (use `read` or `local_file`)."""
        if not self._staged(rel_path):
            self._key(rel_path)
            raise ValueError(f"{rel_path!r} is an object in {self.url_text}, not a local file")
        return super().resolve(rel_path)

    # -- deletion on purpose ----------------------------------------------------------------

    def _mark(self, key: str, at: datetime | None = None) -> datetime:
        """The time in the mark object at `key`, written (`at`, else now) unless one is there
        (the first time kept)."""
        when = self._marked(key)
        if when is None:
            when = at or datetime.now(UTC)
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=when.isoformat().encode())
        return when

    def mark_deleted(self, rel_path: str, at: datetime) -> datetime:
        """Record that the video at `rel_path` was deleted at `at` (a folder store's mark, copied)."""
        return self._mark(self._key(rel_path) + _DELETED, at)

    def mark_video_deleted(self, job_id: str, at: datetime) -> datetime:
        """Record that the job's video was deleted as a whole at `at` (copied from a folder store)."""
        return self._mark(self._job_prefix(job_id) + _VIDEO_DELETED, at)

    def _marked(self, key: str) -> datetime | None:
        body = self._get(key)
        if body is None:
            return None
        with body:
            return datetime.fromisoformat(body.read().decode())

    def delete(self, rel_path: str) -> datetime:
        """Mark the video deleted (the first time kept), then delete its object."""
        key = self._key(rel_path)
        when = self._mark(key + _DELETED)
        self.s3.delete_object(Bucket=self.bucket, Key=key)
        return when

    def deleted_at(self, rel_path: str) -> datetime | None:
        """When `delete` removed the video, as its mark says; None if it never did."""
        return self._marked(self._key(rel_path) + _DELETED)

    def delete_video(self, job_id: str) -> datetime:
        """Mark the job's video deleted as a whole (the first time kept)."""
        return self._mark(self._job_prefix(job_id) + _VIDEO_DELETED)

    def video_deleted_at(self, job_id: str) -> datetime | None:
        """When `delete_video` marked the job's video deleted; None if it never did."""
        return self._marked(self._job_prefix(job_id) + _VIDEO_DELETED)
