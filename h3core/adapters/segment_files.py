"""A long video's segment files, and joining them into the one video its job delivers (PyAV).

A segment file (`write_segment`) holds the frames its segment keeps (the repeated joint frame at
its head left out, so the file starts on a keyframe) as H.264, and the sound of every frame it was
asked for, the joint frame's included, as ALAC (lossless, and what this FFmpeg's MP4 muxer takes:
it refuses FLAC), so the final AAC is the only lossy step, and the joint's sound from both sides
is there to be crossfaded.

`segment_from_video` writes a segment file from a video an executor made whole (ComfyUI's own
mp4), decoded and encoded again frame by frame.

`join_segments` writes the final H.264 + AAC mp4: the segments' video packets copied as they are
(a remux: no frame is encoded again) where every segment was encoded alike, which segments made
by one executor are; otherwise their frames decoded and encoded once more (`Joined.remuxed` says
which). The sound is joined by `join_audio` (each joint frame's two takes crossfaded) and encoded
to AAC once, across the joints: AAC cannot be cut and spliced at an arbitrary sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from h3core.adapters.video import encode_audio
from h3core.domain.segments import Segment, SegmentPlan

__all__ = [
    "Joined",
    "ShortVideo",
    "audio_samples",
    "join_audio",
    "join_segments",
    "last_frame_png",
    "segment_from_video",
    "segment_sound",
    "write_segment",
]


def audio_samples(frames: int, fps: int, sample_rate: int) -> int:
    """The samples of sound that `frames` frames last (a frame is 1333⅓ samples at 32 kHz and 24 fps:
    counted from the start of the video, so lengths add up without drift)."""
    return round(frames * sample_rate / fps)


def segment_sound(audio: np.ndarray, segment: Segment, *, fps: int, sample_rate: int) -> np.ndarray:
    """`audio` (float32 [2, samples], a model's sound for the segment's frames) cut or padded with
    silence to exactly the samples its frames last where they lie in the joined video (what
    `join_audio` lays): a model's sound may run a little longer or shorter than its frames."""
    first = segment.start - segment.skip
    want = audio_samples(first + segment.frames, fps, sample_rate) - audio_samples(first, fps, sample_rate)
    have = audio.shape[1]
    if have >= want:
        return np.ascontiguousarray(audio[:, :want], dtype=np.float32)
    return np.concatenate([audio.astype(np.float32), np.zeros((audio.shape[0], want - have), dtype=np.float32)], axis=1)


def last_frame_png(path: Path) -> bytes:
    """The last frame of a video file as a PNG: the first keyframe of the segment after it."""
    import io

    last = None
    with av.open(str(path)) as f:
        for frame in f.decode(video=0):
            last = frame
    if last is None:
        raise ValueError(f"{path.name} holds no video frame")
    out = io.BytesIO()
    last.to_image().save(out, format="PNG")
    return out.getvalue()


def write_segment(
    path: Path,
    frames: np.ndarray,
    audio: np.ndarray,
    *,
    skip: int,
    fps: int = 24,
    sample_rate: int = 32_000,
    preset: str = "veryfast",
) -> None:
    """`frames`: uint8 [T, H, W, 3] RGB, the T frames the segment was asked for (a model's extra tail
    already cut); `audio`: float32 [2, samples], their sound. The file keeps frames[skip:] and all
    of the sound."""
    t, h, w, _ = frames.shape
    with av.open(str(path), "w", format="mp4") as out:
        video, sound = _segment_streams(out, w, h, fps=fps, sample_rate=sample_rate, preset=preset)
        for i in range(skip, t):
            for packet in video.encode(av.VideoFrame.from_ndarray(frames[i], format="rgb24")):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        encode_audio(out, sound, audio, sample_rate)


class ShortVideo(ValueError):
    """The video holds fewer frames than its segment was asked for."""

    def __init__(self, made: int, asked: int) -> None:
        super().__init__(f"the video holds {made} frames, {asked} asked")
        self.made, self.asked = made, asked


