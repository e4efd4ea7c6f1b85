"""`h3core replay`: a job's timeline, folded from its log, and why it ended so."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError
from rich.text import Text

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.artifacts.location import present, where
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
    open_artifacts_at,
    open_store,
    short,
    ts,
    video_now,
)
from h3core.domain.events import (
    Event,
    Submitted,
)
from h3core.domain.state import IllegalEvent, JobState, fold
from h3core.domain.story import fields, progress, why
from h3core.domain.webhooks import Delivery

if TYPE_CHECKING:
    from h3core.adapters.store.postgres import PostgresEventStore


def event_line(event: Event, previous: Event | None) -> Text:
    """One event as `replay` shows it: its seq, its time and the time since `previous`, its type and
    its fields."""
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


# -- commands -------------------------------------------------------------------------------------


def read_log(store: SQLiteEventStore | PostgresEventStore, job_id: str) -> list[Event]:
    """The events of `job_id`'s log, in order (none: no such job). Exits 1 if a stored event does
    not parse."""
    try:
        return store.events(job_id)
    except ValidationError as exc:
        fail(f"job {job_id}: a stored event does not parse: {first_error(exc)}", EXIT_DATA)


@app.command()
def replay(
    job_id: Annotated[str, typer.Argument(help="The job to replay: its id, or the start of one (as `submit --watch` shows).")],
    db: DbOption = Path("h3core.db"),
    artifacts: ArtifactsOption = "artifacts",
    as_json: Annotated[bool, typer.Option("--json", help="Print the events as JSON Lines instead.")] = False,
) -> None:
    """Show a job's timeline, folded from its event log, and why it ended the way it did."""
    with open_store(db) as store:
        job_id = job_named(store, job_id, db)
        events = read_log(store, job_id)
        deliveries = store.deliveries(job_id)
        deleted = store.video_deleted_at(job_id) if events else None
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
    at = progress(state)  # the whole job's steps: a long video's, every segment's
    if at is not None:
        status.append(f"  {at}")
    status.append(f"  {len(events)} events over {dur((events[-1].at - events[0].at).total_seconds())}")
    video = _video_line(open_artifacts_at(artifacts), state, deleted) if state.artifact is not None else None
    if video is not None and video[1]:
        status.append(f"  video {video[1]}", style="bold yellow")
    out.print()
    out.print(status)
    out.print(Text.assemble(("why: ", "bold"), why(state, events, datetime.now(UTC))))
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


def _video_line(videos: ArtifactStore, state: JobState, deleted: datetime | None = None) -> tuple[str, str | None]:
    """What became of a done job's video since its log recorded it (deletions are recorded in the
    store, `deleted`, and beside the video, not in the log), and a word for the state line when it is gone."""
    a = state.artifact
    assert a is not None
    if deleted is None and not present(videos):
        return f"not looked for: no artifact store at {where(videos)} (pass --artifacts or set H3_ARTIFACTS)", None
    now = video_now(videos, a, hashed=False, deleted=deleted)
    if now.deleted_at is not None:
        return f"{a.path} was deleted at {ts(now.deleted_at)} (DELETE /v1/videos/{state.job_id}); the log remains", "deleted"
    if now.problem is not None:
        return f"{now.problem} in {where(videos)} (not deleted through the API; `h3core verify` checks every video)", (
            "missing" if now.missing else "changed"
        )
    return f"{a.path} in {where(videos)}, {a.bytes} bytes as recorded (`h3core verify` checks its sha256)", None
