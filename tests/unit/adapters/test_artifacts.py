"""The local artifact store: a commit is a durable record then a rename, so a complete video always
has its record; what recovery and gc read back (a commit stopped between the two is finished, a
video a record-second commit left without its record is read from the file); a deletion on
purpose leaves a record of when."""

from __future__ import annotations

import hashlib
import os

import pytest

from h3core.adapters.artifacts import ArtifactStore, LocalArtifactStore, sha256_file
from h3core.adapters.video_probe import probe_video
from h3core.domain.adoption import Expected
from h3core.executors.fake import _render_mp4, _render_y4m


@pytest.fixture
def videos(tmp_path) -> LocalArtifactStore:
    return LocalArtifactStore(tmp_path / "artifacts")


def test_a_commit_records_what_it_committed_and_reads_it_back(videos):
    staged = videos.staging("job", 3)
    staged.write_bytes(b"a video")
    artifact = videos.commit(staged, job_id="job", attempt=3, frames=24, duration_s=1.0)
    assert not staged.exists() and artifact.path == "job/attempt-3.mp4"
    assert (artifact.bytes, artifact.sha256) == (7, sha256_file(videos.resolve(artifact.path)))
    found = videos.committed("job", 3)
    assert found is not None and found.recorded == artifact and (found.size, found.sha256) == (7, artifact.sha256)
    assert videos.committed("job", 2) is None and videos.committed("other", 3) is None


def test_a_staged_file_never_committed_has_no_record(videos):
    videos.staging("job", 1).write_bytes(b"half")
    assert videos.committed("job", 1) is None
    assert [(f.path, f.partial, f.attempt) for f in videos.files()] == [("job/attempt-1.mp4.part", True, 1)]


def test_discard_removes_one_attempts_files_only(videos):
    for attempt in (1, 10):
        staged = videos.staging("job", attempt)
        staged.write_bytes(b"v")
        videos.commit(staged, job_id="job", attempt=attempt, frames=1, duration_s=0.1)
    videos.staging("job", 1, ".webm").write_bytes(b"x")
    removed = videos.discard("job", 1)
    assert sorted(f.path for f in removed) == ["job/attempt-1.mp4", "job/attempt-1.record.json", "job/attempt-1.webm.part"]
    webm = next(f for f in removed if f.path.endswith(".webm.part"))
    assert (webm.bytes, webm.sha256, webm.partial) == (1, hashlib.sha256(b"x").hexdigest(), True), "what went is said"
    assert [f.path for f in videos.files()] == ["job/attempt-10.mp4", "job/attempt-10.record.json"]


def test_measure_refuses_paths_outside_the_store_and_reports_what_is_not_a_file(videos):
    with pytest.raises(ValueError, match="leaves the artifact store"):
        videos.measure("../../etc/passwd")
    with pytest.raises(ValueError):
        videos.measure("/etc/passwd")
    assert videos.measure(".") == (None, None)
    assert videos.measure("nothing/here.mp4") == (None, None)


def test_a_commit_writes_its_record_before_the_video_takes_its_name(videos, monkeypatch):
    """Stopped at the rename (the commit's last step), the record already names the video, and
    reading the attempt back finishes the rename: the video is adopted, not thrown away."""
    staged = videos.staging("job", 1)
    staged.write_bytes(b"a whole video")

    real = os.replace

    def replace(src, dst):  # the record's own rename goes through; the video's is where it dies
        if str(src).endswith(".mp4.part"):
            raise OSError("the process died here")
        return real(src, dst)

    with monkeypatch.context() as m:
        m.setattr(os, "replace", replace)
        with pytest.raises(OSError, match="died here"):
            videos.commit(staged, job_id="job", attempt=1, frames=24, duration_s=1.0)
    assert staged.exists() and (videos.root / "job" / "attempt-1.record.json").exists()
    assert not (videos.root / "job" / "attempt-1.mp4").exists()
    found = videos.committed("job", 1)
    assert found is not None and found.recorded.path == "job/attempt-1.mp4"
    assert (found.size, found.sha256) == (13, hashlib.sha256(b"a whole video").hexdigest())
    assert not staged.exists() and (videos.root / found.recorded.path).read_bytes() == b"a whole video"


