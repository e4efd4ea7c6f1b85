"""Commands over a whole store: `verify`, `gc`, `export`, `import`, `jobs`, `backup`."""

from __future__ import annotations

import itertools
import sqlite3
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer
from pydantic import ValidationError
from rich.table import Table
from rich.text import Text

from h3core.adapters.artifacts.location import present, where
from h3core.adapters.store.base import Conflict
from h3core.adapters.store.location import is_postgres_url
from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.adapters.uploads import LocalUploadStore
from h3core.cli.app import app
from h3core.cli.common import (
    EXIT_DATA,
    STATUS_STYLE,
    ArtifactsOption,
    DbOption,
    StatusChoice,
    console,
    console_err,
    fail,
    first_error,
    job_named,
    open_artifacts_at,
    open_store,
    plural,
    ts,
    video_now,
)
from h3core.cli.replay import read_log
from h3core.domain.events import (
    Event,
    event_from_json,
)
from h3core.domain.retention import garbage
from h3core.domain.state import IllegalEvent, JobState, fold
from h3core.domain.story import progress

if TYPE_CHECKING:
    from h3core.adapters.store.postgres import PostgresEventStore


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


def _check_job(store: SQLiteEventStore | PostgresEventStore, job_id: str) -> tuple[JobState | None, int, str | None]:
    """(folded state, events, why it is broken or None). Safe while a worker writes."""
    # Read the log, then the projection. Every event in the log was committed before the
    # projection was read, with its projection update in the same transaction, so the projection
    # is at least as far as the log; further only when a write landed in between: read again.
    for _ in range(20):
        try:
            events = store.events(job_id)
        except ValidationError as exc:
            return None, 0, f"a stored event does not parse: {first_error(exc)}"
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
def verify(
    db: DbOption = Path("h3core.db"),
    artifacts: ArtifactsOption = "artifacts",
    quick: Annotated[bool, typer.Option("--quick", help="Check each video's size, not its sha256.")] = False,
    logs_only: Annotated[bool, typer.Option("--logs-only", help="Check the logs, not the videos.")] = False,
) -> None:
    """Fold every job's log, check it against the jobs projection, and check that every done job's
    video is on disk as its done event recorded it (size and sha256); exit 1 naming each broken job."""
    out = console()
    broken: list[tuple[str, str]] = []
    statuses: Counter[str] = Counter()
    n_events = 0
    videos = open_artifacts_at(artifacts)
    checked, missing = 0, 0
    deleted: list[tuple[str, str, datetime]] = []
    with open_store(db) as store:
        if not logs_only and not present(videos) and store.list_jobs(status="done", limit=1):
            # Every video would read as missing: the folder is what is wrong, not each job.
            fail(f"no artifact store at {artifacts} (pass --artifacts or set H3_ARTIFACTS; --logs-only checks the logs alone)")
        job_ids = store.job_ids()
        for job_id in job_ids:
            state, count, problem = _check_job(store, job_id)
            n_events += count
            statuses[state.status if state is not None else "broken"] += 1
            if problem is None and not logs_only and state is not None and state.artifact is not None:
                checked += 1
                now = video_now(videos, state.artifact, hashed=not quick, deleted=store.video_deleted_at(job_id))
                problem, missing = now.problem, missing + now.missing
                if now.deleted_at is not None:
                    deleted.append((job_id, state.artifact.path, now.deleted_at))
            if problem:
                broken.append((job_id, problem))
        for job_id in cast("PostgresEventStore", store).orphans() if is_postgres_url(db) else _orphans(db):
            broken.append((job_id, "it has events but no jobs row"))

    summary = ", ".join(f"{status} {n}" for status, n in sorted(statuses.items())) or "no jobs"
    out.print(f"checked {len(job_ids)} jobs, {n_events} events: {summary}")
    if not logs_only:
        how = "size only" if quick else "size and sha256"
        out.print(
            f"checked {plural(checked, 'video')} in {where(videos)} ({how})"
            + (f", {len(deleted)} of them deleted" if deleted else "")
        )
    for job_id, path, when in deleted:
        out.print(
            Text.assemble(
                ("DELETED ", "bold yellow"), (job_id, "bold"), f": its video {path} was deleted at {ts(when)} (DELETE /v1/videos)"
            )
        )
    for job_id, problem in broken:
        out.print(Text.assemble(("BROKEN ", "bold red"), (job_id, "bold"), f": {problem}"))
    if missing and missing == checked - len(deleted):
        out.print(f"none of the {missing} videos is in {where(videos)}: is it the store the service writes (H3_ARTIFACTS)?")
    if broken:
        fail(f"{len(broken)} broken job(s) in {db}", EXIT_DATA)
    what = "every log folds and matches the projection"
    if not logs_only:
        what += ", every video is as recorded" if not deleted else f", every video left is as recorded ({len(deleted)} deleted)"
    out.print(Text(f"OK: {what}", style="green"))


