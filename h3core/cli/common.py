"""What the CLI's commands share: exit codes, options, consoles, opening the store, formatting."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, cast

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.artifacts.location import artifacts_at
from h3core.adapters.lock import LockHeld, RunnerLock
from h3core.adapters.store.location import StoreLocation, is_postgres_url, open_store_at, parse_location, runner_lock_for
from h3core.adapters.store.sqlite import SchemaTooNew, SQLiteEventStore
from h3core.domain.adoption import mismatch
from h3core.domain.events import Artifact
from h3core.domain.ids import is_job_id
from h3core.domain.story import dur, short, ts  # noqa: F401 - the CLI's formatting, kept where its commands import it

if TYPE_CHECKING:
    from h3core.adapters.store.postgres import PostgresEventStore

EXIT_DATA = 1  # the stored or given data is wrong
EXIT_USAGE = 2  # the request is wrong: unknown job, missing store, bad value
EXIT_LOCKED = 3  # another worker holds the store

DbOption = Annotated[
    Path,
    typer.Option(
        "--db",
        envvar="H3_DB",
        help="The store: a SQLite file, or a postgresql:// URL.",
        show_default=True,
        parser=parse_location,  # a URL stays whole (a Path would fold its `//`)
    ),
]

ArtifactsOption = Annotated[
    str,  # a URL stays whole (a Path would fold its `//`)
    typer.Option(
        "--artifacts",
        envvar="H3_ARTIFACTS",
        help="The artifact store: a folder, or an s3://bucket/prefix URL.",
        show_default=True,
    ),
]


class StatusChoice(StrEnum):
    """The states a job can be in, as `h3core jobs --status` takes them."""

    submitted = "submitted"
    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"


def console() -> Console:
    """A console on standard output, for a command's results (piped: 200 columns wide unless `COLUMNS` says otherwise)."""
    # Built per call so it writes to whatever sys.stdout is now (CliRunner swaps it). Piped
    # output is not cut to 80 columns: tables keep whole job ids for grep and scripts.
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 200
    return console


def console_err() -> Console:
    """A console on standard error, for errors, warnings and progress."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


def plural(n: int, word: str, many: str | None = None) -> str:
    """`n` and the word for that many: "1 job", "14 jobs", "2 videos"."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print `message` as one error line on standard error and exit with `code` (2 by default: the
    request is wrong)."""
    console_err().print(Text.assemble(("error: ", "bold red"), message))
    raise typer.Exit(code)


@contextmanager
def open_store(db: StoreLocation, *, create: bool = False, **options: object) -> Iterator[SQLiteEventStore | PostgresEventStore]:
    """Open the store, turning the ways that can fail into one clear line (no traceback)."""
    if not create and not is_postgres_url(db) and not Path(db).exists():
        fail(f"no store at {db} (pass --db or set H3_DB)")
    if is_postgres_url(db):
        require_extra("postgres", "psycopg", "psycopg_pool")
    try:
        store = cast("SQLiteEventStore | PostgresEventStore", open_store_at(db, **options))  # one or the other
    except SchemaTooNew as exc:
        fail(str(exc))
    except sqlite3.DatabaseError as exc:
        fail(f"{db} is not a usable h3core store: {exc}")
    except Exception as exc:
        if type(exc).__module__.startswith(("psycopg", "psycopg_pool")):  # the server refused or is unreachable
            fail(f"cannot open the store at {db}: {exc}")
        raise
    try:
        yield store
    finally:
        store.close()


def job_named(store: SQLiteEventStore | PostgresEventStore, given: str, db: Path) -> str:
    """The job a user named: its whole id, or the start of exactly one job's id (`submit --watch`
    shows the first 12 characters). Several: exit 2 listing them. None: `given`, for the caller
    to say it has no such job."""
    if store.get(given) is not None or not is_job_id(given):
        return given
    shown = 5
    matches = store.ids_starting(given, limit=shown + 1)
    if len(matches) == 1:
        return matches[0]
    if matches:
        listed = ", ".join(matches[:shown]) + (", …" if len(matches) > shown else "")
        fail(f"{given!r} is the start of several jobs in {db} ({listed}): give more of the id")
    return given


@dataclass(frozen=True)
class VideoNow:
    """A done job's video as the artifact store holds it now."""

    deleted_at: datetime | None = None  # deleted on purpose (DELETE /v1/videos/{id}), its log kept
    problem: str | None = None  # how the file differs from the recorded video; None: it is that video
    missing: bool = False  # no file at all (and no deletion recorded)