def test_a_segment_takes_its_name_whole_or_not_at_all(videos, monkeypatch):
    """The staged bytes are synced before the rename, the folder's names after it: stopped at the
    rename, no file is at the segment's name and the staged one is whole where it was; put again,
    the segment is there whole."""
    staged = videos.staging("job", 1)
    staged.write_bytes(b"a whole segment")
    staged_inode, folder_inode = staged.stat().st_ino, staged.parent.stat().st_ino
    real_fsync = os.fsync
    seen: list[tuple[str, int]] = []

    def fsync(fd):
        seen.append(("fsync", os.fstat(fd).st_ino))
        return real_fsync(fd)

    def replace(src, dst):
        seen.append(("replace", os.stat(src).st_ino))
        raise OSError("the process died here")

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", fsync)
        m.setattr(os, "replace", replace)
        with pytest.raises(OSError, match="died here"):
            videos.put_segment(staged, job_id="job", attempt=1, index=0, frames=24, duration_s=1.0)
    assert seen == [("fsync", staged_inode), ("replace", staged_inode)]
    assert not (videos.root / "job" / "segment-1-0.mp4").exists() and videos.segment_files("job") == []
    assert staged.read_bytes() == b"a whole segment", "staged, as it was: recovery discards it with its attempt"

    seen.clear()
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", fsync)
        segment = videos.put_segment(staged, job_id="job", attempt=1, index=0, frames=24, duration_s=1.0)
    assert seen == [("fsync", staged_inode), ("fsync", folder_inode)], "the new name made durable"
    assert (videos.root / segment.path).read_bytes() == b"a whole segment" and not staged.exists()
    assert segment.sha256 == hashlib.sha256(b"a whole segment").hexdigest()


def test_a_staged_file_that_is_not_the_recorded_one_is_not_renamed(videos):
    staged = videos.staging("job", 1)
    staged.write_bytes(b"a whole video")
    artifact = videos.commit(staged, job_id="job", attempt=1, frames=24, duration_s=1.0)
    final = videos.resolve(artifact.path)
    final.rename(final.with_name(final.name + ".part"))
    final.with_name(final.name + ".part").write_bytes(b"something else")
    found = videos.committed("job", 1)
    assert found is not None and found.size is None, "the recorded video is missing; the other file stays staged"


@pytest.mark.parametrize(
    ("suffix", "render", "media_type"),
    [(".mp4", _render_mp4, "video/mp4"), (".y4m", _render_y4m, "video/x-yuv4mpeg2")],
)
def test_a_whole_video_without_a_record_is_recorded_from_the_file(videos, suffix, render, media_type):
    """What a commit that wrote its record second left when it was stopped between the two."""
    data = render(64, 48, 22, 7)
    (videos.root / "job").mkdir()
    (videos.root / "job" / f"attempt-2{suffix}").write_bytes(data)
    found = videos.committed("job", 2)
    assert found is not None
    assert found.recorded.path == f"job/attempt-2{suffix}" and found.recorded.media_type == media_type
    assert (found.recorded.frames, found.recorded.duration_s) == (22, round(22 / 24, 3))
    assert found.recorded.sha256 == found.sha256 == hashlib.sha256(data).hexdigest()
    assert (videos.root / "job" / "attempt-2.record.json").exists(), "recorded, as every commit leaves it"
    assert videos.committed("job", 1) is None


