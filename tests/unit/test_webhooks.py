"""Webhook delivery from the log (`WebhookDispatcher`) to a real HTTP receiver on loopback:
signed, in order, retried, given up, and delivered after a restart that came before delivery."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import ssl
import subprocess
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import anyio
import pytest
from standardwebhooks import Webhook
from typer.testing import CliRunner

from h3core.adapters.backoff import Backoff
from h3core.adapters.store.nodes import TurnLost
from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.adapters.webhooks import DeliveryFailed, MemoryTransport, PostFailed, WebhookSender, target_refusal
from h3core.cli import app
from h3core.domain.events import Submitted
from h3core.domain.webhooks import Allow, WebhookTarget
from h3core.runtime.bus import EventBus
from h3core.runtime.delivery_process import DeliveryConfig, DeliveryProcess
from h3core.runtime.store_retry import StoreUnavailable
from h3core.runtime.webhooks import SUBSCRIPTION, WebhookDispatcher
from h3core.testing.factories import done_log
from tests.receiver import Receiver, receiver
from tests.waiting import until

pytestmark = pytest.mark.anyio

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
QUICK = Backoff(first_s=0.01, longest_s=0.05, limit_s=0.5, jitter=0.5)


def _log(url: str, events=("start", "progress", "completed")):
    """A whole job's log (submitted to done) whose submission asks for webhooks to `url`."""
    first, *rest = done_log(steps=2)
    assert isinstance(first, Submitted)
    return [first.model_copy(update={"webhook": WebhookTarget(url=url, events=events)}), *rest]


def _dispatcher(store, **kw) -> WebhookDispatcher:
    """A dispatcher to the loopback receiver; progress not throttled unless the test says."""
    kw = {"progress_every_s": 0, **kw}
    return WebhookDispatcher(store, EventBus(), WebhookSender(SECRET, Allow(["127.0.0.1"])), resync_s=0.05, **kw)


@asynccontextmanager
async def delivering(store, **kw) -> AsyncIterator[WebhookDispatcher]:
    """A dispatcher running over `store` for the length of the block."""
    dispatcher = _dispatcher(store, **kw)
    async with anyio.create_task_group() as tg:
        await tg.start(dispatcher.run)
        yield dispatcher
        tg.cancel_scope.cancel()


async def _deliver_until(store, done) -> None:
    async with delivering(store):
        await until(done, 30, "the deliveries")


def _verified(rec: Receiver) -> list[dict]:
    return [Webhook(SECRET).verify(r.body, r.headers) for r in rec.answered()]


async def test_a_job_s_events_arrive_signed_in_order_and_the_position_moves_past_them(tmp_path):
    store = SQLiteEventStore(tmp_path / "h3.db")
    with receiver() as rec:
        async with delivering(store) as dispatcher:
            *running, end = _log(rec.url)
            store.append("a", running)
            store.append("b", [Submitted(request=running[0].request)])  # no webhook asked: nothing sent
            await until(lambda: len(rec.got()) >= 3, 30, "job a's webhooks while it runs")
            store.append("a", [end])  # after its progress was sent (a progress read with its job's end is not)
            await until(lambda: len(rec.got()) >= 4, 30, "job a's webhooks")
            await until(lambda: store.position(SUBSCRIPTION) == store.cursor(), 30, "the position to move on")
    payloads = _verified(rec)
    assert [p["type"] for p in payloads] == ["job.running", "job.progress", "job.progress", "job.done"]
    assert [p["data"]["seq"] for p in payloads] == [3, 4, 5, 6] and {p["data"]["job_id"] for p in payloads} == {"a"}
    assert [r.headers["webhook-id"] for r in rec.got()] == [f"msg_a_{seq}" for seq in (3, 4, 5, 6)]
    assert dispatcher.outcomes["delivered"] == 4
    store.close()


