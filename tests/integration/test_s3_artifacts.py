"""The artifact store in a real S3-compatible object store (SeaweedFS, tests/seaweed.py): the
shipped contract, multipart uploads with their record, unfinished uploads aborted, and a kill in
the middle of an upload's parts (the real write path) recovered with nothing redone in vain and
no part left behind."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from h3core.adapters.artifacts.s3 import S3ArtifactStore
from h3core.domain.adoption import Expected
from h3core.testing.artifacts import JOB, ArtifactStoreContract
from tests.waiting import poll

PART = 5 << 20  # S3's least part


class TestS3ArtifactStore(ArtifactStoreContract):
    @pytest.fixture
    def artifacts(self, seaweed, s3_url, tmp_path):
        return S3ArtifactStore(s3_url, tmp_path / "staging", client=seaweed.client())


@pytest.fixture
def store(seaweed, s3_url, tmp_path) -> S3ArtifactStore:
    return S3ArtifactStore(s3_url, tmp_path / "staging", client=seaweed.client(), part_bytes=PART)


def y4m(frames: int, width: int = 320, height: int = 240) -> bytes:
    """A whole YUV4MPEG2 video at 24 fps (what recovery can tell whole from cut)."""
    frame = b"FRAME\n" + bytes(width * height * 3 // 2)
    return f"YUV4MPEG2 W{width} H{height} F24:1 Ip A1:1 C420jpeg\n".encode() + frame * frames


def uploads(store: S3ArtifactStore) -> list[str]:
    listed = store.s3.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix)
    return [u["Key"] for u in listed.get("Uploads", [])]


def orphan(store: S3ArtifactStore, rel: str) -> None:
    """A multipart upload begun and one part sent, never completed: what a crash leaves."""
    key = store._key(rel)
    upload = store.s3.create_multipart_upload(Bucket=store.bucket, Key=key)["UploadId"]
    store.s3.upload_part(Bucket=store.bucket, Key=key, UploadId=upload, PartNumber=1, Body=bytes(PART))


def test_a_video_larger_than_a_part_goes_up_in_parts_with_its_record(store):
    data = os.urandom(2 * PART + 12345)
    staged = store.staging(JOB, 1)
    staged.write_bytes(data)
    artifact = store.commit(staged, job_id=JOB, attempt=1, frames=24, duration_s=1.0)
    assert not staged.exists(), "the staged file goes once the object is up"
    head = store.s3.head_object(Bucket=store.bucket, Key=store._key(artifact.path))
    assert head["ContentLength"] == len(data) and head["ETag"].strip('"').endswith("-3"), head["ETag"]
    found = store.committed(JOB, 1)
    assert found is not None and found.recorded == artifact and found.sha256 == hashlib.sha256(data).hexdigest()
    assert b"".join(store.read(artifact.path, PART - 2, PART + 1)) == data[PART - 2 : PART + 2], "a range across parts"


def test_unfinished_uploads_are_listed_and_aborted_by_commit_discard_and_abort_uploads(store):
    orphan(store, f"{JOB}/attempt-1.mp4")
    partial = [(f.attempt, f.path, f.partial) for f in store.files()]
    assert partial == [(1, f"{JOB}/attempt-1.mp4.part", True)]
    staged = store.staging(JOB, 1)
    staged.write_bytes(b"video")
    store.commit(staged, job_id=JOB, attempt=1, frames=24, duration_s=1.0)
    assert uploads(store) == [], "the commit of the same name aborted what a crash left"

    orphan(store, f"{JOB}/attempt-2.mp4")
    assert [f.path for f in store.discard(JOB, 2)] == [f"{JOB}/attempt-2.mp4.part"]
    assert uploads(store) == []

    orphan(store, f"{JOB}/attempt-3.mp4")
    orphan(store, f"{JOB}/checkpoint-3-4.ckpt")
    assert sorted(store.abort_uploads()) == [f"{JOB}/attempt-3.mp4", f"{JOB}/checkpoint-3-4.ckpt"]
    assert uploads(store) == [] and store.committed(JOB, 1) is not None, "the committed video stays"


def test_a_segment_goes_up_in_parts_and_an_upload_a_crash_cut_is_the_jobs_partial_segment(store):
    rel = f"{JOB}/segment-2-1.mp4"
    orphan(store, rel)
    assert [(f.path, f.attempt, f.segment, f.partial) for f in store.segment_files(JOB)] == [(rel + ".part", 2, 1, True)]
    assert [(f.path, f.segment) for f in store.files()] == [(rel + ".part", 1)]
    assert store.discard(JOB, 2) == [] and len(uploads(store)) == 1, "the job's, not the attempt's"
    store.remove(rel + ".part")
    assert uploads(store) == []

    orphan(store, rel)
    data = os.urandom(PART + 12345)
    staged = store.staging(JOB, 2)
    staged.write_bytes(data)
    segment = store.put_segment(staged, job_id=JOB, attempt=2, index=1, frames=24, duration_s=1.0)
    assert uploads(store) == [], "the put of the same name aborted what a crash left"
    assert segment.path == rel and not staged.exists() and store.staged_here() == []
    head = store.s3.head_object(Bucket=store.bucket, Key=store._key(rel))
    assert head["ETag"].strip('"').endswith("-2") and head["ContentType"] == "video/mp4", head
    assert store.measure(rel) == (len(data), hashlib.sha256(data).hexdigest()) == (segment.bytes, segment.sha256)


_CHILD = """
import sys, time
import boto3
from botocore.config import Config
from h3core.adapters.artifacts.s3 import S3ArtifactStore

