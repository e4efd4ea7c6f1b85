"""Which files of the artifact store are still needed (`h3core gc`). Pure: the caller lists the
files first and reads the jobs after, so a job's state is never older than the files it judges.

Kept: the finished files of the attempt a `Done` names (the video and its record), and every
file of an attempt that is running or may still run. Garbage: files of jobs the store does not
know, of attempts that ended without becoming the job's video (interrupted, failed, retried,
cancelled), and partial files of an attempt that is not running.
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
        elif state.status == "done":
            if f.attempt != state.attempt or f.partial:
                out.append(Garbage(f, f"the job is done with attempt {state.attempt}'s video"))
        elif state.terminal:
            out.append(Garbage(f, f"the job ended '{state.status}' without a video"))
        elif f.attempt < state.attempt or (f.attempt == state.attempt and state.status != "running"):
            out.append(Garbage(f, f"attempt {f.attempt} ended without becoming the job's video"))
    return out