async def test_the_default_filter_sends_start_and_completed_only(tmp_path):
    store = SQLiteEventStore(tmp_path / "h3.db")
    with receiver() as rec:
        async with delivering(store):
            store.append("a", _log(rec.url, events=("start", "completed")))
            await until(lambda: any(r.payload["type"] == "job.done" for r in rec.got()), 30, "the done webhook")
    assert [p["type"] for p in _verified(rec)] == ["job.running", "job.done"]
    store.close()


async def test_a_receiver_failing_three_times_gets_the_terminal_event_four_times_with_one_id(tmp_path):
    store = SQLiteEventStore(tmp_path / "h3.db")
    with receiver(fail_first=3) as rec:
        async with delivering(store, backoff=QUICK) as dispatcher:
            store.append("a", _log(rec.url, events=("completed",)))
            await until(lambda: dispatcher.outcomes["delivered"] == 1, 30, "the delivery")
            store.append("b", _log(rec.url, events=("completed",)))  # a later job's delivery: a's are over by then
            await until(lambda: dispatcher.outcomes["delivered"] == 2, 30, "job b's delivery")
            await until(lambda: [d.outcome for d in store.deliveries("a")] == ["delivered"], 30, "a's record")
    ids = [r.headers["webhook-id"] for r in rec.got()]
    assert ids == ["msg_a_6"] * 4 + ["msg_b_6"]
    assert dispatcher.outcomes["failed"] == 3 and dispatcher.outcomes["retried"] == 3 and dispatcher.outcomes["given_up"] == 0
    [record] = store.deliveries("a")  # what the API and `h3core replay` show
    assert (record.seq, record.event_type, record.url, record.webhook_id, record.tries) == (6, "done", rec.url, "msg_a_6", 4)
    assert record.last_error == "the receiver answered 500"
    store.close()


async def test_a_receiver_down_past_the_limit_ends_given_up_and_the_position_moves_on(tmp_path, caplog):
    store = SQLiteEventStore(tmp_path / "h3.db")
    with receiver(fail_first=10**6) as rec:
        async with delivering(store, backoff=Backoff(first_s=0.01, longest_s=0.02, limit_s=0.2)) as dispatcher:
            store.append("a", _log(rec.url, events=("completed",)))
            await until(lambda: dispatcher.outcomes["given_up"] == 1, 30, "the delivery to be given up")
            await until(lambda: store.position(SUBSCRIPTION) == store.cursor(), 30, "the position to move on")
    assert len(rec.got()) >= 2 and dispatcher.outcomes["delivered"] == 0
    [record] = store.deliveries("a")
    assert record.outcome == "given_up" and record.tries == len(rec.got()) and "500" in (record.last_error or "")
    replayed = CliRunner().invoke(app, ["replay", "a", "--db", str(tmp_path / "h3.db")], env={"H3_CONFIG": None})
    assert f"webhook: #6 done -> {rec.url}: given up after {record.tries} tries (msg_a_6" in replayed.output, replayed.output
    assert any("given up" in r.getMessage() and "msg_a_6" in r.getMessage() for r in caplog.records)
    store.close()


async def test_a_terminal_event_stored_before_a_crash_is_delivered_after_the_restart_and_only_then(tmp_path):
    """The dispatcher had started (its position saved) when the job ran to its end, and the process
    died before any delivery: the next start delivers its start and its end, not its progress (the
    job has ended: the progress is stale news); a start after that, nothing again."""
    path = tmp_path / "h3.db"
    with receiver() as rec:
        store = SQLiteEventStore(path)
        store.save_position(SUBSCRIPTION, store.cursor())  # the subscription of the process that died
        store.append("a", _log(rec.url))
        store.close()
        store = SQLiteEventStore(path)  # the restart
        await _deliver_until(store, lambda: store.position(SUBSCRIPTION) == store.cursor())
        assert [p["type"] for p in _verified(rec)] == ["job.running", "job.done"]
        store.append("b", _log(rec.url))  # a start after that sends b's, and nothing of a's again
        await _deliver_until(store, lambda: store.position(SUBSCRIPTION) == store.cursor())
        assert [r.headers["webhook-id"] for r in rec.got()] == [f"msg_{job}_{seq}" for job in "ab" for seq in (3, 6)]
        store.close()


