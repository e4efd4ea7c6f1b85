"""Logging: a job's life as records with its fields, the formats of `h3core.runtime.logs`, and a library
that configures nothing."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from h3core import Admitted, RetryPolicy, Running, SQLiteEventStore
from h3core.runtime.logs import configure, fields
from tests.factories import request, submitted
from tests.unit.conftest import wait_until

pytestmark = pytest.mark.anyio


def lifecycle(caplog, job_id: str) -> list[tuple[str, str, int, dict]]:
    """(level, event, attempt, other fields) of the runner's records about one job."""
    out = []
    for r in caplog.records:
        if r.name == "h3core.runner" and getattr(r, "job_id", None) == job_id and hasattr(r, "event"):
            rest = {k: v for k, v in fields(r).items() if k not in ("job_id", "event", "attempt")}
            out.append((r.levelname, r.event, r.attempt, rest))
    return out


async def test_a_job_that_runs_to_done_is_logged_step_by_step_with_its_fields(make_runner, caplog):
    caplog.set_level(logging.DEBUG, logger="h3core")
    async with make_runner() as runner:
        job = await runner.submit(request(steps=3))
        await wait_until(lambda: runner.store.get(job.job_id).terminal)
    life = lifecycle(caplog, job.job_id)
    assert [(level, event, attempt) for level, event, attempt, _ in life] == [
        ("DEBUG", "submitted", 0),
        ("INFO", "admitted", 0),
        ("INFO", "running", 1),
        ("DEBUG", "progress", 1),
        ("DEBUG", "progress", 1),
        ("DEBUG", "progress", 1),
        ("INFO", "done", 1),
    ]
    assert life[1][3] == {"tokens": job.tokens, "priority": 0, "mode": "t2va"}
    assert life[2][3]["executor"] == "fake" and life[2][3]["executor_ref"]
    assert [rest["step"] for _, event, _, rest in life if event == "progress"] == [1, 2, 3]
    assert life[-1][3]["path"] == runner.store.get(job.job_id).artifact.path


async def test_a_failed_attempt_its_retry_and_the_final_failure_are_warnings_with_their_kind(make_runner, caplog):
    caplog.set_level(logging.DEBUG, logger="h3core")
    retry = RetryPolicy(max_attempts=2, retry_on=("oom",))
    async with make_runner(retry=retry) as runner:
        job = await runner.submit(request(steps=3, prompt="x [fake fail_at=2 kind=oom]"))
        await wait_until(lambda: runner.store.get(job.job_id).terminal)
    life = [(level, event, attempt, rest.get("kind")) for level, event, attempt, rest in lifecycle(caplog, job.job_id)]
    assert [x for x in life if x[1] != "progress"] == [
        ("DEBUG", "submitted", 0, None),
        ("INFO", "admitted", 0, None),
        ("INFO", "running", 1, None),
        ("WARNING", "attempt_failed", 1, "oom"),
        ("INFO", "running", 2, None),
        ("WARNING", "failed", 2, "oom"),
    ]
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING and getattr(r, "job_id", None) == job.job_id]
    assert [(r.event, r.attempt, r.kind, r.executor) for r in warned] == [
        ("attempt_failed", 1, "oom", "fake"),
        ("failed", 2, "oom", "fake"),
    ], "each failure is one warning: its event's"
    assert "out of memory" in warned[0].getMessage()
    raised = [r for r in caplog.records if r.name == "h3core.runner" and not hasattr(r, "event") and r.job_id == job.job_id]
    assert [(r.levelname, r.attempt, r.kind, r.executor) for r in raised] == [
        ("DEBUG", 1, "oom", "fake"),
        ("DEBUG", 2, "oom", "fake"),
    ]
    assert all(r.exc_info is not None for r in raised), "the traceback goes at DEBUG"


async def test_a_cancel_is_logged_as_requested_then_cancelled(make_runner, caplog):
    caplog.set_level(logging.INFO, logger="h3core")
    async with make_runner() as runner:
        job = await runner.submit(request(steps=1000, prompt="x [fake step=0.02]"))
        await wait_until(lambda: runner.store.get(job.job_id).step)
        await runner.cancel(job.job_id, "no longer needed")
        await wait_until(lambda: runner.store.get(job.job_id).terminal)
    events = [event for _, event, _, _ in lifecycle(caplog, job.job_id)]
    assert events == ["admitted", "running", "cancel_requested", "cancelled"]


