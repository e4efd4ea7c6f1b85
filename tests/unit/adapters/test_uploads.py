"""The local upload store beyond the contract (tests/unit/adapters/test_upload_contract.py): an
image's size is read from its header and bounded before anything decodes it, a bomb that decodes
to gigabytes included; an MP4 that declares millions of samples costs the store's process next to
nothing, refused or probed; raw sound is counted as FFmpeg indexes it; a `.part` file is swept
only when no upload is writing it."""

from __future__ import annotations

import fcntl
import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

from h3core.adapters.uploads import LocalUploadStore, UploadRejected, probing
from h3core.testing.uploads import chunks, mp4_bomb
from tests.factories import bomb_png

pytestmark = pytest.mark.anyio


@pytest.fixture
def no_decoding(monkeypatch):
    """Any decode of pixels fails the test: Pillow's `load`, and PyAV's probe of a whole file."""
    from PIL import Image

    def refuse(*args, **kwargs):
        raise AssertionError("an upload's pixels were decoded")

    monkeypatch.setattr(Image.Image, "load", refuse)
    monkeypatch.setattr(probing, "probe", refuse)


@pytest.mark.usefixtures("no_decoding")
async def test_a_png_that_decodes_to_a_gigabyte_is_refused_with_its_pixel_count(tmp_path):
    """The contract's case has a header alone; this one is a whole bomb, 4.5 MB of real data."""
    with pytest.raises(UploadRejected, match="at most 16777216 pixels; it has 256000000$"):
        await LocalUploadStore(tmp_path).put("image/png", chunks(bomb_png(16000, 16000)))
    assert list(tmp_path.iterdir()) == []


# Puts the bomb into a LocalUploadStore in a fresh process and prints how far its peak resident
# size rose (VmHWM: the kernel's own high-water mark, so no sampling can miss a spike).
PEAK = textwrap.dedent(
    """
    import asyncio, json, sys
    from h3core.adapters.uploads import LocalUploadStore, UploadRejected
    from h3core.testing.uploads import chunks, mp4_bomb

    def peak():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))

    bomb = mp4_bomb(10_000_000)
    store = LocalUploadStore(sys.argv[1], max_samples=int(sys.argv[2]))
    before = peak()
    try:
        asyncio.run(store.put("video/mp4", chunks(bomb)))
        answer = "kept"
    except UploadRejected as exc:
        answer = str(exc)
    print(json.dumps({"rise": peak() - before, "answer": answer}))
    """
)


@pytest.mark.slow  # a fresh process that imports h3core, and a 5 MB file put
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
@pytest.mark.parametrize("max_samples", [None, 10**9], ids=["tables-counted", "tables-let-through"])
def test_an_mp4_declaring_ten_million_samples_costs_the_store_s_process_under_100_mb(tmp_path, max_samples):
    """Probed in the store's process, this 5 MB file took it up by 390 MB. Refused from its box
    headers, or (its tables let through) probed in a capped child, it costs a few MB here."""
    pytest.importorskip("av")
    bound = str(max_samples or 1_000_000)
    ran = subprocess.run(
        [sys.executable, "-c", PEAK, str(tmp_path), bound], capture_output=True, text=True, timeout=240, check=False
    )
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout)
    assert found["answer"] != "kept"
    assert found["rise"] <= 100 * 2**20, f"the peak rose by {found['rise'] / 2**20:.0f} MiB"


async def test_an_index_past_the_sample_bound_is_refused_whatever_the_container(tmp_path, monkeypatch):
    """FFmpeg's own count of its index, after the probe: the check for what the box walk does not read."""
    pytest.importorskip("av")
    walk_sees_nothing = lambda source, bound: 0  # noqa: E731
    monkeypatch.setattr("h3core.adapters.uploads._checking.declared_entries", walk_sees_nothing)
    with pytest.raises(UploadRejected) as caught:
        await LocalUploadStore(tmp_path, max_samples=100).put("video/mp4", chunks(mp4_bomb(1000, compact=False)))
    assert (caught.value.status, caught.value.field, caught.value.limit) == (422, "body", 100)
    assert str(caught.value) == "the video's index has 1000 entries; at most 100 are accepted"
    assert list(tmp_path.iterdir()) == []


async def test_raw_sound_in_a_quicktime_file_is_kept_though_it_declares_a_sample_per_sound_sample(tmp_path):
    """PCM in a .mov declares 48,000 samples a second; FFmpeg indexes it by chunk (1,024 samples an
    entry), and so does the count: 10 s of it fit a bound of 20,000."""
    av = pytest.importorskip("av")
    np = pytest.importorskip("numpy")
    out = io.BytesIO()
    with av.open(out, "w", format="mov") as container:
        picture = container.add_stream("mpeg4", rate=24)
        picture.width, picture.height, picture.pix_fmt = 64, 48, "yuv420p"
        sound = container.add_stream("pcm_s16le", rate=48_000, layout="stereo")
        for i in range(240):
            frame = av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), np.uint8), format="rgb24")
            frame.pts = i
            container.mux(picture.encode(frame))
        for start in range(0, 480_000, 1024):
            samples = av.AudioFrame.from_ndarray(np.zeros((1, 2048), np.int16), format="s16", layout="stereo")
            samples.sample_rate, samples.pts = 48_000, start
            container.mux(sound.encode(samples))
        container.mux(picture.encode())
        container.mux(sound.encode())
    upload = await LocalUploadStore(tmp_path, max_samples=20_000).put("video/quicktime", chunks(out.getvalue()))
    assert (upload.width, upload.height, upload.has_audio) == (64, 48, True)
    assert upload.seconds is not None and 9.9 < upload.seconds < 10.2


def test_a_part_file_is_swept_only_when_no_upload_writes_it(tmp_path):
    uploads = LocalUploadStore(tmp_path)
    writing, cut_off = tmp_path / f"u_{'a' * 32}.part", tmp_path / f"u_{'b' * 32}.part"
    writing.write_bytes(b"x" * 10)
    cut_off.write_bytes(b"y" * 20)
    with open(writing, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # as `put` holds the file it streams to
        assert uploads.sweep_parts(dry_run=True) == [(cut_off.name, 20)] and cut_off.exists()
        assert uploads.sweep_parts() == [(cut_off.name, 20)]
        assert writing.exists() and not cut_off.exists()
    assert uploads.sweep_parts() == [(writing.name, 10)] and not writing.exists()
