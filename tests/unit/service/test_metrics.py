"""The job-duration histogram: from a job's first start to its end, whether this process saw
the start on the bus or has to read it from the store."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.domain.events import Admitted, AttemptFailed, Done, Event, Running
from h3core.runtime.bus import EventBus
from h3core.service.metrics import Metrics
from tests.factories import artifact, submitted
from tests.waiting import until

pytestmark = pytest.mark.anyio


def _durations(metrics: Metrics) -> dict[str, tuple[float, float]]:
    out: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == "h3core_job_duration_seconds_count":
                out.setdefault(s.labels["status"], [0.0, 0.0])[0] = s.value
            if s.name == "h3core_job_duration_seconds_sum":
                out.setdefault(s.labels["status"], [0.0, 0.0])[1] = s.value
    return {k: (v[0], v[1]) for k, v in out.items()}


def _shifted(events: tuple[Event, ...], base: Event, seconds: float) -> list[Event]:
    """The events as if each came `seconds` after the one before, from `base`."""
    return [e.model_copy(update={"at": base.at + timedelta(seconds=seconds * (i + 1))}) for i, e in enumerate(events)]


async def test_a_start_seen_live_and_one_read_from_the_store_give_the_same_duration(tmp_path):
    store = SQLiteEventStore(tmp_path / "h3.db", durable=False)
    metrics, bus = Metrics(store), EventBus()
    # Started before the metrics followed the bus: only its end is published.
    _, early = store.append("a" * 32, [submitted(), Admitted(), Running(attempt=1, executor="fake")])
    _, (early_done,) = store.append("a" * 32, [Done(artifact=artifact())])
    early_seconds = (early_done.at - early[-1].at).total_seconds()
    # Seen whole: two attempts, the duration counts from the first start.
    _, live = store.append("b" * 32, [submitted(), Admitted()])
    live_events = _shifted(
        (
            Event(job_id="b" * 32, seq=3, at=live[-1].at, body=Running(attempt=1, executor="fake")),
            Event(job_id="b" * 32, seq=4, at=live[-1].at, body=AttemptFailed(attempt=1, kind="oom", message="x")),
            Event(job_id="b" * 32, seq=5, at=live[-1].at, body=Running(attempt=2, executor="fake")),
            Event(job_id="b" * 32, seq=6, at=live[-1].at, body=Done(artifact=artifact())),
        ),
        live[-1],
        seconds=2.5,
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(metrics.follow, bus)
        await until(lambda: bus.subscribers == 1)
        bus.publish([early_done, *live_events])
        await until(lambda: _durations(metrics).get("done", (0, 0))[0] == 2)
        tg.cancel_scope.cancel()
    count, total = _durations(metrics)["done"]
    assert total == pytest.approx(early_seconds + 3 * 2.5)  # the live job: first start to end, 3 gaps
    store.close()


def _value(metrics: Metrics, name: str) -> float:
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == name:
                return s.value
    return 0.0


async def test_checkpoints_resumes_releases_and_the_steps_redone_are_counted(tmp_path):
    """Two interruptions: a release continued from its stop's checkpoint (nothing redone), then a
    crash after step 7 whose newest checkpoint (step 6) is rejected, continued from step 3's: steps
    4 to 7 are computed again."""
    from h3core.domain.events import Checkpoint, Checkpointed, CheckpointRejected, Progress, Released, Restored

    store = SQLiteEventStore(tmp_path / "h3.db", durable=False)
    metrics, bus = Metrics(store), EventBus()
    job = "c" * 32

    def cp(attempt: int, step: int) -> Checkpoint:
        return Checkpoint(
            attempt=attempt, step=step, total=10, path=f"{job}/checkpoint-{attempt}-{step}.ckpt", bytes=100, sha256="a" * 64
        )

    bodies = [
        submitted(),
        Admitted(),
        Running(attempt=1, executor="fake"),
        *[Progress(step=i, total=10) for i in (1, 2, 3)],
        Checkpointed(checkpoint=cp(1, 3), paused_s=0.01),
        Released(attempt=1, reason="shutdown", step=3),
        Running(attempt=2, executor="fake"),
        Restored(attempt=2, checkpoint=cp(1, 3)),
        *[Progress(step=i, total=10) for i in (4, 5, 6)],
        Checkpointed(checkpoint=cp(2, 6), paused_s=0.01),
        Progress(step=7, total=10),
        AttemptFailed(attempt=2, kind="interrupted", message="crash"),
        Running(attempt=3, executor="fake"),
        CheckpointRejected(attempt=3, checkpoint=cp(2, 6), reason="sha256 differs"),
        Restored(attempt=3, checkpoint=cp(1, 3)),
        Progress(step=4, total=10),
    ]
    _, events = store.append(job, bodies)
    await _counted_redone(metrics, bus, events)
    assert _value(metrics, "h3core_checkpoints_written_total") == 2
    assert _value(metrics, "h3core_checkpoint_bytes_written_total") == 200
    assert _value(metrics, "h3core_resumes_total") == 2
    assert _value(metrics, "h3core_checkpoints_rejected_total") == 1
    assert _value(metrics, "h3core_attempts_released_total") == 1
    assert _value(metrics, "h3core_steps_redone_total") == 4, "attempt 3 computes steps 4 to 7 again"
    store.close()


async def test_a_segment_made_is_never_counted_as_redone(tmp_path):
    """A long video: attempt 1 makes segment 1 and is lost before segment 2's first step (nothing
    to redo: the segment is kept); attempt 2 reaches step 2 of segment 2 and is lost; attempt 3
    computes those 2 steps again."""
    from h3core.domain.events import Planned, Progress, SegmentDone
    from h3core.domain.retry import RetryPolicy
    from h3core.domain.segments import plan_segments
    from tests.factories import segment_file

    store = SQLiteEventStore(tmp_path / "h3.db", durable=False)
    metrics, bus = Metrics(store), EventBus()
    plan = plan_segments(100, 40)
    lost = [AttemptFailed(attempt=n, kind="executor_lost", message="gone") for n in (1, 2)]
    bodies = [
        submitted(frames=100, steps=10, retry=RetryPolicy(max_attempts=3, retry_on=("executor_lost",))),
        Admitted(),
        Planned(plan=plan),
        Running(attempt=1, executor="fake"),
        *[Progress(step=i, total=10) for i in range(1, 11)],
        SegmentDone(index=0, artifact=segment_file(plan, 0)),
        lost[0],
        Running(attempt=2, executor="fake"),
        *[Progress(step=i, total=10) for i in (1, 2)],
        lost[1],
        Running(attempt=3, executor="fake"),
        Progress(step=1, total=10),
    ]
    _, events = store.append("s" * 32, bodies)
    await _counted_redone(metrics, bus, events)
    assert _value(metrics, "h3core_steps_redone_total") == 2, "not the 10 steps of the segment kept"
    store.close()


async def _counted_redone(metrics, bus, events) -> None:
    """`metrics` following `bus` while `events` are published, until it has counted steps redone."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(metrics.follow, bus)
        await until(lambda: bus.subscribers == 1)
        bus.publish(list(events))
        await until(lambda: _value(metrics, "h3core_steps_redone_total") > 0)
        tg.cancel_scope.cancel()
