"""The `h3core` command line: inspect, check, move and run a store's jobs.

    h3core replay JOB_ID       a job's timeline, folded from its log, and why it ended so
    h3core verify              fold every log, compare with the jobs projection
    h3core export / import     the event log as JSON Lines
    h3core worker              run queued jobs with the fake executor until SIGTERM/SIGINT
    h3core enqueue --prompt    store a job for a worker to run (no runner is started)
    h3core jobs                the newest jobs, as a table

Every command takes `--db PATH` (env `H3_DB`, default `h3core.db`). Exit codes: 0 fine;
1 the data is wrong (a log breaks a rule, a line does not parse); 2 the request is wrong (no
such job, no such store, a bad value); 3 another worker already holds the store.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import sqlite3
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Annotated, NoReturn

import anyio
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from h3core.adapters.artifacts import LocalArtifactStore
from h3core.adapters.lock import LockHeld, RunnerLock
from h3core.adapters.store.base import Conflict
from h3core.adapters.store.sqlite import SchemaTooNew, SQLiteEventStore
from h3core.domain.events import (
    Admitted,
    Artifact,
    AttemptFailed,
    CancelRequested,
    Cancelled,
    Done,
    Event,
    Failed,
    Progress,
    Running,
    Submitted,
    event_from_json,
)
from h3core.domain.request import GenerationRequest
from h3core.domain.retry import RetryPolicy
from h3core.domain.state import IllegalEvent, JobState, fold
from h3core.executors.fake import FakeExecutor, FakePlan
from h3core.runner import IdempotencyMismatch, Refused, Runner, RunnerConfig

app = typer.Typer(
    name="h3core",
    help="Run long video-generation jobs so that none is ever stuck, lost or silently half-done.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_DATA = 1  # the stored or given data is wrong
EXIT_USAGE = 2  # the request is wrong: unknown job, missing store, bad value
EXIT_LOCKED = 3  # another worker holds the store

DbOption = Annotated[
    Path,
    typer.Option("--db", envvar="H3_DB", help="The SQLite store.", show_default=True),
]


class StatusChoice(str, Enum):
    submitted = "submitted"
    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"


def _out() -> Console:
    # Built per call so it writes to whatever sys.stdout is now (CliRunner swaps it). Piped
    # output is not cut to 80 columns: tables keep whole job ids for grep and scripts.
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 200
    return console


def _err() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    _err().print(Text.assemble(("error: ", "bold red"), message))
    raise typer.Exit(code)


@contextmanager
def _open_store(db: Path, *, create: bool = False) -> Iterator[SQLiteEventStore]:
    """Open the store, turning the ways that can fail into one clear line (no traceback)."""
    if not create and not db.exists():
        _fail(f"no store at {db} (pass --db or set H3_DB)")
    try:
        store = SQLiteEventStore(db)
    except SchemaTooNew as exc:
        _fail(str(exc))
    except sqlite3.DatabaseError as exc:
        _fail(f"{db} is not a usable h3core store: {exc}")
    try:
        yield store
    finally:
        store.close()


# -- formatting ---------------------------------------------------------------------------------


def _ts(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _dur(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(round(seconds)), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def _short(text: str, n: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _fields(event: Event) -> str:
    """The fields of an event worth a human's attention, as one line."""
    b = event.body
    match b:
        case Submitted():
            r = b.request
            parts = [
                f"{r.mode} {r.width}x{r.height} frames={r.frames} steps={r.steps} seed={r.seed}",
                f"priority={b.priority}",
                f"retry=max {b.retry.max_attempts} on {','.join(b.retry.retry_on) or 'nothing'}",
            ]
            if b.idempotency_key:
                parts.append(f"key={b.idempotency_key}")
            if b.warnings:
                parts.append(f"{len(b.warnings)} warning(s)")
            parts.append(f"prompt={_short(r.prompt, 60)!r}")
            return "  ".join(parts)
        case Admitted():
            return f"tokens={b.tokens}" if b.tokens is not None else ""
        case Running():
            parts = [f"attempt={b.attempt}", f"executor={b.executor}"]
            if b.executor_ref:
                parts.append(f"ref={b.executor_ref}")
            parts += [f"{k}={v}" for k, v in b.info.items()]
            return "  ".join(parts)
        case Progress():
            return f"step {b.step}/{b.total}"
        case Done():
            a = b.artifact
            return (
                f"artifact={a.path}  bytes={a.bytes}  sha256={a.sha256}  "
                f"frames={a.frames}  duration={a.duration_s:g}s"
            )
        case AttemptFailed():
            return f"attempt={b.attempt}  kind={b.kind}  message={b.message!r}" + (
                f"  detail={b.detail!r}" if b.detail else ""
            )
        case Failed():
            return f"kind={b.kind}  message={b.message!r}" + (f"  detail={b.detail!r}" if b.detail else "")
        case CancelRequested() | Cancelled():
            return f"reason={b.reason!r}"
    return ""  # pragma: no cover


