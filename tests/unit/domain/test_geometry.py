"""Token geometry against the worked values of docs/design.md §5."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from h3core.domain.geometry import (
    Media,
    audio_tokens,
    count_tokens,
    latent_frames,
    ref_audio_rows,
    ref_image_rows,
    ref_video_grid,
    ref_video_rows,
    snap_frames,
    video_tokens,
)
from tests.factories import request


@pytest.mark.parametrize(
    ("w", "h", "frames", "snapped", "total"),
    [
        (832, 480, 1125, 1127, 133_236),
        (832, 480, 1195, 1195, 141_264),
        (1024, 576, 743, 753, 130_382),
        (1024, 576, 787, 787, 136_256),
        (1344, 768, 412, 413, 124_352),
        (1344, 768, 431, 447, 134_546),
        (448, 256, 3000, 3014, 109_390),
    ],
)
def test_measured_points_of_the_field_notes(w, h, frames, snapped, total):
    assert snap_frames(frames) == snapped
    assert video_tokens(w, h, frames) + audio_tokens(frames) == total
    assert count_tokens(request(width=w, height=h, frames=frames)).total == total


def test_default_request_geometry():
    # 1344x768, 124 frames: 124 is already 17*7+5.
    assert snap_frames(124) == 124 and latent_frames(124) == 37
    assert video_tokens(1344, 768, 124) == 37 * 42 * 24


@given(st.integers(1, 50_000))
def test_snapping_is_the_smallest_17n_plus_5_at_or_above(frames):
    s = snap_frames(frames)
    assert s >= frames and s % 17 == 5 and s - 17 < max(frames, 5)


@given(st.integers(1, 5000), st.integers(1, 5000))
def test_tokens_grow_with_frames(a, b):
    lo, hi = sorted((a, b))
    assert video_tokens(832, 480, lo) + audio_tokens(lo) <= video_tokens(832, 480, hi) + audio_tokens(hi)


def test_keyframes_add_one_latent_frame_of_canvas_rows_each():
    plain = count_tokens(request(width=832, height=480))
    one = count_tokens(request(width=832, height=480, mode="fl2va", keyframes={"last": "b"}))
    two = count_tokens(request(width=832, height=480, mode="fl2va", keyframes={"first": "a", "last": "b"}))
    assert one.total - plain.total == 26 * 15
    assert two.total - plain.total == 2 * 26 * 15


def test_reference_images_are_encoded_at_a_2048_short_edge_whatever_the_canvas():
    # diffusers 0.42.1: a 16:9 picture becomes 3648x2048 (7296 rows), a square one 2048x2048.
    assert ref_image_rows(1920, 1080) == 7296
    assert ref_image_rows(500, 500) == 4096
    media = {"wide": Media(kind="image", width=1920, height=1080), "sq": Media(kind="image", width=512, height=512)}
    t = count_tokens(request(width=448, height=256, mode="ref2va", references={"images": ["wide", "sq"]}), media)
    assert t.references == 7296 + 4096
    assert t.reference_text == t.references  # about one Qwen3-VL token per 32x32 pixels too
    # Unknown dimensions are assumed 16:9, the common large case.
    assert count_tokens(request(mode="ref2va", references={"images": ["x"]})).references == 7296


def test_reference_audio_rows_round_up_and_stop_at_the_target_length():
    assert ref_audio_rows(1.0, 413) == 80  # 32000 samples: 40 steps of 800, two rows each
    assert ref_audio_rows(1.0 + 1 / 32000, 413) == 82  # one sample more: a 41st step
    assert ref_audio_rows(None, 413) == 2 * 689  # ceil, where target audio rounds (688)
    assert ref_audio_rows(600.0, 413) == 2 * 689


def test_reference_videos_snap_down_and_use_a_768_short_edge_canvas():
    assert ref_video_grid(1920, 1080) == 42 * 24  # 1344x768
    silent = Media(kind="video", width=1920, height=1080, seconds=2.0)
    # 48 frames snap down to 39 -> 12 latent frames.
    assert ref_video_rows(silent, 413) == 12 * 1008
    voiced = silent.model_copy(update={"has_audio": True})
    assert ref_video_rows(voiced, 413) == 12 * 1008 + 160
