"""`h3core replay`: a job's timeline, folded from its log, and why it ended so."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.text import Text

from h3core.adapters.artifacts import LocalArtifactStore
from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.cli.app import app
from h3core.cli.common import (
    EXIT_DATA,
    STATUS_STYLE,
    TYPE_STYLE,
    ArtifactsOption,
    DbOption,
    console,
    dur,
    fail,
    first_error,
    job_named,
    open_store,
    short,
    ts,
    video_now,
)
from h3core.domain.events import (
    Admitted,
    AttemptFailed,
    Cancelled,
    CancelRequested,
    Detached,
    Done,
    Event,
    Failed,
    Progress,
    Recovered,
    Resumed,
    Running,
    Submitted,
)
from h3core.domain.state import IllegalEvent, JobState, fold
from h3core.domain.webhooks import Delivery


def fields(event: Event) -> str:
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
            if b.remixed_from:
                parts.append(f"remix of {b.remixed_from}")
            if b.warnings:
                parts.append(f"{len(b.warnings)} warning(s)")
            parts.append(f"prompt={short(r.prompt, 60)!r}")
            return "  ".join(parts)
        case Admitted():
            return f"tokens={b.tokens}" if b.tokens is not None else ""
        case Running():
            parts = [f"attempt={b.attempt}", f"executor={b.executor}"]
            if b.executor_ref:
                parts.append(f"ref={b.executor_ref}")
            parts += [f"{k}={v}" for k, v in b.info.items()]
            return "  ".join(parts)
        case Resumed():
            return f"attempt={b.attempt}  ref={b.executor_ref}  after={dur(b.after_s)}"
        case Detached():
            return f"attempt={b.attempt}  ref={b.executor_ref}  (h3core stopped; the work runs on)"
        case Progress():
            return f"step {b.step}/{b.total}"
        case Done():
            a = b.artifact
            late = "  (the cancel came too late: the work had finished)" if b.cancel_too_late else ""
            return f"artifact={a.path}  bytes={a.bytes}  sha256={a.sha256}  frames={a.frames}  duration={a.duration_s:g}s{late}"
        case Recovered():
            return f"attempt={b.attempt}  artifact={b.artifact.path}  (committed before h3core stopped; size and sha256 checked)"
        case AttemptFailed():
            return f"attempt={b.attempt}  kind={b.kind}  message={b.message!r}" + (f"  detail={b.detail!r}" if b.detail else "")
        case Failed():
            return f"kind={b.kind}  message={b.message!r}" + (f"  detail={b.detail!r}" if b.detail else "")
        case CancelRequested() | Cancelled():
            return f"reason={b.reason!r}"
    return ""  # pragma: no cover


def event_line(event: Event, previous: Event | None) -> Text:
    delta = "" if previous is None else "+" + dur((event.at - previous.at).total_seconds())
    line = Text.assemble(
        (f"#{event.seq:<4}", "bold"),
        f"{ts(event.at)}  ",
        (f"{delta:>9}  ", "dim"),
        (f"{event.type:<17}", TYPE_STYLE.get(event.type, "")),
        fields(event),
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
    resumed: list[Resumed] = field(default_factory=list)  # re-attached after h3core restarts

    @property
    def resumes(self) -> str:
        """' (resumed after 2 restarts of h3core, unfollowed 41.0s)', or nothing."""
        if not self.resumed:
            return ""
        n = len(self.resumed)
        away = dur(sum(r.after_s for r in self.resumed))
        return f" (resumed after {n} restart{'s' if n != 1 else ''} of h3core, unfollowed {away})"

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
        elif isinstance(b, Resumed) and current is not None:
            current.resumed.append(b)
        elif isinstance(b, AttemptFailed | Failed | Done | Cancelled) and current is not None:
            current.ended, current.outcome = e.at, b
            current = None
    return tries


def _earlier(tries: list[_Try]) -> str:
    """'attempt 1 failed executor_lost after step 3/10 — lost the worker' for each retried attempt."""
    out = []
    for t in tries:
        if isinstance(t.outcome, AttemptFailed):
            out.append(f"attempt {t.number} failed {t.outcome.kind} {t.where} — {short(t.outcome.message, 200)}")
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
        if state.cancel_requested:
            text += "; a cancel was requested, but the work had finished before it could take effect, so its video was kept"
        if state.recovered is not None:
            text += (
                f". h3core stopped after attempt {n} had committed its video and before it recorded the job done; "
                "recovery found the video intact (size and sha256 as committed) and recorded it instead of running again"
            )
        text += (
            f". Attempt {n} ran {dur((last.ended - last.started).total_seconds())}{last.resumes}; "
            f"{dur(since_submit)} from submission to done. "
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
        elif err.kind == "not_started":
            text += f". Not retried: {state.not_started + 1} attempts never started"
        elif err.kind not in policy.retry_on:
            text += f". Not retried: the job's policy retries only {', '.join(policy.retry_on) or 'nothing'}"
        elif state.attempt - state.not_started >= policy.max_attempts:
            text += f". Not retried: attempt {state.attempt} was the last of {policy.max_attempts} allowed"
        return text + f". It ended {dur(since_submit)} after submission."

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
        return text + f". It ended {dur(since_submit)} after submission."

    idle = dur((now - state.updated_at).total_seconds())
    if state.status == "running":
        assert last is not None and state.attempt_started_at is not None
        step = f"at step {state.step}/{state.total}" if state.step is not None else "with no step reported yet"
        text = (
            f"still running: attempt {state.attempt} on {state.executor} since {ts(state.attempt_started_at)} "
            f"({dur((now - state.attempt_started_at).total_seconds())} ago), {step}; last event {idle} ago"
        )
        if last.resumed:
            text += f"; re-attached to {state.executor_ref} at {ts(state.resumed_at or last.started)}{last.resumes}"
        if state.cancel_requested:
            text += "; a cancel was requested and the executor has not confirmed it yet"
        if earlier:
            text += f". Earlier: {earlier}"
        return text + "."

    if state.status == "queued":
        waiting_since = state.updated_at if tries else (state.admitted_at or state.updated_at)
        text = (
            f"still queued since {ts(waiting_since)} ({dur((now - waiting_since).total_seconds())} ago), "
            f"waiting for attempt {state.attempt + 1}"
        )
        if earlier:
            text += f" after {earlier}"
        return text + "."

    return (
        f"submitted at {ts(state.created_at)} ({dur((now - state.created_at).total_seconds())} ago) "
        "but not admitted yet; the next worker to start admits it."
    )


# -- commands -------------------------------------------------------------------------------------


def read_log(store: SQLiteEventStore, job_id: str) -> list[Event]:
    try:
        return store.events(job_id)
    except ValidationError as exc:
        fail(f"job {job_id}: a stored event does not parse: {first_error(exc)}", EXIT_DATA)


@app.command()
def replay(
    job_id: Annotated[str, typer.Argument(help="The job to replay: its id, or the start of one (as `submit --watch` shows).")],
    db: DbOption = Path("h3core.db"),
    artifacts: ArtifactsOption = Path("artifacts"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the events as JSON Lines instead.")] = False,
) -> None:
    """Show a job's timeline, folded from its event log, and why it ended the way it did."""
    with open_store(db) as store:
        job_id = job_named(store, job_id, db)
        events = read_log(store, job_id)
        deliveries = store.deliveries(job_id)
    if not events:
        fail(f"no job {job_id!r} in {db}")

    out = console()
    if as_json:
        for e in events:
            typer.echo(e.model_dump_json())
    else:
        first = events[0].body
        if isinstance(first, Submitted):
            out.print(Text.assemble(("job ", "bold"), (job_id, "bold"), f"  prompt={short(first.request.prompt)!r}"))

    # Fold the log rather than read the projection: this shows what the log says.
    try:
        state, broken = fold(events), None
    except IllegalEvent as exc:
        state, broken = None, exc
    previous: Event | None = None
    for e in events:
        if broken is not None and e.seq == broken.seq:
            if not as_json:
                out.print(Text.assemble(event_line(e, previous), ("   <- breaks a rule", "bold red")))
            break
        if not as_json:
            out.print(event_line(e, previous))
        previous = e
    if broken is not None:
        fail(f"the log breaks a rule ({broken.code}): {broken}", EXIT_DATA)
    if as_json:
        return

    assert state is not None
    status = Text.assemble(("state: ", "bold"), (state.status, f"bold {STATUS_STYLE[state.status]}"))
    if state.attempt:
        status.append(f"  attempt {state.attempt}/{state.retry.max_attempts}")
    if state.step is not None:
        status.append(f"  step {state.step}/{state.total}")
    status.append(f"  {len(events)} events over {dur((events[-1].at - events[0].at).total_seconds())}")
    video = _video_line(LocalArtifactStore(artifacts, create=False), state) if state.artifact is not None else None
    if video is not None and video[1]:
        status.append(f"  video {video[1]}", style="bold yellow")
    out.print()
    out.print(status)
    out.print(Text.assemble(("why: ", "bold"), _why(state, events, datetime.now(UTC))))
    if video is not None:
        out.print(Text.assemble(("video: ", "bold"), video[0]))
    for d in deliveries:
        out.print(Text.assemble(("webhook: ", "bold"), webhook_line(d)))