_TYPE_STYLE = {
    "submitted": "cyan",
    "admitted": "cyan",
    "running": "blue",
    "progress": "dim",
    "done": "bold green",
    "attempt_failed": "yellow",
    "failed": "bold red",
    "cancel_requested": "magenta",
    "cancelled": "bold magenta",
}
_STATUS_STYLE = {
    "submitted": "cyan",
    "queued": "cyan",
    "running": "blue",
    "done": "green",
    "failed": "red",
    "cancelled": "magenta",
}


def _event_line(event: Event, previous: Event | None) -> Text:
    delta = "" if previous is None else "+" + _dur((event.at - previous.at).total_seconds())
    line = Text.assemble(
        (f"#{event.seq:<4}", "bold"),
        f"{_ts(event.at)}  ",
        (f"{delta:>9}  ", "dim"),
        (f"{event.type:<17}", _TYPE_STYLE.get(event.type, "")),
        _fields(event),
    )
    line.rstrip()
    return line


# -- the story of a job ---------------------------------------------------------------------------


@dataclass
class _Try:
    """One attempt as the log tells it."""

    number: int
    started: datetime
    executor: str
    step: int | None = None
    total: int | None = None
    ended: datetime | None = None
    outcome: AttemptFailed | Failed | Done | Cancelled | None = None

    @property
    def where(self) -> str:
        return f"after step {self.step}/{self.total}" if self.step is not None else "before its first step"


def _tries(events: Sequence[Event]) -> list[_Try]:
    tries: list[_Try] = []
    current: _Try | None = None
    for e in events:
        b = e.body
        if isinstance(b, Running):
            current = _Try(b.attempt, e.at, b.executor)
            tries.append(current)
        elif isinstance(b, Progress) and current is not None:
            current.step, current.total = b.step, b.total
        elif isinstance(b, AttemptFailed | Failed | Done | Cancelled) and current is not None:
            current.ended, current.outcome = e.at, b
            current = None
    return tries


def _earlier(tries: list[_Try]) -> str:
    """'attempt 1 failed executor_lost after step 3/10 — lost the worker' for each retried attempt."""
    out = []
    for t in tries:
        if isinstance(t.outcome, AttemptFailed):
            out.append(f"attempt {t.number} failed {t.outcome.kind} {t.where} — {_short(t.outcome.message, 200)}")
    return "; ".join(out)