def segment_from_video(
    source: Path, dest: Path, segment: Segment, *, fps: int = 24, sample_rate: int = 32_000, preset: str = "veryfast"
) -> None:
    """Write `dest` as `write_segment` does from `source`, a video an executor made of the segment's
    call with its sound (ComfyUI's own mp4): its first `segment.frames` frames (a model's extra tail
    cut) but the joint frame (`segment.skip`), and their sound cut to `segment_sound`. Frames are
    decoded and encoded one at a time: a long high-resolution video is never held whole. Raises
    `ShortVideo` where `source` holds fewer frames than asked (`dest` is then not a segment)."""
    with av.open(str(source)) as src:
        audio = _decoded_sound(src, sample_rate) if src.streams.audio else np.zeros((2, 0), dtype=np.float32)
    sound = segment_sound(audio, segment, fps=fps, sample_rate=sample_rate)
    made = 0
    with av.open(str(source)) as src, av.open(str(dest), "w", format="mp4") as out:
        v = src.streams.video[0].codec_context
        video, audio_out = _segment_streams(out, v.width, v.height, fps=fps, sample_rate=sample_rate, preset=preset)
        for frame in src.decode(video=0):
            if made >= segment.frames:
                break
            if made >= segment.skip:
                frame = frame.reformat(format="yuv420p")
                frame.pts, frame.time_base = made - segment.skip, Fraction(1, fps)  # its place in the segment file
                for packet in video.encode(frame):
                    out.mux(packet)
            made += 1
        for packet in video.encode():
            out.mux(packet)
        encode_audio(out, audio_out, sound, sample_rate)
    if made < segment.frames:
        raise ShortVideo(made, segment.frames)


def _segment_streams(
    out: av.container.OutputContainer, width: int, height: int, *, fps: int, sample_rate: int, preset: str
) -> tuple[av.video.stream.VideoStream, av.audio.stream.AudioStream]:
    """A segment file's streams: H.264 video, ALAC stereo sound."""
    video = out.add_stream("libx264", rate=fps)
    video.width, video.height, video.pix_fmt = width, height, "yuv420p"
    video.options = {"preset": preset}
    sound = out.add_stream("alac", rate=sample_rate)
    sound.layout = "stereo"
    return video, sound


def join_audio(parts: Sequence[np.ndarray], plan: SegmentPlan, *, fps: int, sample_rate: int) -> np.ndarray:
    """The joined sound of the plan's video, exactly as long as its frames: segment k's sound laid
    from where its asked frames begin (its joint frame over the previous segment's last), and over
    each joint frame the previous segment's take faded out as the next one's fades in. `parts`:
    each segment's sound, float32 [2, samples], as long as the frames it was asked for."""
    if len(parts) != len(plan.segments):
        raise ValueError(f"{len(parts)} parts of sound for {len(plan.segments)} segments")
    out = np.zeros((2, audio_samples(plan.frames, fps, sample_rate)), dtype=np.float32)
    for segment, part in zip(plan.segments, parts, strict=True):
        first = segment.start - segment.skip  # the joined video's frame its sound begins at
        begin = audio_samples(first, fps, sample_rate)
        end = audio_samples(first + segment.frames, fps, sample_rate)
        if part.shape != (2, end - begin):
            raise ValueError(
                f"segment {segment.index}: sound of shape {part.shape} for {segment.frames} frames, not {(2, end - begin)}"
            )
        weight = np.ones(end - begin, dtype=np.float32)
        if segment.skip:  # fade in over the joint frame; the previous part fades out over the same samples
            joint = audio_samples(segment.start, fps, sample_rate) - begin
            ramp = (np.arange(joint, dtype=np.float32) + 0.5) / joint
            weight[:joint] = ramp
            out[:, begin : begin + joint] *= ramp[::-1]
        out[:, begin:end] += part * weight
    return out


@dataclass(frozen=True)
class Joined:
    """What `join_segments` wrote: the video's frames and samples of sound, and whether its video
    was copied as it was (a remux) or encoded again."""

    frames: int
    samples: int
    remuxed: bool


