"""Which files of the artifact store are still needed (`h3core gc`). Pure: the caller lists the
files first and reads the jobs after, so a job's state is never older than the files it judges.

Kept: the finished files of the attempt a `Done` names (the video and its record), every file of
an attempt that is running or may still run, the checkpoints the log of a job that has not ended
holds (a next attempt may continue from them), and, while the job has not ended, the segments its
log records done (a later attempt continues after them, the last joins them) and those of the
attempt running now or of a later one (written, their `segment_done` not yet). Garbage: files of
jobs the store does not know, of attempts that ended without becoming the job's video
(interrupted, failed, retried, cancelled), partial files of an attempt that is not running,
checkpoints no attempt can use any more (the job ended, or the log no longer holds them:
superseded or rejected), and segments no join will read (the job ended: done, its video joined;
failed or cancelled; or an earlier attempt's that the log does not record: made again later, or
its event never written).
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
    segment: int | None = None  # a long video's segment file's index in its plan


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
        elif f.segment is not None:
            if why := _unjoined(f, state):
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


def _unjoined(f: StoredFile, state: JobState) -> str | None:
    """Why no join will read the segment file `f`; None while one may."""
    if state.terminal:
        return f"a segment of a job that ended '{state.status}'"
    if f.attempt > state.attempt or (state.status == "running" and f.attempt == state.attempt):
        return None  # written (or being written) by an attempt that runs now, its event not yet
    if f.partial:
        return f"a segment attempt {f.attempt} did not finish writing"
    if any(a.path == f.path for a in state.segments):
        return None
    return f"a segment the job's log does not record (attempt {f.attempt} ended before its 'segment_done')"