def _why(state: JobState, events: Sequence[Event], now: datetime) -> str:
    """One paragraph: how the job came to be where it is."""
    tries = _tries(events)
    last = tries[-1] if tries else None
    earlier = _earlier(tries)
    since_submit = (state.updated_at - state.created_at).total_seconds()

    if state.status == "done":
        assert state.artifact is not None and last is not None and last.ended is not None
        n = state.attempt
        text = f"done after {n} attempt{'s' if n != 1 else ''}"
        if earlier:
            text += f"; {earlier}"
        text += (
            f". Attempt {n} ran {_dur((last.ended - last.started).total_seconds())}; "
            f"{_dur(since_submit)} from submission to done. "
            f"Artifact {state.artifact.path} ({state.artifact.bytes} bytes, sha256 {state.artifact.sha256})."
        )
        return text

    if state.status == "failed":
        assert state.error is not None
        err = state.error
        detail = f" ({err.detail})" if err.detail else ""
        if last is not None and isinstance(last.outcome, Failed):
            text = f"failed: {err.kind} {last.where} on attempt {last.number} — {err.message}{detail}"
        else:
            text = f"failed: {err.kind} while queued, before attempt {state.attempt + 1} ran — {err.message}{detail}"
        if earlier:
            text += f". Earlier: {earlier}"
        policy = state.retry
        if state.cancel_requested:
            text += ". Not retried: a cancel had been requested"
        elif err.kind not in policy.retry_on:
            text += f". Not retried: the job's policy retries only {', '.join(policy.retry_on) or 'nothing'}"
        elif state.attempt >= policy.max_attempts:
            text += f". Not retried: attempt {state.attempt} was the last of {policy.max_attempts} allowed"
        return text + f". It ended {_dur(since_submit)} after submission."

    if state.status == "cancelled":
        reason = next((e.body.reason for e in reversed(events) if isinstance(e.body, Cancelled)), "")
        if last is not None and isinstance(last.outcome, Cancelled):
            text = f"cancelled while running attempt {last.number} {last.where}"
        else:
            text = "cancelled while queued" if state.attempt == 0 else f"cancelled while queued for attempt {state.attempt + 1}"
        if reason:
            text += f": {reason}"
        if earlier:
            text += f". Earlier: {earlier}"
        return text + f". It ended {_dur(since_submit)} after submission."

    idle = _dur((now - state.updated_at).total_seconds())
    if state.status == "running":
        assert last is not None and state.attempt_started_at is not None
        step = f"at step {state.step}/{state.total}" if state.step is not None else "with no step reported yet"
        text = (
            f"still running: attempt {state.attempt} on {state.executor} since {_ts(state.attempt_started_at)} "
            f"({_dur((now - state.attempt_started_at).total_seconds())} ago), {step}; last event {idle} ago"
        )
        if state.cancel_requested:
            text += "; a cancel was requested and the executor has not confirmed it yet"
        if earlier:
            text += f". Earlier: {earlier}"
        return text + "."

    if state.status == "queued":
        waiting_since = state.updated_at if tries else (state.admitted_at or state.updated_at)
        text = (
            f"still queued since {_ts(waiting_since)} ({_dur((now - waiting_since).total_seconds())} ago), "
            f"waiting for attempt {state.attempt + 1}"
        )
        if earlier:
            text += f" after {earlier}"
        return text + "."

    return (
        f"submitted at {_ts(state.created_at)} ({_dur((now - state.created_at).total_seconds())} ago) "
        "but not admitted yet; the next worker to start admits it."
    )


# -- commands -------------------------------------------------------------------------------------


def _read_log(store: SQLiteEventStore, job_id: str) -> list[Event]:
    try:
        return store.events(job_id)
    except ValidationError as exc:
        _fail(f"job {job_id}: a stored event does not parse: {_first_error(exc)}", EXIT_DATA)