async def test_one_slow_receiver_does_not_hold_up_another_job_s_deliveries(tmp_path):
    store = SQLiteEventStore(tmp_path / "h3.db")
    with receiver(fail_first=10**6) as dead, receiver() as alive:
        async with delivering(store, backoff=Backoff(first_s=0.05, longest_s=0.05, limit_s=60)):
            store.append("dead", _log(dead.url, events=("completed",)))
            await until(lambda: len(dead.got()) >= 2, 30, "the dead receiver to be retried")
            store.append("alive", _log(alive.url, events=("completed",)))
            await until(lambda: len(alive.got()) == 1, 30, "the live receiver's delivery")
            # The dead receiver's event is still pending: the position stays before it.
            assert store.position(SUBSCRIPTION) < store.events_after(0, 100)[5][0]
    store.close()


async def test_private_targets_are_refused_after_resolution_unless_allowed():
    nothing = Allow()
    assert "loopback" in (await target_refusal("http://127.0.0.1:9/hook", nothing) or "")
    assert "localhost resolves to" in (await target_refusal("http://localhost:9/hook", nothing) or "")
    assert "link-local" in (await target_refusal("http://169.254.169.254/latest/meta-data", nothing) or "")
    assert "private" in (await target_refusal("http://10.1.2.3/hook", nothing) or "")
    assert "loopback" in (await target_refusal("http://[::ffff:127.0.0.1]/hook", nothing) or "")
    assert "scheme" in (await target_refusal("ftp://example.com/hook", nothing) or "")
    assert await target_refusal("http://127.0.0.1:9/hook", Allow(["127.0.0.0/8"])) is None
    assert await target_refusal("http://localhost:9/hook", Allow(["localhost"])) is None
    assert await target_refusal("http://93.184.215.14/hook", nothing) is None  # a public address: no lookup needed


async def test_progress_is_throttled_and_the_latest_wins(tmp_path):
    store = SQLiteEventStore(tmp_path / "h3.db")
    first, *rest, end = done_log(steps=20)
    with receiver() as rec:
        target = WebhookTarget(url=rec.url, events=("progress", "completed"))
        # The 20 are stored at once: all but the last are overtaken.
        async with delivering(store, progress_every_s=1.0) as dispatcher:
            store.append("a", [first.model_copy(update={"webhook": target}), *rest])
            await until(lambda: any(r.payload["data"]["event"].get("step") == 20 for r in rec.got()), 30, "the last progress")
            store.append("a", [end])
            await until(lambda: any(r.payload["type"] == "job.done" for r in rec.got()), 30, "the done webhook")
    steps = [p["data"]["event"]["step"] for p in _verified(rec) if p["type"] == "job.progress"]
    assert steps[-1] == 20 and len(steps) < 20 and steps == sorted(steps)
    assert dispatcher.outcomes["superseded"] == 20 - len(steps)
    store.close()


async def test_a_progress_read_with_its_job_s_end_is_not_sent(tmp_path):
    """Its job ended: the progress would reach the receiver after the news it is older than."""
    store = SQLiteEventStore(tmp_path / "h3.db")
    with receiver() as rec:
        async with delivering(store) as dispatcher:  # progress not throttled: only the end supersedes it
            store.append("a", _log(rec.url))
            await until(lambda: store.position(SUBSCRIPTION) == store.cursor(), 30, "the position to move on")
    assert [p["type"] for p in _verified(rec)] == ["job.running", "job.done"]
    assert dispatcher.outcomes["superseded"] == 2 and dispatcher.outcomes["delivered"] == 2
    store.close()


class _Gated(SQLiteEventStore):
    """Reads of the log past `gate_at` wait until `gate` is set: what is stored there is not read yet."""

    gate_at = 0
    gate = threading.Event()

    def events_after(self, cursor, limit=1000):
        if cursor >= self.gate_at:
            self.gate.wait(30)
        return super().events_after(cursor, limit)


