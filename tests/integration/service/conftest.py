"""The real HTTP service (`python -m h3core.cli serve`) in a subprocess, and deadline-bounded polls.

Each `Server` listens on a free loopback port, with its own store, artifacts and uploads under
a temporary folder. Nothing here sleeps in place of synchronisation: every wait polls the
server (or the process) against a deadline and fails with the server's log when it runs out.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import clean_env, poll

__all__ = [
    "CLEAN_EXIT",
    "DEFAULT_SERVER",
    "SMALL",
    "TERMINAL",
    "Server",
    "Servers",
    "cancel_quietly",
    "event_types",
    "free_port",
    "long_job",
    "poll",
    "submit",
    "wait_job",
]

# A request that runs in a fraction of a second with the fake executor and renders a tiny video.
SMALL: dict[str, Any] = {"width": 448, "height": 256, "frames": 24, "steps": 2}
TERMINAL = ("done", "failed", "cancelled")
FAST_STEP = "0.05"  # H3_FAKE_STEP_SECONDS for every server unless a test says otherwise
# How `h3core serve` may end after SIGTERM in cleanup. It should be 0 only; uvicorn re-raises the
# signal once it has shut down, so today it dies by SIGTERM (-15). test_restart_http's
# A SIGTERM is a clean stop: status 0 (test_sigterm_exits_0).
CLEAN_EXIT = (0,)


def free_port() -> int:
    """A port nothing listens on right now (the server may still lose a race for it: see start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `h3core serve` process on 127.0.0.1; stdout and stderr go to a log file."""

    def __init__(self, root: Path, env: dict[str, str], log: Path, args: tuple[str, ...] = ()) -> None:
        self.root = root
        self.db = root / "h3.db"
        self.artifacts = root / "artifacts"
        self.uploads = root / "uploads"
        self.env = {**clean_env(), "H3_EXECUTOR": "fake", "H3_FAKE_STEP_SECONDS": FAST_STEP, **env}
        self.log_path = log
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    # -- process --------------------------------------------------------------------------

    def start(self, timeout: float = 90, *, same_port: bool = False) -> Server:
        """Start and wait for /healthz; retries with another port if this one was taken meanwhile.
        `same_port`: listen where it did before (a restart its clients must find again)."""
        for _ in range(3):
            self.launch(same_port=same_port)
            if self.wait_healthy_or_exit(timeout):
                return self
            if "address already in use" not in self.log().lower():
                break
        raise AssertionError(f"h3core serve exited with {self.proc.returncode} before answering /healthz\n{self.log()}")

    def launch(self, *, same_port: bool = False) -> None:
        """Spawn the process on a fresh free port (or its last one), without waiting for it."""
        self.port = self.port if same_port and self.port else free_port()
        cmd = [
            sys.executable,
            "-m",
            "h3core.cli",
            "serve",
            "--port",
            str(self.port),
            "--db",
            str(self.db),
            "--artifacts",
            str(self.artifacts),
            "--uploads",
            str(self.uploads),
            *self.args,
        ]
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.root)

    def wait_healthy_or_exit(self, timeout: float) -> bool:
        """True once /healthz answers 200; False if the process exits first."""

        def healthy_or_gone() -> bool:
            if self.proc.poll() is not None:
                return True  # stop polling; the caller looks at the exit
            try:
                return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        poll(healthy_or_gone, timeout, "h3core serve to answer /healthz or exit", self.log)
        return self.proc.poll() is None

    def wait_ready(self, timeout: float, what: str = "/readyz to answer 200", *, also=None) -> None:
        """Until /readyz answers 200; on the deadline, its last answer and `also()` (another
        node's log) are shown beside this one's."""
        with self.client() as api:
            poll(
                lambda: api.get("/readyz").status_code == 200,
                timeout,
                what,
                lambda: api.get("/readyz").text + (also() if also else self.log()),
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        try:
            return f"--- server log {self.log_path} ---\n" + self.log_path.read_text(errors="replace")[-8000:]
        except FileNotFoundError:
            return "(no server log)"

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        proc = self.proc
        poll(lambda: proc.poll() is not None, timeout, "h3core serve to exit", self.log)
        return proc.returncode

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM, and the process must exit cleanly (CLEAN_EXIT) within `timeout` seconds."""
        self.signal(signal.SIGTERM)
        rc = self.wait(timeout)
        assert rc in CLEAN_EXIT, f"h3core serve exited {rc} after SIGTERM\n{self.log()}"

    def kill(self) -> None:
        if self.running:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)

    # -- HTTP -----------------------------------------------------------------------------

    def client(self, token: str | None = None, headers: dict[str, str] | None = None) -> httpx.Client:
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers={**auth, **(headers or {})}, timeout=httpx.Timeout(15.0))


