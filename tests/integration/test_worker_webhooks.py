"""`h3core worker` runs the jobs, so it delivers their webhooks (with H3_WEBHOOK_SECRET set)."""

from __future__ import annotations

import pytest
from standardwebhooks import Webhook

from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.domain.events import Admitted, Submitted
from h3core.domain.webhooks import WebhookTarget
from tests.factories import request
from tests.integration.conftest import poll
from tests.receiver import receiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_a_worker_delivers_the_webhooks_of_the_jobs_it_runs(tmp_path, workers):
    db = tmp_path / "h3.db"
    with receiver() as rec:
        store = SQLiteEventStore(db)
        hook = WebhookTarget(url=rec.url)  # start and completed
        store.append("j1", [Submitted(request=request(steps=2), webhook=hook), Admitted()])  # as an api process stores it
        store.close()
        worker = workers.start(db, tmp_path / "artifacts", env={"H3_WEBHOOK_SECRET": SECRET, "H3_WEBHOOKS_ALLOW": "127.0.0.1"})
        poll(lambda: len(rec.answered()) >= 2, 60, "the job's webhooks", worker.log)
    payloads = [Webhook(SECRET).verify(r.body, r.headers) for r in rec.answered()]
    assert [(p["type"], p["data"]["job_id"]) for p in payloads] == [("job.running", "j1"), ("job.done", "j1")]
