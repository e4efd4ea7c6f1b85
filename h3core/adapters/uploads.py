"""Keyframes and references that requests refer to, addressed by an id this store mints.

Contract (`UploadStore`): `put` checks the declared content type against an allow-list and the
file's own leading bytes, enforces the size limit for its kind while it streams to disk, and
returns an `Upload` whose id is random (never derived from a client's name or path); `get`
returns the record or None; `path` gives the stored file. No client string reaches the file
system except through `get`'s id check.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import AsyncIterable, Callable
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import anyio
from pydantic import BaseModel, ConfigDict

from h3core.domain.geometry import Media

Kind = Literal["image", "video", "audio"]

_ID = re.compile(r"^u_[0-9a-f]{32}$")


def _riff(form: bytes) -> Callable[[bytes], bool]:
    return lambda head: head[:4] == b"RIFF" and head[8:12] == form


def _mp3(head: bytes) -> bool:
    return head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0)


# content type -> (kind, check of the first bytes)
CONTENT_TYPES: dict[str, tuple[Kind, Callable[[bytes], bool]]] = {
    "image/png": ("image", lambda h: h.startswith(b"\x89PNG\r\n\x1a\n")),
    "image/jpeg": ("image", lambda h: h.startswith(b"\xff\xd8\xff")),
    "image/webp": ("image", _riff(b"WEBP")),
    "video/mp4": ("video", lambda h: h[4:8] == b"ftyp"),
    "video/quicktime": ("video", lambda h: h[4:8] in (b"ftyp", b"moov", b"wide", b"mdat")),
    "video/webm": ("video", lambda h: h.startswith(b"\x1a\x45\xdf\xa3")),
    "audio/wav": ("audio", _riff(b"WAVE")),
    "audio/x-wav": ("audio", _riff(b"WAVE")),
    "audio/wave": ("audio", _riff(b"WAVE")),
    "audio/mpeg": ("audio", _mp3),
    "audio/flac": ("audio", lambda h: h.startswith(b"fLaC")),
    "audio/ogg": ("audio", lambda h: h.startswith(b"OggS")),
    "audio/mp4": ("audio", lambda h: h[4:8] == b"ftyp"),
}

DEFAULT_LIMITS: dict[Kind, int] = {"image": 20 * 2**20, "video": 500 * 2**20, "audio": 100 * 2**20}


class UploadRejected(ValueError):
    """Why an upload was refused: `field` names what was wrong, `limit` the bound if any."""

    def __init__(self, message: str, *, field: str, status: int = 422, limit: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.status = status
        self.limit = limit


class Upload(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    kind: Kind
    content_type: str
    bytes: int
    sha256: str
    # What admission needs to count the upload's tokens; None where the file did not say.
    width: int | None = None
    height: int | None = None
    seconds: float | None = None
    has_audio: bool = False

    def media(self) -> Media:
        return Media(kind=self.kind, width=self.width, height=self.height, seconds=self.seconds, has_audio=self.has_audio)


def probe(path: Path) -> dict[str, object]:
    """Dimensions, duration and sound of a media file (PyAV); {} if it cannot be decoded."""
    import av

    try:
        with av.open(str(path)) as container:
            out: dict[str, object] = {"has_audio": bool(container.streams.audio)}
            if container.streams.video:
                v = container.streams.video[0]
                out["width"], out["height"] = v.codec_context.width or None, v.codec_context.height or None
            if container.duration:
                out["seconds"] = container.duration / 1_000_000
            return out
    except (av.error.FFmpegError, OSError, ValueError):
        return {}


@runtime_checkable
class UploadStore(Protocol):
    async def put(self, content_type: str, chunks: AsyncIterable[bytes]) -> Upload: ...

    def get(self, upload_id: str) -> Upload | None: ...

    def path(self, upload: Upload) -> Path: ...


class LocalUploadStore:
    def __init__(self, root: str | Path, limits: dict[Kind, int] | None = None) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.limits = {**DEFAULT_LIMITS, **(limits or {})}

    async def put(self, content_type: str, chunks: AsyncIterable[bytes]) -> Upload:
        ctype = content_type.split(";")[0].strip().lower()
        if ctype not in CONTENT_TYPES:
            raise UploadRejected(
                f"content type {ctype or '(none)'!r} is not accepted; accepted: {sorted(CONTENT_TYPES)}",
                field="content-type",
                status=415,
            )
        kind, looks_right = CONTENT_TYPES[ctype]
        limit = self.limits[kind]
        upload_id = f"u_{secrets.token_hex(16)}"
        part = self.root / f"{upload_id}.part"
        digest, size, head = hashlib.sha256(), 0, b""
        try:
            async with await anyio.open_file(part, "wb") as f:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise UploadRejected(
                            f"a {kind} upload may be at most {limit} bytes", field="body", status=413, limit=limit
                        )
                    if len(head) < 16:
                        head += chunk[: 16 - len(head)]
                    digest.update(chunk)
                    await f.write(chunk)
            if size == 0:
                raise UploadRejected("the upload is empty", field="body")
            if not looks_right(head):
                raise UploadRejected(f"the data is not {ctype}: its leading bytes do not match", field="content-type", status=415)
            info = await anyio.to_thread.run_sync(probe, part)
            if kind != "audio" and not info.get("width"):
                raise UploadRejected(f"the {kind} could not be decoded", field="body", status=422)
            if kind == "image":
                info.pop("seconds", None)
            upload = Upload(id=upload_id, kind=kind, content_type=ctype, bytes=size, sha256=digest.hexdigest(), **info)
            meta = self.root / f"{upload_id}.json"
            await anyio.Path(meta).write_text(upload.model_dump_json())
            await anyio.to_thread.run_sync(os.replace, part, self.root / upload_id)
            return upload
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.Path(part).unlink(missing_ok=True)

    def get(self, upload_id: str) -> Upload | None:
        if not _ID.fullmatch(upload_id):
            return None
        meta = self.root / f"{upload_id}.json"
        if not (self.root / upload_id).exists() or not meta.exists():
            return None
        return Upload.model_validate(json.loads(meta.read_text()))

    def path(self, upload: Upload) -> Path:
        return self.root / upload.id
