"""The service on a PostgreSQL store: a runner node and an API node share it; /readyz says which
nodes run the jobs and /metrics reports each node; a job submitted to the API node is run by the
runner node."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack, contextmanager

from litestar.testing import TestClient

from h3core.executors.fake import FakeLimits
from h3core.runtime.settings import Settings
from h3core.service.app import create_app
from h3core.service.context import build_service
from tests.receiver import receiver
from tests.unit.service.conftest import QUICK, finished_video
from tests.unit.service.test_deleted_videos import gone
from tests.unit.service.test_webhooks import SECRET
from tests.waiting import poll


@contextmanager
def node(pg_url, root, limits: FakeLimits | None = None, **settings):
    """A service process on the store; `limits`: what its fake executor can run (default: anything)."""
    with node_and_service(pg_url, root, limits, **settings) as (client, _):
        yield client


@contextmanager
def node_and_service(pg_url, root, limits: FakeLimits | None = None, **settings):
    config = Settings(db=pg_url, artifacts=root / "artifacts", uploads=root / "uploads", executor="fake", **settings)
    svc = build_service(config)
    if limits is not None:
        svc.runner.executor.limits = limits
    with TestClient(create_app(config, svc), base_url="http://127.0.0.1:8100", timeout=30) as client:
        yield client, svc


def test_an_api_node_and_a_runner_node_share_the_queue_and_report_the_nodes(pg_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a PostgreSQL deployment's capability board lives (one machine here)
    with node(pg_url, tmp_path, node="gpu-1", slots=2) as runner, node(pg_url, tmp_path, role="api") as api:
        ready = runner.get("/readyz").json()
        assert ready["status"] == "ready" and ready["node"] == "gpu-1"
        assert [(n["node_id"], n["slots"], n["alive"]) for n in ready["nodes"]] == [("gpu-1", 2, True)]
        ready = poll(lambda: (r := api.get("/readyz")).status_code == 200 and r.json(), 30, "the api node to be ready")
        assert ready["runner"] == "node gpu-1 (2 slots) run the jobs" and ready["node"] is None
        created = api.post("/v1/jobs", json=QUICK)
        assert created.status_code == 201, created.text
        job = created.json()["id"]
        poll(lambda: api.get(f"/v1/jobs/{job}").json()["status"] == "done", 30, "the runner node to run the job")
        metrics = runner.get("/metrics").text
        assert 'h3core_node_up{node="gpu-1"} 1.0' in metrics and 'h3core_node_slots{node="gpu-1"} 2.0' in metrics
        # The console's box page lists the nodes too, from either node.
        box = api.get("/console/box").text
        assert "Runner nodes" in box and '<tr data-node="gpu-1"><td>gpu-1</td>' in box and "1 of 1 alive" in box


def test_a_job_running_on_one_node_streams_from_another_and_a_cancel_there_reaches_it(pg_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hang = {**QUICK, "prompt": "a fox [fake step=0.02 hang_at=2]", "steps": 4}
    with (
        node(pg_url, tmp_path / "a", node="a", poll_interval=0.05) as a,
        node(pg_url, tmp_path / "b", node="b", poll_interval=0.05) as b,
    ):
        job = a.post("/v1/jobs", json=hang).json()["id"]
        running = poll(
            lambda: [e for e in a.get(f"/v1/jobs/{job}/events").json() if e["body"]["type"] == "running"],
            30,
            "the job to start",
        )
        runs_on = running[0]["body"]["info"]["node"]
        other = b if runs_on == "a" else a  # streams and cancels where the job does not run
        # Its last progress (step 1: it hangs at step 2) is stored before the cancel, so none can
        # follow the cancel's event on a loaded machine.
        poll(lambda: [e for e in a.get(f"/v1/jobs/{job}/events").json() if e["body"]["type"] == "progress"], 30, "step 1")
        seen: list[str] = []
        last = len(other.get(f"/v1/jobs/{job}/events").json())

        def stream() -> None:
            with other.stream("GET", f"/v1/jobs/{job}/stream", headers={"Last-Event-ID": str(last)}) as events:
                for line in events.iter_lines():
                    if line.startswith("event: "):
                        seen.append(line.removeprefix("event: "))

        reader = threading.Thread(target=stream)
        reader.start()
        assert other.post(f"/v1/jobs/{job}/cancel").status_code in (200, 202)
        reader.join(timeout=60)
        assert not reader.is_alive(), f"the stream did not end: {seen}"
        assert seen[-2:] == ["cancel_requested", "cancelled"] and set(seen[:-2]) <= {"progress"}, seen
        assert other.get(f"/v1/jobs/{job}").json()["status"] == "cancelled"


def test_each_node_admits_what_any_live_node_can_run_and_the_node_that_can_runs_it(pg_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no capability file is read on PostgreSQL: the nodes state theirs in the store
    long, too_long = {**QUICK, "frames": 240}, {**QUICK, "frames": 1000}  # 10 s; 41.7 s
    with (
        node(pg_url, tmp_path / "s", FakeLimits(max_seconds=5.0), node="small", poll_interval=0.05) as small,
        node(pg_url, tmp_path / "b", FakeLimits(max_seconds=20.0), node="big", poll_interval=0.05) as big,
        node(pg_url, tmp_path / "a", role="api") as api,
    ):

        def t2va(client) -> dict:  # /v1/ceilings' row for QUICK's shape
            rows = client.get("/v1/ceilings").json()["ceilings"]
            return next(r for r in rows if (r["mode"], r["width"], r["height"]) == ("t2va", 448, 256))

        for client in (small, big, api):  # each has read the other nodes' statements
            row = poll(lambda c=client: (r := t2va(c))["max_frames"] == 464 and r, 30, "the big node's window in /v1/ceilings")
            assert row["reason"] == "model_window" and row["why"].startswith("node big: "), row
        jobs = []
        for client in (small, api):  # the small node's window is 5 s; the api node has no executor
            created = client.post("/v1/jobs", json=long)
            assert created.status_code == 201, created.text
            jobs.append(created.json()["id"])
        for job in jobs:
            poll(lambda j=job: big.get(f"/v1/jobs/{j}").json()["status"] == "done", 30, "the big node to run the job")
            running = [e["body"] for e in big.get(f"/v1/jobs/{job}/events").json() if e["body"]["type"] == "running"]
            assert [r["info"]["node"] for r in running] == ["big"]  # only the big node ever took it
        for client in (small, big, api):  # no node can: refused, naming the limit and the closest node
            refused = client.post("/v1/jobs", json=too_long)
            assert refused.status_code == 422, refused.text
            body = refused.json()
            assert body["reason"] == "model_window" and body["ceiling"]["max_frames"] == 464, body
            assert "the closest, node big" in body["detail"] and "1000 frames" in body["detail"], body


def test_of_two_nodes_with_the_webhook_secret_one_delivers_and_the_other_takes_over_when_it_stops(pg_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with receiver() as rec, ExitStack() as stack:

        def start(name: str):
            hooks = {"webhook_secret": SECRET, "webhooks_allow": ["127.0.0.1"], "webhook_endpoints": [f"jobs={rec.url}"]}
            return node_and_service(pg_url, tmp_path / name, node=name, poll_interval=0.05, **hooks)

        def done_hooks(ids: list[str]) -> bool:
            done = {r.payload["data"]["job_id"] for r in rec.got() if r.payload["type"] == "job.done"}
            return done >= set(ids)

        first = ExitStack()
        try:
            a, a_svc = first.enter_context(start("a"))
            poll(lambda: a_svc.webhooks.delivering, 60, "node a to deliver")
            b, b_svc = stack.enter_context(start("b"))
            poll(lambda: b_svc.webhooks.delivering is False, 60, "node b to stand by")
            assert "h3core_webhook_delivering 0.0" in b.get("/metrics").text
            assert "h3core_webhook_delivering 1.0" in a.get("/metrics").text
            ids = [(a if i % 2 else b).post("/v1/jobs", json=QUICK).json()["id"] for i in range(4)]
            poll(lambda: done_hooks(ids), 60, "the jobs' webhooks", lambda: str(rec.got()))
            # Reported by the delivering process every quarter second: 2 hooks a job (start, completed).
            poll(lambda: a_svc.webhooks.outcomes["delivered"] >= 8, 30, "node a's count", lambda: str(a_svc.webhooks.outcomes))
            assert not b_svc.webhooks.outcomes, "node b delivered while node a held the turn"
        finally:
            first.close()  # node a stops: its delivering process ends, and the turn with it
        poll(lambda: b_svc.webhooks.delivering, 60, "node b to take over the delivery")
        later = [b.post("/v1/jobs", json=QUICK).json()["id"] for _ in range(2)]
        poll(lambda: done_hooks(later), 60, "node b's webhooks", lambda: str(rec.got()))
        sent = [r.headers["webhook-id"] for r in rec.got()]
        assert len(sent) == len(set(sent)) == 12, "an event was delivered twice, or one not at all"


SMALL_BOX = """
name = "small-box"
hardware = "a box measured at one short run"
attention = "any"
api_max_frames = 1200
resolutions = [[448, 256]]