class Servers:
    """Start servers for one test; whatever is still running at the end is killed."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Server] = []

    def make(self, env: dict[str, str] | None = None, *, root: Path | None = None, args: tuple[str, ...] = ()) -> Server:
        """A server not started yet (`root` shared between servers means the same store)."""
        n = len(self.started) + 1
        root = root or self.tmp_path / f"server-{n}"
        root.mkdir(parents=True, exist_ok=True)
        server = Server(root, env or {}, self.tmp_path / f"server-{n}.log", args)
        self.started.append(server)
        return server

    def start(self, env: dict[str, str] | None = None, *, root: Path | None = None) -> Server:
        return self.make(env, root=root).start()

    def nodes(self, pg_url: str, names: tuple[str, ...], env: dict[str, str] | None = None) -> dict[str, Server]:
        """Runner nodes (`serve`, `H3_NODE` each of `names`) on the PostgreSQL store at `pg_url`,
        started and healthy; every node's artifacts in one folder, as a deployment shares one."""
        made = {}
        for name in names:
            made[name] = self.make({**(env or {}), "H3_NODE": name}, root=self.tmp_path / "shared")
            made[name].db = pg_url  # a URL where the helper puts a SQLite file
            made[name].launch()
        for server in made.values():
            assert server.wait_healthy_or_exit(120), server.log()
        return made

    def kill_all(self) -> None:
        for server in self.started:
            server.kill()


@pytest.fixture
def servers(tmp_path) -> Iterator[Servers]:
    s = Servers(tmp_path)
    try:
        yield s
    finally:
        s.kill_all()


@pytest.fixture(scope="package")
def api_server(tmp_path_factory) -> Iterator[Server]:
    """One server shared by the tests that need no special settings (one slot, fast fake steps).

    Tests that use it leave it idle: they cancel whatever long job they start.
    """
    s = Servers(tmp_path_factory.mktemp("api"))
    # The deployment's profile applied to the fake executor: its ceilings are the ones tested.
    server = s.start({"H3_CAPACITY_PROFILE": "4x2080ti-sage-fp16"})
    try:
        yield server
        server.stop()
    finally:
        s.kill_all()


# The tests on `default_server` run on one xdist worker, so the run starts one such server.
DEFAULT_SERVER = pytest.mark.xdist_group("default-server")


@pytest.fixture(scope="session")
def default_server(tmp_path_factory) -> Iterator[Server]:
    """`h3core serve` with the defaults, as the README's run command has them: the pipeline on the
    tiny random model it writes beside the store. One for the run (mark its tests DEFAULT_SERVER):
    starting it takes seconds of CPU. Its tests leave it idle."""
    pytest.importorskip("diffusers", reason="the pipeline extra is not installed")
    s = Servers(tmp_path_factory.mktemp("default"))
    server = s.make()
    del server.env["H3_EXECUTOR"]
    try:
        server.start(timeout=120)
        server.wait_ready(120, "the model to load")
        yield server
        server.stop(timeout=30)
    finally:
        s.kill_all()


@pytest.fixture
def api(api_server) -> Iterator[httpx.Client]:
    assert api_server.running, api_server.log()
    with api_server.client() as client:
        yield client


# -- jobs -------------------------------------------------------------------------------------


def submit(client: httpx.Client, expect: int = 201, headers: dict[str, str] | None = None, **fields: Any) -> dict:
    """POST /v1/jobs with SMALL plus `fields`; the answer must have status `expect`."""
    body = {"prompt": "a red fox in snow", **SMALL, **fields}
    r = client.post("/v1/jobs", json=body, headers=headers or {})
    assert r.status_code == expect, f"POST /v1/jobs {body} -> {r.status_code} {r.text}"
    return r.json()


def wait_job(
    client: httpx.Client,
    job_id: str,
    until: Callable[[dict], bool] | tuple[str, ...] = TERMINAL,
    timeout: float = 60,
    what: str | None = None,
) -> dict:
    """Poll GET /v1/jobs/{id} until `until` (a predicate, or a tuple of statuses) holds."""
    check = until if callable(until) else (lambda job: job["status"] in until)
    last: dict = {}

    def ready() -> dict | None:
        nonlocal last
        r = client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, f"GET /v1/jobs/{job_id} -> {r.status_code} {r.text}"
        last = r.json()
        return last if check(last) else None

    return poll(ready, timeout, what or f"job {job_id} to reach {until}", lambda: f"last seen: {last}")


def event_types(client: httpx.Client, job_id: str) -> list[str]:
    r = client.get(f"/v1/jobs/{job_id}/events")
    assert r.status_code == 200, r.text
    return [e["body"]["type"] for e in r.json()]


def long_job(client: httpx.Client, steps: int = 100, step: float = 0.2, **fields: Any) -> dict:
    """A job that runs for steps x step seconds unless cancelled."""
    return submit(client, prompt=f"a slow fox [fake step={step}]", steps=steps, **fields)


def cancel_quietly(client: httpx.Client, *job_ids: str) -> None:
    """Cleanup: cancel jobs that may already have ended."""
    for job_id in job_ids:
        r = client.post(f"/v1/jobs/{job_id}/cancel")
        assert r.status_code in (202, 409), r.text