async def test_what_a_dead_process_left_running_is_logged_at_recovery(make_runner, caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="h3core")
    store = SQLiteEventStore(tmp_path / "h3.db", durable=False)
    store.append("dead", [submitted(), Admitted(), Running(attempt=1, executor="fake")], expected_seq=0)
    async with make_runner(store=store) as runner:
        await wait_until(lambda: runner.store.get("dead").terminal)
    life = [(level, event, attempt, rest.get("kind")) for level, event, attempt, rest in lifecycle(caplog, "dead")]
    assert life == [
        ("WARNING", "attempt_failed", 1, "interrupted"),
        ("INFO", "running", 2, None),
        ("INFO", "done", 2, None),
    ]


def record(msg: str = "job %s started", *args, exc: bool = False, **extra) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            exc_info = sys.exc_info()
    r = logging.LogRecord("h3core.runner", logging.WARNING, __file__, 1, msg, args or ("j1",), exc_info)
    r.__dict__.update(extra)
    return r


def test_json_lines_carry_the_four_keys_the_extra_fields_and_a_traceback():
    from h3core.runtime.logs import JsonLines

    line = json.loads(JsonLines().format(record(job_id="j1", attempt=2, kind="oom", exc=True)))
    assert line["level"] == "warning" and line["logger"] == "h3core.runner"
    assert line["message"] == "job j1 started" and line["ts"].endswith("Z")
    assert (line["job_id"], line["attempt"], line["kind"]) == ("j1", 2, "oom")
    assert "RuntimeError: boom" in line["exc"]
    # An extra field named like one of the four does not hide it.
    assert json.loads(JsonLines().format(record(logger="x")))["logger"] == "h3core.runner"


@settings(max_examples=300)
@given(
    second=st.integers(min_value=0, max_value=4_000_000_000),
    fraction=st.one_of(
        st.floats(min_value=0, max_value=1, exclude_max=True),
        st.sampled_from([0.0005, 0.0004995, 0.9994995, 0.9995, 0.9999995, 0.99999949, 0.99999951]),
    ),
)
def test_a_records_stamp_is_its_time_in_utc_to_the_millisecond_as_datetime_writes_it(second, fraction):
    """The stamp reuses the text of the last second it wrote: records in the same second, the next
    second and an earlier one all read as datetime.isoformat writes them (rounding included)."""
    from h3core.runtime.logs import _ts

    for t in (second + fraction, second + 1 + fraction, second + fraction / 2, float(second)):
        expected = datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        assert _ts(logging.makeLogRecord({"created": t})) == expected


def test_configure_prints_text_or_json_at_the_level_asked_and_replaces_itself():
    root = logging.getLogger()
    before = list(root.handlers), root.level
    text, lines = io.StringIO(), io.StringIO()
    try:
        configure("text", "warning", text)
        configure("json", "info", lines)  # replaces the text handler: one record, one line
        log = logging.getLogger("h3core.test")
        log.info("job %s done", "j1", extra={"job_id": "j1", "attempt": 1})
        log.debug("not shown")
        configure("text", "info", text)
        log.info("job %s done", "j2", extra={"job_id": "j2"})
    finally:
        root.handlers[:] = before[0]
        root.setLevel(before[1])
    (one,) = [json.loads(x) for x in lines.getvalue().splitlines()]
    assert one["message"] == "job j1 done" and one["job_id"] == "j1" and one["attempt"] == 1
    (said,) = text.getvalue().splitlines()
    assert said.endswith("INFO h3core.test: job j2 done job_id=j2")
    with pytest.raises(ValueError, match="log format 'xml'"):
        configure("xml")  # type: ignore[arg-type]


def test_on_stderr_records_go_to_the_stderr_of_the_moment_never_to_one_replaced_and_closed(monkeypatch):
    """A test's captured stderr is closed at its end; a record a thread writes after it (a runner
    still stopping) goes to the stderr now, not to the closed one ("I/O operation on closed file")."""
    root = logging.getLogger()
    before = list(root.handlers), root.level
    first, then = io.StringIO(), io.StringIO()
    try:
        monkeypatch.setattr(sys, "stderr", first)
        configure("text", "info")
        log = logging.getLogger("h3core.test")
        log.info("one")
        monkeypatch.setattr(sys, "stderr", then)
        first.close()
        log.info("two")
    finally:
        root.handlers[:] = before[0]
        root.setLevel(before[1])
    assert then.getvalue().endswith("INFO h3core.test: two\n"), then.getvalue()
    assert "Logging error" not in then.getvalue()


