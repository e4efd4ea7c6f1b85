"""The fleet under PostgreSQL faults, with real processes: an API node (`serve --role api`) and a
runner node (`serve --role runner`, the fake executor) on a server of this module's own, which the
tests restart (`-m fast`, `-m immediate`), rid of every session (`pg_terminate_backend`) and freeze
(SIGSTOP of the postmaster).

After each fault: /healthz stayed 200 throughout, beside a client polling a job; submits through
the API node are 201 again once the store is back (it used to answer 503 for good: its store tail
died of the restart and took the submissions with it); a job submitted before the fault ends
`done`; and a live stream opened before it reaches the job's terminal event with every event once,
in order (one reopened with Last-Event-ID loses nothing).
A store kept down past a short H3_STORE_RETRY ends an API node with status 1, /healthz 503 before
it goes. And a writer frozen inside its write, holding the events lock, holds another store's
append up for about `STALLED_TRANSACTION_S` only: the server ends its session.

The server commits synchronously here (the suite's servers do not, for speed): an immediate stop
would otherwise lose commits the nodes were told of, which no deployment's server does. Each wait
polls against a deadline far past what it takes; the figures measured are in the assertions'
messages.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import psycopg
import pytest
from httpx_sse import connect_sse

from h3core.adapters.store._postgres import STALLED_TRANSACTION_S, Connections
from h3core.adapters.store.postgres import PostgresEventStore
from h3core.domain.events import Admitted
from h3core.runtime.store_retry import transient
from tests.factories import submitted
from tests.integration.service.conftest import TERMINAL, Server, Servers, poll, submit, wait_job
from tests.pgserver import PgServer, running_server
from tests.waiting import stretch

pytestmark = pytest.mark.timeout(300)

SLOW = "a fox through a fault [fake step=0.1]"  # 20 steps: running when the fault comes, and after


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    with running_server() as server:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("ALTER DATABASE postgres SET synchronous_commit = on")
        yield server


@dataclass
class Fleet:
    api: Server
    runner: Server
    url: str
    servers: Servers


@pytest.fixture(scope="module")
def fleet(pg: PgServer, tmp_path_factory) -> Iterator[Fleet]:
    """A runner node and an API node on one store, riding out faults shorter than H3_STORE_RETRY."""
    servers = Servers(tmp_path_factory.mktemp("fleet"))
    url = pg.fresh_schema()
    shared = servers.tmp_path / "shared"
    runner = servers.make(
        {"H3_ROLE": "runner", "H3_NODE": "gpu-1", "H3_POLL_INTERVAL": "0.05", "H3_STORE_RETRY": "30"}, root=shared
    )
    api = servers.make({"H3_ROLE": "api", "H3_STORE_RETRY": "30"}, root=shared)
    for node in (runner, api):
        node.db = url  # a URL where the helper puts a SQLite file
        node.launch()
    try:
        assert api.wait_healthy_or_exit(120), api.log()
        api.wait_ready(120, "the runner node to beat", also=runner.log)
        yield Fleet(api, runner, url, servers)
        for node in (api, runner):  # whatever the faults did, both stop cleanly
            node.stop(timeout=60)
    finally:
        servers.kill_all()


@dataclass
class Stream:
    """A live stream of one job read in a thread: (event type, seq) until the server ends it."""

    base_url: str
    job_id: str
    seen: list[tuple[str, int]] = field(default_factory=list)
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> Stream:
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        return self

    def _read(self) -> None:
        try:
            with (
                httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(60.0)) as client,
                connect_sse(client, "GET", f"/v1/jobs/{self.job_id}/stream") as source,
            ):
                for sse in source.iter_sse():
                    self.seen.append((sse.event, int(sse.id)))
        except BaseException as exc:
            self.error = exc

    def ended(self, timeout: float) -> list[tuple[str, int]]:
        assert self.thread is not None
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the stream did not end within {timeout:g}s: {self.seen}"
        assert self.error is None, f"the stream failed: {self.error!r} after {self.seen}"
        return self.seen


class Probed:
    """While the block runs: a client polling the job's status, and /healthz probed every 0.2 s
    beside it, each answer's (status, seconds) kept."""

    def __init__(self, base_url: str, job_id: str) -> None:
        self.base_url, self.job_id = base_url, job_id
        self.answers: list[tuple[int, float]] = []
        self._done = threading.Event()
        self._threads = [threading.Thread(target=self._poll, daemon=True), threading.Thread(target=self._probe, daemon=True)]

    def __enter__(self) -> Probed:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        for thread in self._threads:
            thread.join(60)

    def _poll(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=60) as client:
            while not self._done.is_set():
                with contextlib.suppress(httpx.TransportError):
                    client.get(f"/v1/jobs/{self.job_id}")  # 200, or 503 while the store is away

    def _probe(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=60) as client:
            while not self._done.wait(0.2):
                began = time.monotonic()
                status = client.get("/healthz").status_code
                self.answers.append((status, began, time.monotonic()))