async def test_after_a_takeover_a_job_that_ended_in_the_store_gets_none_of_its_progress(tmp_path):
    """A dispatcher starting from a saved place before a job's progress (a restart, a takeover),
    the job's end stored but not read yet: the store says the job has ended, so its progress,
    which the process before may have sent or superseded, is not sent (late); its end is."""
    store = _Gated(tmp_path / "h3.db")
    store.gate = threading.Event()
    with receiver() as rec:
        *running, end = _log(rec.url)
        store.append("a", running)
        store.append("a", [end])
        store.gate_at = 5  # the first read ends with a's last progress (its seq: it is the only job)
        dispatcher = _dispatcher(store)
        dispatcher.subscription.batch = 5
        async with anyio.create_task_group() as tg:
            await tg.start(dispatcher.run)
            await until(lambda: dispatcher.outcomes["superseded"] == 2, 10, "both progress events to be dropped")
            store.gate.set()
            await until(lambda: store.position(SUBSCRIPTION) == store.cursor(), 30, "the position to move on")
            tg.cancel_scope.cancel()
    assert [p["type"] for p in _verified(rec)] == ["job.running", "job.done"]
    store.close()


class _Turn:
    """A delivery turn held until the test says it is not (`Turn`)."""

    name = "webhooks"
    lease_s = 1.0
    holding = True

    def held(self) -> bool:
        return self.holding

    def renew(self) -> bool:
        return self.holding

    def release(self) -> None:
        self.holding = False


async def test_a_dispatcher_that_no_longer_holds_its_turn_sends_and_saves_nothing_more(tmp_path):
    store = SQLiteEventStore(tmp_path / "h3.db")
    turn = _Turn()
    with receiver() as rec:
        dispatcher = _dispatcher(store, turn=turn)
        with pytest.raises(BaseExceptionGroup) as ended:
            async with anyio.create_task_group() as tg:
                await tg.start(dispatcher.run)
                store.append("a", _log(rec.url, events=("completed",)))
                await until(lambda: store.position(SUBSCRIPTION) == store.cursor(), 30, "a's delivery and the place past it")
                turn.holding = False  # its lease passed unrenewed (frozen, cut off): another node may deliver now
                saved = store.position(SUBSCRIPTION)
                store.append("b", _log(rec.url, events=("completed",)))
                with anyio.fail_after(30):
                    await anyio.sleep_forever()  # the dispatcher ends by itself
    assert ended.group_contains(TurnLost)
    assert [r.headers["webhook-id"] for r in rec.got()] == ["msg_a_6"]
    assert store.position(SUBSCRIPTION) == saved and store.deliveries("b") == []
    store.close()


class _Flaky(SQLiteEventStore):
    """Its reads of the log and position saves fail (as a lost connection does) while `failing` counts down."""

    failing = 0

    def _fail(self) -> None:
        if self.failing:
            self.failing -= 1
            raise sqlite3.OperationalError("disk I/O error")

    def events_after(self, cursor, limit=1000):
        self._fail()
        return super().events_after(cursor, limit)

    def save_position(self, name, position):
        self._fail()
        super().save_position(name, position)


async def test_a_store_failing_for_a_while_is_read_again_and_one_failing_past_the_bound_ends_the_dispatcher(tmp_path):
    store = _Flaky(tmp_path / "h3.db")
    with receiver() as rec:
        async with delivering(store, store_retry_s=30) as dispatcher:
            store.failing = 3
            store.append("a", _log(rec.url, events=("completed",)))
            await until(lambda: store.position(SUBSCRIPTION) == store.cursor(), 30, "a's delivery and the place past it")
        assert store.failing == 0 and dispatcher.outcomes["delivered"] == 1
        store.failing = 10**6
        with pytest.raises(BaseExceptionGroup) as ended:
            async with delivering(store, store_retry_s=0.3):
                with anyio.fail_after(30):
                    await anyio.sleep_forever()
        assert ended.group_contains(StoreUnavailable)
    store.close()