def webhook_line(d: Delivery) -> str:
    """One delivery of a webhook, as `replay` shows it."""
    tries = f"{d.tries} {'try' if d.tries == 1 else 'tries'}"
    last = f", last failure: {d.last_error}" if d.last_error and d.outcome != "delivered" else ""
    outcome = d.outcome.replace("_", " ")
    return f"#{d.seq} {d.event_type} -> {d.url}: {outcome} after {tries} ({d.webhook_id}, {ts(d.updated_at)}){last}"


def _video_line(videos: LocalArtifactStore, state: JobState) -> tuple[str, str | None]:
    """What became of a done job's video since its log recorded it (deletions are recorded beside
    the video, not in the log), and a word for the state line when it is gone."""
    a = state.artifact
    assert a is not None
    if not videos.root.is_dir():
        return f"not looked for: no artifact store at {videos.root} (pass --artifacts or set H3_ARTIFACTS)", None
    now = video_now(videos, a, hashed=False)
    if now.deleted_at is not None:
        return f"{a.path} was deleted at {ts(now.deleted_at)} (DELETE /v1/videos/{state.job_id}); the log remains", "deleted"
    if now.problem is not None:
        return f"{now.problem} in {videos.root} (not deleted through the API; `h3core verify` checks every video)", (
            "missing" if now.missing else "changed"
        )
    return f"{a.path} in {videos.root}, {a.bytes} bytes as recorded (`h3core verify` checks its sha256)", None
