"""A real `h3core serve` (the pipeline executor on the tiny model) killed with SIGKILL mid-denoise
and started again: the retry continues after the last checkpoint, computes no more than the
checkpoint interval again, and makes the video an uninterrupted run makes."""

from __future__ import annotations

import pytest

pytest.importorskip("diffusers")

from h3core import SQLiteEventStore  # noqa: E402
from tests.integration.service.conftest import poll, wait_job  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS, EVERY = 40, 4
REQUEST = {"prompt": "a fox in snow", "width": 64, "height": 64, "frames": 22, "steps": STEPS, "seed": 5}


def settings(tiny_model) -> dict[str, str]:
    return {
        "H3_EXECUTOR": "pipeline",
        "H3_MODEL_DIR": str(tiny_model),
        "H3_ATTENTION": "flash",
        "H3_CHECKPOINT_EVERY_STEPS": str(EVERY),
        "H3_CHECKPOINT_EVERY_S": "0",
    }


def test_sigkill_mid_denoise_then_restart_continues_from_the_last_checkpoint(servers, tiny_model):
    env = settings(tiny_model)
    first = servers.start(env)
    with first.client() as c:
        job = c.post("/v1/jobs", json=REQUEST).json()
        store = SQLiteEventStore(first.db)
        try:
            # Killed once a checkpoint is logged and the loop has gone past it.
            poll(
                lambda: (s := store.get(job["id"])).checkpoint is not None and (s.step or 0) > s.checkpoint.step,
                240,
                "a checkpoint, and a step past it",
                first.log,
            )
        finally:
            store.close()
    first.kill()
    second = servers.start(env, root=first.root)
    with second.client() as c:
        done = wait_job(c, job["id"], timeout=300)
        assert done["status"] == "done", (done, second.log())
        # The same request, uninterrupted, on the same device.
        whole = c.post("/v1/jobs", json=REQUEST).json()
        wait_job(c, whole["id"], ("done",), timeout=300)
    store = SQLiteEventStore(first.db)
    try:
        events = store.events(job["id"])
        state, reference = store.get(job["id"]), store.get(whole["id"])
    finally:
        store.close()
    second.stop()

    types = [e.type for e in events]
    retry = types.index("running", types.index("running") + 1)
    before, after = events[:retry], events[retry:]
    last = [e.body.checkpoint for e in before if e.type == "checkpointed"][-1]
    assert [e.type for e in after[:2]] == ["running", "restored"] and after[1].body.checkpoint == last
    assert state.attempt_errors[0].kind == "interrupted" and state.attempt == 2
    first_step = next(e.body.step for e in after if e.type == "progress")
    assert first_step == last.step + 1, "attempt 2's first step follows the last checkpoint"
    computed = max(e.body.step for e in before if e.type == "progress") + (STEPS - last.step)
    assert computed <= STEPS + EVERY, f"{computed} steps computed for a {STEPS}-step job, checkpoints every {EVERY}"
    assert state.artifact.sha256 == reference.artifact.sha256, "the video of an uninterrupted run, byte for byte"
    assert not list((first.artifacts / job["id"]).glob("checkpoint-*")), "a job's checkpoints go when it ends"