async def test_the_delivering_process_delivers_and_stops_with_its_position_saved_when_its_stdin_ends(tmp_path):
    """The child a runner's process starts: it follows the log by reading the store (no bus crosses
    processes), reports its counts, and when its lifeline (stdin) ends, as when the parent dies,
    it saves its position and exits."""
    db = tmp_path / "h3.db"
    store = SQLiteEventStore(db)
    with receiver() as rec:
        delivery = DeliveryProcess(DeliveryConfig(db=str(db), allow=["127.0.0.1"], resync_s=0.05), [SECRET])
        async with anyio.create_task_group() as tg:
            await tg.start(delivery.run)
            store.append("a", _log(rec.url))
            await until(lambda: delivery.outcomes["delivered"] == 2, 30, "the counts the child reports")
            await until(lambda: store.position(SUBSCRIPTION) == store.cursor(), 30, "the position to move on")
            tg.cancel_scope.cancel()  # closes the child's stdin, waits for it
    # The two progress events came with the job's end: the first is overtaken, the second superseded by the end.
    assert [p["type"] for p in _verified(rec)] == ["job.running", "job.done"]
    assert delivery.outcomes["superseded"] == 2
    assert store.position(SUBSCRIPTION) == store.cursor() and delivery.starts == 1
    store.close()


async def test_a_send_connects_to_the_address_it_checked_and_never_looks_the_name_up_again():
    """DNS rebinding: the check and the connection must be one lookup. The stub resolver says
    `localhost` is 127.0.0.2 (allowed here, standing for a public address) while the system's says
    127.0.0.1; a receiver listens on each, same port: only the checked one may be reached. Then a
    name that answers the check with the allowed address and the next look with a refused one."""
    with receiver(host="127.0.0.2") as checked:
        port = urlsplit(checked.url).port
        with receiver(port=port) as other:  # 127.0.0.1: where a second, system lookup of localhost leads
            looks: list[str] = []

            async def stub(host: str, port: int) -> list[str]:
                looks.append(host)
                return ["127.0.0.2"] if len(looks) == 1 else ["127.0.0.1"]

            sender = WebhookSender(SECRET, Allow(["127.0.0.2/32"]), resolve=stub, resolve_ttl_s=0)
            url = f"http://localhost:{port}/hook"
            await sender.send(url, "msg_1", "{}")
            with pytest.raises(DeliveryFailed, match="localhost resolves to 127.0.0.1, a loopback address"):
                await sender.send(url, "msg_2", "{}")
            await sender.aclose()
    assert [r.headers["webhook-id"] for r in checked.got()] == ["msg_1"] and other.got() == []
    assert checked.got()[0].headers["host"] == f"localhost:{port}"  # the name, as the URL says it
    assert looks == ["localhost", "localhost"]


async def test_a_host_s_addresses_are_looked_up_once_per_ttl():
    with receiver(host="127.0.0.2") as rec:
        looks: list[str] = []

        async def stub(host: str, port: int) -> list[str]:
            looks.append(host)
            return ["127.0.0.2"]

        sender = WebhookSender(SECRET, Allow(["127.0.0.2/32"]), resolve=stub, resolve_ttl_s=60)
        for n in range(3):
            await sender.send(f"http://hooks.example:{urlsplit(rec.url).port}/hook", f"msg_{n}", "{}")
        await sender.aclose()
    assert len(rec.got()) == 3 and looks == ["hooks.example"]


async def test_a_receiver_that_never_answers_takes_none_of_another_receiver_s_sends(tmp_path):
    """One send at a time per receiver (concurrency=1): the hung receiver holds its own slot (its
    read timeout is 15 s), the live one is sent to meanwhile; before, one slot for all."""
    store = SQLiteEventStore(tmp_path / "h3.db")
    with socket.socket() as hung, receiver() as alive:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)  # connections complete in the backlog; nothing ever answers
        hung_url = f"http://127.0.0.1:{hung.getsockname()[1]}/hook"
        async with delivering(store, concurrency=1) as dispatcher:
            store.append("hung", _log(hung_url, events=("completed",)))
            store.append("alive", _log(alive.url, events=("completed",)))
            await until(lambda: len(alive.got()) == 1, 30, "the live receiver's delivery")
            assert dispatcher.outcomes["failed"] == 0  # the hung receiver's first try has not even ended
    store.close()