[[points]]
width = 448
height = 256
frames = 48
outcome = "ran"
"""


def test_an_api_node_without_a_profile_refuses_what_the_runner_nodes_profile_refuses(pg_url, tmp_path, monkeypatch):
    """The runner node admits by its own profile (here a budget of one short run); the API node,
    with no profile of its own, judges by the profile the node states, so it never admits a job
    that no node would claim (it used to: 201, then `waiting` forever)."""
    monkeypatch.chdir(tmp_path)
    profile = tmp_path / "small-box.toml"
    profile.write_text(SMALL_BOX)
    with (
        node(pg_url, tmp_path / "r", node="box", capacity_profile=str(profile), poll_interval=0.05) as runner,
        node(pg_url, tmp_path / "a", role="api") as api,
    ):
        ready = lambda: (r := api.get("/readyz")).status_code == 200 and r.json()  # noqa: E731 - it has read the node
        poll(ready, 30, "the api node to read the runner node's statement")
        refused = api.post("/v1/jobs", json={**QUICK, "frames": 240})
        assert refused.status_code == 422, refused.text
        body = refused.json()
        assert body["reason"] == "unverified" and "profile small-box" in body["detail"] and "node box" in body["detail"], body
        assert body["errors"] == [{"field": "frames", "message": body["detail"]}]
        assert runner.post("/v1/jobs", json={**QUICK, "frames": 240}).status_code == 422, "the runner node judges alike"
        created = api.post("/v1/jobs", json={**QUICK, "frames": 48})
        assert created.status_code == 201, created.text
        job = created.json()["id"]
        poll(lambda: api.get(f"/v1/jobs/{job}").json()["status"] == "done", 30, "the runner node to run the job")


def test_a_video_deleted_through_a_node_without_its_file_is_served_by_none_and_removed_by_its_holder(
    pg_url, tmp_path, monkeypatch
):
    """Each node with its own artifacts folder: the runner node holds the video, the DELETE goes to
    the API node, which holds nothing. The deletion is the store's record: neither node serves the
    video from then on (the holder's file still there, its sweep held), and the holder's sweep
    removes the file once let go."""
    monkeypatch.chdir(tmp_path)
    with (
        node_and_service(pg_url, tmp_path / "r", node="r", poll_interval=0.05, deletion_sweep=0.1) as (runner, svc),
        node(pg_url, tmp_path / "a", role="api") as api,
    ):
        video = finished_video(api)
        path = svc.store.get(video["id"]).artifact.path
        held_file = svc.artifacts.resolve(path)
        assert held_file.is_file() and not (tmp_path / "a" / "artifacts" / path).exists()
        sweep, real = svc.runner.deletions, svc.runner.deletions.sweep
        held: list[int] = []
        sweep.sweep = lambda: held.append(1) or []  # the holder removes nothing while the test looks
        poll(lambda: held, 30, "a sweep of the runner node to be held (none under way)")
        r = api.delete(f"/v1/videos/{video['id']}")
        assert r.status_code == 200 and r.json() == {**r.json(), "deleted": True, "file": "recorded"}, r.text
        for client in (api, runner):
            gone(client, video["id"])
            assert client.get(f"/v1/jobs/{video['id']}/video").status_code == 410
            view = client.get(f"/v1/jobs/{video['id']}").json()
            assert view["artifact"]["url"] is None and view["artifact"]["deleted_at"] is not None, view
            (listed,) = [j for j in client.get("/v1/jobs").json()["items"] if j["id"] == video["id"]]
            assert listed["artifact"]["url"] is None, listed
        assert held_file.is_file(), "neither node served it, though its holder still has the file"
        let_go = time.monotonic()
        sweep.sweep = real
        poll(lambda: not held_file.exists(), 20, "the runner node's sweep to remove the file")
        print(f"removed {time.monotonic() - let_go:.2f} s after the sweep was let go (interval 0.1 s)")
        assert svc.artifacts.deleted_at(path) is not None and svc.artifacts.video_deleted_at(video["id"])


def test_a_drained_node_is_shown_counted_and_cleared_on_every_door(pg_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with node(pg_url, tmp_path, node="gpu-1", slots=2) as runner, node(pg_url, tmp_path, role="api") as api:
        poll(lambda: api.get("/readyz").status_code == 200, 30, "the api node to be ready")
        posted = api.post("/console/nodes/gpu-1/drain", data={"draining": "yes"}, follow_redirects=False)
        assert posted.status_code == 303 and posted.headers["location"] == "/console/box?said=drained", posted.text
        box = api.get("/console/box?said=drained").text
        assert "Node marked draining" in box and "draining since" in box and "Clear drain" in box, box
        assert 'h3core_node_draining{node="gpu-1"} 1.0' in api.get("/metrics").text
        ready = poll(lambda: (r := runner.get("/readyz")).status_code == 503 and r.json(), 30, "the drained node to say 503")
        assert ready["runner"].startswith("draining since") and ready["nodes"][0]["drain"]["by"] is None
        ready = poll(lambda: (r := api.get("/readyz")).status_code == 503 and r.json(), 30, "the api node to say why")
        assert ready["runner"] == "every live runner node is draining (gpu-1): queued jobs wait until a drain is cleared"
        created = api.post("/v1/jobs", json=QUICK)
        assert created.status_code == 201, created.text  # admitted: it waits for the drain to be cleared
        job = created.json()["id"]
        assert api.post("/console/nodes/nobody/drain", data={"draining": "yes"}).status_code == 404
        cleared = api.post("/console/nodes/gpu-1/drain", data={"draining": "no"}, follow_redirects=False)
        assert cleared.headers["location"] == "/console/box?said=undrained"
        poll(lambda: api.get(f"/v1/jobs/{job}").json()["status"] == "done", 30, "the job to run once the drain is cleared")
        assert "Drain node gpu-1" in api.get("/console/box").text
        assert 'h3core_node_draining{node="gpu-1"} 0.0' in runner.get("/metrics").text
