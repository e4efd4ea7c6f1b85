"""Write video frames and stereo audio as an H.264 + AAC mp4 (PyAV), and stereo audio into a stream."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np


def write_mp4(
    path: Path,
    frames: np.ndarray,
    *,
    fps: int = 24,
    audio: np.ndarray | None = None,
    sample_rate: int = 32_000,
    preset: str = "veryfast",
    alive: Callable[[], None] | None = None,
) -> None:
    """`frames`: uint8 [T, H, W, 3] RGB, H and W even. `audio`: float32 [2, samples] in [-1, 1].
    `alive` is called after each second of video is encoded (a long clip's encode takes minutes)."""
    t, h, w, _ = frames.shape
    with av.open(str(path), "w", format="mp4") as out:
        video = out.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = w, h, "yuv420p"
        video.options = {"preset": preset}
        sound = None
        if audio is not None:
            sound = out.add_stream("aac", rate=sample_rate)
            sound.layout = "stereo"
        for i in range(t):
            for packet in video.encode(av.VideoFrame.from_ndarray(frames[i], format="rgb24")):
                out.mux(packet)
            if alive is not None and (i + 1) % fps == 0:
                alive()
        for packet in video.encode():
            out.mux(packet)
        if sound is not None and audio is not None:
            encode_audio(out, sound, audio, sample_rate)


def encode_audio(
    out: av.container.OutputContainer, sound: av.audio.stream.AudioStream, audio: np.ndarray, sample_rate: int
) -> None:
    """`audio` (float32 [2, samples]) encoded into `sound`, a stereo stream of `out`, and flushed;
    converted first where the codec takes other samples (ALAC's integers)."""
    wanted = sound.codec_context.format
    convert = (
        None
        if wanted is None or wanted.name == "fltp"
        else av.AudioResampler(format=wanted.name, layout="stereo", rate=sample_rate)
    )
    chunk = 1024 * 32
    for start in range(0, audio.shape[1], chunk):
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(audio[:, start : start + chunk], dtype=np.float32), format="fltp", layout="stereo"
        )
        frame.sample_rate = sample_rate
        # Timed from 0: the encoder's first packet then starts before it (AAC's 1024 priming samples)
        # and the muxer writes the edit list that has players skip them, keeping the sound in sync.
        frame.pts, frame.time_base = start, Fraction(1, sample_rate)
        for ready in convert.resample(frame) if convert is not None else (frame,):
            for packet in sound.encode(ready):
                out.mux(packet)
    for ready in convert.resample(None) if convert is not None else ():
        for packet in sound.encode(ready):
            out.mux(packet)
    for packet in sound.encode():
        out.mux(packet)