async def test_a_dead_receiver_s_backlog_is_deferred_not_held_and_delivered_in_order_when_it_is_back(tmp_path):
    """A target holds at most `target_window` deliveries in memory; the rest are deferred (read
    back from the store when it has room), so its backlog never stops the reading for others. When
    it answers again, every one arrives, a job's in log order, and the position reaches the end."""
    store = SQLiteEventStore(tmp_path / "h3.db")
    with receiver() as dead, receiver() as alive:
        dead.down = True
        backoff = Backoff(first_s=0.02, longest_s=0.05, limit_s=120)
        async with delivering(store, target_window=2, window=3, backoff=backoff) as dispatcher:
            for n in range(4):
                store.append(f"d{n}", _log(dead.url, events=("completed",)))
            store.append("alive", _log(alive.url, events=("start", "completed")))
            await until(lambda: len(alive.answered()) == 2, 30, "the live receiver's deliveries")
            assert {r.headers["webhook-id"] for r in dead.got()} <= {"msg_d0_6", "msg_d1_6"}  # d2, d3: deferred
            assert store.position(SUBSCRIPTION) < store.cursor()
            dead.down = False
            await until(lambda: len(dead.answered()) == 4, 30, "the backlog")
            *running, end = _log(dead.url)
            store.append("e", running)  # 3 deliveries at once: 2 held, 1 deferred behind them
            await until(lambda: store.position(SUBSCRIPTION) == store.cursor(), 30, "the position to reach the end")
            store.append("e", [end])
            await until(lambda: store.position(SUBSCRIPTION) == store.cursor(), 30, "the position to reach the end")
    assert sorted(r.headers["webhook-id"] for r in dead.answered()[:4]) == [f"msg_d{n}_6" for n in range(4)]
    assert [r.headers["webhook-id"] for r in dead.answered()[4:]] == [f"msg_e_{seq}" for seq in (3, 4, 5, 6)]
    assert dispatcher.outcomes["given_up"] == 0
    store.close()


