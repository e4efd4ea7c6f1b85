"""What every upload store checks, written once: the content type, the size while the bytes
stream, the leading bytes, an MP4's sample tables, and what probing reads (pixels bounded,
dimensions readable, memory and time bounded). A store keeps the bytes its own way; these say
whether it may."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable

import anyio

from h3core.adapters.uploads import probing
from h3core.adapters.uploads._mp4 import declared_entries
from h3core.adapters.uploads.base import (
    CONTENT_TYPES,
    DEFAULT_LIMITS,
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_SAMPLES,
    DEFAULT_PROBES,
    MP4_TYPES,
    Kind,
    Upload,
    UploadRejected,
)

HEAD = 16  # leading bytes kept for the content-type check: enough for every check in CONTENT_TYPES
# What a probe's child may map beyond PyAV's own: a decoder's few frames of up to max_pixels (8
# bytes a pixel covers 10-bit 4:2:0 twice over; a 4096 x 4096 8-bit H.264 probe mapped 73 MiB)
# and 64 MiB besides, for the container's tables (under max_samples, ~40 MB) and buffers.
PROBE_BASE_MEMORY = 64 * 2**20
PROBE_BYTES_PER_PIXEL = 8


class Receiving:
    """One upload as its bytes arrive: its freshly minted id, kind and bare content type, and its
    size, sha256 and leading bytes so far."""

    def __init__(self, ctype: str, kind: Kind, limit: int, looks_right: Callable[[bytes], bool]) -> None:
        self.id = f"u_{secrets.token_hex(16)}"  # random: nothing of the client's reaches a name
        self.ctype, self.kind, self.limit = ctype, kind, limit
        self._looks_right = looks_right
        self.size = 0
        self._digest = hashlib.sha256()
        self._head = b""

    def add(self, chunk: bytes) -> None:
        """Count `chunk` in, before it is kept; `UploadRejected` (413) once the kind's limit is passed."""
        self.size += len(chunk)
        if self.size > self.limit:
            raise UploadRejected(
                f"{'an' if self.kind[0] in 'aeiou' else 'a'} {self.kind} upload may be at most {self.limit} bytes",
                field="body",
                status=413,
                limit=self.limit,
            )
        if len(self._head) < HEAD:
            self._head += chunk[: HEAD - len(self._head)]
        self._digest.update(chunk)

    def check_bytes(self) -> None:
        """`UploadRejected` for an empty upload (422) or one whose leading bytes are not its type's (415)."""
        if self.size == 0:
            raise UploadRejected("the upload is empty", field="body")
        if not self._looks_right(self._head):
            why = f"the data is not {self.ctype}: its leading bytes do not match"
            raise UploadRejected(why, field="content-type", status=415)

    def record(self, info: probing.Probed) -> Upload:
        """The upload's record, with what probing read."""
        return Upload(
            id=self.id,
            kind=self.kind,
            content_type=self.ctype,
            bytes=self.size,
            sha256=self._digest.hexdigest(),
            width=info.get("width"),
            height=info.get("height"),
            seconds=info.get("seconds"),
            has_audio=info.get("has_audio", False),
        )


class UploadChecks:
    """The checks of a store with `limits` per kind (over `DEFAULT_LIMITS`), `max_pixels` per image
    or video frame, `max_samples` per MP4's sample tables and index, and at most `probes` files
    probed at once."""

    def __init__(
        self,
        limits: dict[Kind, int] | None = None,
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        probes: int = DEFAULT_PROBES,
        max_samples: int = DEFAULT_MAX_SAMPLES,
    ) -> None:
        self.limits = {**DEFAULT_LIMITS, **(limits or {})}
        self.max_pixels = max_pixels
        self.max_samples = max_samples
        self.probe_memory = PROBE_BASE_MEMORY + PROBE_BYTES_PER_PIXEL * max_pixels
        self._probes = anyio.CapacityLimiter(probes)

    def _receive(self, content_type: str) -> Receiving:
        """A new upload of `content_type` (parameters and case aside); `UploadRejected` (415) for a
        type not accepted, before a byte is read."""
        ctype = content_type.split(";")[0].strip().lower()
        if ctype not in CONTENT_TYPES:
            raise UploadRejected(
                f"content type {ctype or '(none)'!r} is not accepted; accepted: {sorted(CONTENT_TYPES)}",
                field="content-type",
                status=415,
            )
        kind, looks_right = CONTENT_TYPES[ctype]
        return Receiving(ctype, kind, self.limits[kind], looks_right)

    def _read(self, upload: Receiving, source: probing.Source) -> probing.Probed:
        """What the file says of itself (in a worker thread); `UploadRejected` for an MP4 whose
        sample tables pass `max_samples`, before anything parses them, or a probe past its bounds."""
        kind = upload.kind
        if upload.ctype in MP4_TYPES:
            declared = declared_entries(source, self.max_samples)
            if declared is None:
                why = f"the {kind}'s movie header is compressed (cmov): its sample tables cannot be counted before they are read"
                raise UploadRejected(why, field="body", limit=self.max_samples)
            if declared > self.max_samples:
                why = f"the {kind} declares at least {declared} samples, table rows and boxes"
                raise UploadRejected(f"{why}; at most {self.max_samples} are accepted", field="body", limit=self.max_samples)
        # Looked up on the module at each call: a test that forbids decoding replaces them there.
        if kind == "image":
            return probing.probe_image(source)
        info = probing.probe(source, memory=self.probe_memory)
        if info.get("exceeded") == "time":
            why = f"probing the {kind} took longer than {probing.PROBE_SECONDS:g} s"
            raise UploadRejected(why, field="body", limit=int(probing.PROBE_SECONDS))
        if "exceeded" in info:
            why = f"probing the {kind} needed more than {self.probe_memory} bytes of memory"
            raise UploadRejected(why, field="body", limit=self.probe_memory)
        if info.get("index", 0) > self.max_samples:  # FFmpeg's own count, for any container
            why = f"the {kind}'s index has {info['index']} entries; at most {self.max_samples} are accepted"
            raise UploadRejected(why, field="body", limit=self.max_samples)
        return info

    async def _admit(self, upload: Receiving, source: probing.Source) -> Upload:
        """Check the received bytes (kept at `source`) and probe them; the record, or `UploadRejected`."""
        upload.check_bytes()
        info = await anyio.to_thread.run_sync(self._read, upload, source, limiter=self._probes)
        huge = "pixels" in info  # only as many pixels as Pillow would say: it refused to open it
        pixels = info.pop("pixels", None) if huge else int(info.get("width") or 0) * int(info.get("height") or 0)
        if huge or (pixels or 0) > self.max_pixels:
            dims = f"{info['width']} x {info['height']}, " if not huge else ""
            raise UploadRejected(
                f"the {upload.kind} may have at most {self.max_pixels} pixels; it has {dims}{pixels or 'far more'}",
                field="body",
                status=422,
                limit=self.max_pixels,
            )
        if upload.kind != "audio" and not info.get("width"):
            raise UploadRejected(f"the {upload.kind} could not be decoded", field="body", status=422)
        return upload.record(info)
