"""Draining a node with real processes: two `h3core serve` runner nodes (one slot each) on one
PostgreSQL store. An operator drains the node running a job through the other node's API: that
job goes on to its end on it, its /readyz answers 503 saying why, and every job submitted
meanwhile (through either node) runs on the other. Cleared, it takes work again, and the log and
the store say who did each."""

from __future__ import annotations

import httpx
import pytest

from h3core.adapters.store.postgres import PostgresEventStore
from tests.integration.service.conftest import poll, submit

pytestmark = pytest.mark.timeout(300)

TOKEN = "tok-drain-aaaaaaaaaaaaaaaa"
SLOW = "a slow fox [fake step=0.1]"


def node_of(store: PostgresEventStore, job_id: str) -> str | None:
    """The node the job's attempt ran on, once it has started."""
    state = store.get(job_id)
    return state.info.get("node") if state.status != "queued" else None


def test_a_drained_node_finishes_its_job_takes_no_new_one_and_says_so_until_cleared(servers, pg_url):
    env = {"H3_LEASE": "2", "H3_POLL_INTERVAL": "0.05", "H3_API_TOKENS": f"ops:{TOKEN}"}
    nodes = servers.nodes(pg_url, ("a", "b"), env)  # a slot each
    store = PostgresEventStore(pg_url)
    try:
        with nodes["a"].client(TOKEN) as a_api, nodes["b"].client(TOKEN) as b_api:
            first = submit(a_api, prompt=SLOW, steps=30)["id"]
            drained = poll(lambda: node_of(store, first), 60, "the first job to start")
            other = "b" if drained == "a" else "a"
            api = {"a": a_api, "b": b_api}[other]  # the drain is asked through the other node

            r = api.patch(f"/v1/nodes/{drained}", json={"draining": True})
            assert r.status_code == 200, r.text
            assert r.json()["node_id"] == drained and r.json()["drain"]["by"] == "ops", r.json()
            with nodes[drained].client(TOKEN) as own:
                ready = poll(lambda: (r := own.get("/readyz")).status_code == 503 and r, 60, "its /readyz to say 503")
                assert "draining" in ready.json()["runner"] and "by ops" in ready.json()["runner"], ready.json()
            assert api.get("/readyz").status_code == 200  # the other node still takes work

            jobs = [submit(c, prompt="a fox", steps=2)["id"] for c in (a_api, b_api, a_api, b_api)]
            poll(lambda: all(store.get(j).status == "done" for j in [first, *jobs]), 120, "every job to end")
            assert node_of(store, first) == drained and store.get(first).attempt == 1  # it went on to its end
            assert {j: node_of(store, j) for j in jobs} == {j: other for j in jobs}

            listed = {n["node_id"]: n for n in api.get("/v1/nodes").json()}
            assert listed[drained]["drain"]["by"] == "ops" and listed[other]["drain"] is None and listed[drained]["alive"]

            r = api.patch(f"/v1/nodes/{drained}", json={"draining": False})
            assert r.status_code == 200 and r.json()["drain"] is None, r.text
            with nodes[drained].client(TOKEN) as own:
                poll(lambda: own.get("/readyz").status_code == 200, 60, "its /readyz to say ready again")
            long = [submit(a_api, prompt=SLOW, steps=20)["id"] for _ in range(2)]  # one slot each: one per node
            poll(lambda: all(store.get(j).status == "done" for j in long), 120, "the next jobs to end")
            assert {node_of(store, j) for j in long} == {"a", "b"}

            r = api.patch("/v1/nodes/nobody", json={"draining": True})
            assert r.status_code == 404 and "no runner node 'nobody'" in r.json()["detail"], r.text
            r = api.patch(f"/v1/nodes/{drained}", json={"draining": "yes"})
            assert r.status_code == 422 and r.json()["errors"][0]["field"] == "draining", r.text  # strict: a boolean
            assert httpx.patch(f"{nodes[other].url}/v1/nodes/{drained}", json={"draining": True}).status_code == 401
        log = nodes[other].log_path.read_text()
        assert f"node {drained} marked draining by ops" in log and f"node {drained}: its drain cleared by ops" in log
        assert f"node {drained} is draining (marked by ops)" in nodes[drained].log_path.read_text()
    finally:
        store.close()