@pytest.fixture
def certificate(tmp_path):
    """A self-signed certificate for hooks.example (openssl): (its file, its key's file)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"]
        + ["-subj", "/CN=hooks.example", "-addext", "subjectAltName=DNS:hooks.example", "-keyout", key, "-out", cert],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_https_goes_to_the_checked_address_and_the_certificate_is_checked_against_the_name(certificate):
    """The stub resolver says both names are 127.0.0.2; the certificate is hooks.example's only:
    a send to hooks.example arrives (SNI and the check use the name, not the address), a send to
    another name at that address fails the certificate check."""
    cert, key = certificate
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    with receiver(host="127.0.0.2", tls=server_tls) as rec:
        port = urlsplit(rec.url).port

        async def stub(host: str, port: int) -> list[str]:
            return ["127.0.0.2"]

        sender = WebhookSender(SECRET, Allow(["127.0.0.2/32"]), resolve=stub, ssl_context=ssl.create_default_context(cafile=cert))
        await sender.send(f"https://hooks.example:{port}/hook", "msg_1", "{}")
        await sender.send(f"https://hooks.example:{port}/hook", "msg_2", "{}")  # on the kept connection
        with pytest.raises(DeliveryFailed, match="CERTIFICATE_VERIFY_FAILED|certificate"):
            await sender.send(f"https://other.example:{port}/hook", "msg_3", "{}")
        await sender.aclose()
    assert [(r.headers["webhook-id"], r.headers["host"]) for r in rec.got()] == [
        ("msg_1", f"hooks.example:{port}"),
        ("msg_2", f"hooks.example:{port}"),
    ]


async def test_a_kept_connection_the_receiver_closed_meanwhile_is_replaced_and_the_send_succeeds():
    """A receiver that closes each connection after its answer without saying so (no
    `connection: close`): the next send finds the kept one dead before any answer and goes out
    again on a fresh connection, instead of failing (a `start` is tried once)."""
    server = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve() -> None:
        for _ in range(2):
            conn, _ = server.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                seen.append(data.split(b"\r\n", 1)[0])
                conn.sendall(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    sender = WebhookSender(SECRET, Allow(["127.0.0.1"]))
    url = f"http://127.0.0.1:{server.getsockname()[1]}/hook"
    await sender.send(url, "msg_1", "{}")
    await until(lambda: len(seen) == 1, 30, "the first request")
    await sender.send(url, "msg_2", "{}")
    await sender.aclose()
    thread.join(10)
    server.close()
    assert seen == [b"POST /hook HTTP/1.1"] * 2


async def test_a_delivering_process_that_dies_is_started_again_and_goes_on_from_its_place(tmp_path):
    db = tmp_path / "h3.db"
    store = SQLiteEventStore(db)
    with receiver() as rec:
        delivery = DeliveryProcess(DeliveryConfig(db=str(db), allow=["127.0.0.1"], resync_s=0.05), [SECRET], restart_s=0.05)
        async with anyio.create_task_group() as tg:
            await tg.start(delivery.run)
            store.append("a", _log(rec.url, events=("completed",)))
            await until(lambda: store.position(SUBSCRIPTION) == store.cursor(), 30, "a's delivery and the place past it")
            first = delivery.pid
            assert first is not None
            os.kill(first, signal.SIGKILL)
            store.append("b", _log(rec.url, events=("completed",)))
            await until(lambda: len(rec.answered()) >= 2, 30, "b's delivery, by the next child")
            tg.cancel_scope.cancel()
    assert [r.headers["webhook-id"] for r in rec.answered()] == ["msg_a_6", "msg_b_6"]
    assert delivery.starts == 2 and delivery.pid != first
    store.close()


async def test_the_sender_hands_its_transport_the_checked_address_and_a_refused_target_never_reaches_it():
    """Over the fake transport: what the transport is given is the address the check resolved and
    the signed body; a target the check refuses, by address or by its name's answer, is never
    handed to the transport at all."""
    answers = {"hooks.example": ["93.184.215.14"], "rebound.example": ["10.0.0.1"]}

    async def stub(host: str, port: int) -> list[str]:
        return answers[host]

    transport = MemoryTransport()
    sender = WebhookSender(SECRET, Allow(), resolve=stub, transport=transport)
    await sender.send("https://hooks.example/in?x=1", "msg_1", '{"a": 1}')
    [sent] = transport.requests
    assert (sent.address, sent.host, sent.port, sent.target) == ("93.184.215.14", "hooks.example", 443, "/in?x=1")
    headers = dict(sent.headers)
    assert Webhook(SECRET).verify(sent.body, headers) == {"a": 1} and headers["host"] == "hooks.example"
    for url in ("http://127.0.0.1/hook", "http://rebound.example/hook", "ftp://hooks.example/hook"):
        with pytest.raises(DeliveryFailed, match="refused target") as refused:
            await sender.send(url, "msg_2", "{}")
        assert not refused.value.retryable
    assert len(transport.requests) == 1
    await sender.aclose()
    assert transport.closed == 1


async def test_a_non_2xx_or_no_answer_from_the_transport_is_a_retryable_failure():
    transport = MemoryTransport(302, 500, PostFailed("cannot connect"), 204)
    sender = WebhookSender(SECRET, Allow(), transport=transport)
    url = "http://93.184.215.14/hook"  # an address: no lookup
    for why in ("the receiver answered 302", "the receiver answered 500", "cannot connect"):
        with pytest.raises(DeliveryFailed, match=why) as failed:
            await sender.send(url, "msg_1", "{}")
        assert failed.value.retryable
    await sender.send(url, "msg_1", "{}")
    assert [r.address for r in transport.requests] == ["93.184.215.14"] * 4


def test_a_sender_given_a_transport_takes_no_ssl_context_of_its_own():
    with pytest.raises(ValueError, match="ssl_context"):
        WebhookSender(SECRET, Allow(), transport=MemoryTransport(), ssl_context=ssl.create_default_context())
