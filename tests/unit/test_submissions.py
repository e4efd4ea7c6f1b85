"""`Submissions`, the write side every door shares: the webhook and uploads checked, created told
apart from replayed, and the same answers through `Jobs` as through HTTP."""

from __future__ import annotations

import anyio
import pytest

from h3core import (
    FakeExecutor,
    IdempotencyMismatch,
    InvalidSubmission,
    Jobs,
    LocalArtifactStore,
    RunnerConfig,
    ShuttingDown,
    SQLiteEventStore,
    Submissions,
    WebhookPolicy,
)
from h3core.adapters.uploads import LocalUploadStore
from h3core.domain.webhooks import Allow, WebhookTarget
from tests.factories import png, request

pytestmark = pytest.mark.anyio

LOOPBACK = WebhookPolicy(signing=True, allow=Allow(["127.0.0.0/8"]))


async def chunks(data: bytes):
    yield data


@pytest.fixture
def store(tmp_path):
    s = SQLiteEventStore(tmp_path / "h3.db", durable=False)
    yield s
    s.close()


async def test_the_first_submit_of_a_key_is_created_and_every_other_replays_it(store):
    submissions = Submissions(store)
    first = await submissions.submit(request(), idempotency_key="k")
    again = await submissions.submit(request(), idempotency_key="k")
    other = await submissions.submit(request())
    assert first.created and not again.created and other.created
    assert again.state.job_id == first.state.job_id != other.state.job_id
    with pytest.raises(IdempotencyMismatch):
        await submissions.submit(request(prompt="something else"), idempotency_key="k")


async def test_of_submits_racing_on_one_key_exactly_one_is_told_created(store):
    submissions = Submissions(store)
    answers = []

    async def one() -> None:
        answers.append(await submissions.submit(request(), idempotency_key="race"))

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(one)
    assert sum(a.created for a in answers) == 1
    assert len({a.state.job_id for a in answers}) == 1
    assert len(store.list_jobs(limit=10)) == 1


async def test_a_webhook_is_refused_without_a_secret_and_where_it_may_not_reach(store):
    hook = WebhookTarget(url="http://127.0.0.1:9/hook")
    with pytest.raises(InvalidSubmission) as unsigned:
        await Submissions(store).submit(request(), webhook=hook)
    assert unsigned.value.about == "webhook"
    assert unsigned.value.errors == [("webhook", "this service sends no webhooks: H3_WEBHOOK_SECRET is not set")]
    with pytest.raises(InvalidSubmission) as private:
        await Submissions(store, webhooks=WebhookPolicy(signing=True)).submit(request(), webhook=hook)
    assert private.value.errors[0][0] == "webhook" and "loopback" in private.value.errors[0][1]
    assert store.list_jobs(limit=10) == [], "a refused submit stores nothing"
    stored = await Submissions(store, webhooks=LOOPBACK).submit(request(), webhook=hook)
    assert stored.created and store.get(stored.state.job_id).webhook == hook


async def test_every_missing_or_mistyped_upload_is_named_and_a_good_one_is_taken(tmp_path, store):
    uploads = LocalUploadStore(tmp_path / "uploads")
    image = await uploads.put("image/png", chunks(png(64, 48)))
    submissions = Submissions(store, uploads=uploads)
    with pytest.raises(InvalidSubmission) as bad:
        await submissions.submit(request(mode="ref2va", references={"images": [image.id, "nope"], "videos": [image.id]}))
    assert bad.value.about == "uploads"
    assert bad.value.errors == [
        ("references.images.1", "no upload 'nope' (POST /v1/uploads first)"),
        ("references.videos.0", f"upload {image.id!r} is image, not video"),
    ]
    assert bad.value.missing == [("references.images.1", "nope")], "what is not there, apart from what is of the wrong kind"
    assert store.list_jobs(limit=10) == []
    good = await submissions.submit(request(mode="fl2va", keyframes={"first": image.id}))
    assert good.created and good.state.request.keyframes.first == image.id


async def test_once_its_writer_has_stopped_a_submit_is_refused_as_shutting_down(store):
    submissions = Submissions(store)
    async with anyio.create_task_group() as tg:
        await tg.start(submissions.run)
        assert submissions.accepting
        assert (await submissions.submit(request())).created
        tg.cancel_scope.cancel()
    assert not submissions.accepting
    with pytest.raises(ShuttingDown):
        await submissions.submit(request())


async def test_jobs_takes_webhooks_and_uploads_as_the_service_does(tmp_path):
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    uploads = LocalUploadStore(tmp_path / "uploads")
    image = await uploads.put("image/png", chunks(png(64, 48)))
    hook = WebhookTarget(url="http://127.0.0.1:9/hook")
    config = RunnerConfig(poll_interval_s=0.05)
    async with Jobs(tmp_path / "h3.db", FakeExecutor(artifacts), artifacts=artifacts, config=config) as plain:
        with pytest.raises(InvalidSubmission):
            await plain.submit(request(), webhook=hook)
    jobs = Jobs(
        tmp_path / "h3.db", FakeExecutor(artifacts), artifacts=artifacts, config=config, uploads=uploads, webhooks=LOOPBACK
    )
    async with jobs:
        with pytest.raises(InvalidSubmission) as missing:
            await jobs.submit(request(mode="fl2va", keyframes={"first": "nope"}))
        assert missing.value.errors[0][0] == "keyframes.first"
        first = await jobs.submission(request(mode="fl2va", keyframes={"first": image.id}, steps=2), webhook=hook)
        replay = await jobs.submission(request(mode="fl2va", keyframes={"first": image.id}, steps=2), webhook=hook)
        assert first.created and replay.created, "no key: two jobs"
        keyed = [await jobs.submission(request(steps=1), idempotency_key="k") for _ in range(2)]
        assert [s.created for s in keyed] == [True, False]
        done = await jobs.result(first.state.job_id)
    assert done.webhook == hook and done.request.keyframes.first == image.id
