"""The async shell around `generate.Generator`: load once, run one job at a time in a worker
thread, stream its steps to the runner, stop between steps when the runner cancels.

The model loads in the background when the executor starts (`/readyz` says "loading" until it
is resident); a job that arrives meanwhile waits, sending heartbeats. The worker thread never
sees anyio cancellation: the runner's cancel sets the job's stop flag, the thread ends at the
next step boundary, and the executor waits for it (shielded) before the next job may start,
so no two jobs ever share the device.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.to_thread

from h3core.adapters.artifacts import ArtifactStore
from h3core.domain.capabilities import Capabilities
from h3core.domain.quality import QUALITIES
from h3core.executors.base import CheckpointSaved, ExecutorFailure, Heartbeat, JobSpec, NoReports, Result, Update
from h3core.executors.pipeline.attention import DEFAULT_MATH_MAX_TOKENS
from h3core.executors.pipeline.caching import quality_info
from h3core.executors.pipeline.driver import CheckpointWriter, media_for, model_failure, save_video, stream
from h3core.executors.pipeline.generate import Control, Generator, Media, StopRequested, load_checkpoint
from h3core.executors.pipeline.kernel_probe import DEFAULT_TOLERANCE, at_start
from h3core.executors.pipeline.limits import ModelLimits, kernel_limit
from h3core.executors.pipeline.model import ModelError, device_memory, device_name, load_model
from h3core.executors.reports import DeviceMemory, ProbeRow


@dataclass(frozen=True)
class PipelineSettings:
    """How the pipeline executor runs: the model folder, the device and dtype, the attention kernel
    (or how to choose one at start) and where the text encoder and VAE go."""

    model_dir: Path
    device: str = "cpu"
    dtype: str = "float32"
    attention: str = "auto"  # a kernel's name, or auto: measured at start (kernel_probe)
    attention_tolerance: float = DEFAULT_TOLERANCE
    attention_cache: Path | None = None  # where the measured decision is kept between starts (None: measure each time)
    math_max_tokens: int = DEFAULT_MATH_MAX_TOKENS
    # Where the start-up probe measures. None: in a child process on CUDA (a kernel that faults must not
    # poison or kill the serving process), in this process on a CPU (no device state to poison, and a
    # child costs a torch import, seconds, at every start).
    probe_in_child: bool | None = None
    prompt_cache: int = 32  # prompt embeddings kept (entries)
    placement: Mapping[str, str] = field(default_factory=dict)  # "text_encoder" / "vae" -> device, where not `device`


@dataclass
class Counters:
    """What the executor has done since it was built: model loads, jobs, OOMs, and the last finished
    job's seconds by stage."""

    loads: int = 0  # model loads (one per executor start)
    jobs: int = 0
    ooms: int = 0
    load_seconds: float = 0.0
    last_job: dict[str, float] = field(default_factory=dict)  # stage -> seconds, of the last finished job