@app.command()
def replay(
    job_id: Annotated[str, typer.Argument(help="The job to replay.")],
    db: DbOption = Path("h3core.db"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the events as JSON Lines instead.")] = False,
) -> None:
    """Show a job's timeline, folded from its event log, and why it ended the way it did."""
    with _open_store(db) as store:
        events = _read_log(store, job_id)
    if not events:
        _fail(f"no job {job_id!r} in {db}")

    out = _out()
    if as_json:
        for e in events:
            typer.echo(e.model_dump_json())
    else:
        first = events[0].body
        if isinstance(first, Submitted):
            out.print(Text.assemble(("job ", "bold"), (job_id, "bold"), f"  prompt={_short(first.request.prompt)!r}"))

    # Fold the log rather than read the projection: this shows what the log says.
    try:
        state, broken = fold(events), None
    except IllegalEvent as exc:
        state, broken = None, exc
    previous: Event | None = None
    for e in events:
        if broken is not None and e.seq == broken.seq:
            if not as_json:
                out.print(Text.assemble(_event_line(e, previous), ("   <- breaks a rule", "bold red")))
            break
        if not as_json:
            out.print(_event_line(e, previous))
        previous = e
    if broken is not None:
        _fail(f"the log breaks a rule ({broken.code}): {broken}", EXIT_DATA)
    if as_json:
        return

    assert state is not None
    status = Text.assemble(("state: ", "bold"), (state.status, f"bold {_STATUS_STYLE[state.status]}"))
    if state.attempt:
        status.append(f"  attempt {state.attempt}/{state.retry.max_attempts}")
    if state.step is not None:
        status.append(f"  step {state.step}/{state.total}")
    status.append(f"  {len(events)} events over {_dur((events[-1].at - events[0].at).total_seconds())}")
    out.print()
    out.print(status)
    out.print(Text.assemble(("why: ", "bold"), _why(state, events, datetime.now(UTC))))


def _first_error(exc: ValidationError) -> str:
    errs = exc.errors()
    shown = []
    for err in errs[:3]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(event)"
        shown.append(f"{loc}: {err.get('msg')}")
    more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
    return "; ".join(shown) + more


def _orphans(db: Path) -> list[str]:
    """Job ids that have events but no row in the `jobs` projection (invisible to the store API)."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        conn.execute("PRAGMA query_only = ON")
        rows = conn.execute(
            "SELECT DISTINCT job_id FROM events WHERE job_id NOT IN (SELECT job_id FROM jobs) ORDER BY job_id"
        ).fetchall()
    finally:
        conn.close()
    return [j for (j,) in rows]


def _check_job(store: SQLiteEventStore, job_id: str) -> tuple[JobState | None, int, str | None]:
    """(folded state, events, why it is broken or None). Safe while a worker writes."""
    # Read the log, then the projection. Every event in the log was committed before the
    # projection was read, with its projection update in the same transaction, so the projection
    # is at least as far as the log; further only when a write landed in between: read again.
    for _ in range(20):
        try:
            events = store.events(job_id)
        except ValidationError as exc:
            return None, 0, f"a stored event does not parse: {_first_error(exc)}"
        projected = store.get(job_id)
        if projected is None or not events or projected.last_seq <= events[-1].seq:
            break
    if not events:
        return None, 0, "it has a jobs row but no events"
    try:
        state = fold(events)
    except IllegalEvent as exc:
        return None, len(events), f"the log breaks a rule ({exc.code}): {exc}"
    assert state is not None
    if projected is None:
        return state, len(events), "it has events but no jobs row"
    if state.last_seq > projected.last_seq:
        return (
            state,
            len(events),
            f"the log has events up to seq {state.last_seq} but the jobs projection only up to seq {projected.last_seq}",
        )
    if state.last_seq < projected.last_seq:
        return state, len(events), f"the jobs projection is at seq {projected.last_seq} but the log ends at seq {state.last_seq}"
    if state != projected:
        mine, theirs = state.model_dump(), projected.model_dump()
        diff = sorted(k for k in mine if mine[k] != theirs.get(k))
        return state, len(events), f"the jobs projection differs from the fold of its log in {', '.join(diff)}"
    return state, len(events), None


@app.command()
def verify(db: DbOption = Path("h3core.db")) -> None:
    """Fold every job's log, check it against the jobs projection; exit 1 naming each broken job."""
    out = _out()
    broken: list[tuple[str, str]] = []
    statuses: Counter[str] = Counter()
    n_events = 0
    with _open_store(db) as store:
        job_ids = store.job_ids()
        for job_id in job_ids:
            state, count, problem = _check_job(store, job_id)
            n_events += count
            statuses[state.status if state is not None else "broken"] += 1
            if problem:
                broken.append((job_id, problem))
        for job_id in _orphans(db):
            broken.append((job_id, "it has events but no jobs row"))

    summary = ", ".join(f"{status} {n}" for status, n in sorted(statuses.items())) or "no jobs"
    out.print(f"checked {len(job_ids)} jobs, {n_events} events: {summary}")
    for job_id, problem in broken:
        out.print(Text.assemble(("BROKEN ", "bold red"), (job_id, "bold"), f": {problem}"))
    if broken:
        _fail(f"{len(broken)} broken job(s) in {db}", EXIT_DATA)
    out.print(Text("OK: every log folds and matches the projection", style="green"))


@app.command()
def export(
    db: DbOption = Path("h3core.db"),
    job: Annotated[list[str] | None, typer.Option("--job", help="Only this job (repeatable).")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write here instead of stdout.")] = None,
) -> None:
    """Write events as JSON Lines, one event per line (all jobs, or those named with --job)."""
    with _open_store(db) as store:
        if job:
            logs = []
            for job_id in job:
                events = _read_log(store, job_id)
                if not events:
                    _fail(f"no job {job_id!r} in {db}")
                logs.append(events)
            events_iter: Iterator[Event] = itertools.chain.from_iterable(logs)
        else:
            events_iter = store.all_events()
        f = open(output, "w", encoding="utf-8") if output is not None else sys.stdout  # noqa: SIM115
        count = 0
        jobs = set()
        try:
            for e in events_iter:
                f.write(e.model_dump_json() + "\n")
                count += 1
                jobs.add(e.job_id)
        except ValidationError as exc:
            _fail(f"a stored event does not parse: {_first_error(exc)}", EXIT_DATA)
        finally:
            if output is not None:
                f.close()
            else:
                f.flush()
    _err().print(f"exported {count} events of {len(jobs)} jobs" + (f" to {output}" if output else ""))


@app.command("import")
def import_(
    file: Annotated[str, typer.Argument(help="A JSON Lines file of events, or - for stdin.")],
    db: DbOption = Path("h3core.db"),
) -> None:
    """Add events made elsewhere to the store, checked like any append; all or nothing."""
    if file == "-":
        lines = sys.stdin.read().splitlines()
    else:
        try:
            lines = Path(file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            _fail(f"cannot read {file}: {exc.strerror or exc}")
        except UnicodeDecodeError as exc:
            _fail(f"{file} is not UTF-8 text: {exc}", EXIT_DATA)
    events: list[Event] = []
    line_of: dict[tuple[str, int], int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = event_from_json(line)
        except ValidationError as exc:
            _fail(f"line {number} is not an event: {_first_error(exc)}; nothing was imported", EXIT_DATA)
        events.append(event)
        line_of.setdefault((event.job_id, event.seq), number)
    with _open_store(db, create=True) as store:
        try:
            added = store.import_events(events)
        except IllegalEvent as exc:
            where = line_of.get((exc.job_id, exc.seq))
            _fail(
                (f"line {where}: " if where else "")
                + f"the log breaks a rule ({exc.code}): {exc}; nothing was imported",
                EXIT_DATA,
            )
        except Conflict as exc:
            _fail(f"{exc}; nothing was imported", EXIT_DATA)
    jobs = len({e.job_id for e in events})
    _out().print(f"imported {added} new events ({len(events) - added} already present) for {jobs} jobs into {db}")


@app.command()
def jobs(
    db: DbOption = Path("h3core.db"),
    status: Annotated[StatusChoice | None, typer.Option("--status", help="Only jobs in this state.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 50,
) -> None:
    """List jobs, newest first."""
    with _open_store(db) as store:
        rows = store.list_jobs(status=status.value if status else None, limit=limit)
    table = Table(title=f"jobs in {db}" + (f" ({status.value})" if status else ""), title_justify="left")
    table.add_column("id", no_wrap=True, min_width=32)
    table.add_column("status", no_wrap=True)
    table.add_column("step", no_wrap=True, justify="right")
    table.add_column("attempt", no_wrap=True, justify="right")
    table.add_column("created", no_wrap=True)
    table.add_column("error", no_wrap=True)
    for _, s in rows:
        step = f"{s.step}/{s.total}" if s.step is not None else "-"
        if s.error is not None:
            error = s.error.kind
        elif s.attempt_errors:
            error = f"(retried: {', '.join(e.kind for e in s.attempt_errors)})"
        else:
            error = ""
        table.add_row(
            s.job_id,
            Text(s.status, style=_STATUS_STYLE[s.status]),
            step,
            f"{s.attempt}/{s.retry.max_attempts}",
            s.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ"),
            error,
        )
    out = _out()
    if not rows:
        out.print(f"no jobs{f' with status {status.value}' if status else ''} in {db}")
        return
    out.print(table)


class _NoArtifacts:
    """`enqueue` builds a runner only to submit; its executor never runs, so never writes."""

    def staging(self, job_id: str, attempt: int, suffix: str = ".mp4") -> Path:
        raise RuntimeError("enqueue does not run jobs")

    def commit(self, staged: Path, **kwargs: object) -> Artifact:
        raise RuntimeError("enqueue does not run jobs")

    def resolve(self, rel_path: str) -> Path:
        raise RuntimeError("enqueue does not run jobs")


@app.command()
def enqueue(
    prompt: Annotated[str, typer.Option("--prompt", help="What to generate.")],
    db: DbOption = Path("h3core.db"),
    steps: Annotated[int, typer.Option(help="Denoising steps.")] = 50,
    frames: Annotated[int, typer.Option(help="Frames (24 fps).")] = 124,
    width: Annotated[int, typer.Option(help="Width in pixels, a multiple of 32.")] = 1344,
    height: Annotated[int, typer.Option(help="Height in pixels, a multiple of 32.")] = 768,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    max_attempts: Annotated[
        int,
        typer.Option(envvar="H3_MAX_ATTEMPTS", help="The job's retry policy: at most this many attempts."),
    ] = 2,
    idempotency_key: Annotated[str | None, typer.Option(help="Submitting the same key again returns the same job.")] = None,
) -> None:
    """Store a job for a worker to run, and print its id. No runner is started."""
    try:
        request = GenerationRequest(
            prompt=prompt, steps=steps, frames=frames, width=width, height=height, seed=seed
        )
        retry = RetryPolicy(max_attempts=max_attempts)
    except ValidationError as exc:
        _fail(f"invalid job: {_first_error(exc)}")
    with _open_store(db, create=True) as store:
        runner = Runner(store, FakeExecutor(_NoArtifacts()), RunnerConfig(retry=retry))
        try:
            state = anyio.run(
                functools.partial(runner.submit, request, priority=priority, idempotency_key=idempotency_key)
            )
        except (Refused, IdempotencyMismatch) as exc:
            _fail(str(exc))
    for warning in state.warnings:
        _err().print(f"warning: {warning}")
    typer.echo(state.job_id)


# -- the worker -----------------------------------------------------------------------------------


def _log_event(e: Event) -> None:
    """One plain line per event, flushed at once (the worker's log may be a pipe or a file)."""
    print(f"{_ts(e.at)} {e.job_id} #{e.seq} {e.type} {_fields(e)}".rstrip(), flush=True)


async def _print_events(events: AsyncIterator[Event]) -> None:
    async for e in events:
        _log_event(e)


async def _serve(runner: Runner, *, verbose: bool) -> str:
    """Run until SIGTERM or SIGINT; return the signal's name. Cancelling the runner is its shutdown."""
    received: list[str] = []
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with AsyncExitStack() as stack:
            events = await stack.enter_async_context(runner.bus.subscribe()) if verbose else None
            async with anyio.create_task_group() as printer:
                if events is not None:
                    printer.start_soon(_print_events, events)
                with anyio.CancelScope() as run_scope:
                    async with anyio.create_task_group() as tg:

                        async def stop_on_signal() -> None:
                            async for signum in signals:
                                received.append(signal.Signals(signum).name)
                                _err().print(
                                    f"worker: {received[-1]} received, stopping "
                                    "(running jobs are recorded as interrupted)"
                                )
                                run_scope.cancel()
                                return

                        tg.start_soon(stop_on_signal)
                        await tg.start(runner.run)
                        _err().print("worker: ready")
                printer.cancel_scope.cancel()
            # What the runner wrote while stopping (the interrupted attempts), not yet printed.
            while events is not None:
                try:
                    e = events.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
                _log_event(e)
    return received[0] if received else "cancel"


@app.command()
def worker(
    db: DbOption = Path("h3core.db"),
    artifacts: Annotated[Path, typer.Option(envvar="H3_ARTIFACTS", help="Where finished videos go.")] = Path(
        "artifacts"
    ),
    slots: Annotated[int, typer.Option(min=1, max=256, help="Jobs run at once.")] = 1,
    stall_timeout: Annotated[
        float, typer.Option(envvar="H3_STALL_TIMEOUT", help="Seconds without progress before an attempt is stalled.")
    ] = 600.0,
    fake_step_seconds: Annotated[
        float, typer.Option(envvar="H3_FAKE_STEP_SECONDS", min=0, help="The fake executor's time per step.")
    ] = 0.5,
    max_attempts: Annotated[
        int,
        typer.Option(
            envvar="H3_MAX_ATTEMPTS",
            help="Retry policy of jobs submitted through this runner. Jobs already stored keep the "
            "policy recorded when they were enqueued (see `enqueue --max-attempts`).",
        ),
    ] = 2,
    poll_interval: Annotated[float, typer.Option(help="Seconds between looks for work other processes stored.")] = 0.5,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print one line per event written.")] = False,
) -> None:
    """Run queued jobs with the fake executor until SIGTERM or SIGINT (a graceful stop)."""
    try:
        config = RunnerConfig(
            slots=slots,
            stall_timeout_s=stall_timeout,
            poll_interval_s=poll_interval,
            retry=RetryPolicy(max_attempts=max_attempts),
        )
    except ValidationError as exc:
        _fail(f"invalid worker setting: {_first_error(exc)}")
    lock_path = Path(f"{db}.runner.lock")
    try:
        lock = RunnerLock(lock_path)
        lock.acquire()
    except LockHeld as exc:
        holder = f" (process {exc.holder})" if exc.holder else ""
        _fail(
            f"another worker already runs on {db}{holder}: {lock_path} is locked. "
            "Stop that worker first; one store takes one worker.",
            EXIT_LOCKED,
        )
    except OSError as exc:
        _fail(f"cannot create the lock file {lock_path}: {exc.strerror or exc}")
    try:
        with _open_store(db, create=True) as store:
            try:
                artifact_store = LocalArtifactStore(artifacts)
            except OSError as exc:
                _fail(f"cannot use {artifacts} for artifacts: {exc.strerror or exc}")
            executor = FakeExecutor(artifact_store, default=FakePlan(step_seconds=fake_step_seconds))
            runner = Runner(store, executor, config)
            _err().print(
                f"worker: pid {os.getpid()}, store {db}, artifacts {artifacts}, slots {slots}; "
                "stop with SIGTERM or Ctrl-C"
            )
            how = anyio.run(functools.partial(_serve, runner, verbose=verbose))
            _err().print(f"worker: stopped ({how})")
    finally:
        lock.release()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
