"""The artifact-store contract as tests, for any implementation of `h3core.ArtifactStore`.

Subclass `ArtifactStoreContract` in a test module and override its `artifacts` fixture to give
a fresh, empty store; pytest then runs every contract test against it:

    class TestMyArtifacts(ArtifactStoreContract):
        @pytest.fixture
        def artifacts(self, tmp_path):
            return MyArtifactStore(tmp_path / "artifacts")

h3core's own suite runs it against `LocalArtifactStore` and `MemoryArtifactStore`. Needs pytest.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from h3core.adapters.artifacts.base import ArtifactStore
from h3core.domain.adoption import Expected

__all__ = ["ArtifactStoreContract"]

JOB = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"
VIDEO = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 40  # bytes the store must keep as they are
# A whole video any install can read (YUV4MPEG2: 24 frames of 8x8, 4:2:0, one second at 24 fps),
# for the staged video a crash left before its commit's record; each frame is 6 + 96 bytes.
_FRAME = b"FRAME\n" + bytes(range(96))
WHOLE = b"YUV4MPEG2 W8 H8 F24:1 Ip A1:1 C420jpeg\n" + _FRAME * 24
WHOLE_EXPECTED = Expected(frames=24, fps=24)


def _stage(store: ArtifactStore, job: str = JOB, attempt: int = 1, data: bytes = VIDEO, suffix: str = ".mp4") -> Path:
    staged = store.staging(job, attempt, suffix)
    staged.write_bytes(data)
    return staged


def _commit(store: ArtifactStore, job: str = JOB, attempt: int = 1, data: bytes = VIDEO):
    return store.commit(_stage(store, job, attempt, data), job_id=job, attempt=attempt, frames=24, duration_s=1.0)


def _segment(store: ArtifactStore, attempt: int = 1, index: int = 0, data: bytes = VIDEO):
    staged = _stage(store, attempt=attempt, data=data)
    return store.put_segment(staged, job_id=JOB, attempt=attempt, index=index, frames=24, duration_s=1.0)


class ArtifactStoreContract:
    """What every artifact store must do (the contract in `h3core.adapters.artifacts.base`)."""

    @pytest.fixture
    def artifacts(self) -> ArtifactStore:
        raise NotImplementedError("override the `artifacts` fixture: return a fresh, empty artifact store")

    def test_it_is_an_artifact_store(self, artifacts):
        assert isinstance(artifacts, ArtifactStore)

    def test_a_checkpoint_reads_back_as_written_and_is_listed_with_its_step(self, artifacts):
        data = b"latents" * 1000
        path, size, sha = artifacts.put_checkpoint(JOB, 1, 4, data)
        assert (size, sha) == (len(data), hashlib.sha256(data).hexdigest()) and not Path(path).is_absolute()
        assert artifacts.read_checkpoint(path) == data
        assert artifacts.measure(path) == (size, sha)
        later, _, _ = artifacts.put_checkpoint(JOB, 2, 9, b"later")
        listed = artifacts.checkpoint_files(JOB)
        assert [(f.path, f.attempt, f.checkpoint, f.partial) for f in listed] == [(path, 1, 4, False), (later, 2, 9, False)]
        assert {f.path for f in artifacts.files() if f.checkpoint is not None} == {path, later}
        assert artifacts.checkpoint_files(OTHER) == []

    def test_checkpoints_belong_to_the_job_not_to_an_attempt(self, artifacts):
        path, _, _ = artifacts.put_checkpoint(JOB, 1, 3, b"state")
        _commit(artifacts, attempt=1)
        artifacts.discard(JOB, 1)
        assert path not in {f.path for f in artifacts.attempt_files(JOB, 1)}
        assert artifacts.read_checkpoint(path) == b"state", "discarding a failed attempt keeps what the next continues from"
        artifacts.remove(path)
        assert artifacts.checkpoint_files(JOB) == []
        with pytest.raises(FileNotFoundError):
            artifacts.read_checkpoint(path)

    def test_a_checkpoint_is_never_read_from_outside_the_store_or_from_a_video(self, artifacts):
        artifact = _commit(artifacts)
        with pytest.raises(ValueError):
            artifacts.read_checkpoint(artifact.path)
        with pytest.raises(ValueError):
            artifacts.read_checkpoint("../outside.ckpt")
        with pytest.raises(ValueError):
            artifacts.put_checkpoint("../escape", 1, 1, b"x")

    def test_a_segment_is_stored_at_its_own_name_as_staged_and_reads_back(self, artifacts):
        staged = _stage(artifacts, attempt=2)
        segment = artifacts.put_segment(staged, job_id=JOB, attempt=2, index=1, frames=24, duration_s=1.0)
        sha = hashlib.sha256(VIDEO).hexdigest()
        assert segment.path == f"{JOB}/segment-2-1.mp4" and not staged.exists(), "moved, not copied"
        assert (segment.bytes, segment.sha256, segment.frames, segment.duration_s) == (len(VIDEO), sha, 24, 1.0)
        assert segment.media_type == "video/mp4"
        assert artifacts.measure(segment.path) == (len(VIDEO), sha) and artifacts.stat(segment.path).size == len(VIDEO)
        assert b"".join(artifacts.read(segment.path, 10, 20)) == VIDEO[10:21]
        with artifacts.local_file(segment.path) as path:
            assert path.read_bytes() == VIDEO
        first = _segment(artifacts, attempt=3, index=0, data=b"first")
        listed = artifacts.segment_files(JOB)
        assert [(f.path, f.attempt, f.segment, f.partial, f.bytes) for f in listed] == [
            (first.path, 3, 0, False, 5),
            (segment.path, 2, 1, False, len(VIDEO)),
        ], "by index, then attempt"
        in_files = {f.path: (f.job_id, f.attempt, f.segment, f.checkpoint) for f in artifacts.files()}
        assert in_files == {first.path: (JOB, 3, 0, None), segment.path: (JOB, 2, 1, None)}
        assert artifacts.segment_files(OTHER) == []

    def test_a_segment_put_again_replaces_it(self, artifacts):
        _segment(artifacts, data=b"an attempt's first try")
        again = _segment(artifacts, data=b"again")
        assert b"".join(artifacts.read(again.path)) == b"again" and again.bytes == 5
        assert [f.path for f in artifacts.segment_files(JOB)] == [again.path]

    def test_segments_belong_to_the_job_not_to_an_attempt(self, artifacts):
        segment = _segment(artifacts)
        _commit(artifacts, attempt=1)
        assert segment.path not in {f.path for f in artifacts.attempt_files(JOB, 1)}
        assert segment.path not in {f.path for f in artifacts.discard(JOB, 1)}
        assert artifacts.measure(segment.path) == (segment.bytes, segment.sha256), "a retry continues after it"
        artifacts.remove(segment.path)
        artifacts.remove(segment.path)  # a missing one is no error
        assert artifacts.segment_files(JOB) == [] and artifacts.files() == []

    def test_no_segment_is_put_for_an_unsafe_job_id(self, artifacts):
        staged = _stage(artifacts)
        for job in ("../x", "a/b", "", "."):
            with pytest.raises(ValueError):
                artifacts.put_segment(staged, job_id=job, attempt=1, index=0, frames=24, duration_s=1.0)
        assert staged.read_bytes() == VIDEO and artifacts.segment_files(JOB) == []

    def test_a_staged_video_is_not_committed_and_is_listed_as_partial(self, artifacts):
        staged = _stage(artifacts)
        assert artifacts.committed(JOB, 1) is None
        listed = artifacts.files()
        assert [(f.job_id, f.attempt, f.partial, f.bytes) for f in listed] == [(JOB, 1, True, len(VIDEO))]
        assert artifacts.staging(JOB, 2) != staged, "each attempt stages apart"

    def test_what_only_this_process_sees_staged_is_partial_and_among_the_files(self, artifacts):
        _stage(artifacts)
        here = artifacts.staged_here()
        assert all(f.partial for f in here) and {f.path for f in here} <= {f.path for f in artifacts.files()}, here

    def test_a_commit_records_the_staged_bytes_and_reads_them_back(self, artifacts):
        artifact = _commit(artifacts)
        sha = hashlib.sha256(VIDEO).hexdigest()
        assert (artifact.bytes, artifact.sha256, artifact.frames, artifact.duration_s) == (len(VIDEO), sha, 24, 1.0)
        assert artifact.media_type == "video/mp4" and not Path(artifact.path).is_absolute()
        found = artifacts.committed(JOB, 1)
        assert found is not None and found.recorded == artifact
        assert (found.attempt, found.size, found.sha256) == (1, len(VIDEO), sha)
        assert b"".join(artifacts.read(artifact.path)) == VIDEO
        assert artifacts.measure(artifact.path) == (len(VIDEO), sha)
        assert artifacts.measure(artifact.path, hashed=False) == (len(VIDEO), None)
        assert artifacts.committed(JOB, 2) is None and artifacts.committed(OTHER, 1) is None

    def test_a_whole_staged_video_a_crash_left_before_its_record_is_committed_when_asked(self, artifacts):
        staged = _stage(artifacts, data=WHOLE, suffix=".y4m")
        assert artifacts.committed(JOB, 1) is None, "without `expect`, nothing staged is committed"
        found = artifacts.committed(JOB, 1, expect=WHOLE_EXPECTED)
        sha = hashlib.sha256(WHOLE).hexdigest()
        assert found is not None and (found.attempt, found.size, found.sha256) == (1, len(WHOLE), sha)
        recorded = found.recorded
        assert (recorded.bytes, recorded.sha256, recorded.frames, recorded.duration_s) == (len(WHOLE), sha, 24, 1.0)
        assert recorded.path.endswith(".y4m") and recorded.media_type == "video/x-yuv4mpeg2"
        assert b"".join(artifacts.read(recorded.path)) == WHOLE and not staged.exists(), "moved into place"
        assert [(f.path, f.partial) for f in artifacts.files() if f.path.endswith(".y4m")] == [(recorded.path, False)]
        assert artifacts.committed(JOB, 1) == found, "read back as any committed video"

    @pytest.mark.parametrize(
        ("data", "expect"),
        [
            (WHOLE[:-40], WHOLE_EXPECTED),  # cut inside its last frame
            (WHOLE[: -len(_FRAME)], WHOLE_EXPECTED),  # cut where a frame begins: 23 whole frames
            (WHOLE[:20], WHOLE_EXPECTED),  # cut inside its header
            (WHOLE, Expected(frames=25, fps=24)),  # whole, but not the video the attempt makes
            (WHOLE, Expected(frames=24, fps=12)),  # its frames, not its length
        ],
        ids=["mid-frame", "frame-boundary", "header", "other-frames", "other-length"],
    )
    def test_a_staged_video_that_is_not_whole_is_never_committed(self, artifacts, data, expect):
        staged = _stage(artifacts, data=data, suffix=".y4m")
        assert artifacts.committed(JOB, 1, expect=expect) is None
        assert staged.read_bytes() == data, "it stays staged, as it was"
        assert [(f.attempt, f.partial, f.bytes) for f in artifacts.files()] == [(1, True, len(data))]

    def test_a_staged_file_of_a_container_whose_cut_cannot_be_told_is_never_committed(self, artifacts):
        staged = _stage(artifacts, data=WHOLE, suffix=".webm")  # not a WebM: whatever it reads as, it stays staged
        assert artifacts.committed(JOB, 1, expect=WHOLE_EXPECTED) is None and staged.exists()

    def test_adoption_measures_the_video_as_it_is_now(self, artifacts):
        artifact = _commit(artifacts)
        artifacts.remove(artifact.path)
        found = artifacts.committed(JOB, 1)
        assert found is None or (found.recorded == artifact and found.size is None and found.sha256 is None)
        assert artifacts.measure(artifact.path) == (None, None)

    def test_attempt_files_and_discard_see_one_attempt_only(self, artifacts):
        first = _commit(artifacts, attempt=1)
        _stage(artifacts, attempt=2, data=b"half a video")
        of_two = artifacts.attempt_files(JOB, 2)
        assert [(f.attempt, f.partial, f.bytes, f.sha256) for f in of_two] == [
            (2, True, 12, hashlib.sha256(b"half a video").hexdigest())
        ]
        assert artifacts.discard(JOB, 2) == of_two
        assert artifacts.attempt_files(JOB, 2) == [] and artifacts.committed(JOB, 1) is not None
        assert first.path in {f.path for f in artifacts.attempt_files(JOB, 1)}
        removed = artifacts.discard(JOB, 1)
        assert first.path in {f.path for f in removed} and artifacts.committed(JOB, 1) is None
        assert artifacts.files() == []

    def test_files_lists_every_job_and_attempt_and_remove_deletes_one(self, artifacts):
        a = _commit(artifacts, JOB, 1)
        b = _commit(artifacts, OTHER, 3)
        videos = {f.path: (f.job_id, f.attempt, f.partial) for f in artifacts.files()}
        assert videos[a.path] == (JOB, 1, False) and videos[b.path] == (OTHER, 3, False)
        artifacts.remove(a.path)
        artifacts.remove(a.path)  # a missing file is no error
        assert a.path not in {f.path for f in artifacts.files()} and b.path in {f.path for f in artifacts.files()}

    def test_no_path_leaves_the_store_and_no_unsafe_job_id_is_taken(self, artifacts):
        for path in ("../outside.mp4", "/etc/passwd", f"{JOB}/../../outside.mp4"):
            for read in (artifacts.stat, artifacts.read, artifacts.measure, artifacts.deleted_at, artifacts.remove):
                with pytest.raises(ValueError):
                    read(path)
            with pytest.raises(ValueError), artifacts.local_file(path):
                pass
        for job in ("../x", "a/b", "", "."):
            with pytest.raises(ValueError):
                artifacts.staging(job, 1)
            try:  # a read may refuse it too, or find nothing
                assert artifacts.committed(job, 1) is None
            except ValueError:
                pass

    def test_a_file_reads_back_whole_or_by_range_and_its_version_changes_with_its_bytes(self, artifacts):
        artifact = _commit(artifacts)
        stat = artifacts.stat(artifact.path)
        assert stat is not None and stat.size == len(VIDEO) and stat.version
        assert artifacts.stat(artifact.path) == stat, "unchanged, the same version"
        assert b"".join(artifacts.read(artifact.path, 10, 20)) == VIDEO[10:21]
        assert b"".join(artifacts.read(artifact.path, len(VIDEO) - 5)) == VIDEO[-5:]
        assert b"".join(artifacts.read(artifact.path, 0, 0)) == VIDEO[:1]
        with artifacts.local_file(artifact.path) as path:
            assert path.read_bytes() == VIDEO
        url = artifacts.url(artifact.path, 60)
        assert url is None or url.startswith(("http://", "https://"))
        other = _commit(artifacts, attempt=2, data=VIDEO[::-1])
        assert artifacts.stat(other.path).version != stat.version, "other bytes, another version"
        artifacts.remove(artifact.path)
        assert artifacts.stat(artifact.path) is None
        with pytest.raises(FileNotFoundError):
            b"".join(artifacts.read(artifact.path))
        with pytest.raises(FileNotFoundError), artifacts.local_file(artifact.path):
            pass

    def test_a_deletion_is_recorded_before_the_video_goes_and_keeps_its_first_time(self, artifacts):
        artifact = _commit(artifacts)
        assert artifacts.deleted_at(artifact.path) is None
        when = artifacts.delete(artifact.path)
        assert artifacts.deleted_at(artifact.path) == when
        assert artifacts.measure(artifact.path) == (None, None)
        assert artifacts.delete(artifact.path) == when, "deleting again keeps the first time"

    def test_a_video_deleted_as_a_whole_is_recorded_once(self, artifacts):
        assert artifacts.video_deleted_at(JOB) is None
        when = artifacts.delete_video(JOB)
        assert artifacts.video_deleted_at(JOB) == when == artifacts.delete_video(JOB)
        assert artifacts.video_deleted_at(OTHER) is None
