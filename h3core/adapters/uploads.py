"""Keyframes and references that requests refer to, addressed by an id this store mints.

Contract (`UploadStore`): `put` checks the declared content type against an allow-list and the
file's own leading bytes, enforces the size limit for its kind while it streams to disk, and
returns an `Upload` whose id is random (never derived from a client's name or path); `get`
returns the record or None; `path` gives the stored file. No client string reaches the file
system except through `get`'s id check.

An image's dimensions are read from its header (Pillow opens lazily), never by decoding it: a
small file can declare a huge canvas (a 1 MB PNG of 16000 x 16000 decodes to 1 GB), so one above
`max_pixels` is refused before any pixel is decoded. At most `probes` files are probed at once.
A `.part` file is held under an exclusive lock while it is written; `sweep_parts` removes those
no writer holds (an upload cut off by a crash), safe beside a running service.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
from collections.abc import AsyncIterable, Callable
from pathlib import Path
from typing import Literal, Protocol, TypedDict, runtime_checkable

import anyio
from pydantic import BaseModel, ConfigDict

from h3core.domain.geometry import Media

Kind = Literal["image", "video", "audio"]

# The ids `put` mints (`u_` and 32 hex digits); a request names an upload by one of these.
ID_PATTERN = r"^u_[0-9a-f]{32}$"
_ID = re.compile(ID_PATTERN)


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
# The largest image (or video frame) accepted, in pixels: 4096 x 4096. A reference is encoded at a
# 2048-pixel edge and a keyframe at the job's canvas, so nothing larger is needed; decoded as RGBA
# it is 64 MiB, where 16000 x 16000 would be 1 GiB.
DEFAULT_MAX_PIXELS = 4096 * 4096
DEFAULT_PROBES = 2  # files probed at once (each a worker thread, and a decoder's memory)


class UploadRejected(ValueError):
    """Why an upload was refused: `field` names what was wrong, `limit` the bound if any."""

    def __init__(self, message: str, *, field: str, status: int = 422, limit: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.status = status
        self.limit = limit


class Upload(BaseModel):
    """A stored upload's record: its minted id, kind, content type, size and sha256, and what
    probing the file read (dimensions, duration, sound)."""

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
        """What admission needs to know of the upload."""
        return Media(kind=self.kind, width=self.width, height=self.height, seconds=self.seconds, has_audio=self.has_audio)


class Probed(TypedDict, total=False):
    """What probing a media file read; a key is absent where the file did not say."""

    width: int | None
    height: int | None
    seconds: float
    has_audio: bool
    pixels: int | None  # `probe_image` only: Pillow refused the header of an image this large (None: it did not say)


def probe_image(path: Path) -> Probed:
    """An image's dimensions from its header (Pillow), without decoding it; {} if unreadable."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:  # the header only: no pixel is decoded
            width, height = image.size
    except Image.DecompressionBombError as exc:
        # Pillow's own bound (far above the store's) refused the header; its message has the count.
        found = re.search(r"\((\d+) pixels\)", str(exc))
        return {"pixels": int(found.group(1)) if found else None}
    except (UnidentifiedImageError, OSError, ValueError):
        return {}
    return {"width": width or None, "height": height or None}


def probe(path: Path) -> Probed:
    """Dimensions, duration and sound of a media file (PyAV); {} if it cannot be decoded."""
    import av

    try:
        with av.open(str(path)) as container:
            out: Probed = {"has_audio": bool(container.streams.audio)}
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
    """Where uploads are kept (the module docstring states the contract)."""

    async def put(self, content_type: str, chunks: AsyncIterable[bytes]) -> Upload:
        """Check and keep the upload streamed as `chunks`; its record, under a freshly minted id.
        `UploadRejected` says why one is refused."""
        ...

    def get(self, upload_id: str) -> Upload | None:
        """The upload's record; None for an id this store did not mint or does not hold."""
        ...

    def path(self, upload: Upload) -> Path:
        """The stored file of `upload`."""
        ...


class LocalUploadStore:
    """Uploads as files under `root`, each beside its JSON record: at most `limits` bytes per kind
    (over `DEFAULT_LIMITS`), `max_pixels` per image or video frame, and at most `probes` files
    probed at once."""

    def __init__(
        self,
        root: str | Path,
        limits: dict[Kind, int] | None = None,
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        probes: int = DEFAULT_PROBES,
    ) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.limits = {**DEFAULT_LIMITS, **(limits or {})}
        self.max_pixels = max_pixels
        self._probes = anyio.CapacityLimiter(probes)

    async def put(self, content_type: str, chunks: AsyncIterable[bytes]) -> Upload:
        """Stream `chunks` to a locked `.part` file within its kind's limit, check its leading bytes
        and probe it, then write its record and rename it into place. `UploadRejected` (413, 415
        or 422) says why one is refused."""
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
                fcntl.flock(f.wrapped.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours while we write (sweep_parts)
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise UploadRejected(
                            f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} upload may be at most {limit} bytes",
                            field="body",
                            status=413,
                            limit=limit,
                        )
                    if len(head) < 16:
                        head += chunk[: 16 - len(head)]
                    digest.update(chunk)
                    await f.write(chunk)
            if size == 0:
                raise UploadRejected("the upload is empty", field="body")
            if not looks_right(head):
                raise UploadRejected(f"the data is not {ctype}: its leading bytes do not match", field="content-type", status=415)
            info = await anyio.to_thread.run_sync(probe_image if kind == "image" else probe, part, limiter=self._probes)
            huge = "pixels" in info  # only as many pixels as Pillow would say: it refused to open it
            pixels = info.pop("pixels", None) if huge else int(info.get("width") or 0) * int(info.get("height") or 0)
            if huge or (pixels or 0) > self.max_pixels:
                dims = f"{info['width']} x {info['height']}, " if not huge else ""
                raise UploadRejected(
                    f"the {kind} may have at most {self.max_pixels} pixels; it has {dims}{pixels or 'far more'}",
                    field="body",
                    status=422,
                    limit=self.max_pixels,
                )
            if kind != "audio" and not info.get("width"):
                raise UploadRejected(f"the {kind} could not be decoded", field="body", status=422)
            upload = Upload(
                id=upload_id,
                kind=kind,
                content_type=ctype,
                bytes=size,
                sha256=digest.hexdigest(),
                width=info.get("width"),
                height=info.get("height"),
                seconds=info.get("seconds"),
                has_audio=info.get("has_audio", False),
            )
            meta = self.root / f"{upload_id}.json"
            await anyio.Path(meta).write_text(upload.model_dump_json())
            await anyio.to_thread.run_sync(os.replace, part, self.root / upload_id)
            return upload
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.Path(part).unlink(missing_ok=True)

    def get(self, upload_id: str) -> Upload | None:
        """The record of `upload_id`; None unless it is an id this store mints and both its file and its record are here."""
        if not _ID.fullmatch(upload_id):
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
