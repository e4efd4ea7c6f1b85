"""`LocalUploadStore`: uploads as files under a folder, each beside its JSON record.

A `.part` file is held under an exclusive lock while it is written; `sweep_parts` removes those
no writer holds (an upload cut off by a crash), safe beside a running service.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import AsyncIterable
from pathlib import Path

import anyio

from h3core.adapters.uploads._checking import UploadChecks
from h3core.adapters.uploads.base import DEFAULT_MAX_PIXELS, DEFAULT_MAX_SAMPLES, DEFAULT_PROBES, Kind, Upload, is_upload_id

__all__ = ["LocalUploadStore"]


class LocalUploadStore(UploadChecks):
    """Uploads as files under `root`, each beside its JSON record: at most `limits` bytes per kind
    (over `DEFAULT_LIMITS`), `max_pixels` per image or video frame, `max_samples` per video's or
    sound's tables and index, and at most `probes` files probed at once."""

    def __init__(
        self,
        root: str | Path,
        limits: dict[Kind, int] | None = None,
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        probes: int = DEFAULT_PROBES,
        max_samples: int = DEFAULT_MAX_SAMPLES,
    ) -> None:
        super().__init__(limits, max_pixels=max_pixels, probes=probes, max_samples=max_samples)
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    async def put(self, content_type: str, chunks: AsyncIterable[bytes]) -> Upload:
        """Stream `chunks` to a locked `.part` file within its kind's limit, check its leading bytes
        and probe it, then write its record and rename it into place. `UploadRejected` (413, 415
        or 422) says why one is refused."""
        receiving = self._receive(content_type)
        part = self.root / f"{receiving.id}.part"
        try:
            async with await anyio.open_file(part, "wb") as f:
                fcntl.flock(f.wrapped.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours while we write (sweep_parts)
                async for chunk in chunks:
                    receiving.add(chunk)
                    await f.write(chunk)
            upload = await self._admit(receiving, part)
            meta = self.root / f"{upload.id}.json"
            await anyio.Path(meta).write_text(upload.model_dump_json())
            await anyio.to_thread.run_sync(os.replace, part, self.root / upload.id)
            return upload
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.Path(part).unlink(missing_ok=True)

    def get(self, upload_id: str) -> Upload | None:
        """The record of `upload_id`; None unless it is an id this store mints and both its file and its record are here."""
        if not is_upload_id(upload_id):
            return None
        meta = self.root / f"{upload_id}.json"
        if not (self.root / upload_id).exists() or not meta.exists():
            return None
        return Upload.model_validate(json.loads(meta.read_text()))

    def path(self, upload: Upload) -> Path:
        """The stored file of `upload`, under the root."""
        return self.root / upload.id

    def sweep_parts(self, *, dry_run: bool = False) -> list[tuple[str, int]]:
        """Remove the `.part` files no upload is writing (left by a process that died mid-body);
        (name, bytes) of each. One being written is locked by its writer and left alone."""
        out = []
        for part in sorted(self.root.glob("u_*.part")):
            try:
                with open(part, "rb") as f:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    size = os.fstat(f.fileno()).st_size
                    if not dry_run:
                        part.unlink(missing_ok=True)
            except BlockingIOError:
                continue  # an upload in progress
            except FileNotFoundError:
                continue  # finished or removed meanwhile
            out.append((part.name, size))
        return out
