"""Two processes appending to one SQLite file at once: no "database is locked", no lost event."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.domain.state import fold
from tests.integration.conftest import clean_env, poll

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

JOBS_PER_WRITER = 200
EVENTS_PER_JOB = 7  # submitted, admitted, running, progress x3, done

# Each writer opens the store, says it is ready, waits for the go file (so both write at once),
# then runs its jobs through the whole lifecycle, one append (one write transaction) per event.
WRITER = r"""
import sys, time
from pathlib import Path
from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.domain.events import Admitted, Artifact, Done, Progress, Running, Submitted
from h3core.domain.request import GenerationRequest

db, name, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
store = SQLiteEventStore(db)
Path(f"{go}.{name}.ready").touch()
deadline = time.monotonic() + 60
while not go.exists():
    if time.monotonic() > deadline:
        sys.exit("never told to go")
    time.sleep(0.001)
request = GenerationRequest(prompt=f"written by {name}", steps=3, frames=24, width=64, height=64)
began = time.time()
for i in range(count):
    job = f"{name}-{i:04d}"
    store.append(job, [Submitted(request=request)])
    store.append(job, [Admitted()])
    store.append(job, [Running(attempt=1, executor=name)])
    for step in (1, 2, 3):
        store.append(job, [Progress(step=step, total=3)])
    artifact = Artifact(path=f"{job}/attempt-1.mp4", bytes=1, sha256="0" * 64, frames=24, duration_s=1.0)
    store.append(job, [Done(artifact=artifact)])
ended = time.time()
store.close()
print(f"{name} wrote {count} jobs")
print(began, ended)
"""


def test_two_processes_append_to_one_store_concurrently(tmp_path: Path):
    db = tmp_path / "h3.db"
    go = tmp_path / "go"
    names = ("alpha", "beta")
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", WRITER, str(db), name, str(JOBS_PER_WRITER), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
        )
        for name in names
    }
    try:
        poll(
            lambda: all(Path(f"{go}.{n}.ready").exists() or procs[n].poll() is not None for n in names),
            60,
            "both writers to open the store",
        )
        go.touch()
        results = {name: proc.communicate(timeout=90) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    spans = []
    for name, (out, err) in results.items():
        assert "database is locked" not in err, f"{name}:\n{err[-4000:]}"
        assert procs[name].returncode == 0, f"{name} failed:\n{err}"
        said, times = out.strip().splitlines()
        assert said == f"{name} wrote {JOBS_PER_WRITER} jobs"
        spans.append(tuple(map(float, times.split())))
    # The writers really contended: each was writing (or waiting to write) while the other wrote.
    # (SQLite's busy wait is not fair, so one may wait out the other's whole run: turns between
    # them in commit order are not a reliable measure of overlap, the time spans are.)
    assert max(b for b, _ in spans) < min(e for _, e in spans), f"the writers did not overlap: {spans}"

    store = SQLiteEventStore(db, durable=False)
    try:
        job_ids = store.job_ids()
        assert sorted(job_ids) == sorted(f"{n}-{i:04d}" for n in names for i in range(JOBS_PER_WRITER))
        for job_id in job_ids:
            events = store.events(job_id)
            assert [e.seq for e in events] == list(range(1, EVENTS_PER_JOB + 1))
            state = fold(events)
            assert state == store.get(job_id)
            assert state.status == "done"
        assert store.counts() == {"done": 2 * JOBS_PER_WRITER}
    finally:
        store.close()