class PipelineExecutor(NoReports):  # one device: no groups, no head
    """One resident MiniMax-H3 model on one device, running one job at a time in a worker thread."""

    name = "pipeline"

    def __init__(self, settings: PipelineSettings, artifacts: ArtifactStore, upload_path: Callable[[str], Path]) -> None:
        self.settings = settings
        self.artifacts = artifacts
        self._upload_path = upload_path
        # Decided now (measured, for auto): a kernel this machine cannot run is refused at start, and the
        # Running event of every job, even one claimed while the model loads, names the kernel that runs.
        # A kernel that kills or poisons the probe's process is a failed row (kernel_probe.decide_in_child).
        s = settings
        self.attention = at_start(
            s.model_dir,
            s.device,
            s.dtype,
            s.attention,
            tolerance=s.attention_tolerance,
            math_max_tokens=s.math_max_tokens,
            cache=s.attention_cache,
            in_child=s.probe_in_child if s.probe_in_child is not None else s.device.split(":")[0] == "cuda",
        )
        self.plan = self.attention.plan
        self.limits = ModelLimits.of(settings.model_dir)  # what the folder lets it run, before the weights load
        self.hardware = device_name(settings.device)
        self.generator: Generator | None = None
        self.counters = Counters()
        self._load_error: str | None = None
        self._loaded: anyio.Event | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._lock = anyio.Lock()
        self._current: Control | None = None

    # -- life ---------------------------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        """The model folder's limits and the chosen kernel's bound; no mode is ready until the model has
        loaded."""
        caps = self.limits.capabilities(
            hardware=self.hardware, kernel=self.plan.kernel, not_ready=self._not_ready(), **kernel_limit(self.plan)
        )
        return caps.model_copy(update={"checkpoints": True, "qualities": QUALITIES, "continues_segments": True})

    def _not_ready(self) -> str | None:
        if self._tg is None:
            return "not started"
        if self._load_error:
            return f"model did not load: {self._load_error}"
        if self.generator is None:
            return f"loading the model from {self.settings.model_dir}"
        return None

    def check(self, job: JobSpec) -> None:
        """The model folder's pre-check (`ModelLimits.check`)."""
        self.limits.check(job.request)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Load the model in the background (jobs wait for it); on exit stop the current job and abandon
        a load still under way."""
        self._loaded = anyio.Event()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._load)
            try:
                yield
            finally:
                if self._current is not None:
                    self._current.stop.set()
                self._tg = None
                tg.cancel_scope.cancel()

    async def _load(self) -> None:
        t0 = time.perf_counter()
        try:
            # Abandoned on shutdown: a load of real weights takes minutes and holds nothing to release.
            self.generator = await anyio.to_thread.run_sync(self._load_sync, abandon_on_cancel=True)
            self.counters.loads += 1
            self.counters.load_seconds = time.perf_counter() - t0
        except ModelError as exc:
            self._load_error = str(exc)
        finally:
            assert self._loaded is not None
            self._loaded.set()

    def _load_sync(self) -> Generator:
        s = self.settings
        model = load_model(s.model_dir, device=s.device, dtype=s.dtype, placement=s.placement)
        return Generator(model, self.plan, cache_size=s.prompt_cache)

    def attention_report(self) -> tuple[ProbeRow, ...]:
        """What the start-up probe measured, one row per kernel (the chosen one among them)."""
        return self.attention.rows

    async def device_memory(self) -> tuple[DeviceMemory, ...] | None:
        """Its CUDA device's memory, from the driver (asked on a worker thread); None on the CPU."""
        found = await anyio.to_thread.run_sync(device_memory, self.settings.device)
        return (found,) if found is not None else None

    # -- the contract -------------------------------------------------------------------------

    def reference(self, job: JobSpec) -> str | None:
        """None: the job runs in this process, with no id of its own."""
        return None

    def info(self, job: JobSpec) -> dict[str, str]:
        """The attention plan, device, dtype and model folder the job runs with."""
        s = self.settings
        out = {"attention": self.plan.describe(), "device": s.device, "dtype": s.dtype, "model": str(s.model_dir)}
        return out | quality_info(job.request.quality)

    async def run(self, job: JobSpec) -> AsyncIterator[Update]:
        """Wait for the model (with heartbeats) and for the job before it, then run the job in a worker
        thread; a cancel stops it at the next step boundary."""
        if self._loaded is None or self._tg is None:
            raise ExecutorFailure("executor_error", "the pipeline executor is not running")
        while not self._loaded.is_set():
            with anyio.move_on_after(5):
                await self._loaded.wait()
            yield Heartbeat("loading the model")
        if self.generator is None:
            raise ExecutorFailure("executor_error", f"model did not load: {self._load_error}")
        async with self._lock:
            yield Heartbeat("starting")
            media = media_for(job, self._upload_path)
            control = Control()
            self._current = control
            try:
                async for update in stream(self._tg, lambda c: self._job_sync(job, media, c), control):
                    yield update
            finally:
                self._current = None

    def save_on_stop(self, job: JobSpec) -> None:
        """The stop that follows is h3core's own: checkpoint the last step the job reaches."""
        current = self._current
        if current is not None:
            current.save_on_stop = True

    # -- one job ------------------------------------------------------------------------------

    def _job_sync(self, job: JobSpec, media: Media, control: Control) -> Result | ExecutorFailure | CheckpointSaved | None:
        """Runs in a worker thread: every exception becomes an outcome (nothing here is anyio's)."""
        assert self.generator is not None
        self.counters.jobs += 1
        writer = CheckpointWriter(self.artifacts, job, control.on_saved)
        try:
            if job.checkpoints is not None:
                control.checkpoints, control.on_checkpoint = job.checkpoints, writer.hand
            if job.resume is not None:
                control.resume = load_checkpoint(job.resume.data)
            try:
                out = self.generator.run(job.request, media, control)
            finally:
                writer.drain()  # every checkpoint handed over is stored (and reported) before what follows
            t0 = time.perf_counter()
            artifact = save_video(self.artifacts, job, out.frames, out.audio, out.sample_rate, control)
            self.counters.last_job = {**out.seconds, "mux": time.perf_counter() - t0, "steps": float(out.steps)}
            return Result(artifact, out.cache)
        except StopRequested:
            at_stop = writer.last
            return at_stop if control.save_on_stop and at_stop is not None else None
        except Exception as exc:  # noqa: BLE001 - a worker thread: report whatever the model raised
            failure = model_failure(exc, where=self.settings.device, tokens=self.generator.last_tokens or job.tokens)
            self.counters.ooms += failure.kind == "oom"
            return failure
