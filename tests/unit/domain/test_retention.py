"""Which artifact files `h3core gc` removes, and which it must keep."""

from __future__ import annotations

from datetime import UTC, datetime

from h3core.domain.events import (
    Admitted,
    AttemptFailed,
    Cancelled,
    Checkpoint,
    Checkpointed,
    Done,
    Failed,
    Progress,
    Released,
    Running,
)
from h3core.domain.retention import StoredFile, garbage
from h3core.domain.state import extend as extend
from tests.factories import artifact, submitted

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def state(*bodies):
    return extend(None, "j", [submitted(), Admitted(), *bodies], T0)[0]


def f(attempt: int, name: str, job: str = "j") -> StoredFile:
    return StoredFile(job_id=job, attempt=attempt, path=f"{job}/{name}", bytes=10, partial=name.endswith(".part"))


def removed(files, jobs) -> set[str]:
    return {g.file.path for g in garbage(files, jobs)}


RETRIED = [Running(attempt=1, executor="x"), AttemptFailed(kind="interrupted", message="m", attempt=1)]


def test_a_done_job_keeps_its_video_and_record_only():
    done = state(*RETRIED, Running(attempt=2, executor="x"), Done(artifact=artifact("j/attempt-2.mp4")))
    files = [
        f(1, "attempt-1.mp4"),
        f(1, "attempt-1.record.json"),
        f(2, "attempt-2.mp4"),
        f(2, "attempt-2.record.json"),
        f(2, "attempt-2.webm.part"),
    ]
    assert removed(files, {"j": done}) == {"j/attempt-1.mp4", "j/attempt-1.record.json", "j/attempt-2.webm.part"}


def test_every_file_of_a_job_that_ended_without_a_video_or_is_unknown_goes():
    files = [f(1, "attempt-1.mp4.part"), f(1, "attempt-1.mp4", job="ghost")]
    assert removed(files, {"j": state(Running(attempt=1, executor="x"), Failed(kind="oom", message="m")), "ghost": None}) == {
        "j/attempt-1.mp4.part",
        "ghost/attempt-1.mp4",
    }
    assert removed([f(1, "attempt-1.mp4.part")], {"j": state(Cancelled())}) == {"j/attempt-1.mp4.part"}


def test_the_running_attempts_files_and_later_ones_are_kept():
    running = state(*RETRIED, Running(attempt=2, executor="x"))
    files = [f(1, "attempt-1.mp4.part"), f(2, "attempt-2.mp4.part"), f(2, "attempt-2.mp4"), f(3, "attempt-3.mp4.part")]
    assert removed(files, {"j": running}) == {"j/attempt-1.mp4.part"}


def test_a_queued_job_keeps_only_files_of_attempts_yet_to_run():
    queued = state(*RETRIED)  # attempt 1 ended; attempt 2 may start any moment
    files = [f(1, "attempt-1.mp4.part"), f(2, "attempt-2.mp4.part")]
    assert removed(files, {"j": queued}) == {"j/attempt-1.mp4.part"}


def cp(attempt: int, step: int, *, part: bool = False) -> StoredFile:
    name = f"checkpoint-{attempt}-{step}.ckpt" + (".part" if part else "")
    return StoredFile(job_id="j", attempt=attempt, path=f"j/{name}", bytes=10, partial=part, checkpoint=step)


def logged(attempt: int, step: int) -> Checkpointed:
    return Checkpointed(
        checkpoint=Checkpoint(
            attempt=attempt, step=step, total=8, path=f"j/checkpoint-{attempt}-{step}.ckpt", bytes=10, sha256="a" * 64
        )
    )


def test_the_checkpoints_a_waiting_job_may_continue_from_are_kept_the_rest_go():
    """Kept: those the log holds (the two newest), while the job has not ended; gone: superseded
    ones, a partial one no attempt is writing, and every one once the job ended."""
    steps = [Progress(step=i, total=8) for i in range(1, 7)]
    run = [Running(attempt=1, executor="x"), *steps[:2], logged(1, 2), *steps[2:4], logged(1, 4), *steps[4:], logged(1, 6)]
    queued = state(*run, Released(attempt=1, reason="shutdown", step=6))
    files = [cp(1, 2), cp(1, 4), cp(1, 6), cp(1, 7, part=True)]
    assert removed(files, {"j": queued}) == {"j/checkpoint-1-2.ckpt", "j/checkpoint-1-7.ckpt.part"}
    running = state(*run)
    assert removed(files, {"j": running}) == {"j/checkpoint-1-2.ckpt"}, "the running attempt may be writing step 7"
    ended = state(*run, Done(artifact=artifact("j/attempt-1.mp4")))
    assert removed(files, {"j": ended}) == {f.path for f in files}
    assert removed([cp(1, 4)], {"j": None}) == {"j/checkpoint-1-4.ckpt"}
