"""What a video file holds, read from the file alone: its frame count and duration. Recovery
uses it for a finished video whose commit record is missing: one renamed into place by a commit
that wrote its record second (as earlier versions did) and was stopped between the two, and a
staged video the encoder had closed when a crash stopped its commit before the record.

mp4 and other containers are decoded whole through PyAV where it is installed, so a truncated
or damaged file does not pass; an ISO BMFF file (mp4, mov) must also be whole box by box: a file
cut inside its `moov` can still decode every video frame (its audio track lost), so decoding
alone does not tell it from the whole one. YUV4MPEG2 (the fake executor's video in the core
install) is walked frame by frame in pure Python. None: not a video that can be read whole here.
"""

from __future__ import annotations

import re
import struct
from fractions import Fraction
from pathlib import Path

# Containers whose own structure tells a whole file from one cut short at any byte: a file of
# one of these that reads whole is the file its writer closed (given the frames it should hold).
ENDS_CHECKED = frozenset({".y4m", ".mp4", ".m4v", ".mov"})
_ISO_BMFF = frozenset({".mp4", ".m4v", ".mov"})

_Y4M_HEADER = re.compile(rb"^YUV4MPEG2((?: [^\n]*)?)\n")
# Bytes of chroma per luma pixel for each YUV4MPEG2 colour space (4:2:0 unless the header says).
_Y4M_CHROMA = {"420": Fraction(1, 2), "422": Fraction(1), "444": Fraction(2), "mono": Fraction(0)}


def probe_video(path: Path, suffix: str | None = None) -> tuple[int, float] | None:
    """(frames, seconds) of the video at `path`, or None where it cannot be read whole. `suffix`:
    its container's extension where the name does not end with it (a staged `.mp4.part`)."""
    suffix = suffix or path.suffix
    if suffix == ".y4m":
        return _y4m(path.read_bytes())
    if suffix in _ISO_BMFF and not _boxes_whole(path):
        return None
    try:
        import av
    except ImportError:
        return None
    try:
        with av.open(str(path), format="mp4" if suffix in _ISO_BMFF else None) as container:
            stream = container.streams.video[0]
            frames = sum(1 for _ in container.decode(stream))
            rate = stream.average_rate or stream.guessed_rate
    except (av.error.FFmpegError, IndexError, OSError, ValueError):
        return None
    if not frames or not rate:
        return None
    return frames, float(frames / rate)


def _y4m(data: bytes) -> tuple[int, float] | None:
    m = _Y4M_HEADER.match(data)
    if m is None:
        return None
    params = {p[:1]: p[1:] for p in m.group(1).decode("ascii", "replace").split()}
    try:
        width, height = int(params["W"]), int(params["H"])
        num, den = (int(x) for x in params.get("F", "24:1").split(":"))
        colour = params.get("C", "420")
        chroma = next(v for k, v in _Y4M_CHROMA.items() if colour.startswith(k))
    except (KeyError, ValueError, StopIteration, ZeroDivisionError):
        return None
    frame_bytes = int(width * height * (1 + chroma))
    pos, frames = m.end(), 0
    while pos < len(data):
        if not data.startswith(b"FRAME", pos):
            return None
        end = data.find(b"\n", pos)
        if end < 0 or end + 1 + frame_bytes > len(data):
            return None  # cut short: not a whole video
        pos = end + 1 + frame_bytes
        frames += 1
    if not frames or not num:
        return None
    return frames, frames * den / num


def _boxes_whole(path: Path) -> bool:
    """Whether the file's top-level ISO BMFF boxes tile it exactly, a `moov` among them. A muxer
    writes a box's size once its content is written (0 until then, as an `mdat` while encoding),
    so a file cut at any byte has a box running past its end or sized 0."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, 2)
            pos, moov = 0, False
            while pos < end:
                f.seek(pos)
                head = f.read(16)
                if len(head) < 8:
                    return False
                size, kind = struct.unpack(">I4s", head[:8])
                if size == 1 and len(head) == 16:  # a 64-bit size follows the type
                    size = struct.unpack(">Q", head[8:])[0]
                if size < 8:  # 0 ("to the end of the file") is a size not yet written
                    return False
                moov = moov or kind == b"moov"
                pos += size
    except OSError:
        return False
    return moov and pos == end