url, staging, job = sys.argv[1:4]
client = boto3.client("s3", config=Config(s3={"addressing_style": "path"}))  # AWS_* from the environment
sent = []
def slow_after_the_first(**kw):
    sent.append(1)
    if len(sent) > 1:
        time.sleep(60)  # the kill comes in here
client.meta.events.register("before-send.s3.UploadPart", slow_after_the_first)
store = S3ArtifactStore(url, staging, client=client, part_bytes=5 << 20)
staged = store.staging(job, 1, ".y4m")
store.commit(staged, job_id=job, attempt=1, frames=int(sys.argv[4]), duration_s=int(sys.argv[4]) / 24)
"""


def test_a_kill_in_the_middle_of_an_upload_leaves_no_part_and_the_staged_video_is_committed_at_recovery(
    seaweed, s3_url, tmp_path
):
    frames = 180  # 20.7 MB: five parts
    data = y4m(frames)
    staging = tmp_path / "staging"
    store = S3ArtifactStore(s3_url, staging, client=seaweed.client(), part_bytes=PART)
    store.staging(JOB, 1, ".y4m").write_bytes(data)
    env = {**os.environ, **seaweed.env(), "PYTHONPATH": str(Path(__file__).parents[2])}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, s3_url, str(staging), JOB, str(frames)], env=env)
    try:
        key = store._key(f"{JOB}/attempt-1.y4m")

        def a_part_is_up() -> bool:
            assert child.poll() is None, "the upload ended before the kill"
            for u in store.s3.list_multipart_uploads(Bucket=store.bucket, Prefix=key).get("Uploads", []):
                parts = store.s3.list_parts(Bucket=store.bucket, Key=key, UploadId=u["UploadId"]).get("Parts", [])
                if parts:
                    return True
            return False

        poll(a_part_is_up, 60, "the first part to be up")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    assert store.committed(JOB, 1) is None, "no object: the upload never completed"
    assert [(f.path, f.partial) for f in store.files()] == [
        (f"{JOB}/attempt-1.y4m.part", True),  # staged on this node
        (f"{JOB}/attempt-1.y4m.part", True),  # the unfinished upload
    ]
    found = store.committed(JOB, 1, expect=Expected(frames=frames, fps=24))
    assert found is not None and found.sha256 == hashlib.sha256(data).hexdigest() == found.recorded.sha256
    assert uploads(store) == [], "the unfinished upload was aborted, not left billing"
    assert [(f.path, f.partial) for f in store.files()] == [(found.recorded.path, False)]


def test_migrate_artifacts_copies_videos_checkpoints_segments_and_marks_each_checked_and_skips_them_when_run_again(
    aws_environ, s3_url, tmp_path
):
    from typer.testing import CliRunner

    from h3core.adapters.artifacts import LocalArtifactStore
    from h3core.cli import app
    from h3core.testing.artifacts import OTHER

    folder = LocalArtifactStore(tmp_path / "artifacts")

    def commit(job: str, attempt: int, data: bytes):
        staged = folder.staging(job, attempt)
        staged.write_bytes(data)
        return folder.commit(staged, job_id=job, attempt=attempt, frames=24, duration_s=1.0)

    kept = commit(JOB, 2, os.urandom(PART + 100))  # in parts
    gone = commit(JOB, 1, b"an older attempt's video, deleted")
    deleted_at = folder.delete(gone.path)
    ckpt, _, _ = folder.put_checkpoint(JOB, 2, 7, b"latents")
    staged = folder.staging(JOB, 2)
    staged.write_bytes(b"a segment of a long video")
    segment = folder.put_segment(staged, job_id=JOB, attempt=2, index=0, frames=24, duration_s=1.0)
    third = "abcdef0123456789abcdef0123456789"
    damaged = commit(third, 1, b"a video whose file changed after its record")
    folder.resolve(damaged.path).write_bytes(b"another video, same name")
    commit(OTHER, 1, b"a video deleted as a whole (OpenAI's DELETE)")
    whole_deleted = folder.delete_video(OTHER)
    folder.staging(JOB, 3).write_bytes(b"a node's unfinished work")

    def run() -> tuple[int, str]:
        result = CliRunner().invoke(app, ["migrate-artifacts", str(folder.root), "--to", s3_url], env={"COLUMNS": "200"})
        return result.exit_code, result.output

    code, said = run()
    assert code == 1 and f"FAILED {damaged.path}: not copied: " in said, said
    bucket = S3ArtifactStore(s3_url)
    assert bucket.recorded(kept.path) == kept and bucket.measure(kept.path) == (kept.bytes, kept.sha256)
    assert bucket.read_checkpoint(ckpt) == b"latents"
    assert bucket.measure(segment.path) == (segment.bytes, segment.sha256)
    assert bucket.deleted_at(gone.path) == deleted_at and bucket.video_deleted_at(OTHER) == whole_deleted
    assert bucket.stat(damaged.path) is None and bucket.stat(gone.path) is None
    assert {f.path for f in bucket.files()} == {kept.path, ckpt, segment.path}, "no staged file, damaged or deleted video"
    assert "3 copied" not in said and f"copied {kept.path}" in said

    folder.delete(damaged.path)  # the damaged one dealt with: run again
    code, again = run()
    assert code == 0, again
    assert again.count("copied ") == 1 and f"copied {damaged.path}.deleted" in again, again
    assert "1 copied, 5 already there, 0 failed" in again, again
    assert bucket.deleted_at(damaged.path) is not None


@pytest.mark.anyio
async def test_a_job_stopped_on_one_node_resumes_on_another_from_its_checkpoint_in_the_bucket(seaweed, s3_url, tmp_path):
    """Checkpoints go to the bucket: the node that runs the job next (another staging folder, no
    file shared with the first) continues after the newest one and makes the uninterrupted video."""
    import anyio

    from h3core import Runner, RunnerConfig, SQLiteEventStore
    from h3core.domain.checkpoints import CheckpointPolicy
    from h3core.executors.fake import FakeExecutor, FakePlan
    from tests.factories import request
    from tests.waiting import ended, until

    asked = request(steps=8)

    async def node(store, name: str, plan: FakePlan, job: str | None = None, *, until_checkpoint: int | None = None):
        artifacts = S3ArtifactStore(s3_url, tmp_path / name, client=seaweed.client())
        config = RunnerConfig(stall_timeout_s=30, poll_interval_s=0.05, checkpoints=CheckpointPolicy(every_steps=2))
        runner = Runner(store, FakeExecutor(artifacts, default=plan), config, artifacts=artifacts)
        async with anyio.create_task_group() as tg:
            await tg.start(runner.run)
            job = job or (await runner.submit(asked)).job_id
            if until_checkpoint is not None:
                await until(lambda: (c := store.get(job).checkpoint) is not None and c.step == until_checkpoint)
            else:
                await ended(runner, job)
            tg.cancel_scope.cancel()
        return job

    store = SQLiteEventStore(tmp_path / "h3.db", durable=False)
    job = await node(store, "node-a", FakePlan(hang_at=7), until_checkpoint=6)
    newest = store.get(job).checkpoint
    await node(store, "node-b", FakePlan(), job)
    state = store.get(job)
    types = [e.type for e in store.events(job)]
    assert state.status == "done" and "restored" in types and "checkpoint_rejected" not in types, types
    restored = next(e for e in store.events(job) if e.type == "restored")
    assert restored.body.checkpoint == newest, "continued after the newest checkpoint, read from the bucket"
    through = SQLiteEventStore(tmp_path / "through.db", durable=False)
    other = await node(through, "node-c", FakePlan())  # the same request, uninterrupted
    assert state.artifact.sha256 == through.get(other).artifact.sha256


@pytest.mark.anyio
async def test_a_node_removes_at_start_what_it_staged_for_attempts_another_node_ended_or_holds(pg_url, seaweed, s3_url, tmp_path):
    """A node killed with videos staged on its own disk, whose attempts another node took over
    while it was down: no other node sees that folder, so the node's start removes them (and the
    upload a kill left of one) rather than keep them for ever."""
    import anyio

    from h3core import FakeExecutor, RetryPolicy, Runner, RunnerConfig
    from h3core.adapters.store.postgres import PostgresEventStore
    from h3core.domain.events import Admitted, AttemptFailed, Done, Running
    from h3core.testing.artifacts import OTHER
    from h3core.testing.factories import artifact, submitted

    other = PostgresEventStore(pg_url, node="b")
    retry = RetryPolicy(max_attempts=2, retry_on=("interrupted",))
    # JOB: attempt 1 (this node's) ended by node b and run again there, done; OTHER: attempt 1
    # taken over by node b, which holds its lease now and has not ended it yet.
    other.append(JOB, [submitted(retry=retry), Admitted(), Running(attempt=1, executor="fake")])
    other.append(JOB, [AttemptFailed(attempt=1, kind="interrupted", message="node a stopped heartbeating")])
    done = artifact(f"{JOB}/attempt-2.y4m")
    other.append(JOB, [Running(attempt=2, executor="fake"), Done(artifact=done)])
    other.append(OTHER, [submitted(retry=retry), Admitted(), Running(attempt=1, executor="fake")])
    staging = tmp_path / "staging"
    store = S3ArtifactStore(s3_url, staging, client=seaweed.client(), part_bytes=PART)
    store.staging(JOB, 1, ".y4m").write_bytes(y4m(48))  # whole: killed before its upload
    orphan(store, f"{JOB}/attempt-1.y4m")  # and the upload a kill in it left
    store.staging(OTHER, 1, ".y4m").write_bytes(y4m(48)[:1000])  # cut short: killed while written

    runner = Runner(
        PostgresEventStore(pg_url, node="a"),
        FakeExecutor(store),
        RunnerConfig(retry=retry, poll_interval_s=0.05, lease_s=30.0),
        artifacts=store,
    )
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(runner.run)  # started: recovered
            assert sorted(p.name for p in staging.rglob("*.part")) == [], "nothing of another node's attempts stays staged"
            assert uploads(store) == [], "the upload a kill left is aborted with it"
            tg.cancel_scope.cancel()
        held = other.get(OTHER)
        assert held is not None and (held.status, held.attempt) == ("running", 1), "node b's attempt is left to node b"
    finally:
        runner.store.close()
        other.close()
