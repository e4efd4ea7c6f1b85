"""What an MP4 or QuickTime file's sample tables declare, counted from the box headers before
FFmpeg reads them.

FFmpeg's mov demuxer holds a row for every row a table declares and an index entry (24 bytes,
beside a sample size and a composition offset) for every sample, and it allocates for the count
written in a table's header: a 20-byte `stsz` with a constant size declares any number of
samples, a `trun` without per-sample fields as many, and 4-bit `stz2` sizes pack two samples a
byte. A 5 MB upload once took a probe from 117 MB to 500 MB. `declared_entries` walks the boxes
FFmpeg walks, reading headers and counts (and an `stsc`'s rows where needed), never a sample.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

__all__ = ["declared_entries"]

# Boxes FFmpeg reads as a list of boxes (mov_read_default, directly or through its handler); a
# table inside any of them is read, wherever the specification would have it.
CONTAINERS = frozenset(
    {
        b"moov", b"trak", b"mdia", b"minf", b"stbl", b"dinf", b"edts", b"mvex", b"tref", b"udta",
        b"sinf", b"schi", b"wave", b"moof", b"traf", b"mfra", b"ilst", b"iprp", b"ipco",
    }
)  # fmt: skip
# The handler types that set a stream's media type in FFmpeg (the last one read wins); a data
# handler's (`alis`, `url `) leaves it as it was.
MEDIA = frozenset({b"vide", b"soun", b"subp", b"clcp"})
MAX_DEPTH = 16  # FFmpeg stops at 10 levels
CHUNK_SAMPLES = 160  # the fewest samples FFmpeg's chunk index puts in one entry (GSM frames)


@dataclass
class _Track:
    """What decides the index FFmpeg builds for one `trak`."""

    handler: bytes = b""
    sizes: list[tuple[int, int]] = field(default_factory=list)  # (constant size or 0, sample count) per stsz/stz2
    stts: list[tuple[int, int]] = field(default_factory=list)  # (rows, first row's delta)
    stsc: list[tuple[int, int]] = field(default_factory=list)  # (offset of the rows, rows)
    chunks: int = 0  # chunk offsets FFmpeg reads


class _Walk:
    def __init__(self, f: IO[bytes], bound: int) -> None:
        self.f, self.bound = f, bound
        self.end = f.seek(0, os.SEEK_END)
        self.total = 0
        self.compressed = False

    def add(self, n: int) -> bool:
        """Count `n` more; whether the walk may go on."""
        self.total += n
        return self.total <= self.bound and not self.compressed

    def read(self, at: int, n: int) -> bytes:
        self.f.seek(at)
        return self.f.read(n)

    def boxes(self, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
        """(type, payload start, end) of each box from `start` to `end`, as FFmpeg cuts them: a
        size of 0 runs to `end`, 1 is followed by a 64-bit size, one past `end` stops at `end`,
        and one too small to be a box ends the list."""
        pos = start
        while end - pos >= 8:
            head = self.read(pos, 16)
            if len(head) < 8:
                return
            size, kind = struct.unpack(">I4s", head[:8])
            skip = 8
            if size == 1:
                if len(head) < 16:
                    return
                size, skip = struct.unpack(">Q", head[8:16])[0], 16
            elif size == 0:
                size = end - pos
            if size < skip:
                return
            stop = min(pos + size, end)
            yield kind, pos + skip, stop
            pos = stop

    def walk(self, start: int, end: int, track: _Track | None, depth: int) -> bool:
        """Count the boxes from `start` to `end` and what they declare; whether to go on."""
        for kind, body, stop in self.boxes(start, end):
            if not self.add(1):
                return False
            if kind == b"cmov":  # a compressed header: its tables are not in the file to count
                self.compressed = True
                return False
            if depth >= MAX_DEPTH:
                continue
            if kind == b"trak":
                inner = _Track()
                if not self.walk(body, stop, inner, depth + 1) or not self.add(self.samples(inner)):
                    return False
            elif kind in CONTAINERS:
                if not self.walk(body, stop, track, depth + 1):
                    return False
            elif kind == b"meta":
                # FFmpeg looks for the `hdlr` inside (an ISO `meta` has 4 bytes before it, a
                # QuickTime one none) and reads the boxes from there.
                at = self.find_hdlr(body, stop)
                if at is not None and not self.walk(at, stop, track, depth + 1):
                    return False
            elif kind == b"stsd":
                if not self.sample_entries(body, stop, track, depth + 1):
                    return False
            elif not self.add(self.table(kind, body, stop, track)):
                return False
        return True

    def find_hdlr(self, body: int, stop: int) -> int | None:
        """Where FFmpeg starts reading a `meta`: 4 bytes before the first `hdlr` a multiple of 4
        bytes into it, searched a piece at a time (an aligned tag never spans two pieces)."""
        pos = body
        while pos < stop:
            piece = self.read(pos, min(1 << 16, stop - pos))
            if not piece:
                return None
            found = piece.find(b"hdlr")
            while found >= 0:
                if found % 4 == 0 and pos + found > body:
                    return pos + found - 4
                found = piece.find(b"hdlr", found + 1)
            pos += len(piece)
        return None

    def sample_entries(self, body: int, stop: int, track: _Track | None, depth: int) -> bool:
        """An `stsd`: after each entry's fixed fields FFmpeg reads the rest as boxes (avcC,
        esds, wave, ...). Where those fields end depends on the track and the sound version;
        every place FFmpeg may start is walked."""
        handler = track.handler if track is not None else b""
        for _kind, entry, end in self.boxes(body + 8, stop):
            if not self.add(1):
                return False
            starts: list[int] = []
            if handler == b"vide":
                colours = self.palette(entry)
                starts = [78] + ([78 + colours] if colours else [])  # both: where FFmpeg reads a palette is its choice
            elif handler == b"soun":
                version = self.u16(entry + 8)
                starts = [28] + ([44] if version == 1 else [64] if version == 2 else [])
            for offset in starts:
                if entry + offset < end and not self.walk(entry + offset, end, track, depth):
                    return False
        return True

    def palette(self, entry: int) -> int:
        """The bytes of the colour table a video sample entry of 1 to 8 bits a pixel may carry
        after its fixed fields (FFmpeg's ff_get_qtpalette), which it reads before the boxes."""
        depth, table = self.u16(entry + 74), self.u16(entry + 76)
        if depth & 0x1F not in (1, 2, 4, 8) or depth & 0x20 or table:
            return 0
        first, last = self.u32(entry + 78), self.u16(entry + 84)
        return 8 + (8 * (last - first + 1) if first <= last <= 255 else 0)

    def u32(self, at: int) -> int:
        data = self.read(at, 4)
        return int.from_bytes(data, "big") if len(data) == 4 else 0

    def u16(self, at: int) -> int:
        data = self.read(at, 2)
        return int.from_bytes(data, "big") if len(data) == 2 else 0

    def table(self, kind: bytes, body: int, stop: int, track: _Track | None) -> int:
        """The rows (or samples) a leaf box declares; 0 for one that declares none. A track's
        sample counts are summed when its `trak` ends (`samples`)."""
        version, flags = self.read(body, 1), self.u32(body) & 0xFFFFFF
        v = version[0] if version else 0
        if kind in (b"stsz", b"stz2"):
            size = self.u32(body + 4) if kind == b"stsz" else 0
            count = self.u32(body + 8)
            if track is None:
                return count  # outside a `trak` it is still read, into the last stream
            track.sizes.append((size, count))
            return 0
        if kind in (b"stts", b"stsc", b"stco", b"co64") and track is not None:
            rows = self.u32(body + 4)
            if kind == b"stts":
                track.stts.append((rows, self.u32(body + 12)))
            elif kind == b"stsc":
                track.stsc.append((body + 8, rows))
            else:  # FFmpeg reads the rows past the box's end, up to the file's
                track.chunks += min(rows, (self.end - body - 8) // (8 if kind == b"co64" else 4))
            return rows
        if kind == b"hdlr":
            if track is not None:
                subtype = self.read(body + 8, 4)
                if subtype in MEDIA:
                    track.handler = subtype
            return 0
        if kind in (b"stts", b"ctts", b"stsc", b"stco", b"co64", b"stss", b"stps", b"elst", b"trun", b"senc"):
            return self.u32(body + 4)
        if kind == b"sdtp":
            return max(0, stop - body - 4)  # a byte a sample, as many as the box holds
        if kind == b"saiz":
            return self.u32(body + 5 + (8 if flags & 1 else 0))
        if kind == b"saio":
            return self.u32(body + 4 + (8 if flags & 1 else 0))
        if kind == b"sbgp":
            return self.u32(body + 8 + (4 if v == 1 else 0))
        if kind == b"sgpd":
            return self.u32(body + 8 + (4 if v >= 1 else 0))  # a default length (1) or description index (2)
        if kind == b"iloc":  # HEIF items, a record each
            return self.u32(body + 6) if v >= 2 else self.u16(body + 6)
        if kind == b"iinf":
            return self.u32(body + 4) if v else self.u16(body + 4)
        if kind == b"ipma":
            return self.u32(body + 4)
        if kind == b"tfra":
            return self.u32(body + 12)
        if kind == b"sidx":
            return self.u16(body + (30 if v else 22))
        return 0

    def samples(self, track: _Track) -> int:
        """The index entries FFmpeg builds for `track`: one a sample; but raw sound (an audio
        track of constant sample size whose one `stts` row has a delta of 1) is indexed by
        chunk, one entry per at least 160 samples of a chunk."""
        one_row = len(track.stts) == 1 and track.stts[0] == (1, 1)
        constant = len(track.sizes) == 1 and track.sizes[0][0] > 0
        if not (track.handler == b"soun" and one_row and constant):
            return sum(count for _, count in track.sizes)
        runs: list[tuple[int, int]] = []  # (first chunk, samples a chunk) of each `stsc` row
        for at, rows in track.stsc:
            rows = min(rows, (self.end - at) // 12)  # FFmpeg reads the rows past the box's end, up to the file's
            for start in range(0, rows, 1 << 14):
                piece = self.read(at + 12 * start, 12 * min(1 << 14, rows - start))
                runs += [(first, n) for first, n, _ in struct.iter_unpack(">III", piece[: len(piece) // 12 * 12])]
        chunks = track.chunks
        if not runs:
            return 0
        if len(track.stsc) != 1 or runs[0][0] < 1 or any(a >= b for (a, _), (b, _) in zip(runs, runs[1:], strict=False)):
            # Rows FFmpeg would mend first: as if every chunk held the most samples any row gives.
            return chunks * -(-max((n for _, n in runs), default=0) // CHUNK_SAMPLES)
        ends = [first - 1 for first, _ in runs[1:]] + [chunks]
        starts = [0] + ends[:-1]  # the first row applies from the first chunk, whatever it says
        return sum(
            max(0, min(end, chunks) - start) * -(-n // CHUNK_SAMPLES)
            for start, end, (_, n) in zip(starts, ends, runs, strict=True)
        )


def declared_entries(source: IO[bytes] | os.PathLike[str], bound: int) -> int | None:
    """The boxes of the MP4 or QuickTime file at `source`, the rows their sample tables declare
    and the index entries FFmpeg would build from them, counted up to just past `bound` (the walk
    stops there: it reads a box header per count); None for a compressed movie header (`cmov`),
    whose tables cannot be counted before FFmpeg expands them."""
    if isinstance(source, os.PathLike):
        with open(source, "rb") as f:
            return declared_entries(f, bound)
    walk = _Walk(source, bound)
    try:
        walk.walk(0, walk.end, None, 0)
    finally:
        source.seek(0)
    return None if walk.compressed else walk.total
