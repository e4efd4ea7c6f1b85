"""Which artifact files `h3core gc` removes, and which it must keep."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from h3core.domain.events import (
    Admitted,
    Artifact,
    AttemptFailed,
    Cancelled,
    CancelRequested,
    Checkpoint,
    Checkpointed,
    Done,
    Failed,
    Planned,
    Progress,
    Released,
    Running,
    SegmentDone,
)
from h3core.domain.retention import StoredFile, garbage
from h3core.domain.retry import RetryPolicy
from h3core.domain.segments import plan_segments
from h3core.domain.state import extend as extend
from tests.factories import artifact, submitted
from tests.profiles import examples

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


# -- segment files of a long video ----------------------------------------------------------------

PLAN = plan_segments(100, 40)  # three segments
RETRY = RetryPolicy(max_attempts=9, retry_on=("executor_lost",))


def seg(attempt: int, index: int, *, part: bool = False) -> StoredFile:
    name = f"segment-{attempt}-{index}.mp4" + (".part" if part else "")
    return StoredFile(job_id="j", attempt=attempt, path=f"j/{name}", bytes=10, partial=part, segment=index)


def segment_done(attempt: int, index: int) -> SegmentDone:
    made = Artifact(
        path=f"j/segment-{attempt}-{index}.mp4", bytes=10, sha256="a" * 64, frames=PLAN.segments[index].keep, duration_s=1.0
    )
    return SegmentDone(index=index, artifact=made)


def segmented(*bodies):
    return extend(None, "j", [submitted(frames=100, retry=RETRY), Admitted(), Planned(plan=PLAN), *bodies], T0)[0]


LOST = AttemptFailed(kind="executor_lost", message="m", attempt=1)
# Attempt 1 logged segment 0, wrote segment 1 but died before its event, and was cut off writing 2.
FIRST = [Running(attempt=1, executor="x"), segment_done(1, 0), LOST]
FIRST_FILES = [seg(1, 0), seg(1, 1), seg(1, 2, part=True)]


def test_the_segments_the_log_records_and_those_the_running_attempt_writes_are_kept():
    running = segmented(*FIRST, Running(attempt=2, executor="x"))
    files = [*FIRST_FILES, seg(2, 1), seg(2, 2, part=True)]  # attempt 2 wrote segment 1, writes 2
    assert removed(files, {"j": running}) == {"j/segment-1-1.mp4", "j/segment-1-2.mp4.part"}
    queued = segmented(*FIRST)
    later = [seg(2, 1), seg(2, 2, part=True)]  # listed before attempt 2's `running` was read: it may run
    assert removed(FIRST_FILES + later, {"j": queued}) == {"j/segment-1-1.mp4", "j/segment-1-2.mp4.part"}
    assert removed([seg(1, 1)], {"j": segmented(Running(attempt=1, executor="x"), segment_done(1, 0))}) == set()


def test_an_ended_attempts_segments_its_log_does_not_record_go():
    second = [Running(attempt=2, executor="x"), segment_done(2, 1), AttemptFailed(kind="executor_lost", message="m", attempt=2)]
    queued = segmented(*FIRST, *second)
    files = [*FIRST_FILES, seg(2, 1), seg(2, 2)]  # segment 2 of attempt 2: written, its event never
    assert removed(files, {"j": queued}) == {"j/segment-1-1.mp4", "j/segment-1-2.mp4.part", "j/segment-2-2.mp4"}


def test_every_segment_file_goes_once_the_job_ended():
    run = [*FIRST, Running(attempt=2, executor="x"), segment_done(2, 1), segment_done(2, 2)]
    files = [*FIRST_FILES, seg(2, 1), seg(2, 2)]
    everything = {f.path for f in files}
    assert removed(files, {"j": segmented(*run, Done(artifact=artifact("j/attempt-2.mp4")))}) == everything, "joined"
    assert removed(files, {"j": segmented(*run, Failed(kind="oom", message="m"))}) == everything
    assert removed(files, {"j": segmented(*run, CancelRequested(), Cancelled())}) == everything
    assert removed(files, {"j": None}) == everything


@given(st.data())
@settings(max_examples=examples(200))
def test_a_segment_file_is_kept_exactly_while_a_join_may_still_read_it(data):
    """A segmented job's life drawn at random: each attempt writes segments in order (each logged,
    written with its event lost, or cut off partial), then ends (retried, still running, failed,
    cancelled, or done once every segment is). While the job has not ended, the segments logged and
    every file of the attempt running are kept and every other goes; once it ended, every one goes."""
    bodies: list = [Running(attempt=1, executor="x")]
    files: list[StoredFile] = []
    logged: set[str] = set()
    index = attempt = 0
    while True:
        attempt += 1
        if attempt > 1:
            bodies.append(Running(attempt=attempt, executor="x"))
        while index < len(PLAN.segments):
            how = data.draw(st.sampled_from(["logged", "logged", "event lost", "partial", "stopped"]))
            if how == "stopped":
                break
            files.append(seg(attempt, index, part=how == "partial"))
            if how != "logged":
                break
            bodies.append(segment_done(attempt, index))
            logged.add(files[-1].path)
            index += 1
        ends = ["retried", "running", "failed", "cancelled"] + (["done"] if index == len(PLAN.segments) else [])
        end = data.draw(st.sampled_from(ends))
        if end == "retried":
            bodies.append(AttemptFailed(kind="executor_lost", message="m", attempt=attempt))
            if attempt < 4 and data.draw(st.booleans()):
                continue
        elif end == "failed":
            bodies.append(Failed(kind="oom", message="m"))
        elif end == "cancelled":
            bodies += [CancelRequested(), Cancelled()]
        elif end == "done":
            bodies.append(Done(artifact=artifact(f"j/attempt-{attempt}.mp4")))
        break
    state = segmented(*bodies)
    ended = end in ("failed", "cancelled", "done")
    assert state.terminal == ended and {a.path for a in state.segments} == logged
    needed = set() if ended else logged | {f.path for f in files if end == "running" and f.attempt == attempt}
    assert {f.path for f in files} - removed(files, {"j": state}) == needed
