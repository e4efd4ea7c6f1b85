"""A video deleted through /v1/videos is gone from it, as OpenAI's Videos API answers: GET, its
content, a remix and a second DELETE are 404 and the list leaves it out. Its job and log stay on
/v1/jobs. (Schemathesis' use-after-free check found GET answering 200 after DELETE.)"""

from __future__ import annotations

from tests.unit.service.conftest import QUICK, finished_video
from tests.waiting import poll


def gone(client, video_id: str) -> None:
    for method, path, body in [
        ("GET", f"/v1/videos/{video_id}", None),
        ("GET", f"/v1/videos/{video_id}/content", None),
        ("GET", f"/v1/videos/{video_id}/content?variant=thumbnail", None),
        ("POST", f"/v1/videos/{video_id}/remix", {"prompt": "again"}),
        ("DELETE", f"/v1/videos/{video_id}", None),
    ]:
        r = client.request(method, path, json=body)
        assert r.status_code == 404, (method, path, r.text)
        error = r.json()["error"]
        assert (error["code"], error["param"]) == ("video_deleted", "video_id") and "deleted at" in error["message"], error
    listed = client.get("/v1/videos", params={"limit": 100}).json()["data"]
    assert video_id not in [v["id"] for v in listed]


def test_a_deleted_finished_video_is_gone_and_its_job_stays(client):
    video = finished_video(client)
    r = client.delete(f"/v1/videos/{video['id']}")
    assert r.status_code == 200 and r.json() == {"id": video["id"], "object": "video.deleted", "deleted": True}
    gone(client, video["id"])
    job = client.get(f"/v1/jobs/{video['id']}")
    assert job.status_code == 200 and job.json()["status"] == "done"
    assert client.get(f"/v1/jobs/{video['id']}/events").json()[-1]["body"]["type"] == "done"
    old = client.get(f"/v1/jobs/{video['id']}/video")
    assert old.status_code == 410 and "deleted" in old.json()["detail"]


def test_a_deleted_live_video_is_gone_at_once_and_its_job_ends_cancelled(client):
    video = client.post("/v1/videos", json={**QUICK, "prompt": "a slow fox [fake step=0.2]", "steps": 100}).json()
    assert client.delete(f"/v1/videos/{video['id']}").status_code == 200
    gone(client, video["id"])
    poll(lambda: client.get(f"/v1/jobs/{video['id']}").json()["status"] == "cancelled", 30, "the deleted video's job to end")


def test_the_list_fills_its_pages_past_deleted_videos(client):
    ids = [client.post("/v1/videos", json={**QUICK, "prompt": f"fox {i} [fake step=5]"}).json()["id"] for i in range(6)]
    for deleted in ids[1:5]:
        assert client.delete(f"/v1/videos/{deleted}").status_code == 200
    first = client.get("/v1/videos", params={"limit": 2, "order": "asc", "after": ids[0]}).json()
    assert [v["id"] for v in first["data"]] == [ids[5]] and first["has_more"] is False
    newest = client.get("/v1/videos", params={"limit": 2}).json()
    assert [v["id"] for v in newest["data"]] == [ids[5], ids[0]]
    for kept in (ids[0], ids[5]):
        client.delete(f"/v1/videos/{kept}")


def test_the_document_says_a_deleted_video_is_gone(client):
    operation = client.get("/schema/openapi.json").json()["paths"]["/v1/videos/{video_id}"]["delete"]
    assert "404" in operation["summary"] and "404" in operation["description"]
