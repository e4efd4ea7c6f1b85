"""A long video's segment files joined (h3core.adapters.segment_files): the joined video has exactly
the frames asked, each once and in order (the repeated joint frames dropped), its video packets
copied as they were, and its sound exactly as long, crossfaded over each joint frame."""

from __future__ import annotations

import av
import numpy as np
import pytest

from h3core.adapters.segment_files import audio_samples, join_audio, join_segments, write_segment
from h3core.domain.segments import plan_segments

FPS, RATE = 24, 32_000
SIZE = 64


BITS = 8


def frame_of(index: int) -> np.ndarray:
    """A frame whose black and white bars spell which frame of the whole video it is, in binary
    (what survives any encoder's loss)."""
    bars = np.repeat([255 if index >> b & 1 else 0 for b in range(BITS)], SIZE // BITS).astype(np.uint8)
    return np.broadcast_to(bars[None, :, None], (SIZE, SIZE, 3)).copy()


def index_of(frame: np.ndarray) -> int:
    bars = frame.reshape(SIZE, BITS, SIZE // BITS, 3).mean(axis=(0, 2, 3))
    return sum(1 << b for b, level in enumerate(bars) if level > 128)


def tone(first_frame: int, frames: int) -> np.ndarray:
    """A 440 Hz tone over frames [first_frame, first_frame + frames) of the whole video, in its own time."""
    begin, end = audio_samples(first_frame, FPS, RATE), audio_samples(first_frame + frames, FPS, RATE)
    t = np.arange(begin, end) / RATE
    wave = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    return np.stack([wave, wave])


def segment_files(tmp_path, plan, preset: str = "veryfast"):
    """Each segment as a model would make it: its first frame the previous segment's last again."""
    paths = []
    for s in plan.segments:
        first = s.start - s.skip
        frames = np.stack([frame_of(first + i) for i in range(s.frames)])
        path = tmp_path / f"segment-{s.index}.mp4"
        write_segment(path, frames, tone(first, s.frames), skip=s.skip, fps=FPS, sample_rate=RATE, preset=preset)
        paths.append(path)
    return paths


def decoded(path):
    """Each frame's index, the sound, and the sound's length as the container states it (what a
    player plays: AAC's priming and padding left out)."""
    with av.open(str(path)) as f:
        levels = [index_of(fr.to_ndarray(format="rgb24")) for fr in f.decode(video=0)]
    with av.open(str(path)) as f:
        sound = np.concatenate([fr.to_ndarray() for fr in f.decode(audio=0)], axis=1)
        stream = f.streams.audio[0]
        played = stream.duration * stream.time_base * RATE
    return levels, sound, played


def test_three_segments_join_into_exactly_the_frames_asked_each_once_with_their_sound(tmp_path):
    plan = plan_segments(100, 40)  # 34 + 33 + 33 frames kept: two joints
    assert len(plan.segments) == 3
    joined = join_segments(segment_files(tmp_path, plan), plan, tmp_path / "video.mp4", fps=FPS, sample_rate=RATE)
    assert (joined.frames, joined.samples, joined.remuxed) == (100, audio_samples(100, FPS, RATE), True)
    levels, sound, played = decoded(tmp_path / "video.mp4")
    assert levels == list(range(100))  # every frame once, in order: no joint frame twice, none lost
    # The sound lasts the video (to the container's timescale), and the tone runs on across the joints.
    assert abs(played - audio_samples(100, FPS, RATE)) <= 16
    n = joined.samples
    ideal = tone(0, 100)[0, :n]
    assert np.corrcoef(sound[0, :n], ideal)[0, 1] > 0.99
    for joint in plan.joints:  # around each joint as well as anywhere
        at = audio_samples(joint, FPS, RATE)
        assert np.max(np.abs(sound[0, at - 2000 : at + 2000] - ideal[at - 2000 : at + 2000])) < 0.1


def test_segments_encoded_otherwise_are_encoded_once_more_and_still_add_up(tmp_path):
    plan = plan_segments(60, 31)
    paths = segment_files(tmp_path, plan)
    write_segment(  # one segment encoded with other settings: its packets cannot follow the others'
        paths[1],
        np.stack([frame_of(plan.segments[1].start - 1 + i) for i in range(plan.segments[1].frames)]),
        tone(plan.segments[1].start - 1, plan.segments[1].frames),
        skip=1,
        fps=FPS,
        sample_rate=RATE,
        preset="ultrafast",
    )
    joined = join_segments(paths, plan, tmp_path / "video.mp4", fps=FPS, sample_rate=RATE)
    assert (joined.frames, joined.remuxed) == (60, False)
    levels, _, played = decoded(tmp_path / "video.mp4")
    assert levels == list(range(60)) and abs(played - audio_samples(60, FPS, RATE)) <= 16


def test_the_joint_frame_s_two_takes_are_crossfaded_and_the_sound_is_exactly_as_long_as_the_video():
    plan = plan_segments(10, 6)  # 6 frames, then 5 more after a joint frame
    first, second = plan.segments
    ones = np.ones((2, audio_samples(first.frames, FPS, RATE)), dtype=np.float32)
    silence = np.zeros(
        (2, audio_samples(second.start - 1 + second.frames, FPS, RATE) - audio_samples(second.start - 1, FPS, RATE)),
        dtype=np.float32,
    )
    out = join_audio([ones, silence], plan, fps=FPS, sample_rate=RATE)
    assert out.shape == (2, audio_samples(10, FPS, RATE))
    begin, end = audio_samples(second.start - 1, FPS, RATE), audio_samples(second.start, FPS, RATE)
    assert np.all(out[:, :begin] == 1) and np.all(out[:, end:] == 0)  # each side's own sound, whole
    fade = out[0, begin:end]
    assert fade[0] > 0.99 and fade[-1] < 0.01 and np.all(np.diff(fade) < 0)  # faded out over the joint frame
    with pytest.raises(ValueError, match="not \\(2, "):
        join_audio([ones, silence[:, 1:]], plan, fps=FPS, sample_rate=RATE)  # a part that does not last its frames
    with pytest.raises(ValueError, match="1 parts of sound for 2 segments"):
        join_audio([ones], plan, fps=FPS, sample_rate=RATE)
