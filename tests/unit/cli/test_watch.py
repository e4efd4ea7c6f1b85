"""`h3core submit --watch`'s follower against a loopback server that does what real ones do: a
keep-alive comment between events (every 10 s of a long step) and a stream cut before the job
ends (a restart of the service); the follower skips the one and resumes the other with
Last-Event-ID, and gives up, saying so, only when the stream stays away."""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import typer
from rich.console import Console
from rich.progress import Progress

from h3core.cli import client as cli_client
from h3core.domain.segments import plan_segments

JOB = "0123456789abcdef0123456789abcdef"


def _event(seq: int, body: dict) -> bytes:
    event = {"job_id": JOB, "seq": seq, "at": "2026-12-03T00:00:00Z", "type": body["type"], "body": body}
    return f"id: {seq}\r\nevent: {body['type']}\r\ndata: {json.dumps(event)}\r\n\r\n".encode()


BODIES = [
    {"type": "submitted"},
    {"type": "admitted"},
    {"type": "running", "attempt": 1},
    *({"type": "progress", "step": n, "total": 4} for n in range(1, 5)),
    {"type": "done"},
]


class _Service(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, cut_after: list[int]) -> None:
        """`cut_after`: for each connection in turn, the seq after which it is cut (0: at once)."""
        super().__init__(("127.0.0.1", 0), _Handler)
        self.cut_after = cut_after
        self.asked_from: list[str | None] = []  # each connection's Last-Event-ID


class _Handler(BaseHTTPRequestHandler):
    server: _Service

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == f"/v1/jobs/{JOB}":
            data = json.dumps({"id": JOB, "status": "done"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        after = self.headers.get("Last-Event-ID")
        self.server.asked_from.append(after)
        connection = len(self.server.asked_from) - 1
        cut = self.server.cut_after[connection] if connection < len(self.server.cut_after) else 0
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b": keep-alive\r\n\r\n")  # before any event, as a quiet job's stream begins
        for seq, body in enumerate(BODIES, start=1):
            if seq <= int(after or 0):
                continue
            if cut and seq > cut:
                break  # the connection drops: no terminal event on it
            self.wfile.write(_event(seq, body))
            self.wfile.write(b": keep-alive\r\n\r\n")  # a step longer than the keep-alive interval
            self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def service(request, monkeypatch):
    pauses = getattr(cli_client, "RECONNECT_PAUSES_S", ())
    monkeypatch.setattr(cli_client, "RECONNECT_PAUSES_S", (0.01,) * len(pauses), raising=False)
    server = _Service(request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("service", [[0]], indirect=True)
def test_keep_alives_between_events_are_skipped(service):
    url = f"http://127.0.0.1:{service.server_address[1]}"
    with cli_client.http(url, None) as http:
        assert cli_client.watch(http, JOB)["status"] == "done"
    assert service.asked_from == [None]


@pytest.mark.parametrize("service", [[5, 6]], indirect=True)
def test_a_dropped_stream_is_followed_again_from_the_last_event_seen(service):
    url = f"http://127.0.0.1:{service.server_address[1]}"
    with cli_client.http(url, None) as http:
        assert cli_client.watch(http, JOB)["status"] == "done"
    assert service.asked_from == [None, "5", "6"]


@pytest.mark.parametrize("service", [[2] + [2] * 20], indirect=True)
def test_a_stream_that_stays_away_ends_the_watch_saying_the_job_goes_on(service, capsys):
    url = f"http://127.0.0.1:{service.server_address[1]}"
    with cli_client.http(url, None) as http, pytest.raises(typer.Exit) as stopped:
        cli_client.watch(http, JOB)
    assert stopped.value.exit_code != 0
    assert "the job goes on" in capsys.readouterr().err
    assert service.asked_from == [None] + ["2"] * len(cli_client.RECONNECT_PAUSES_S)


def test_only_the_logs_events_are_events():
    assert cli_client.log_event("") is None and cli_client.log_event("  ") is None
    assert cli_client.log_event("not json") is None and cli_client.log_event("[1]") is None
    assert cli_client.log_event(json.dumps({"seq": 1, "body": {"type": "done"}})) == {"seq": 1, "body": {"type": "done"}}


def test_the_bar_of_a_long_video_counts_every_segment_s_steps_and_says_each_one_made():
    plan = plan_segments(100, 40).model_dump(mode="json")  # three segments, 2 steps each below
    out = io.StringIO()
    seen = cli_client._Seen()
    with Progress(console=Console(file=out, width=120)) as bar:
        task = bar.add_task("job", total=None)
        shown = []
        for body in [
            {"type": "submitted", "request": {"steps": 2}},
            {"type": "planned", "plan": plan},
            {"type": "running", "attempt": 1},
            *({"type": "progress", "step": n, "total": 2} for n in (1, 2)),
            {"type": "segment_done", "index": 0, "artifact": {}},
            {"type": "progress", "step": 1, "total": 2},
            {"type": "attempt_failed", "attempt": 1, "kind": "executor_lost", "message": "gone"},
            {"type": "running", "attempt": 2},
            {"type": "progress", "step": 1, "total": 2},
        ]:
            assert not cli_client._show(bar, task, JOB, body, seen)
            shown.append((bar.tasks[0].completed, bar.tasks[0].total))
        assert bar.tasks[0].description == f"{JOB[:12]} running (attempt 2, segment 2 of 3)"
    assert shown[3:] == [(1, 6), (2, 6), (2, 6), (3, 6), (3, 6), (2, 6), (3, 6)]  # never back to 1 of 2
    printed = out.getvalue()
    assert "made as 3 segments of" in printed and "segment 1 of 3 made" in printed
