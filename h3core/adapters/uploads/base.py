"""The upload-store contract: where the keyframes and references that requests name are kept,
addressed by an id the store mints, so that no client string reaches the storage.

A store is made with `limits` (bytes per kind, over `DEFAULT_LIMITS`), `max_pixels` (per image
or video frame), `probes` (files probed at once) and `max_samples` (per video's or sound's sample
tables and index). Every implementation keeps these promises
(`h3core.testing.uploads.UploadStoreContract` checks them; run it against yours):

- **Types.** `put` takes only the content types of `CONTENT_TYPES`, parameters and case aside (the
  record keeps the bare type, lower-cased); any other, or none, is refused with 415 (`field`
  "content-type") before a byte is read.
- **Leading bytes.** The data's own first bytes, however it is chunked, must be what its declared
  type starts with, else 415 ("content-type"); an empty upload is refused with 422 ("body").
- **Size.** An upload is at most `limits[kind]` bytes, counted while it streams: the chunk that
  passes its kind's limit ends it with 413 ("body", `limit`: the bound), and no chunk after it is read.
- **Nothing of a refusal is kept.** An upload refused, or cancelled mid-stream, leaves nothing
  behind: no record, no bytes, no partial file.
- **Ids.** Each upload kept gets a fresh random id of `ID_PATTERN` (`u_` and 32 hex digits), never
  derived from the client's name, path or data: the same bytes sent twice are two uploads.
- **Records.** `put` returns the `Upload`: its id, kind, bare content type, the size and sha256 of
  the bytes as streamed, and what probing read.
- **Lookup.** `get` returns the record of an id the store minted and holds; None for any other
  string, a malformed one included, and such a string reaches no storage (no client string
  does, except through this check).
- **Files.** `path(upload)` is a local file holding exactly the stored bytes, for an upload `get`
  returned: executors read uploads by path.
- **Probing, never decoding.** An image's width and height are read from its header (Pillow opens
  lazily), never by decoding it: a small file can declare a huge canvas (a 1 MB PNG of 16000 x
  16000 decodes to 1 GB), so one above `max_pixels` is refused with 422 ("body", `limit`: the
  bound) before any pixel is decoded, as is one past Pillow's own bound. A video's width, height,
  duration and sound are read by PyAV, and a frame above `max_pixels` is refused alike. An image
  or video whose dimensions cannot be read is refused with 422; an audio file is kept whether or
  not its duration can be read.
- **Bounded sample tables.** FFmpeg holds an index entry for every sample a container declares,
  and a few bytes can declare millions. An MP4 or QuickTime upload (`MP4_TYPES`) whose boxes, and
  the rows and samples their tables declare, number more than `max_samples` is refused with 422
  ("body", `limit`: the bound) from its box headers, before anything parses it; so is one whose
  movie header is compressed (`cmov`: its tables cannot be counted first). A video or sound of
  any container whose index FFmpeg builds with more than `max_samples` entries is refused alike.
- **Bounded probing.** At most `probes` uploads are probed at once (each is a worker thread, and
  a decoder's memory). A video or sound is probed in a child process that may map 64 MiB and 8
  bytes per pixel of `max_pixels` beyond PyAV's own and run `probing.PROBE_SECONDS`; one that
  passes either (the child dies, times out, or FFmpeg drops an index for want of memory) is
  refused with 422 ("body", `limit`: that bound), and the store's own process never holds what
  FFmpeg allocates.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, Callable
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from h3core.domain.geometry import Media

__all__ = [
    "CONTENT_TYPES",
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MAX_SAMPLES",
    "DEFAULT_PROBES",
    "ID_PATTERN",
    "MP4_TYPES",
    "Kind",
    "Upload",
    "UploadRejected",
    "UploadStore",
    "is_upload_id",
]

Kind = Literal["image", "video", "audio"]

# The ids `put` mints (`u_` and 32 hex digits); a request names an upload by one of these.
ID_PATTERN = r"^u_[0-9a-f]{32}$"
_ID = re.compile(ID_PATTERN)


def is_upload_id(text: str) -> bool:
    """Whether `text` has the form of an id a store mints: the one check a client string passes
    before it may reach any storage."""
    return _ID.fullmatch(text) is not None


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
# The most samples, sample-table rows and boxes an MP4 or QuickTime upload may declare, and index
# entries FFmpeg may build for any video or sound. FFmpeg holds 35-40 bytes a sample (measured: an
# index entry, its size and composition offset), so the bound is ~40 MB of a probe's memory. An
# hour of 60 fps video with B-frames and 48 kHz AAC declares ~0.6 million; a reference is cut
# to the job's length (seconds), so nothing near the bound is needed.
DEFAULT_MAX_SAMPLES = 1_000_000
# The content types read as ISO base media (MP4, QuickTime): their sample tables are counted first.
MP4_TYPES = frozenset({"video/mp4", "video/quicktime", "audio/mp4"})


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


@runtime_checkable
class UploadStore(Protocol):
    """Where uploads are kept (the contract above)."""

    async def put(self, content_type: str, chunks: AsyncIterable[bytes]) -> Upload:
        """Check and keep the upload streamed as `chunks`, declared as `content_type` (a request's
        `Content-Type`, parameters allowed); its record, under a freshly minted id. `UploadRejected`
        says why one is refused (415: its type or leading bytes; 413: its size; 422: empty, too
        many pixels, or not decodable), and nothing of it is kept."""
        ...

    def get(self, upload_id: str) -> Upload | None:
        """The upload's record; None for an id this store did not mint or does not hold (a
        malformed one reaches no storage)."""
        ...

    def path(self, upload: Upload) -> Path:
        """A local file holding exactly the stored bytes of `upload` (one `get` returned)."""
        ...
