"""What an upload's file says of itself: an image's dimensions from its header (Pillow), a video's
or a sound's from its container (PyAV, in a child process bounded in memory and time). Each reads
a path or an open binary file (an upload kept in memory), and imports its library only when called.

This file is also the child's program (`python -P probing.py PATH BYTES`): it imports nothing of
h3core, so the child starts with PyAV alone.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, TypedDict

__all__ = ["PROBE_SECONDS", "Probed", "Source", "probe", "probe_image"]

Source = Path | IO[bytes]  # a file on disk, or bytes read like one

PROBE_SECONDS = 30.0  # a probe reads a container's headers; one slower than this is refused


class Probed(TypedDict, total=False):
    """What probing a media file read; a key is absent where the file did not say."""

    width: int | None
    height: int | None
    seconds: float
    has_audio: bool
    pixels: int | None  # `probe_image` only: Pillow refused the header of an image this large (None: it did not say)
    index: int  # `probe` only: the index entries FFmpeg built for the file's streams
    exceeded: str  # `probe` only: the bound the child passed ("memory" or "time"); nothing else was read


def probe_image(source: Source) -> Probed:
    """An image's dimensions from its header (Pillow), without decoding it; {} if unreadable."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(source) as image:  # the header only: no pixel is decoded
            width, height = image.size
    except Image.DecompressionBombError as exc:
        # Pillow's own bound (far above the store's) refused the header; its message has the count.
        found = re.search(r"\((\d+) pixels\)", str(exc))
        return {"pixels": int(found.group(1)) if found else None}
    except (UnidentifiedImageError, OSError, ValueError):
        return {}
    return {"width": width or None, "height": height or None}


def probe(source: Source, *, memory: int | None = None, seconds: float = PROBE_SECONDS) -> Probed:
    """Dimensions, duration, sound and index size of a media file, read by PyAV in a child process
    that may map `memory` bytes beyond what it holds once PyAV is loaded (None: no bound) and run
    `seconds`; {} if it cannot be decoded, {"exceeded": ...} if the child passed a bound: it died,
    ran out of time, or FFmpeg dropped a stream's index for want of memory (FFmpeg carries on
    without one, so the cap alone would let such a file through)."""
    if not isinstance(source, Path):
        with tempfile.NamedTemporaryFile(prefix="h3-probe-") as spool:  # the child reads a path
            source.seek(0)
            shutil.copyfileobj(source, spool)
            spool.flush()
            source.seek(0)
            return probe(Path(spool.name), memory=memory, seconds=seconds)
    # -P: the child's path is not this folder (its siblings are not modules to it).
    command = [sys.executable, "-P", __file__, str(source), str(memory or 0)]
    try:
        ran = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=seconds, check=False)
    except subprocess.TimeoutExpired:
        return {"exceeded": "time"}
    if ran.returncode == _NO_PYAV:
        raise ImportError(ran.stderr.decode(errors="replace").strip())
    if ran.returncode != 0:
        return {"exceeded": "memory"}  # killed, or a MemoryError: the cap is the child's only bound besides time
    try:
        out: Probed = json.loads(ran.stdout)
    except ValueError:
        return {}  # not the child's answer: as good as unreadable
    return out


_NO_PYAV = 3  # the child's exit status where PyAV cannot be imported


def _read(path: str) -> Probed:
    """`probe`'s reading, done in the child."""
    import av

    try:
        with av.open(path, "r") as container:
            out: Probed = {"has_audio": bool(container.streams.audio)}
            if container.streams.video:
                v = container.streams.video[0]
                out["width"], out["height"] = v.codec_context.width or None, v.codec_context.height or None
            if container.duration:
                out["seconds"] = container.duration / 1_000_000
            out["index"] = sum(len(s.index_entries) for s in container.streams)
            # The mov demuxer counts a stream's frames from its tables and then allocates its
            # index: frames without an index is an allocation that failed under the cap.
            media = [s for s in container.streams if s.type in ("video", "audio")]
            if container.format.name.startswith("mov,") and any(s.frames and not len(s.index_entries) for s in media):
                return {"exceeded": "memory"}
            return out
    except (av.error.FFmpegError, OSError, ValueError):
        return {}


def _child(path: str, memory: int) -> None:
    """The child: load PyAV, cap the address space `memory` bytes above what it maps then, read `path`."""
    try:
        import av  # noqa: F401 - loaded before the cap: the libraries' own mappings are not the probe's
    except ImportError as exc:
        print(f"PyAV is needed to probe videos and sounds: {exc}", file=sys.stderr)
        sys.exit(_NO_PYAV)
    if memory:
        try:
            import resource

            with open("/proc/self/statm") as statm:
                mapped = int(statm.read().split()[0]) * resource.getpagesize()
            hard = resource.getrlimit(resource.RLIMIT_AS)[1]
            soft = mapped + memory if hard == resource.RLIM_INFINITY else min(mapped + memory, hard)
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        except (ImportError, OSError, ValueError):
            pass  # no /proc or no RLIMIT_AS (not Linux): the time bound alone
    print(json.dumps(_read(path)))


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
