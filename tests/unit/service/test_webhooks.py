"""POST /v1/jobs with Replicate's `webhook` fields: the job's events reach a real receiver on
loopback, signed per Standard Webhooks; a target the service may not reach is a 422 naming why."""

from __future__ import annotations

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from tests.receiver import receiver
from tests.unit.service.conftest import QUICK, finished_video
from tests.waiting import poll

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_a_job_s_webhooks_arrive_in_order_and_verify(make_client):
    with receiver() as rec, make_client(webhook_secret=SECRET, webhooks_allow=["127.0.0.1"]) as client:
        body = {**QUICK, "webhook": rec.url, "webhook_events_filter": ["start", "progress", "completed"]}
        created = client.post("/v1/jobs", json=body)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        poll(lambda: any(r.payload["type"] == "job.done" for r in rec.got()), 30, "the done webhook", lambda: str(rec.got()))
        events = client.get(f"/v1/jobs/{job_id}/events").json()

        def saved() -> list[dict]:  # every record, once the done event's is saved too
            d = client.get(f"/v1/jobs/{job_id}/webhooks").json()
            return d if any(r["event_type"] == "done" for r in d) and all(r["outcome"] == "delivered" for r in d) else []

        records = poll(saved, 30, "the delivery records")
        delivered = f'h3core_webhook_deliveries_total{{outcome="delivered"}} {len(records)}.0'
        # The delivering process reports its counts every 0.25 s: /metrics has them soon after.
        metrics = poll(lambda: m if delivered in (m := client.get("/metrics").text) else None, 30, "the counts in /metrics")
    payloads = [Webhook(SECRET).verify(r.body, r.headers) for r in rec.got()]
    wanted = [(f"job.{e['body']['type']}", e["seq"]) for e in events if e["body"]["type"] in ("running", "progress", "done")]
    sent = [(p["type"], p["data"]["seq"]) for p in payloads]
    # In log order; every one but a progress overtaken within 0.5 s by a later one (the latest
    # wins) or by the job's end, which comes last.
    assert [w for w in wanted if w in sent] == sent
    assert [w for w in wanted if w not in sent and w[0] != "job.progress"] == []
    assert sent[-1][0] == "job.done"
    assert [r.headers["webhook-id"] for r in rec.got()] == [f"msg_{job_id}_{seq}" for _, seq in sent]
    assert [(r["seq"], r["webhook_id"], r["tries"], r["url"]) for r in records] == [
        (seq, f"msg_{job_id}_{seq}", 1, rec.url) for _, seq in sent
    ]
    assert events[0]["body"]["webhook"] == {"url": rec.url, "events": ["start", "progress", "completed"]}  # in the log
    assert f'h3core_webhook_deliveries_total{{outcome="delivered"}} {len(sent)}.0' in metrics


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:9/hook", "127.0.0.1 is a loopback address"),
        ("http://localhost:9/hook", "localhost resolves to"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://192.168.1.20/hook", "private"),
        ("file:///etc/passwd", "the scheme must be http or https"),
    ],
)
def test_a_target_the_service_may_not_reach_is_refused_naming_why(make_client, url, why):
    with make_client(webhook_secret=SECRET) as client:
        answer = client.post("/v1/jobs", json={**QUICK, "webhook": url})
        listed = client.get("/v1/jobs").json()["items"]
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["field"] == "webhook" and why in answer.json()["errors"][0]["message"]
    assert listed == []  # nothing was stored


def test_a_webhook_without_a_secret_to_sign_with_is_refused(make_client):
    with make_client(webhooks_allow=["127.0.0.1"]) as client:
        answer = client.post("/v1/jobs", json={**QUICK, "webhook": "http://127.0.0.1:9/hook"})
    assert answer.status_code == 422 and "H3_WEBHOOK_SECRET" in answer.json()["detail"]


def test_a_filter_without_a_webhook_or_with_an_unknown_event_is_refused(make_client):
    with make_client(webhook_secret=SECRET) as client:
        alone = client.post("/v1/jobs", json={**QUICK, "webhook_events_filter": ["start"]})
        unknown = client.post("/v1/jobs", json={**QUICK, "webhook": "http://93.184.215.14/", "webhook_events_filter": ["output"]})
    assert alone.status_code == 422 and alone.json()["errors"][0]["field"] == "webhook_events_filter"
    assert unknown.status_code == 422 and "webhook_events_filter" in unknown.text