def join_segments(
    parts: Sequence[Path], plan: SegmentPlan, dest: Path, *, fps: int = 24, sample_rate: int = 32_000, preset: str = "veryfast"
) -> Joined:
    """Write the plan's video to `dest` from its segment files (`write_segment`'s, in order)."""
    if len(parts) != len(plan.segments):
        raise ValueError(f"{len(parts)} segment files for {len(plan.segments)} segments")
    sounds = [_sound(p, sample_rate) for p in parts]
    audio = join_audio(sounds, plan, fps=fps, sample_rate=sample_rate)
    remux = _encoded_alike(parts)
    with av.open(str(dest), "w", format="mp4") as out:
        with av.open(str(parts[0])) as first:  # every stream is added before the first packet
            source = first.streams.video[0]
            if remux:
                stream = out.add_stream_from_template(source)
            else:
                stream = out.add_stream("libx264", rate=fps)
                stream.width, stream.height, stream.pix_fmt = source.codec_context.width, source.codec_context.height, "yuv420p"
                stream.options = {"preset": preset}
        sound = out.add_stream("aac", rate=sample_rate)
        sound.layout = "stereo"
        frames = _copy_video(parts, out, stream) if remux else _encode_video(parts, out, stream)
        encode_audio(out, sound, audio, sample_rate)
    if frames != plan.frames:
        raise ValueError(f"the segment files hold {frames} frames, the plan {plan.frames}")
    return Joined(frames=frames, samples=audio.shape[1], remuxed=remux)


def _sound(path: Path, sample_rate: int) -> np.ndarray:
    """A segment file's sound, float32 [2, samples]."""
    with av.open(str(path)) as f:
        return _decoded_sound(f, sample_rate)


def _decoded_sound(f: av.container.InputContainer, sample_rate: int) -> np.ndarray:
    """An open file's first sound stream, resampled to float32 [2, samples] at `sample_rate`."""
    resampler = av.AudioResampler(format="fltp", layout="stereo", rate=sample_rate)
    chunks: list[np.ndarray] = []
    for frame in f.decode(audio=0):
        chunks.extend(r.to_ndarray() for r in resampler.resample(frame))
    chunks.extend(r.to_ndarray() for r in resampler.resample(None))
    return np.concatenate(chunks, axis=1).astype(np.float32) if chunks else np.zeros((2, 0), dtype=np.float32)


def _encoded_alike(parts: Sequence[Path]) -> bool:
    """Whether every part's video has the same codec, size and parameter sets: then its packets
    follow one another in one stream as they are."""
    seen = set()
    for path in parts:
        with av.open(str(path)) as f:
            v = f.streams.video[0].codec_context
            seen.add((v.name, v.width, v.height, v.pix_fmt, bytes(v.extradata or b"")))
    return len(seen) == 1


def _copy_video(parts: Sequence[Path], out: av.container.OutputContainer, stream: av.video.stream.VideoStream) -> int:
    """The parts' video packets into `stream` of `out`, each part's times moved past the last's end."""
    offset = Fraction(0)  # seconds: where the next part begins
    frames = 0
    for path in parts:
        with av.open(str(path)) as f:
            source = f.streams.video[0]
            base = source.time_base
            assert base is not None
            shift = int(offset / base)
            count = 0
            for packet in f.demux(source):
                if packet.dts is None:  # the demuxer's end-of-stream marker
                    continue
                packet.pts = packet.pts + shift if packet.pts is not None else None
                packet.dts += shift
                packet.stream = stream
                out.mux(packet)
                count += 1
            frames += count
            offset += Fraction(count) / Fraction(source.average_rate or source.guessed_rate or 24)
    return frames


def _encode_video(parts: Sequence[Path], out: av.container.OutputContainer, stream: av.video.stream.VideoStream) -> int:
    """The parts' frames decoded and encoded again into `stream` (parts not encoded alike)."""
    frames = 0
    for path in parts:
        with av.open(str(path)) as f:
            for frame in f.decode(video=0):
                frame.pts = None  # each part counts from 0: the encoder numbers them in order
                for packet in stream.encode(frame.reformat(format="yuv420p")):
                    out.mux(packet)
                frames += 1
    for packet in stream.encode():
        out.mux(packet)
    return frames
