"""The upload-store contract as tests, for any implementation of `h3core.adapters.uploads.UploadStore`.

Subclass `UploadStoreContract` in a test module; override its `make_uploads` fixture to give a
factory of fresh, empty stores with the limits each test asks for, and `kept` to say what a store
holds now (so that a refusal can be shown to leave nothing); pytest then runs every contract test
against it:

    class TestMyUploads(UploadStoreContract):
        @pytest.fixture
        def make_uploads(self, tmp_path):
            return lambda limits=None, **kw: MyUploadStore(tmp_path / uuid.uuid4().hex, limits, **kw)

        def kept(self, uploads):
            return {p.name for p in uploads.root.iterdir()}

h3core's own suite runs it against `LocalUploadStore` and `MemoryUploadStore`. Needs pytest,
anyio's pytest plugin and Pillow; the video and sound cases need PyAV and numpy (skipped without).
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
import tempfile
import threading
import time
import wave
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from h3core.adapters.uploads.base import DEFAULT_MAX_SAMPLES, ID_PATTERN, Upload, UploadRejected, UploadStore
from h3core.testing.factories import png

__all__ = ["UploadStoreContract", "chunks"]

MakeUploads = Callable[..., UploadStore]  # (limits=None, *, max_pixels=..., probes=..., max_samples=...) -> a fresh, empty store
JPEG_HEAD = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00"


async def chunks(data: bytes, size: int = 1 << 16) -> AsyncIterator[bytes]:
    """`data` as a request body streams it, `size` bytes a chunk."""
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def unread() -> AsyncIterator[bytes]:
    """A body that fails the test if a single chunk of it is read."""
    raise AssertionError("a chunk was read of an upload that should have been refused before")
    yield b""  # pragma: no cover - makes this a generator


def wav(seconds: float = 0.5, rate: int = 8000) -> bytes:
    """A valid mono 16-bit WAV of silence."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(2 * int(seconds * rate)))
    return out.getvalue()