def stored(url: str, job_id: str) -> list[tuple[str, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT type, seq FROM events WHERE job_id = %s ORDER BY seq", (job_id,)).fetchall()
    return [(t, s) for t, s in rows]


def submit_status(c: httpx.Client) -> int:
    """The status of a small submit: 201, or 503 while the store is away (never anything else)."""
    r = c.post("/v1/jobs", json={"prompt": "after the fault", "width": 448, "height": 256, "frames": 24, "steps": 1})
    assert r.status_code in (201, 503), r.text
    return r.status_code


def pause(pg: PgServer) -> None:
    pg.pause()
    try:
        time.sleep(3)
    finally:
        pg.resume()


FAULTS: dict[str, Callable[[PgServer], object]] = {
    "restart-fast": lambda pg: pg.restart("fast", down_s=1.0),
    "restart-immediate": lambda pg: pg.restart("immediate", down_s=2.0),
    "terminate-backends": lambda pg: pg.terminate_backends(),
    "pause-postmaster": pause,
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_api_node_and_a_runner_node_ride_out_the_fault(fleet: Fleet, pg: PgServer, fault: str):
    api = fleet.api
    with api.client() as c:
        job = submit(c, prompt=SLOW, steps=20)["id"]
        live = Stream(api.url, job).start()
        wait_job(c, job, lambda j: j["status"] == "running" and (j.get("step") or 0) >= 1, 60, "the job to run a step")
        poll(lambda: live.seen or live.error, 60, "the stream to be open")
        with Probed(api.url, job) as probed:
            began = time.monotonic()
            FAULTS[fault](pg)
            back = time.monotonic()  # the store answers again
            after = len(probed.answers)
            poll(lambda: len(probed.answers) >= after + 3, 60, "a few probes after the fault")
        # Liveness through the fault, beside a client polling the job: a store briefly away fails
        # no probe, and where it was away for a while, probes were answered while it was (they
        # wait on no store: that a read waiting on the server holds no request up, test_liveness.py).
        assert probed.answers and {s for s, _, _ in probed.answers} == {200}, probed.answers
        if back - began >= 1.0:
            inside = [a for a in probed.answers if began <= a[1] and a[2] <= back]
            assert inside, f"no /healthz answered while the store was away ({back - began:.1f}s): {probed.answers}"

        poll(lambda: submit_status(c) == 201, 60, f"a submit through the API node to be 201 after {fault}", api.log)
        print(f"{fault}: submits 201 again {time.monotonic() - back:.1f}s after the store was back")
        done = wait_job(c, job, TERMINAL, 90)
        assert done["status"] == "done", (done, fleet.runner.log())
        seen = live.ended(60)
        log = stored(fleet.url, job)
        assert seen == log, f"the stream saw {seen}, the store holds {log}"
        assert seen[-1][0] == "done" and [s for _, s in seen] == list(range(1, len(seen) + 1))
        # Reconnected with the last id a client saw before the end: the rest, nothing lost.
        k = len(log) - 3
        with connect_sse(c, "GET", f"/v1/jobs/{job}/stream", headers={"Last-Event-ID": str(k)}) as source:
            rest = [(sse.event, int(sse.id)) for sse in source.iter_sse()]
        assert rest == log[k:]
        assert c.get("/healthz").status_code == 200
        poll(lambda: c.get("/readyz").status_code == 200, 60, "/readyz to be 200 again", lambda: c.get("/readyz").text)
    assert api.running and fleet.runner.running


def test_a_writer_frozen_holding_the_events_lock_holds_others_up_for_the_bound_only(pg: PgServer):
    url = pg.fresh_schema()
    store = PostgresEventStore(url)
    frozen = Connections(url, pool_size=1, connect_timeout_s=10)
    holding, thaw = threading.Event(), threading.Event()
    outcome: dict[str, BaseException] = {}
    thawed: list[bool] = []

    def write_and_freeze(conn: psycopg.Connection) -> None:
        holding.set()  # the events lock is held: a process frozen here holds every writer up
        thawed.append(thaw.wait(120 * stretch()))  # False: the append waited for it to give up
        conn.execute("SELECT 1")

    def writer() -> None:
        try:
            frozen.write(write_and_freeze)
        except BaseException as exc:
            outcome["failed"] = exc

    thread = threading.Thread(target=writer, daemon=True)
    try:
        thread.start()
        assert holding.wait(30)
        began = time.monotonic()
        store.append("j1", [submitted(), Admitted()], expected_seq=0)
        waited = time.monotonic() - began
    finally:
        thaw.set()
        thread.join(30)
        frozen.close()
        store.close()
    bound = STALLED_TRANSACTION_S
    # The append went through while the writer was still frozen: the server ended its session.
    assert thawed == [True], f"the append waited {waited:.2f}s, until the frozen writer gave up (bound {bound:g}s)"
    assert waited > bound / 2, f"the append waited {waited:.2f}s: was the lock held at all?"
    print(f"an append behind a frozen writer waited {waited:.2f}s (bound {bound:g}s)")
    failed = outcome.get("failed")
    assert failed is not None and transient(failed), f"the frozen writer's session was not ended by the server: {failed!r}"


def test_a_store_down_past_the_retry_limit_ends_the_api_node_with_healthz_503_first(fleet: Fleet, pg: PgServer):
    node = fleet.servers.make({"H3_ROLE": "api", "H3_STORE_RETRY": "1"}, root=fleet.servers.tmp_path / "shared")
    node.db = fleet.url
    node.start(120)
    statuses: list[int] = []

    def gone() -> bool:
        with contextlib.suppress(httpx.TransportError):
            statuses.append(httpx.get(f"{node.url}/healthz", timeout=5).status_code)
        return not node.running

    pg.stop("fast")
    try:
        poll(gone, 90, "the API node to exit with its store down", node.log)
    finally:
        pg.start()
    assert node.proc is not None and node.proc.returncode == 1, node.log()
    assert 503 in statuses, f"/healthz answered {sorted(set(statuses))} before the exit\n{node.log()}"
    assert statuses.index(503) > 0 and set(statuses[statuses.index(503) :]) == {503}, statuses
    said = " ".join(node.log().split())
    assert "h3core stopped, the store is unusable: the store failed every" in said, node.log()
    # The fleet's nodes (H3_STORE_RETRY 30) rode the same outage out.
    with fleet.api.client() as c:
        poll(lambda: submit_status(c) == 201, 60, "the fleet's API node to take submits again", fleet.api.log)
