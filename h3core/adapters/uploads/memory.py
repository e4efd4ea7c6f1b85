"""`MemoryUploadStore`: a fake that honours the upload-store contract while its process lives.

The bytes and records are kept in memory, checked by the very checks `LocalUploadStore` applies
(type, leading bytes, size while streaming, minted ids, probing from the bytes themselves). The
contract asks for a local file per upload (executors read uploads by path): `path` writes an
upload's bytes to a file the first time it is asked for it, in `root` or, without one, a fresh
temporary folder removed with the store (or at exit). Nothing of it survives the process, as
nothing of `MemoryEventStore` does: for tests of what is built on the contract, and a second
implementation beside `LocalUploadStore` that the shipped contract tests run against.
"""

from __future__ import annotations

import io
import os
import secrets
import tempfile
from collections.abc import AsyncIterable
from pathlib import Path

from h3core.adapters.uploads._checking import UploadChecks
from h3core.adapters.uploads.base import DEFAULT_MAX_PIXELS, DEFAULT_MAX_SAMPLES, DEFAULT_PROBES, Kind, Upload, is_upload_id

__all__ = ["MemoryUploadStore"]


class MemoryUploadStore(UploadChecks):
    """Uploads in memory, each written to a file under `root` (a temporary folder if None) only
    when its `path` is asked for; the limits as `LocalUploadStore`'s (see the module)."""

    def __init__(
        self,
        limits: dict[Kind, int] | None = None,
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        probes: int = DEFAULT_PROBES,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        root: str | Path | None = None,
    ) -> None:
        super().__init__(limits, max_pixels=max_pixels, probes=probes, max_samples=max_samples)
        self._root = None if root is None else Path(root).resolve()
        self._folder: tempfile.TemporaryDirectory[str] | None = None  # made on the first `path` without a root
        self._held: dict[str, tuple[Upload, bytes]] = {}

    async def put(self, content_type: str, chunks: AsyncIterable[bytes]) -> Upload:
        """Gather `chunks` in memory within its kind's limit, check its leading bytes and probe
        them; then hold the bytes under the record's id. `UploadRejected` (413, 415 or 422) says
        why one is refused, and nothing of it is held."""
        receiving = self._receive(content_type)
        data = bytearray()
        async for chunk in chunks:
            receiving.add(chunk)
            data += chunk
        upload = await self._admit(receiving, io.BytesIO(data))
        self._held[upload.id] = (upload, bytes(data))
        return upload

    def get(self, upload_id: str) -> Upload | None:
        """The record of `upload_id`; None unless it is an id this store mints and holds."""
        if not is_upload_id(upload_id):
            return None
        held = self._held.get(upload_id)
        return None if held is None else held[0]

    def path(self, upload: Upload) -> Path:
        """A file of `upload`'s bytes, written on the first call (atomically: a reader never sees
        half of it); for an upload not held, where it would be (no file)."""
        path = self.root / upload.id
        held = self._held.get(upload.id) if is_upload_id(upload.id) else None
        if held is not None and not path.exists():
            part = path.with_name(f"{upload.id}.{secrets.token_hex(8)}.part")  # each writer its own
            part.write_bytes(held[1])
            os.replace(part, path)
        return path

    @property
    def root(self) -> Path:
        """The folder `path` writes to: the one given, or a temporary one made on first use."""
        if self._root is None:
            self._folder = tempfile.TemporaryDirectory(prefix="h3-uploads-")
            self._root = Path(self._folder.name).resolve()
        self._root.mkdir(parents=True, exist_ok=True)
        return self._root

    def ids(self) -> list[str]:
        """The ids of the uploads held, oldest first (for tests: what a refusal must not leave)."""
        return list(self._held)