@app.command()
def gc(
    db: DbOption = Path("h3core.db"),
    artifacts: ArtifactsOption = "artifacts",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")] = False,
    uploads: Annotated[
        Path | None,
        typer.Option("--uploads", envvar="H3_UPLOADS", help="The upload store: its cut-off `.part` files go too."),
    ] = None,
) -> None:
    """Remove artifact files no job needs: partial files, videos of attempts that ended without
    becoming their job's video, files of jobs the store does not know; and uploads cut off before
    they were stored. Safe beside a running service."""
    store_files = open_artifacts_at(artifacts)
    if not present(store_files):
        fail(f"no artifact store at {artifacts} (pass --artifacts or set H3_ARTIFACTS)")
    files = store_files.files()  # listed before the jobs are read: no state is older than its files
    with open_store(db) as store:
        jobs = {job_id: store.get(job_id) for job_id in sorted({f.job_id for f in files})}
    found = garbage(files, jobs)
    out = console()
    for g in found:
        out.print(f"{'would remove' if dry_run else 'removed'} {g.file.path} ({g.file.bytes} bytes): {g.reason}")
        if not dry_run:
            store_files.remove(g.file.path)
    total = sum(g.file.bytes for g in found)
    verb = "would free" if dry_run else "freed"
    out.print(f"{len(files)} files in {where(store_files)}; {len(found)} not needed, {verb} {total} bytes")
    if uploads is not None and uploads.is_dir():
        parts = LocalUploadStore(uploads).sweep_parts(dry_run=dry_run)
        for name, size in parts:
            out.print(f"{'would remove' if dry_run else 'removed'} {name} ({size} bytes): an upload cut off before it was stored")
        out.print(f"{len(parts)} cut-off uploads in {uploads}; {verb} {sum(size for _, size in parts)} bytes")


@app.command()
def export(
    db: DbOption = Path("h3core.db"),
    job: Annotated[list[str] | None, typer.Option("--job", help="Only this job, by id or the start of one (repeatable).")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write here instead of stdout.")] = None,
) -> None:
    """Write events as JSON Lines, one event per line (all jobs, or those named with --job)."""
    with open_store(db) as store:
        if job:
            logs = []
            for given in job:
                job_id = job_named(store, given, db)
                events = read_log(store, job_id)
                if not events:
                    fail(f"no job {job_id!r} in {db}")
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
            fail(f"a stored event does not parse: {first_error(exc)}", EXIT_DATA)
        finally:
            if output is not None:
                f.close()
            else:
                f.flush()
    console_err().print(f"exported {plural(count, 'event')} of {plural(len(jobs), 'job')}" + (f" to {output}" if output else ""))


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
            fail(f"cannot read {file}: {exc.strerror or exc}")
        except UnicodeDecodeError as exc:
            fail(f"{file} is not UTF-8 text: {exc}", EXIT_DATA)
    events: list[Event] = []
    line_of: dict[tuple[str, int], int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = event_from_json(line)
        except ValidationError as exc:
            fail(f"line {number} is not an event: {first_error(exc)}; nothing was imported", EXIT_DATA)
        events.append(event)
        line_of.setdefault((event.job_id, event.seq), number)
    with open_store(db, create=True) as store:
        try:
            added = store.import_events(events)
        except IllegalEvent as exc:
            where = line_of.get((exc.job_id, exc.seq))
            fail(
                (f"line {where}: " if where else "") + f"the log breaks a rule ({exc.code}): {exc}; nothing was imported",
                EXIT_DATA,
            )
        except Conflict as exc:
            fail(f"{exc}; nothing was imported", EXIT_DATA)
    jobs = len({e.job_id for e in events})
    console().print(f"imported {added} new events ({len(events) - added} already present) for {jobs} jobs into {db}")


@app.command()
def jobs(
    db: DbOption = Path("h3core.db"),
    status: Annotated[StatusChoice | None, typer.Option("--status", help="Only jobs in this state.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 50,
) -> None:
    """List jobs, newest first."""
    with open_store(db) as store:
        rows = store.list_jobs(status=status.value if status else None, limit=limit)
    table = Table(title=f"jobs in {db}" + (f" ({status.value})" if status else ""), title_justify="left")
    table.add_column("id", no_wrap=True, min_width=32)
    table.add_column("status", no_wrap=True)
    table.add_column("progress", no_wrap=True, justify="right")
    table.add_column("attempt", no_wrap=True, justify="right")
    table.add_column("created", no_wrap=True)
    table.add_column("error", no_wrap=True)
    for _, s in rows:
        step = progress(s) or "-"  # the whole job's: a long video's, every segment's
        if s.error is not None:
            error = s.error.kind
        elif s.attempt_errors:
            error = f"(retried: {', '.join(e.kind for e in s.attempt_errors)})"
        else:
            error = ""
        table.add_row(
            s.job_id,
            Text(s.status, style=STATUS_STYLE[s.status]),
            step,
            f"{s.attempt}/{s.retry.max_attempts}",
            s.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ"),
            error,
        )
    out = console()
    if not rows:
        out.print(f"no jobs{f' with status {status.value}' if status else ''} in {db}")
        return
    out.print(table)


@app.command()
def backup(
    destination: Annotated[Path, typer.Argument(help="Where to write the copy (must not exist).")],
    db: DbOption = Path("h3core.db"),
) -> None:
    """Copy the store while it is in use (SQLite's online backup: a consistent snapshot)."""
    if destination.exists():
        fail(f"{destination} already exists; choose a new file")
    if is_postgres_url(db):
        fail("backup copies a SQLite store; back a PostgreSQL store up with pg_dump (docs/operations.md)")
    with open_store(db):  # refuses a missing or foreign file with a clear message
        pass
    source = sqlite3.connect(db, timeout=30)
    target = sqlite3.connect(destination)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
    with open_store(destination) as copy:
        n = len(copy.job_ids())
    console().print(f"backed up {db} to {destination}: {plural(n, 'job')}")
