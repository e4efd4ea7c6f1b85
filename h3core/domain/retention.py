"""Which files of the artifact store are still needed (`h3core gc`). Pure: the caller lists the
files first and reads the jobs after, so a job's state is never older than the files it judges.

Kept: the finished files of the attempt a `Done` names (the video and its record), every file of
an attempt that is running or may still run, and the checkpoints the log of a job that has not
ended holds (a next attempt may continue from them). Garbage: files of jobs the store does not
know, of attempts that ended without becoming the job's video (interrupted, failed, retried,
cancelled), partial files of an attempt that is not running, and checkpoints no attempt can use
any more (the job ended, or the log no longer holds them: superseded or rejected).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from h3core.domain.state import JobState


@dataclass(frozen=True)
class StoredFile:
    """One file of an attempt in the artifact store, with its size and whether it is partial."""

    job_id: str
    attempt: int
    path: str  # relative to the store's root
    bytes: int
    partial: bool  # still being written, or abandoned while it was
    sha256: str | None = None  # where it was read (a discarded file, for the log)
    checkpoint: int | None = None  # a denoising checkpoint's step (None: a video or its record)


@dataclass(frozen=True)
class Garbage:
    """A file no job needs any more, and why."""

    file: StoredFile
    reason: str


def garbage(files: Iterable[StoredFile], jobs: Mapping[str, JobState | None]) -> list[Garbage]:
    """The files of `files` that no job needs (the module docstring says which), each with the
    reason. `jobs`: each file's job state, None or absent for a job the store does not know."""
    out = []
    for f in files:
        state = jobs.get(f.job_id)
        if state is None:
            out.append(Garbage(f, "no such job in the store"))
        elif f.checkpoint is not None:
            if why := _unusable(f, state):
                out.append(Garbage(f, why))
        elif state.status == "done":
            if f.attempt != state.attempt or f.partial:
                out.append(Garbage(f, f"the job is done with attempt {state.attempt}'s video"))
        elif state.terminal:
            out.append(Garbage(f, f"the job ended '{state.status}' without a video"))
        elif f.attempt < state.attempt or (f.attempt == state.attempt and state.status != "running"):
            out.append(Garbage(f, f"attempt {f.attempt} ended without becoming the job's video"))
    return out


def _unusable(f: StoredFile, state: JobState) -> str | None:
    """Why no attempt can continue from the checkpoint file `f` any more; None while one may."""
    if state.terminal:
        return f"a checkpoint of a job that ended '{state.status}'"
    if f.partial:
        writing = state.status == "running" and f.attempt == state.attempt
        return None if writing else f"a checkpoint attempt {f.attempt} did not finish writing"
    if any(c.path == f.path for c in state.checkpoints):
        return None
    newest = max((c.step for c in state.checkpoints if c.attempt == f.attempt), default=0)
    if state.status == "running" and f.attempt == state.attempt and (f.checkpoint or 0) > newest:
        return None  # written, its event not yet: the attempt that writes it still runs
    return "a checkpoint the job's log no longer holds (superseded or unusable)"
