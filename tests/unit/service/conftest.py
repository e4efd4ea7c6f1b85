"""The service in process: `create_app` over a fake executor and a store under a temporary
folder, driven through Litestar's test client (no socket, no subprocess)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from h3core.runtime.settings import Settings
from h3core.service.app import create_app
from tests.waiting import poll

# A request the fake executor finishes at once, with a tiny video.
QUICK: dict[str, Any] = {"prompt": "a quick fox [fake step=0]", "width": 448, "height": 256, "frames": 12, "steps": 1}


@contextmanager
def app_client(root: Path, **settings: Any) -> Iterator[TestClient]:
    root.mkdir(parents=True, exist_ok=True)
    config = Settings(db=root / "h3.db", artifacts=root / "artifacts", uploads=root / "uploads", executor="fake", **settings)
    with TestClient(create_app(config), base_url="http://127.0.0.1:8100", timeout=30) as client:
        yield client


@pytest.fixture
def make_client(tmp_path) -> Callable[..., AbstractContextManager[TestClient]]:
    """A client for a service with these settings (each its own folder under tmp_path)."""
    count = iter(range(1000))
    return lambda **settings: app_client(tmp_path / str(next(count)), **settings)


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Iterator[TestClient]:
    """One service with the default settings, shared by a module's tests."""
    with app_client(tmp_path_factory.mktemp("service")) as c:
        yield c


def finished_video(client: TestClient) -> dict:
    """A video made through POST /v1/videos, once it is completed."""
    created = client.post("/v1/videos", json=QUICK)
    assert created.status_code == 200, created.text
    vid = created.json()["id"]
    return poll(
        lambda: (v := client.get(f"/v1/videos/{vid}").json())["status"] == "completed" and v,
        30,
        f"video {vid} to complete",
        lambda: client.get(f"/v1/jobs/{vid}").text,
    )


@pytest.fixture(params=["httptools", "h11"])
def implementation(request) -> Callable[..., type]:
    """Each of uvicorn's HTTP implementations, as `h3core.service.deadlines` makes its protocol
    from read limits (test_deadlines.py, test_connections.py)."""
    pytest.importorskip("uvicorn")
    if request.param == "httptools":
        pytest.importorskip("httptools")
    from h3core.service.deadlines import _h11, _httptools

    return {"httptools": _httptools, "h11": _h11}[request.param]