def test_a_configured_process_makes_records_without_looking_up_their_caller_thread_or_process():
    """Neither format shows them; looking them up was a third of each record's cost (three per job)."""
    code = (
        "import io, logging; from h3core.runtime.logs import configure;"
        "configure('json', 'info', io.StringIO()); got = [];"
        "h = logging.Handler(); h.emit = got.append; logging.getLogger().addHandler(h);"
        "logging.getLogger('h3core.x').info('hi', extra={'job_id': 'j'});"
        "print(got[0].lineno, got[0].thread, got[0].process, got[0].job_id)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "None", "None", "j"]


def test_importing_h3core_configures_no_logging():
    code = (
        "import logging, h3core, h3core.runtime.runner;"
        "root = logging.getLogger();"
        "print(len(root.handlers), root.level, [type(h).__name__ for h in logging.getLogger('h3core').handlers])"
    )
    out = (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip().split(maxsplit=2)
    )
    assert out == ["0", str(logging.WARNING), "['NullHandler']"]


def test_configure_keeps_httpx_requests_out_of_the_log_but_not_its_warnings():
    root = logging.getLogger()
    before = list(root.handlers), root.level, {n: logging.getLogger(n).level for n in ("httpx", "httpcore")}
    out = io.StringIO()
    try:
        configure("text", "debug", out)
        logging.getLogger("httpx").info('HTTP Request: GET http://127.0.0.1:8188/queue "HTTP/1.1 200 OK"')
        logging.getLogger("httpcore.connection").debug("connect_tcp.started host='127.0.0.1' port=8188")
        logging.getLogger("httpx").warning("a warning is kept")
        logging.getLogger("h3core.test").debug("h3core's own debug is kept")
    finally:
        root.handlers[:] = before[0]
        root.setLevel(before[1])
        for name, level in before[2].items():
            logging.getLogger(name).setLevel(level)
    said = out.getvalue()
    assert "HTTP Request" not in said and "connect_tcp" not in said
    assert "a warning is kept" in said and "h3core's own debug is kept" in said


def test_the_runner_logs_the_same_records_whether_debug_is_on_or_off_less_the_debug_ones(caplog):
    """`log_written` skips what logs at DEBUG when DEBUG is off, before building its fields: one
    body of every type (a type added later is in the list below or this test fails) gives at INFO
    exactly the records it gives at DEBUG, less those at DEBUG."""
    import typing

    from h3core.domain import events as ev
    from h3core.domain.segments import plan_segments
    from h3core.domain.state import fold
    from h3core.runtime._journal import log_written
    from tests.factories import artifact

    CKPT = ev.Checkpoint(attempt=1, step=1, total=2, path="checkpoints/j/1-1.pt", bytes=1, sha256="a" * 64)
    bodies = [
        submitted(),
        Admitted(tokens=7),
        Running(attempt=1, executor="fake"),
        ev.Resumed(attempt=1, executor_ref="r1", after_s=2.0),
        ev.Detached(attempt=1, executor_ref="r1"),
        ev.Progress(step=1, total=2),
        ev.Done(artifact=artifact()),
        ev.Done(artifact=artifact(), cancel_too_late=True),
        ev.AttemptFailed(attempt=1, kind="oom", message="out of memory"),
        ev.Failed(kind="oom", message="out of memory"),
        ev.CancelRequested(reason="asked"),
        ev.Cancelled(reason="asked"),
        ev.Reprioritized(priority=5, by="alice"),
        ev.Planned(plan=plan_segments(100, 40)),
        ev.SegmentDone(index=0, artifact=artifact()),
        ev.Recovered(attempt=1, artifact=artifact()),
        ev.Checkpointed(checkpoint=CKPT),
        ev.Restored(attempt=1, checkpoint=CKPT),
        ev.CheckpointRejected(attempt=1, checkpoint=CKPT, reason="sha256 differs"),
        ev.Released(attempt=1, reason="shutdown", step=1),
    ]
    union = typing.get_args(typing.get_args(ev.Body)[0])  # Annotated[Union[...], its discriminator]
    assert {type(b) for b in bodies} == set(union), "a body type this test does not log"
    state = fold([ev.Event(job_id="j" * 32, seq=i + 1, at=datetime.now(UTC), body=b) for i, b in enumerate(bodies[:2])])

    def records(level: int) -> list[tuple[str, str, dict]]:
        caplog.clear()
        with caplog.at_level(level, logger="h3core.runner"):
            log_written(state, bodies)
        return [(r.levelname, r.getMessage(), fields(r)) for r in caplog.records if r.name == "h3core.runner"]

    every = records(logging.DEBUG)
    assert len(every) == len(bodies)
    assert records(logging.INFO) == [r for r in every if r[0] != "DEBUG"]
    assert {r[2]["event"] for r in every if r[0] == "DEBUG"} == {"submitted", "progress", "checkpointed"}
