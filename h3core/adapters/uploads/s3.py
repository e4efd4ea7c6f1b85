"""`S3UploadStore`: uploads kept in an S3-compatible object store, so a job admitted on one node
runs (and resumes) on any.

An upload is received as `LocalUploadStore` receives it, into this node's cache folder (streamed
within its limit, its leading bytes checked, probed), then put into the bucket at
`<prefix>/<id>` with its record as the object's metadata, and only then answered: an id a client
holds always names an object with its record. The cache keeps the receiving node's copy; another
node reads the record with a HEAD (`get`) and fetches the bytes into its own cache the first time
an executor asks for the file (`path`), through a temporary name, so a crash leaves no half file
under an upload's id. Nothing of a refused upload reaches the bucket.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import AsyncIterable
from pathlib import Path
from typing import Any

import anyio

from h3core.adapters.s3 import client_for, is_missing, parse_s3_url
from h3core.adapters.uploads.base import DEFAULT_MAX_PIXELS, DEFAULT_MAX_SAMPLES, DEFAULT_PROBES, Kind, Upload, is_upload_id
from h3core.adapters.uploads.local import LocalUploadStore

__all__ = ["S3UploadStore"]

_RECORD_KEY = "h3-upload"  # the object's metadata that holds the upload's record (JSON)


class S3UploadStore(LocalUploadStore):
    """Uploads in `s3://bucket/prefix`, each node's copies cached under `cache` (see the module);
    the limits as `LocalUploadStore`'s. `client`: a boto3 S3 client (default: from the environment)."""

    def __init__(
        self,
        url: str,
        cache: str | Path,
        limits: dict[Kind, int] | None = None,
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        probes: int = DEFAULT_PROBES,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        client: Any = None,
    ) -> None:
        super().__init__(cache, limits, max_pixels=max_pixels, probes=probes, max_samples=max_samples)
        self.bucket, self.prefix = parse_s3_url(url)
        self.url_text = url
        self.s3 = client if client is not None else client_for()

    def _key(self, upload_id: str) -> str:
        return f"{self.prefix}/{upload_id}" if self.prefix else upload_id

    async def put(self, content_type: str, chunks: AsyncIterable[bytes]) -> Upload:
        """Receive and check the upload into the cache (`LocalUploadStore.put`), then put it into
        the bucket with its record; a failed put forgets the cached copy (nothing half-kept)."""
        upload = await super().put(content_type, chunks)
        try:
            await anyio.to_thread.run_sync(self._put_object, upload)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._forget, upload.id)
            raise
        return upload

    def _put_object(self, upload: Upload) -> None:
        extra = {"Metadata": {_RECORD_KEY: upload.model_dump_json()}, "ContentType": upload.content_type}
        self.s3.upload_file(str(super().path(upload)), self.bucket, self._key(upload.id), ExtraArgs=extra)

    def _forget(self, upload_id: str) -> None:
        for name in (upload_id, f"{upload_id}.json"):
            (self.root / name).unlink(missing_ok=True)

    def get(self, upload_id: str) -> Upload | None:
        """The record of `upload_id`: this node's cached one, else the object's (a HEAD); None
        unless it is an id this store mints and the bucket holds it."""
        if not is_upload_id(upload_id):
            return None
        cached = super().get(upload_id)
        if cached is not None:
            return cached
        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=self._key(upload_id))
        except Exception as exc:
            if is_missing(exc):
                return None
            raise
        record = head.get("Metadata", {}).get(_RECORD_KEY)
        return Upload.model_validate(json.loads(record)) if record else None

    def path(self, upload: Upload) -> Path:
        """This node's copy of the upload, fetched from the bucket into the cache the first time."""
        local = super().path(upload)
        if local.exists():
            return local
        fd, name = tempfile.mkstemp(dir=self.root, prefix=f".{upload.id}.", suffix=".fetch")
        os.close(fd)
        try:
            try:
                self.s3.download_file(self.bucket, self._key(upload.id), name)
            except Exception as exc:
                if is_missing(exc):
                    raise FileNotFoundError(f"upload {upload.id} is gone from {self.url_text}") from None
                raise
            (self.root / f"{upload.id}.json").write_text(upload.model_dump_json())
            os.replace(name, local)
        finally:
            Path(name).unlink(missing_ok=True)
        return local
