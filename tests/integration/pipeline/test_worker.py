"""`h3core worker --executor pipeline`: a real worker process runs a job on the tiny model to done."""

from __future__ import annotations

import signal

import av
import pytest

from h3core import SQLiteEventStore
from tests.integration.conftest import enqueue, poll

pytestmark = pytest.mark.timeout(300)


def test_a_pipeline_worker_runs_a_tiny_model_job_to_done(tmp_path, tiny_model, workers):
    db, artifacts = tmp_path / "h3.db", tmp_path / "artifacts"
    [job_id] = enqueue(db, 1, steps=3)  # 64x64, 12 frames (snapped to 22 by the model)
    worker = workers.start(db, artifacts, "--executor", "pipeline", "--model-dir", str(tiny_model))
    store = SQLiteEventStore(db)
    try:
        state = poll(lambda: (s := store.get(job_id)).terminal and s, 240, "the job to end", worker.log)
        assert state.status == "done", (state.error, worker.log())
        running = next(e.body for e in store.events(job_id) if e.type == "running")
        assert running.executor == "pipeline"
        with av.open(str(artifacts / state.artifact.path)) as c:
            assert c.streams.video[0].codec_context.name == "h264" and c.streams.audio
            assert sum(1 for _ in c.decode(video=0)) == state.artifact.frames
    finally:
        store.close()
    assert "executor pipeline" in worker.log()
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.log()