@pytest.mark.parametrize(("suffix", "render"), [(".mp4", _render_mp4), (".y4m", _render_y4m)])
def test_a_cut_short_video_without_a_record_is_not_taken_for_a_finished_one(videos, suffix, render):
    data = render(64, 48, 22, 7)
    (videos.root / "job").mkdir()
    (videos.root / "job" / f"attempt-1{suffix}").write_bytes(data[: len(data) * 2 // 3])
    assert videos.committed("job", 1) is None
    assert not (videos.root / "job" / "attempt-1.record.json").exists()


def _mp4_cuts(data: bytes) -> list[int]:
    """Where a kill can cut the encoder's file: every byte from its `moov` (where decoding alone is
    fooled) to its end, and a stride through the rest."""
    moov = data.index(b"moov") - 4
    return sorted(set(range(0, moov, 97)) | set(range(moov - 16, len(data))))


@pytest.mark.parametrize(("suffix", "render"), [(".mp4", _render_mp4), (".y4m", _render_y4m)])
def test_a_whole_staged_video_a_crash_left_before_its_record_is_committed_as_it_is(videos, suffix, render):
    """The encoder closed the file, the crash came before the commit's record: recovery's read
    (with the frames the attempt makes) records it with its true size and sha256 and renames it."""
    data = render(64, 48, 22, 7)
    staged = videos.staging("job", 1, suffix)
    staged.write_bytes(data)
    found = videos.committed("job", 1, expect=Expected(frames=22, fps=24))
    assert found is not None and (found.size, found.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert (found.recorded.path, found.recorded.frames, found.recorded.duration_s) == (f"job/attempt-1{suffix}", 22, 22 / 24)
    assert (found.recorded.bytes, found.recorded.sha256) == (found.size, found.sha256)
    assert not staged.exists() and (videos.root / "job" / "attempt-1.record.json").exists(), "committed, as a commit leaves it"


def test_no_cut_of_a_staged_mp4_is_whole_though_decoding_alone_takes_some_for_whole(tmp_path):
    """A file cut inside its `moov` after the video track decodes every frame (its audio track
    lost): the box walk is what refuses it, at every byte."""
    import av

    data = _render_mp4(64, 48, 22, 7)
    path = tmp_path / "attempt-1.mp4.part"
    fooled = 0
    for cut in _mp4_cuts(data):
        path.write_bytes(data[:cut])
        assert probe_video(path, ".mp4") is None, f"cut at byte {cut} of {len(data)} taken for whole"
        if cut > len(data) - 200:
            try:
                with av.open(str(path), format="mp4") as c:
                    fooled += sum(1 for _ in c.decode(video=0)) == 22
            except av.error.FFmpegError:
                pass
    assert fooled, "some cuts decode all 22 frames: decoding alone cannot tell them from the whole file"


@pytest.mark.parametrize(("suffix", "render"), [(".mp4", _render_mp4), (".y4m", _render_y4m)])
@pytest.mark.parametrize("kept", [0.05, 0.5, 0.97, -1])
def test_a_staged_video_cut_short_is_never_committed(videos, suffix, render, kept):
    data = render(64, 48, 22, 7)
    cut = len(data) - 1 if kept == -1 else int(len(data) * kept)
    staged = videos.staging("job", 1, suffix)
    staged.write_bytes(data[:cut])
    assert videos.committed("job", 1, expect=Expected(frames=22, fps=24)) is None
    assert staged.read_bytes() == data[:cut] and not (videos.root / "job" / "attempt-1.record.json").exists()


@pytest.mark.parametrize("job_id", ["../x", "a/b", ".", ""])
def test_no_job_id_that_is_a_path_gets_a_folder(videos, job_id):
    with pytest.raises(ValueError, match="not a safe artifact name"):
        videos.staging(job_id, 1)


# -- deleting a video on purpose (/v1/videos DELETE): the file goes, a record of when stays --------


@pytest.fixture
def committed(tmp_path):
    store = LocalArtifactStore(tmp_path / "artifacts")
    staged = store.staging("job1", 1)
    staged.write_bytes(b"\x00\x00\x00\x20ftypisom" + b"x" * 100)
    return store, store.commit(staged, job_id="job1", attempt=1, frames=24, duration_s=1.0)


def test_delete_removes_the_file_and_records_when(committed):
    store, artifact = committed
    assert isinstance(store, ArtifactStore)
    assert store.deleted_at(artifact.path) is None
    when = store.delete(artifact.path)
    assert not store.resolve(artifact.path).exists()
    assert store.deleted_at(artifact.path) == when
    assert store.delete(artifact.path) == when  # again: nothing more to do, the first time stands


def test_a_file_left_behind_by_an_interrupted_delete_goes_on_the_next_one(committed):
    store, artifact = committed
    path = store.resolve(artifact.path)
    kept = path.read_bytes()
    when = store.delete(artifact.path)
    path.write_bytes(kept)  # as if the process died between the record and the unlink
    assert store.deleted_at(artifact.path) == when
    assert store.delete(artifact.path) == when and not path.exists()


def test_a_file_missing_without_a_delete_is_not_reported_deleted(committed):
    store, artifact = committed
    store.resolve(artifact.path).unlink()
    assert store.deleted_at(artifact.path) is None


@pytest.mark.parametrize("escape", ["../outside.mp4", "/etc/passwd"])
def test_delete_never_leaves_the_store(committed, escape):
    store, _ = committed
    with pytest.raises(ValueError, match="leaves the artifact store"):
        store.delete(escape)
    with pytest.raises(ValueError, match="leaves the artifact store"):
        store.deleted_at(escape)


def test_a_video_deleted_as_a_whole_is_recorded_once_with_or_without_a_file(tmp_path):
    store = LocalArtifactStore(tmp_path / "artifacts")
    assert store.video_deleted_at("job1") is None
    when = store.delete_video("job1")  # a job that never made a file: its folder is made for the record
    assert store.video_deleted_at("job1") == when and store.delete_video("job1") == when
    assert store.files() == []  # the record is no attempt's file: gc never lists it
    with pytest.raises(ValueError, match="not a safe artifact name"):
        store.delete_video("../job1")
