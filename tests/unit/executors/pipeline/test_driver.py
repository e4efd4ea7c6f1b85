"""The model executors' driver (`stream`): a cancel stops the work at its next step boundary; one
that comes once the work is past its last step (decoding, encoding the video) is too late, and the
video it finishes is the result (`FinishedBeforeStop`), never thrown away."""

from __future__ import annotations

import threading
from contextlib import aclosing

import anyio
import pytest

from h3core.domain.events import Progress
from h3core.executors.base import FinishedBeforeStop, Result
from h3core.executors.pipeline.driver import stream
from h3core.executors.pipeline.generate import Control
from tests.factories import artifact

pytestmark = pytest.mark.anyio


class Work:
    """Two steps (the first waits for `release` when `pause_at_step`), then an encode that waits for
    `release` and ignores the stop flag (as a model's decode and mux do), then the video; stops at a
    step boundary when asked."""

    def __init__(self, *, pause_at_step: bool = False) -> None:
        self.pause_at_step = pause_at_step
        self.encoding = threading.Event()
        self.release = threading.Event()
        self.at_step = threading.Event()

    def __call__(self, control: Control):
        for step in (1, 2):
            control.on_step(step, 2)
            if step == 1 and self.pause_at_step:
                self.at_step.set()
                self.release.wait(10)
            if control.stop.is_set():
                return None
        self.encoding.set()
        self.release.wait(10)
        return Result(artifact())


async def drive(work: Work, until: threading.Event) -> tuple[list, BaseException | None]:
    """Iterate `stream` as the runner does and cancel it once `until` is set; what it yielded and raised."""
    seen: list = []
    raised: BaseException | None = None
    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def consume() -> None:
            nonlocal raised
            try:
                with scope:
                    async with aclosing(stream(tg, work, Control())) as updates:
                        async for update in updates:
                            seen.append(update)
            except FinishedBeforeStop as exc:
                raised = exc

        tg.start_soon(consume)
        with anyio.fail_after(10):
            while not until.is_set():
                await anyio.sleep(0.005)
        scope.cancel()
        work.release.set()
    return seen, raised


async def test_a_cancel_during_the_final_encode_is_too_late_and_the_video_is_the_result():
    work = Work()
    seen, raised = await drive(work, work.encoding)
    assert [u for u in seen if isinstance(u, Progress)] == [Progress(step=1, total=2), Progress(step=2, total=2)]
    assert isinstance(raised, FinishedBeforeStop) and raised.result == Result(artifact())


async def test_a_cancel_between_steps_stops_the_work_and_is_a_cancel():
    work = Work(pause_at_step=True)
    seen, raised = await drive(work, work.at_step)
    assert raised is None and not any(isinstance(u, Result) for u in seen)
    assert not work.encoding.is_set(), "stopped at the step boundary"
