"""The count of what an MP4's boxes declare (`h3core.adapters.uploads._mp4`), read before FFmpeg
reads them: samples wherever FFmpeg would read a table, raw sound by chunk as FFmpeg indexes it,
and a walk that stops at its bound."""

from __future__ import annotations

import io
import struct

import pytest

from h3core.adapters.uploads._mp4 import declared_entries
from h3core.testing.uploads import mp4, mp4_bomb

BOUND = 10**9  # past every count here: each is counted whole


def box(kind: bytes, *parts: bytes) -> bytes:
    body = b"".join(parts)
    return struct.pack(">I4s", 8 + len(body), kind) + body


def full(kind: bytes, *parts: bytes, version: int = 0, flags: int = 0) -> bytes:
    return box(kind, struct.pack(">I", version << 24 | flags), *parts)


FTYP = box(b"ftyp", b"isom", struct.pack(">I", 512), b"isomiso2mp41")
HUGE = full(b"stsz", struct.pack(">II", 1, 50_000_000))  # 20 bytes, fifty million samples


def test_the_samples_a_compact_or_constant_size_table_declares_are_counted():
    assert declared_entries(io.BytesIO(mp4_bomb(10_000_000)), BOUND) == 10_000_023
    assert declared_entries(io.BytesIO(mp4_bomb(10_000_000, compact=False)), BOUND) == 10_000_023
    assert declared_entries(io.BytesIO(mp4_bomb(900)), BOUND) == 923


def test_a_file_is_read_from_a_path_or_an_open_file_left_at_its_start(tmp_path):
    data = mp4_bomb(900)
    (tmp_path / "v.mp4").write_bytes(data)
    assert declared_entries(tmp_path / "v.mp4", BOUND) == 923
    f = io.BytesIO(data)
    f.seek(100)
    assert declared_entries(f, BOUND) == 923 and f.tell() == 0


def test_a_real_mp4_declares_its_samples_rows_and_boxes():
    # 24 frames and ~33 AAC packets, with the boxes and table rows around them (182 with PyAV 18).
    count = declared_entries(io.BytesIO(mp4(64, 48, frames=24)), BOUND)
    assert count is not None and 24 + 30 <= count <= 400


def test_fragment_runs_are_counted():
    trun = full(b"trun", struct.pack(">I", 10_000_000))  # no per-sample fields: 12 bytes for ten million
    moof = box(b"moof", full(b"mfhd", struct.pack(">I", 1)), box(b"traf", full(b"tfhd", struct.pack(">I", 1)), trun))
    assert declared_entries(io.BytesIO(FTYP + moof + box(b"mdat")), BOUND) == 10_000_000 + 7


@pytest.mark.parametrize(
    "hidden",
    [
        pytest.param(lambda t: box(b"moov", box(b"udta", t)), id="udta"),
        pytest.param(
            lambda t: box(b"moov", box(b"meta", bytes(4), full(b"hdlr", bytes(4), b"mdir", bytes(13)), t)), id="iso-meta"
        ),
        pytest.param(lambda t: box(b"moov", box(b"meta", full(b"hdlr", bytes(4), b"mdir", bytes(13)), t)), id="qt-meta"),
        pytest.param(lambda t: box(b"moov", box(b"trak", box(b"mdia", box(b"minf", box(b"dinf", t))))), id="dinf"),
    ],
)
def test_a_table_wherever_ffmpeg_reads_one_is_counted(hidden):
    count = declared_entries(io.BytesIO(FTYP + hidden(HUGE)), BOUND)
    assert count is not None and count >= 50_000_000


def test_a_table_after_a_video_sample_entry_s_fields_is_counted():
    # FFmpeg reads the rest of an `avc1` entry (past its 78 bytes of fields) as boxes: avcC, pasp, ...
    avc1 = box(b"avc1", bytes(6), struct.pack(">H", 1), bytes(70), HUGE)
    stbl = box(b"stbl", full(b"stsd", struct.pack(">I", 1), avc1))
    hdlr = full(b"hdlr", bytes(4), b"vide", bytes(13))
    trak = box(b"trak", box(b"mdia", hdlr, box(b"minf", stbl)))
    count = declared_entries(io.BytesIO(FTYP + box(b"moov", trak)), BOUND)
    assert count is not None and count >= 50_000_000


def test_raw_sound_is_counted_by_chunk_as_ffmpeg_indexes_it():
    av = pytest.importorskip("av")
    np = pytest.importorskip("numpy")
    out = io.BytesIO()
    with av.open(out, "w", format="mov") as container:
        sound = container.add_stream("pcm_s16le", rate=48_000, layout="stereo")
        for start in range(0, 96_000, 1024):  # 2 s: 96,000 samples, each its own in the tables
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 2048), np.int16), format="s16", layout="stereo")
            frame.sample_rate, frame.pts = 48_000, start
            for packet in sound.encode(frame):
                container.mux(packet)
        for packet in sound.encode():
            container.mux(packet)
    count = declared_entries(io.BytesIO(out.getvalue()), BOUND)
    # FFmpeg indexes raw sound at most 1,024 samples an entry (160 for GSM): 94 entries; the count
    # takes 160 (600) and the boxes and rows besides.
    assert count is not None and 600 <= count <= 2_000


def test_a_compressed_movie_header_cannot_be_counted():
    cmov = box(b"moov", box(b"cmov", full(b"dcom", b"zlib")))
    assert declared_entries(io.BytesIO(FTYP + cmov), BOUND) is None


def test_the_walk_stops_just_past_its_bound():
    frees = box(b"free") * 100_000  # a box header read per box: the walk's own cost is bounded too
    assert declared_entries(io.BytesIO(FTYP + frees), 1000) == 1001


@pytest.mark.parametrize(
    "data",
    [
        FTYP + b"\0\0\0\x04moov",  # a box too small to be one
        FTYP + struct.pack(">I4s", 10_000, b"moov") + HUGE[:12],  # cut off
        FTYP + struct.pack(">I4sQ", 1, b"moov", 4),  # a 64-bit size too small
        FTYP + bytes(3),
        b"",
    ],
)
def test_a_broken_or_cut_off_file_is_counted_as_far_as_it_goes(data):
    count = declared_entries(io.BytesIO(data), BOUND)
    assert count is not None and count <= 3