def mp4(width: int = 64, height: int = 48, frames: int = 12) -> bytes:
    """A valid H.264 MP4 of `frames` black frames at 24 fps with a stereo AAC track (PyAV, numpy)."""
    np = pytest.importorskip("numpy")
    pytest.importorskip("av")
    from h3core.adapters.video import write_mp4

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "v.mp4"
        video = np.zeros((frames, height, width, 3), dtype=np.uint8)
        write_mp4(path, video, audio=np.zeros((2, 32_000 * frames // 24), dtype=np.float32), preset="ultrafast")
        return path.read_bytes()


def mp4_bomb(samples: int = 10_000_000, *, compact: bool = True, width: int = 64, height: int = 64) -> bytes:
    """An MP4 of one `width` x `height` H.264 track that declares `samples` samples of a
    millisecond each and holds next to none: with `compact`, their sizes as 4-bit `stz2` rows (two
    a byte: 5 MB for ten million), else one constant `stsz` size (20 bytes for any number). FFmpeg
    builds an index entry for each declared sample: 390 MB for ten million."""

    def box(kind: bytes, *parts: bytes) -> bytes:
        body = b"".join(parts)
        return struct.pack(">I4s", 8 + len(body), kind) + body

    def full(kind: bytes, flags: int, *parts: bytes) -> bytes:
        return box(kind, struct.pack(">I", flags), *parts)  # version 0

    matrix = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)
    if compact:
        sizes = full(b"stz2", 0, struct.pack(">3xBI", 4, samples), bytes((samples + 1) // 2))
    else:
        sizes = full(b"stsz", 0, struct.pack(">II", 1, samples))
    fields = struct.pack(">HHIIIH", width, height, 0x480000, 0x480000, 0, 1)
    entry = box(b"avc1", bytes(6), struct.pack(">H", 1), bytes(16), fields, bytes(32), struct.pack(">Hh", 24, -1))
    ftyp = box(b"ftyp", b"isom", struct.pack(">I", 512), b"isomiso2avc1mp41")

    def moov(mdat_at: int) -> bytes:
        stbl = box(
            b"stbl",
            full(b"stsd", 0, struct.pack(">I", 1), entry),
            full(b"stts", 0, struct.pack(">III", 1, samples, 1)),
            full(b"stsc", 0, struct.pack(">IIII", 1, 1, samples, 1)),
            sizes,
            full(b"stco", 0, struct.pack(">II", 1, mdat_at)),
        )
        dinf = box(b"dinf", full(b"dref", 0, struct.pack(">I", 1), full(b"url ", 1)))
        minf = box(b"minf", full(b"vmhd", 1, bytes(8)), dinf, stbl)
        mdhd = full(b"mdhd", 0, struct.pack(">IIIIHH", 0, 0, 1000, samples, 0x55C4, 0))
        mdia = box(b"mdia", mdhd, full(b"hdlr", 0, bytes(4), b"vide", bytes(12), b"\0"), minf)
        tkhd = full(
            b"tkhd",
            3,
            struct.pack(">IIIII", 0, 0, 1, 0, samples),
            bytes(16),
            matrix,
            struct.pack(">II", width << 16, height << 16),
        )
        mvhd = full(
            b"mvhd",
            0,
            struct.pack(">IIIIIH", 0, 0, 1000, samples, 0x10000, 0x100),
            bytes(10),
            matrix,
            bytes(24),
            struct.pack(">I", 2),
        )
        return box(b"moov", mvhd, box(b"trak", tkhd, mdia))

    at = len(ftyp) + len(moov(0)) + 8  # the mdat's payload, after the moov
    return ftyp + moov(at) + box(b"mdat", bytes(64))


async def refused(uploads: UploadStore, content_type: str, body: AsyncIterator[bytes] | bytes) -> UploadRejected:
    """The refusal of an upload that must be refused."""
    with pytest.raises(UploadRejected) as caught:
        await uploads.put(content_type, chunks(body) if isinstance(body, bytes) else body)
    return caught.value


@pytest.mark.anyio
class UploadStoreContract:
    """What every upload store must do (the contract in `h3core.adapters.uploads.base`)."""

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture
    def make_uploads(self) -> MakeUploads:
        raise NotImplementedError(
            "override the `make_uploads` fixture: return a factory of fresh, empty stores, "
            "called as make_uploads(limits=None, *, max_pixels=..., probes=..., max_samples=...)"
        )

    @pytest.fixture
    def uploads(self, make_uploads: MakeUploads) -> UploadStore:
        """A fresh, empty store with the default limits."""
        return make_uploads()

    def kept(self, uploads: UploadStore) -> set[str]:
        """What `uploads` holds now, by any names (files, keys): empty after nothing was kept."""
        raise NotImplementedError("override `kept`: what the store holds now (its files, its keys)")

    @pytest.fixture
    def no_decoding(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Any decode of pixels fails the test: Pillow's `load`, and any PyAV container opened."""
        from PIL import Image

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("an upload's pixels were decoded")

        monkeypatch.setattr(Image.Image, "load", refuse)
        try:
            import av
        except ImportError:
            return
        monkeypatch.setattr(av, "open", refuse)

    async def test_it_is_an_upload_store(self, uploads):
        assert isinstance(uploads, UploadStore)

    # Types.

    async def test_a_type_not_accepted_is_refused_before_a_byte_is_read(self, uploads):
        for ctype, named in (("text/plain", "'text/plain'"), ("", "'(none)'"), ("image/svg+xml", "'image/svg+xml'")):
            rejected = await refused(uploads, ctype, unread())
            assert (rejected.status, rejected.field, rejected.limit) == (415, "content-type", None)
            assert str(rejected).startswith(f"content type {named} is not accepted; accepted: [")
        assert self.kept(uploads) == set()

    async def test_an_accepted_type_is_taken_whatever_its_case_and_parameters(self, uploads):
        upload = await uploads.put("IMAGE/PNG; charset=binary", chunks(png()))
        assert upload.content_type == "image/png" and upload.kind == "image"
        assert (await uploads.put("audio/wav", chunks(wav()))).content_type == "audio/wav"

    # Leading bytes.

    async def test_data_whose_leading_bytes_are_another_type_s_is_refused(self, uploads):
        for ctype, data in (("image/png", JPEG_HEAD + bytes(100)), ("image/jpeg", png()), ("audio/wav", png())):
            rejected = await refused(uploads, ctype, data)
            assert (rejected.status, rejected.field) == (415, "content-type")
            assert str(rejected) == f"the data is not {ctype}: its leading bytes do not match"
        assert self.kept(uploads) == set()

    async def test_leading_bytes_are_read_across_chunks_however_small(self, uploads):
        data = png()
        upload = await uploads.put("image/png", chunks(data, size=3))
        assert (upload.bytes, upload.width) == (len(data), 64)

    async def test_an_empty_upload_is_refused(self, uploads):
        for body in (b"", chunks(b"")):
            rejected = await refused(uploads, "image/png", body)
            assert (rejected.status, rejected.field, str(rejected)) == (422, "body", "the upload is empty")
        assert self.kept(uploads) == set()

    # Size.

    async def test_the_size_limit_is_enforced_while_streaming_and_no_chunk_after_it_is_read(self, make_uploads):
        uploads = make_uploads({"image": 1000})
        pulled = 0

        async def endless() -> AsyncIterator[bytes]:
            nonlocal pulled
            head = png(8, 8)
            while True:
                pulled += 1
                yield (head + bytes(100))[:100] if pulled == 1 else bytes(100)

        with anyio.fail_after(30):
            rejected = await refused(uploads, "image/png", endless())
        assert (rejected.status, rejected.field, rejected.limit) == (413, "body", 1000)
        assert str(rejected) == "an image upload may be at most 1000 bytes"
        assert pulled == 11, "the chunk that passed the limit was the last one read"
        assert self.kept(uploads) == set()

    async def test_an_upload_of_exactly_its_limit_is_kept(self, make_uploads):
        data = png(8, 8)
        uploads = make_uploads({"image": len(data) + 10})
        upload = await uploads.put("image/png", chunks(data + bytes(10), size=7))
        assert upload.bytes == len(data) + 10
        assert (await refused(uploads, "image/png", data + bytes(11))).status == 413

    async def test_each_kind_has_its_own_limit(self, make_uploads):
        sound = wav()
        uploads = make_uploads({"image": len(sound) - 1})
        assert (await uploads.put("audio/wav", chunks(sound))).bytes == len(sound)
        rejected = await refused(uploads, "image/png", png(8, 8) + bytes(len(sound)))
        assert (rejected.status, rejected.limit) == (413, len(sound) - 1)

    # Nothing of a refusal is kept.

    async def test_a_cancelled_upload_leaves_nothing(self, uploads):
        async def stalled() -> AsyncIterator[bytes]:
            yield png()[:16]
            await anyio.sleep_forever()

        with anyio.move_on_after(0.5) as scope:
            await uploads.put("image/png", stalled())
        assert scope.cancelled_caught
        assert self.kept(uploads) == set()

    # Ids and records.

    async def test_ids_are_random_of_the_pattern_and_the_same_bytes_twice_are_two_uploads(self, uploads):
        data = png()
        first = await uploads.put("image/png", chunks(data))
        second = await uploads.put("image/png", chunks(data))
        assert first.id != second.id
        assert self.kept(uploads), "`kept` sees what the store holds (else its emptiness after a refusal says nothing)"
        assert all(re.fullmatch(ID_PATTERN, u.id) for u in (first, second))
        assert first.sha256 == second.sha256 == hashlib.sha256(data).hexdigest()
        assert uploads.get(first.id) == first and uploads.get(second.id) == second

    async def test_a_record_says_what_was_streamed_and_what_probing_read(self, uploads):
        data = png(64, 48)
        upload = await uploads.put("image/png", chunks(data, size=100))
        assert isinstance(upload, Upload)
        assert (upload.kind, upload.content_type, upload.bytes, upload.sha256) == (
            "image",
            "image/png",
            len(data),
            hashlib.sha256(data).hexdigest(),
        )
        assert (upload.width, upload.height, upload.seconds, upload.has_audio) == (64, 48, None, False)

    # Lookup and files.

    async def test_get_finds_what_was_kept_and_nothing_else(self, uploads):
        upload = await uploads.put("image/png", chunks(png()))
        assert uploads.get(upload.id) == upload
        assert uploads.get("u_" + "0" * 32) is None, "a well-formed id the store did not mint"

    async def test_get_of_a_malformed_id_is_none_even_where_it_spells_a_kept_one(self, uploads):
        upload = await uploads.put("image/png", chunks(png()))
        for name in (
            "",
            "u_",
            upload.id.upper(),
            f"{upload.id}\n",
            f" {upload.id}",
            f"{upload.id}/",
            f"./{upload.id}",
            f"../{upload.id}",
            f"{upload.id}.json",
            f"{upload.id}.part",
            upload.id[:-1] + "g",
            upload.id + "0",
            "/etc/passwd",
        ):
            assert uploads.get(name) is None, name

    async def test_the_path_of_a_kept_upload_holds_exactly_its_bytes(self, uploads):
        image, sound = png(), wav()
        a = await uploads.put("image/png", chunks(image, size=10))
        b = await uploads.put("audio/wav", chunks(sound))
        assert uploads.path(a) != uploads.path(b)
        assert uploads.path(a).read_bytes() == image and uploads.path(b).read_bytes() == sound
        found = uploads.get(a.id)
        assert found is not None and uploads.path(found).read_bytes() == image

    # Probing, never decoding.

    @pytest.mark.usefixtures("no_decoding")
    async def test_an_image_s_size_comes_from_its_header_and_over_max_pixels_it_is_refused(self, make_uploads):
        uploads = make_uploads(max_pixels=4000 * 4000)
        rejected = await refused(uploads, "image/png", png(4001, 4000, pixels=False))
        assert (rejected.status, rejected.field, rejected.limit) == (422, "body", 4000 * 4000)
        assert str(rejected) == "the image may have at most 16000000 pixels; it has 4001 x 4000, 16004000"
        assert self.kept(uploads) == set()
        upload = await uploads.put("image/png", chunks(png(4000, 4000, pixels=False)))
        assert (upload.width, upload.height) == (4000, 4000), "at the bound: kept, and not decoded"

    @pytest.mark.usefixtures("no_decoding")
    async def test_an_image_past_pillow_s_own_bound_is_refused_with_its_pixel_count(self, uploads):
        rejected = await refused(uploads, "image/png", png(16000, 16000, pixels=False))
        assert (rejected.status, rejected.limit) == (422, 4096 * 4096)
        assert str(rejected) == "the image may have at most 16777216 pixels; it has 256000000"
        assert self.kept(uploads) == set()

    async def test_an_image_or_video_whose_dimensions_cannot_be_read_is_refused(self, uploads):
        unreadable = (("image/png", png()[:8] + b"not a png at all" * 8), ("video/mp4", b"\0\0\0\x18ftypmp42" + bytes(200)))
        for ctype, data in unreadable:
            rejected = await refused(uploads, ctype, data)
            kind = ctype.split("/")[0]
            assert (rejected.status, rejected.field, str(rejected)) == (422, "body", f"the {kind} could not be decoded")
        assert self.kept(uploads) == set()

    async def test_a_video_s_dimensions_duration_and_sound_are_read_and_its_frame_is_bounded(self, make_uploads):
        data = mp4(64, 48, frames=12)
        upload = await make_uploads(max_pixels=64 * 48).put("video/mp4", chunks(data))
        assert (upload.kind, upload.width, upload.height, upload.has_audio) == ("video", 64, 48, True)
        assert upload.seconds is not None and 0.4 < upload.seconds < 0.7
        uploads = make_uploads(max_pixels=64 * 48 - 1)
        rejected = await refused(uploads, "video/mp4", data)
        assert (rejected.status, rejected.limit) == (422, 64 * 48 - 1)
        assert str(rejected) == "the video may have at most 3071 pixels; it has 64 x 48, 3072"
        assert self.kept(uploads) == set()

    async def test_a_sound_is_kept_with_its_duration_or_without_one(self, uploads):
        pytest.importorskip("av")
        upload = await uploads.put("audio/wav", chunks(wav(0.5)))
        assert (upload.kind, upload.seconds, upload.has_audio, upload.width) == ("audio", 0.5, True, None)
        unreadable = wav()[:12] + b"no format chunk" * 4  # a WAVE's leading bytes, then nothing PyAV reads
        upload = await uploads.put("audio/wav", chunks(unreadable))
        assert (upload.kind, upload.seconds, upload.bytes) == ("audio", None, len(unreadable))

    # Bounded sample tables.

    @pytest.mark.parametrize("compact", [True, False], ids=["stz2", "stsz"])
    async def test_an_mp4_declaring_millions_of_samples_is_refused_before_anything_parses_it(self, uploads, compact):
        bomb = mp4_bomb(10_000_000, compact=compact)  # 5 MB with 4-bit sizes, 0.7 KB with one constant size
        for ctype in ("video/mp4", "video/quicktime", "audio/mp4"):
            rejected = await refused(uploads, ctype, bomb)
            assert (rejected.status, rejected.field, rejected.limit) == (422, "body", DEFAULT_MAX_SAMPLES)
            kind = ctype.split("/")[0]
            assert re.fullmatch(
                rf"the {kind} declares at least 100000\d\d samples, table rows and boxes; at most 1000000 are accepted",
                str(rejected),
            ), str(rejected)
        assert self.kept(uploads) == set()

    async def test_an_mp4_within_the_sample_bound_is_kept_with_its_duration(self, make_uploads):
        uploads = make_uploads(max_samples=1000)
        upload = await uploads.put("video/mp4", chunks(mp4(64, 48, frames=48)))  # 48 frames and 69 AAC packets
        assert (upload.width, upload.height, upload.has_audio) == (64, 48, True)
        assert upload.seconds is not None and 1.9 < upload.seconds < 2.2
        assert (await uploads.put("video/mp4", chunks(mp4_bomb(900)))).seconds == 0.9, "900 samples of 1 ms"
        rejected = await refused(uploads, "video/mp4", mp4_bomb(1000))
        assert (rejected.status, rejected.limit) == (422, 1000)

    async def test_a_compressed_movie_header_is_refused(self, uploads):
        ftyp = mp4_bomb(10)[:32]
        cmov = (
            struct.pack(">I4s", 8 + 20, b"moov") + struct.pack(">I4s", 20, b"cmov") + struct.pack(">I4s4s", 12, b"dcom", b"zlib")
        )
        rejected = await refused(uploads, "video/quicktime", ftyp + cmov)
        assert (rejected.status, rejected.field, rejected.limit) == (422, "body", DEFAULT_MAX_SAMPLES)
        assert "compressed (cmov)" in str(rejected)
        assert self.kept(uploads) == set()

    async def test_a_probe_that_passes_its_memory_bound_is_refused(self, make_uploads):
        # The tables are let through here (no bound on them), so FFmpeg reads them: in a child
        # capped at 64 MiB and 8 bytes a pixel, whose index of ten million entries does not fit.
        pytest.importorskip("av")
        uploads = make_uploads(max_samples=10**9, max_pixels=64 * 64)
        rejected = await refused(uploads, "video/mp4", mp4_bomb(10_000_000))
        assert (rejected.status, rejected.field, rejected.limit) == (422, "body", 64 * 2**20 + 8 * 64 * 64)
        assert str(rejected) == f"probing the video needed more than {64 * 2**20 + 8 * 64 * 64} bytes of memory"
        assert self.kept(uploads) == set()

    # Bounded probing.

    @pytest.mark.parametrize("probes", [1, 2])
    async def test_at_most_probes_uploads_are_probed_at_once(self, make_uploads, monkeypatch, probes):
        from PIL import Image

        opened = Image.open
        lock, now, most = threading.Lock(), [0], [0]

        def slow_open(*args: Any, **kwargs: Any) -> Any:
            with lock:
                now[0] += 1
                most[0] = max(most[0], now[0])
            try:
                time.sleep(0.2)  # long enough for every other put to reach its probe meanwhile
                return opened(*args, **kwargs)
            finally:
                with lock:
                    now[0] -= 1

        monkeypatch.setattr(Image, "open", slow_open)
        uploads = make_uploads(probes=probes)
        async with anyio.create_task_group() as tg:
            for _ in range(probes + 2):
                tg.start_soon(uploads.put, "image/png", chunks(png()))
        assert most[0] == probes
