"""The executor contract: what the runner may expect of anything that generates a video.

An executor is given a `JobSpec` and returns an async iterator (`run`). It must:

- **Yield progress** as `Progress(step, total)` after each denoising step (steps strictly
  increasing, `total` fixed within an attempt), and `Heartbeat()` when it is alive but has no step
  to report (loading, uploading, decoding); either one renews the runner's stall timer.
- **End with exactly one `Result`** carrying the artifact it wrote through the artifact store,
  and yield nothing after it. Ending without a result is a failure the runner records.
- **Honour cancellation.** The runner cancels the iteration (an anyio cancel scope) to stop a
  job; the executor stops at its next checkpoint and releases what it holds in `finally` blocks,
  under shielded scopes where cleanup awaits. It never swallows cancellation. The iteration
  ends only once the work no longer runs, and the attempt holds its slot until it has ended.
  Where the work finished before the stop could take effect (a prompt that succeeded meanwhile,
  a video already being encoded), the cleanup raises `FinishedBeforeStop(result)`: the job ends
  `done` with that video and the cancel is recorded as too late, never a finished video thrown
  away and called cancelled. Where the work runs outside the iteration (a server's prompt), the
  cleanup follows it until it no longer runs, and ends as it did: stopped (the cancellation
  goes on), finished (`FinishedBeforeStop`), or, once it gives up, `ExecutorFailure(
  "stop_unconfirmed", ...)`: the job then ends `failed`, never `cancelled` while its work may
  still run. Such an executor states how long it may follow (`Capabilities.stop_wait_s`); the
  runner gives it that beyond its cancel grace, then ends the job `failed(stop_unconfirmed)`
  itself, the slot still held until the iteration ends.
- **Report failure by raising.** `ExecutorFailure(kind, ...)` for a failure it has classified
  itself; an out-of-memory error keeps a type named `OutOfMemoryError` (as torch's is) or a
  message saying "out of memory"; anything else becomes `executor_error` with its type and
  message. The executor never writes events: the runner writes every event, terminal ones
  included.

**Quality levels**: `capabilities().qualities` lists the levels it runs (`h3core.domain.quality`);
admission refuses a request at any other, so `run` sees only those. At `exact` it computes every
step; at a faster level it may serve steps from a cache of its own, says how in `info` (`quality`,
`cache`), and counts what it computed and served in `Result.steps`.

**Checkpoints**, where `capabilities().checkpoints` says it keeps them (never otherwise):

- With `job.checkpoints` (a `CheckpointPolicy`) it stores the state its denoising loop needs to
  continue exactly (latents, scheduler, RNG: whatever the loop carries) through the artifact
  store's `put_checkpoint` whenever the policy says one is due, and yields `CheckpointSaved`
  once it is durably there, after the `Progress` of its step.
- With `job.resume` (a checkpoint the runner has checked against its recorded size and sha256)
  it continues after the checkpoint's step: its first `Progress` is that step + 1, and its video
  is the one an uninterrupted run with the same seed on the same device makes (at `exact`: at a
  faster level the step cache is not in the checkpoint, so the resumed attempt's first step is
  computed and the video may differ).
- `save_on_stop(job)` (`Checkpointing`) is asked just before h3core's own graceful stop cancels
  the iteration: the cleanup then ends the step in flight, stores a checkpoint of the last step
  reached (where past the last stored one), and raises `StoppedWithCheckpoint(saved)` in place of
  the cancellation, so the next attempt continues from there.

**Segments**, where `capabilities().continues_segments` says it continues a long video (never
otherwise): with `job.segment` set, the job is one segment of a video longer than the model's
window, and `job.request` is already that segment's call (its frames, its seed, fl2va from the
frame the segment before kept last, an upload). It writes the frames it was asked for, the
model's extra tail cut (`segment.frames`), with `h3core.adapters.segment_files.write_segment`
(the repeated joint frame left out: `segment.skip`) and their sound cut to `segment_sound`,
commits the file through the artifact store's `put_segment`, and its `Result` carries that
segment's artifact (`segment.keep` frames). The runner joins the segments into the job's video.

`running()` is an async context manager the runner holds for the executor's whole life: on
entry it loads what the executor needs (once, before any job) and starts any background tasks
it owns (a websocket, a watchdog) in its own task group; on exit it stops them and releases
everything.

`capabilities()` states what the executor can run, as of now: the modes it serves and whether
each can start a job now, its model's clip window, its groups' token budgets, its kernel's
limit, its upload slots, how many attempts it runs at once where it bounds that itself
(`concurrency`: the runner then runs no more, whatever its slots), and how long it may follow its
work after a stop (`stop_wait_s`). Admission judges every submission against it (with the capacity
profile), and the runner starts attempts only in modes it says are ready; it must be cheap and
do no I/O (both ask often). `check(job)` is the executor's own pre-check, made before an attempt
starts: it raises `ExecutorFailure("invalid", ...)` for a job it cannot run. Whatever the
capabilities admit, `check` must pass (the contract property tests hold every executor to it).

What the service shows of the executor's resources is part of the contract too, each cheap and
without I/O, each None where the executor has no such thing (`NoReports` gives those defaults):
`health()`, a snapshot of each device group it runs on; `head()`, the cluster head those groups
run on; `attention_report()`, what its start-up attention probe measured, one row per kernel.
/readyz and /metrics show what is not None. `device_memory()` is the one that may ask (the
driver, or the server the executor drives), so it is awaited, and the console's box page bounds
how long it waits.

`h3core.testing.executor.ExecutorContract` holds an executor to this contract; h3core's suite runs
it against the fake, the pipeline, a group of ranks and the ComfyUI executor.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from h3core.domain.capabilities import Capabilities
from h3core.domain.checkpoints import CheckpointPolicy
from h3core.domain.events import Artifact, Checkpoint, Progress
from h3core.domain.failures import FailureKind
from h3core.domain.quality import StepCounts
from h3core.domain.request import GenerationRequest
from h3core.domain.segments import Segment
from h3core.executors.reports import DeviceMemory, GroupHealth, HeadHealth, ProbeRow


@dataclass(frozen=True)
class Resume:
    """A checkpoint to continue from, and its bytes as read and checked (size and sha256) by the runner."""

    checkpoint: Checkpoint
    data: bytes = field(repr=False)


@dataclass(frozen=True)
class JobSpec:
    """One attempt at a job, as the runner hands it to an executor: the job's id, the attempt's number,
    its request, the sequence length admission computed for it (`tokens`, None where not stored), the
    last step already logged when the attempt is being resumed, when to checkpoint (`checkpoints`,
    None: never), the checkpoint to continue from (`resume`) and, for a long video, the segment
    this call makes (`segment`)."""

    job_id: str
    attempt: int
    request: GenerationRequest
    tokens: int | None = None
    last_step: int = 0  # when resuming an attempt: the last step already in the log
    checkpoints: CheckpointPolicy | None = None
    resume: Resume | None = None
    segment: Segment | None = None  # one segment of a long video: `request` is its call (the module's docstring)


@dataclass(frozen=True)
class CheckpointSaved:
    """A checkpoint the attempt stored (durably, through the artifact store), with what it cost:
    `paused_s`, how long the denoising loop waited for it; `write_s`, the whole write."""

    checkpoint: Checkpoint
    paused_s: float = 0.0
    write_s: float = 0.0


@dataclass(frozen=True)
class Heartbeat:
    """Alive, nothing to report: renews the stall timer without writing an event."""

    note: str = ""


@dataclass(frozen=True)
class Result:
    """The attempt's one final update: the artifact it wrote through the artifact store, and the
    transformer steps it computed and served from its cache at the request's quality level, where
    it counts them (they go into the job's `done` event)."""

    artifact: Artifact
    steps: StepCounts | None = None


Update = Progress | Heartbeat | CheckpointSaved | Result


class ExecutorFailure(Exception):
    """A failure the executor has classified."""

    def __init__(self, kind: FailureKind, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind
        self.message = message
        self.detail = detail

    def __reduce__(self):
        # Crosses process boundaries (a rank's failure reaches the executor through Ray's pickling).
        return type(self), (self.kind, self.message, self.detail)


class FinishedBeforeStop(Exception):
    """Raised by an executor's cleanup in place of the cancellation it was stopping for: the work
    had already finished (`result`), so nothing was stopped."""

    def __init__(self, result: Result) -> None:
        super().__init__(f"finished before the stop took effect: {result.artifact.path}")
        self.result = result


class StoppedWithCheckpoint(Exception):
    """Raised by an executor's cleanup in place of the cancellation of h3core's graceful stop (after
    `save_on_stop`): the attempt stopped at a step boundary and stored `saved` there."""

    def __init__(self, saved: CheckpointSaved) -> None:
        super().__init__(f"stopped after step {saved.checkpoint.step}, checkpointed at {saved.checkpoint.path}")
        self.saved = saved


# What torch's host allocator raises when the machine's memory runs out: a RuntimeError, not a MemoryError.
HOST_OOM = "DefaultCPUAllocator: can't allocate memory"


def host_oom(exc: BaseException) -> bool:
    """The host's memory (not a GPU's) ran out."""
    return isinstance(exc, MemoryError) or HOST_OOM in str(exc)


def classify(exc: BaseException) -> tuple[FailureKind, str, str | None]:
    """Map an exception an executor raised to (kind, message, detail)."""
    if isinstance(exc, ExecutorFailure):
        return exc.kind, exc.message, exc.detail
    names = {t.__name__ for t in type(exc).__mro__}
    text = str(exc)
    if "OutOfMemoryError" in names or host_oom(exc) or "out of memory" in text.lower():
        return "oom", f"out of memory: {text}"[:2000], type(exc).__name__
    return "executor_error", f"{type(exc).__name__}: {text}"[:2000], None


class NoReports:
    """The optional reports' defaults, for an executor with no device groups, cluster head,
    attention probe or device memory to show: inherit it and override what applies."""

    def health(self) -> Sequence[GroupHealth] | None:
        """None: no device groups."""
        return None

    def head(self) -> HeadHealth | None:
        """None: no cluster head."""
        return None

    def attention_report(self) -> Sequence[ProbeRow] | None:
        """None: no attention probe."""
        return None

    async def device_memory(self) -> Sequence[DeviceMemory] | None:
        """None: it does not know its devices' memory (it runs on the CPU, or has no device)."""
        return None


@runtime_checkable
class Executor(Protocol):
    """What the runner may expect of anything that generates a video (the module's docstring states
    the whole contract)."""

    name: str

    def running(self) -> AbstractAsyncContextManager[None]:
        """Hold the executor's whole life: load what it needs and start its background tasks on entry,
        stop them and release everything on exit."""
        ...

    def capabilities(self) -> Capabilities:
        """What this executor can run now (cheap, no I/O)."""
        ...

    def check(self, job: JobSpec) -> None:
        """Raise `ExecutorFailure("invalid", ...)` if this executor cannot run `job` (cheap, no side effects)."""
        ...

    def reference(self, job: JobSpec) -> str | None:
        """The executor's own id for this attempt, known before it starts (for the log)."""
        ...

    def info(self, job: JobSpec) -> dict[str, str]:
        """What this executor chose for the attempt (kernel, device group), for the log."""
        ...

    def run(self, job: JobSpec) -> AsyncIterator[Update]:
        """Run one attempt: progress and heartbeats, then exactly one `Result`; failures are raised, and
        cancelling the iteration stops the work."""
        ...

    def health(self) -> Sequence[GroupHealth] | None:
        """Each device group's health, a snapshot; None for an executor without groups."""
        ...

    def head(self) -> HeadHealth | None:
        """The health of the cluster head its groups run on; None without one."""
        ...

    def attention_report(self) -> Sequence[ProbeRow] | None:
        """What the start-up attention probe measured, one row per kernel; None without a probe."""
        ...

    async def device_memory(self) -> Sequence[DeviceMemory] | None:
        """Each device's memory now, read where the executor can (the driver, the server it drives),
        within a few seconds; None where it does not know (a CPU, devices in processes it cannot
        ask while they run)."""
        ...


@runtime_checkable
class Resumable(Protocol):
    """An executor whose work outlives h3core (a ComfyUI prompt): after a restart the runner
    re-attaches to a running attempt instead of failing it. `resume` follows the attempt whose
    `Running` event carried `executor_ref`, yielding progress only past `job.last_step`; if the
    work is gone it raises `ExecutorFailure("executor_lost", ...)`.

    `detach` is asked when h3core stops gracefully while the attempt runs, just before its
    iteration is cancelled: True leaves the work running (the cleanup does not stop it, the
    runner writes nothing, the attempt stays `running` in the log and the next start resumes
    it, or fails it `executor_lost` if the work is gone); False stops it as a cancel would,
    and the attempt is handed back (`released`: not a failure).

    A long video's attempt makes a call per segment: `job` is then the call of the segment its log
    says is next (`job.segment`), the one running when h3core stopped, and the executor follows
    (and leaves running) that call's work, not the attempt's first call `executor_ref` names."""

    def resume(self, job: JobSpec, executor_ref: str) -> AsyncIterator[Update]:
        """Follow the running attempt `executor_ref` names, as `run` would past `job.last_step`; raise
        `ExecutorFailure("executor_lost", ...)` if its work is gone."""
        ...

    def detach(self, job: JobSpec, executor_ref: str) -> bool:
        """Whether to leave the attempt's work running when h3core stops gracefully (True), or stop it
        as a cancel would (False)."""
        ...


@runtime_checkable
class Checkpointing(Protocol):
    """An executor that checkpoints its denoising loop (`capabilities().checkpoints`): before h3core's
    own graceful stop cancels an attempt, `save_on_stop` asks it to store a checkpoint where it stops
    (the module's docstring)."""

    def save_on_stop(self, job: JobSpec) -> None:
        """The cancellation that follows is h3core's graceful stop: end the step in flight, store a
        checkpoint there, and raise `StoppedWithCheckpoint` from the cleanup."""
        ...
