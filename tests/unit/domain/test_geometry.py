"""Token geometry against the worked values of field notes §5."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from h3core.domain.geometry import audio_tokens, count_tokens, latent_frames, snap_frames, video_tokens
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


def test_keyframes_and_reference_images_add_one_latent_frame_of_rows_each():
    plain = count_tokens(request(width=832, height=480))
    fl = count_tokens(request(width=832, height=480, mode="fl2va", keyframes={"first": "a", "last": "b"}))
    ref = count_tokens(request(width=832, height=480, mode="ref2va", references={"images": ["a", "b", "c"]}))
    assert fl.total - plain.total == 2 * 26 * 15
    assert ref.total - plain.total == 3 * 26 * 15
