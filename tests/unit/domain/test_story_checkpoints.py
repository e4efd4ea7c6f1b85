"""The replay's words for checkpoints and for h3core's own stops: an operator reading a job's story
can tell a deploy that handed the job back from a failure, and where each attempt continued."""

from __future__ import annotations

from datetime import UTC, datetime

from h3core.domain.events import Admitted, Checkpoint, Checkpointed, Done, Progress, Released, Restored, Running
from h3core.domain.state import extend
from h3core.domain.story import fields, tries, why
from tests.factories import artifact, submitted

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CP = Checkpoint(attempt=1, step=2, total=4, path="j/checkpoint-1-2.ckpt", bytes=10, sha256="a" * 64)


def test_a_released_attempt_is_told_as_the_services_own_stop_and_the_next_as_continued():
    bodies = [
        submitted(),
        Admitted(),
        Running(attempt=1, executor="pipeline"),
        Progress(step=1, total=4),
        Progress(step=2, total=4),
        Checkpointed(checkpoint=CP, paused_s=0.01, write_s=0.2),
        Released(attempt=1, reason="h3core was stopped gracefully while the job ran", step=2),
        Running(attempt=2, executor="pipeline"),
        Restored(attempt=2, checkpoint=CP),
        Progress(step=3, total=4),
        Progress(step=4, total=4),
        Done(artifact=artifact("j/attempt-2.mp4")),
    ]
    state, events = extend(None, "j", bodies, T0)
    lines = {e.type: fields(e) for e in events}
    assert "handed back by h3core's own stop" in lines["released"] and "no attempt spent" in lines["released"]
    assert "continues after step 2/4" in lines["restored"]
    assert "step 2/4 of attempt 1" in lines["checkpointed"]
    assert [t.restored for t in tries(events)] == [None, 2]
    told = why(state, events, T0)
    assert "attempt 1 handed back by h3core's own stop" in told and "failed" not in told
    assert state.spent == 1 and state.released == 1
