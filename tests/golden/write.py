"""Write a golden set: job logs covering every event type and failure kind, as a SQLite store,
its `h3core export` file and the states they fold to.

Run once per released event schema, by the h3core on `sys.path`, into a new folder; a set is
never rewritten (docs/events.md). `python tests/golden/write.py tests/golden/<name>`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.domain.events import (
    Admitted,
    Artifact,
    AttemptFailed,
    Cancelled,
    CancelRequested,
    Done,
    Failed,
    Progress,
    Running,
    Submitted,
)
from h3core.domain.failures import FAILURE_KINDS
from h3core.domain.request import GenerationRequest, Keyframes, References
from h3core.domain.retry import RetryPolicy

try:  # events that came later than the first golden set
    from h3core.domain.events import Recovered, Resumed
except ImportError:  # pragma: no cover
    Recovered = Resumed = None
try:  # ... and later than the second
    from h3core.domain.events import Detached
except ImportError:  # pragma: no cover
    Detached = None
try:  # ... and later than the third
    from h3core.domain.webhooks import WebhookTarget
except ImportError:  # pragma: no cover
    WebhookTarget = None
try:  # ... and later than the fourth
    from h3core.domain.events import Checkpoint, Checkpointed, CheckpointRejected, Released, Restored
except ImportError:  # pragma: no cover
    Checkpoint = Checkpointed = CheckpointRejected = Released = Restored = None
try:  # ... and later than the fifth
    from h3core.domain.events import Reprioritized
except ImportError:  # pragma: no cover
    Reprioritized = None

try:  # ... and later than the fifth
    from h3core.domain.quality import StepCounts
except ImportError:  # pragma: no cover
    StepCounts = None
try:  # ... and later than the sixth
    from h3core.domain.events import Planned, SegmentDone
    from h3core.domain.segments import plan_segments
except ImportError:  # pragma: no cover
    Planned = SegmentDone = plan_segments = None


def _artifact(job: str, attempt: int) -> Artifact:
    return Artifact(path=f"{job}/attempt-{attempt}.mp4", bytes=48213, sha256=f"{attempt:x}" * 64, frames=121, duration_s=5.042)


def _request(**kw) -> GenerationRequest:
    return GenerationRequest(
        **{"prompt": "a red fox running through snow", "width": 448, "height": 256, "frames": 121, "steps": 8, **kw}
    )


def logs() -> dict[str, list[list]]:
    """job id -> the appends (lists of bodies) that make its log, in order."""
    t2va = Submitted(request=_request(seed=7), priority=0)
    out: dict[str, list[list]] = {
        "done": [
            [t2va, Admitted(tokens=7424)],
            [Running(attempt=1, executor="pipeline", executor_ref=None, info={"attention": "cudnn", "group": "0"})],
            *[[Progress(step=i, total=8)] for i in (1, 2, 5, 8)],
            [Done(artifact=_artifact("done", 1), tokens=7424)],
        ],
        "retried": [
            [Submitted(request=_request(), retry=RetryPolicy(max_attempts=3, retry_on=("oom", "stalled"))), Admitted()],
            [Running(attempt=1, executor="distributed")],
            [Progress(step=1, total=8)],
            [
                AttemptFailed(
                    kind="oom", message="CUDA out of memory", detail="Tried to allocate 2.00 GiB", attempt=1, tokens=7424
                )
            ],
            [Running(attempt=2, executor="distributed")],
            [AttemptFailed(kind="stalled", message="no progress for 600 s", attempt=2)],
            [Running(attempt=3, executor="distributed")],
            [Done(artifact=_artifact("retried", 3))],
        ],
        "fl2va": [
            [
                Submitted(
                    request=_request(mode="fl2va", keyframes=Keyframes(first="up-first", last="up-last"), cfg_scale=5.0),
                    priority=5,
                    warnings=("'cfg_scale' was accepted but has no effect: MiniMax-H3 is CFG-distilled",),
                    idempotency_key="console-2026-12-01-0001",
                ),
                Admitted(tokens=7424),
            ],
            [Cancelled(reason="cancelled while queued")],
        ],
        "ref2va": [
            [
                Submitted(
                    request=_request(mode="ref2va", references=References(images=("up-a", "up-b"), audios=("up-c",))),
                    remixed_from="done",
                ),
                Admitted(),
            ],
            [Running(attempt=1, executor="comfyui", executor_ref="prompt-0c1f")],
            [Progress(step=3, total=8)],
            [CancelRequested(reason="asked by the client")],
            [Cancelled(reason="prompt interrupted")],
        ],
        "refused": [
            [Submitted(request=_request())],
            [Failed(kind="invalid", message="refused at recovery: frames: 121 exceeds 97")],
        ],
    }
    for kind in FAILURE_KINDS:
        out[f"failed-{kind.replace('_', '-')}"] = [
            [Submitted(request=_request(), retry=RetryPolicy(max_attempts=1)), Admitted()],
            [Running(attempt=1, executor="fake")],
            [Failed(kind=kind, message=f"ended: {kind}", detail=f"the detail of {kind}", tokens=7424)],
        ]
    if Resumed is not None:
        out["resumed"] = [
            [t2va, Admitted()],
            [Running(attempt=1, executor="comfyui", executor_ref="prompt-9a2e")],
            [Resumed(attempt=1, executor_ref="prompt-9a2e", after_s=2.8)],
            [Progress(step=8, total=8)],
            [Done(artifact=_artifact("resumed", 1))],
        ]
    if Detached is not None:  # schema 2: detached, done's cancel_too_late, the kind not_started
        out["detached"] = [
            [t2va, Admitted()],
            [Running(attempt=1, executor="comfyui", executor_ref="prompt-5d1b")],
            [Progress(step=2, total=8)],
            [Detached(attempt=1, executor_ref="prompt-5d1b")],
            [Resumed(attempt=1, executor_ref="prompt-5d1b", after_s=41.5)],
            [Progress(step=8, total=8)],
            [Done(artifact=_artifact("detached", 1))],
        ]
        out["cancel-too-late"] = [
            [t2va, Admitted()],
            [Running(attempt=1, executor="comfyui", executor_ref="prompt-77c0")],
            [Progress(step=8, total=8)],
            [CancelRequested(reason="asked by the client")],
            [Done(artifact=_artifact("cancel-too-late", 1), cancel_too_late=True)],
        ]
        out["not-started"] = [
            [Submitted(request=_request(), retry=RetryPolicy(max_attempts=1)), Admitted()],
            [Running(attempt=1, executor="comfyui", executor_ref="prompt-0a0a")],
            [AttemptFailed(kind="not_started", message="ComfyUI unreachable: the prompt was not submitted", attempt=1)],
            [Running(attempt=2, executor="comfyui", executor_ref="prompt-0b0b")],
            [Done(artifact=_artifact("not-started", 2))],
        ]
    if WebhookTarget is not None:  # schema 3: submitted's webhook
        hook = WebhookTarget(url="https://hooks.example.com/h3?token=abc", events=("start", "progress", "completed"))
        out["webhook"] = [
            [Submitted(request=_request(), webhook=hook), Admitted()],
            [Running(attempt=1, executor="fake")],
            [Progress(step=8, total=8)],
            [Done(artifact=_artifact("webhook", 1))],
        ]
    if Checkpoint is not None:  # schema 4: checkpoints, restored, checkpoint_rejected, released

        def cp(attempt: int, step: int, digit: str) -> Checkpoint:
            return Checkpoint(
                attempt=attempt, step=step, total=8, path=f"checkpoints/ckpt/{attempt}-{step}.pt", bytes=9120, sha256=digit * 64
            )

        out["checkpointed"] = [
            [t2va, Admitted()],
            [Running(attempt=1, executor="pipeline")],
            *[[Progress(step=i, total=8)] for i in (1, 2, 3)],
            [Checkpointed(checkpoint=cp(1, 2, "a"), paused_s=0.012, write_s=0.4)],
            [Progress(step=4, total=8)],
            [Checkpointed(checkpoint=cp(1, 4, "b"), paused_s=0.011, write_s=0.38)],
            [Progress(step=5, total=8)],
            [Released(attempt=1, reason="h3core stopped gracefully (SIGTERM)", step=5)],
            [Running(attempt=2, executor="pipeline")],
            [CheckpointRejected(attempt=2, checkpoint=cp(1, 4, "b"), reason="sha256 differs: the file is not the one written")],
            [Restored(attempt=2, checkpoint=cp(1, 2, "a"))],
            *[[Progress(step=i, total=8)] for i in (3, 8)],
            [Done(artifact=_artifact("checkpointed", 2))],
        ]
    if Reprioritized is not None:  # schema 5: reprioritized; submitted's retry_of and by, a cancel's by
        out["reprioritized"] = [
            [Submitted(request=_request(), priority=1, retry_of="done", by="alice"), Admitted()],
            [Reprioritized(priority=7, by="alice")],
            [Running(attempt=1, executor="fake")],
            [CancelRequested(reason="cancelled from the console", by="bob")],
            [Cancelled(reason="cancelled from the console", by="bob")],
        ]
    if StepCounts is not None:  # schema 5: the request's quality, done's steps
        out["quality"] = [
            [Submitted(request=_request(quality="fast")), Admitted(tokens=7424)],
            [Running(attempt=1, executor="pipeline", info={"quality": "fast", "cache": "first-block threshold=0.1"})],
            *[[Progress(step=i, total=8)] for i in (1, 4, 8)],
            [Done(artifact=_artifact("quality", 1), tokens=7424, steps=StepCounts(quality="fast", computed=5, cached=3))],
        ]
    if SegmentDone is not None:  # schema 6: a segmented job (planned, segment_done), retried in its third
        plan = plan_segments(720, 355)  # 30 s on a 15 s window: 3 segments
        seg = lambda i: Artifact(  # noqa: E731
            path=f"segmented/segment-{i}.mp4",
            bytes=40000 + i,
            sha256=f"{i + 10:x}" * 64,
            frames=plan.segments[i].keep,
            duration_s=plan.segments[i].keep / 24,
        )
        out["segmented"] = [
            [
                Submitted(request=_request(frames=720), retry=RetryPolicy(max_attempts=2, retry_on=("executor_lost",))),
                Admitted(tokens=20480),
                Planned(plan=plan),
            ],
            [Running(attempt=1, executor="pipeline")],
            [Progress(step=8, total=8)],
            [SegmentDone(index=0, artifact=seg(0))],
            [Progress(step=4, total=8)],
            [SegmentDone(index=1, artifact=seg(1))],
            [Progress(step=2, total=8)],
            [AttemptFailed(attempt=1, kind="executor_lost", message="the worker died")],
            [Running(attempt=2, executor="pipeline")],
            [Progress(step=8, total=8)],
            [SegmentDone(index=2, artifact=seg(2))],
            [Done(artifact=Artifact(path="segmented/attempt-2.mp4", bytes=120003, sha256="c" * 64, frames=720, duration_s=30.0))],
        ]
    if Recovered is not None:
        out["recovered"] = [
            [t2va, Admitted()],
            [Running(attempt=1, executor="pipeline")],
            [Recovered(attempt=1, artifact=_artifact("recovered", 1)), Done(artifact=_artifact("recovered", 1))],
        ]
    return out


def write(folder: Path) -> None:
    folder.mkdir(parents=True)
    start = datetime(2026, 12, 1, tzinfo=UTC)
    ticks = iter(range(10_000))
    store = SQLiteEventStore(folder / "store.db", clock=lambda: start + timedelta(seconds=next(ticks)))
    for job_id, appends in logs().items():
        for bodies in appends:
            store.append(job_id, bodies)
    states = {job_id: store.get(job_id).model_dump(mode="json") for job_id in logs()}
    store.close()
    (folder / "states.json").write_text(json.dumps(states, indent=1, sort_keys=True) + "\n")
    # The export file is what the CLI writes, not a re-serialisation of it.
    subprocess.run(
        [sys.executable, "-m", "h3core.cli", "export", "--db", str(folder / "store.db"), "-o", str(folder / "export.jsonl")],
        check=True,
    )
    for extra in folder.glob("store.db-*"):  # WAL leftovers: the set is the file alone
        extra.unlink()


if __name__ == "__main__":
    write(Path(sys.argv[1]))
