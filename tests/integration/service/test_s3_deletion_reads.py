"""With videos in an object store, whether a video was deleted is read from marks in the bucket
(requests over the network): every route that reads them does so on a worker thread, never on the
event loop that answers every other request, and reads each mark once a request."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from litestar.testing import TestClient

from h3core.runtime.settings import Settings
from h3core.service.app import create_app
from h3core.service.context import build_service
from tests.unit.service.conftest import QUICK
from tests.waiting import poll


def on_the_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture
def service(tmp_path, s3_url, aws_environ) -> Iterator[tuple[TestClient, list[tuple[str, bool]]]]:
    """The service in process on a SQLite store with its videos at `s3_url`; the artifact store's
    mark reads recorded as (name, whether it ran on the event loop)."""
    paths = {"db": tmp_path / "h3.db", "staging": tmp_path / "staging", "uploads": tmp_path / "uploads"}
    settings = Settings(**paths, artifacts=s3_url, executor="fake")
    svc = build_service(settings)
    reads: list[tuple[str, bool]] = []
    lock = threading.Lock()

    def recording(name: str, read: Callable[[str], Any]) -> Callable[[str], Any]:
        def wrapper(arg: str) -> Any:
            with lock:
                reads.append((name, on_the_event_loop()))
            return read(arg)

        return wrapper

    for name in ("deleted_at", "video_deleted_at"):
        setattr(svc.artifacts, name, recording(name, getattr(svc.artifacts, name)))
    with TestClient(create_app(settings, service=svc), base_url="http://127.0.0.1:8100", timeout=30) as client:
        yield client, reads


def test_the_deletion_marks_in_a_bucket_are_read_off_the_event_loop_once_a_request(service):
    client, reads = service
    job = client.post("/v1/jobs", json=QUICK).json()["id"]
    poll(lambda: client.get(f"/v1/jobs/{job}").json()["status"] == "done", 30, "the job to finish")
    for method, path, status in [
        ("GET", f"/v1/jobs/{job}", 200),
        ("GET", f"/v1/jobs/{job}/video", 200),
        ("HEAD", f"/v1/jobs/{job}/video", 200),
        ("GET", f"/v1/videos/{job}", 200),
        ("GET", f"/v1/videos/{job}/content", 200),
    ]:
        reads.clear()
        r = client.request(method, path)
        assert r.status_code == status, (path, r.text)
        assert sorted(reads) == [("deleted_at", False), ("video_deleted_at", False)], (method, path, reads)