def video_now(videos: ArtifactStore, artifact: Artifact, *, hashed: bool, deleted: datetime | None = None) -> VideoNow:
    """Is the recorded video still there, byte for byte (size only unless `hashed`), or was it
    deleted on purpose? Deletions are recorded in the store (`deleted`: when, as its mark says:
    the file may have been another node's) and beside the video, not in the log."""
    try:
        deleted = deleted or videos.deleted_at(artifact.path)
        if deleted is not None:
            return VideoNow(deleted_at=deleted)
        size, sha = videos.measure(artifact.path, hashed=hashed)
    except ValueError as exc:
        return VideoNow(problem=str(exc))
    except OSError as exc:
        return VideoNow(problem=f"its video {artifact.path} cannot be read: {exc.strerror or exc}")
    return VideoNow(problem=mismatch(artifact, size, sha), missing=size is None)


TYPE_STYLE = {
    "submitted": "cyan",
    "admitted": "cyan",
    "running": "blue",
    "resumed": "blue",
    "detached": "blue",
    "progress": "dim",
    "done": "bold green",
    "recovered": "green",
    "checkpointed": "dim",
    "restored": "blue",
    "checkpoint_rejected": "yellow",
    "released": "blue",
    "attempt_failed": "yellow",
    "failed": "bold red",
    "cancel_requested": "magenta",
    "cancelled": "bold magenta",
}
STATUS_STYLE = {
    "submitted": "cyan",
    "queued": "cyan",
    "running": "blue",
    "done": "green",
    "failed": "red",
    "cancelled": "magenta",
}


def first_error(exc: ValidationError) -> str:
    """The first three errors of a pydantic `ValidationError` on one line, each as `field: message`,
    with how many more there are."""
    errs = exc.errors()
    shown = []
    for err in errs[:3]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(event)"
        shown.append(f"{loc}: {err.get('msg')}")
    more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
    return "; ".join(shown) + more


def require_extra(extra: str, *modules: str) -> None:
    """Exit 2 naming the extra to install when one of `modules` (an optional dependency) is missing."""
    from importlib.util import find_spec

    missing = [m for m in modules if find_spec(m) is None]
    if missing:
        fail(f"this command needs the {extra} extra ({', '.join(missing)} not installed): pip install 'h3core[{extra}]'")


def take_runner_lock(db: StoreLocation) -> RunnerLock | None:
    """One SQLite store takes one runner (`serve` or `worker`): a second would fight the first over
    its running jobs. Exits 3 naming the holder if the store is taken. None for PostgreSQL, where
    runner nodes share the queue (claims and leases keep them apart)."""
    lock_path = runner_lock_for(db)
    if lock_path is None:
        return None
    try:
        lock = RunnerLock(lock_path)
        lock.acquire()
    except LockHeld as exc:
        holder = f" (process {exc.holder})" if exc.holder else ""
        fail(
            f"another h3core already runs on {db}{holder}: {lock_path} is locked. Stop it first; one store takes one runner.",
            EXIT_LOCKED,
        )
    except OSError as exc:
        fail(f"cannot create the lock file {lock_path}: {exc.strerror or exc}")
    return lock


def open_artifacts_at(location: str) -> ArtifactStore:
    """The artifact store at `location` for a command, made nowhere (a folder that is not there
    reads as empty); exits 2 naming the missing extra for an s3:// URL without boto3."""
    try:
        return artifacts_at(location, create=False)
    except ImportError:
        fail(f"--artifacts {location}: an s3:// store needs the s3 extra (pip install 'h3core[s3]')")