def test_an_openai_endpoint_hears_each_video_end_and_the_openai_sdk_unwraps_it(make_client):
    from openai import OpenAI

    with (
        receiver() as rec,
        make_client(webhook_secret=SECRET, webhooks_allow=["127.0.0.1"], webhook_endpoints=[f"openai={rec.url}"]) as client,
    ):
        done = finished_video(client)
        failing = client.post("/v1/videos", json={**QUICK, "prompt": "a fox [fake step=0 fail_at=1 kind=oom]"})
        assert failing.status_code == 200, failing.text
        failed_id = failing.json()["id"]
        poll(lambda: len(rec.got()) >= 2, 30, "both videos' webhooks", lambda: str(rec.got()))
    unwrapped = [OpenAI(api_key="unused", webhook_secret=SECRET).webhooks.unwrap(r.body, r.headers) for r in rec.got()]
    assert sorted((e.type, e.data.id) for e in unwrapped) == sorted(
        [("video.completed", done["id"]), ("video.failed", failed_id)]
    )
    assert all(e.object == "event" and e.id.startswith("evt_") for e in unwrapped)


def test_while_a_secret_is_rotated_out_receivers_verify_with_either(make_client):
    new, old = "whsec_" + "bmV3LXNlY3JldC1vZi1tYW55LWJ5dGVz", SECRET
    with receiver() as rec, make_client(webhook_secret=f"{new},{old}", webhooks_allow=["127.0.0.1"]) as client:
        client.post("/v1/jobs", json={**QUICK, "webhook": rec.url, "webhook_events_filter": ["completed"]})
        poll(lambda: rec.got(), 30, "the webhook")
    [got] = rec.got()
    assert Webhook(new).verify(got.body, got.headers) == Webhook(old).verify(got.body, got.headers)
    assert len(got.headers["webhook-signature"].split()) == 2


def test_an_endpoint_with_its_own_secret_signs_with_it_and_while_it_is_rotated_with_both(make_client, monkeypatch):
    """`openai@VAR=URL`: that endpoint's deliveries are signed with VAR's secret(s), not the
    deployment's; VAR holding two (rotation) signs with both, so a receiver with either verifies."""
    new, old = "whsec_" + "bmV3LXNlY3JldC1vZi1tYW55LWJ5dGVz", "whsec_" + "b2xkLXNlY3JldC1vZi1tYW55LWJ5dGVz"
    monkeypatch.setenv("H3_TEST_HOOK_SECRET", f"{new},{old}")
    with (
        receiver() as own,
        receiver() as job_hook,
        make_client(
            webhook_secret=SECRET, webhooks_allow=["127.0.0.1"], webhook_endpoints=[f"openai@H3_TEST_HOOK_SECRET={own.url}"]
        ) as client,
    ):
        client.post("/v1/jobs", json={**QUICK, "webhook": job_hook.url, "webhook_events_filter": ["completed"]})
        poll(lambda: own.got() and job_hook.got(), 30, "both webhooks")
    [got] = own.got()
    assert Webhook(new).verify(got.body, got.headers) == Webhook(old).verify(got.body, got.headers)
    assert len(got.headers["webhook-signature"].split()) == 2
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(got.body, got.headers)  # not the deployment's
    [hook] = job_hook.got()
    assert Webhook(SECRET).verify(hook.body, hook.headers)["type"] == "job.done"  # the job's own webhook: the deployment's


def test_an_endpoint_naming_an_unset_secret_variable_stops_the_start(monkeypatch):
    from h3core.runtime.settings import Settings, SettingsError

    monkeypatch.delenv("H3_TEST_UNSET", raising=False)
    with pytest.raises(SettingsError, match="H3_TEST_UNSET, the secret of webhook endpoint https://a.example/h, is not set"):
        Settings(webhook_endpoints=["openai@H3_TEST_UNSET=https://a.example/h"]).endpoints()
    monkeypatch.setenv("H3_TEST_UNSET", "not-a-secret")
    with pytest.raises(SettingsError, match="H3_TEST_UNSET: a webhook secret is 'whsec_'"):
        Settings(webhook_endpoints=["openai@H3_TEST_UNSET=https://a.example/h"]).endpoints()


def test_a_job_s_page_shows_its_webhook_deliveries(make_client):
    with receiver() as rec, make_client(webhook_secret=SECRET, webhooks_allow=["127.0.0.1"]) as client:
        job_id = client.post("/v1/jobs", json={**QUICK, "webhook": rec.url}).json()["id"]

        def delivered() -> list[dict]:
            d = client.get(f"/v1/jobs/{job_id}/webhooks").json()
            return d if any(r["event_type"] == "done" and r["outcome"] == "delivered" for r in d) else []

        records = poll(delivered, 30, "the done webhook's record")
        page = client.get(f"/console/jobs/{job_id}").text
    assert f'Webhook deliveries <span class="note">to {rec.url}' in page
    for r in records:
        assert f"<td>#{r['seq']} {r['event_type']}</td><td>{r['outcome']}</td>" in page and r["webhook_id"] in page
    assert f'<a href="/v1/jobs/{job_id}/webhooks">JSON</a>' in page and f'<a href="/v1/jobs/{job_id}/events">JSON</a>' in page
