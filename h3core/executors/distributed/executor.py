"""The multi-device pipeline executor: groups of Ray actors, each group one slot.

On start it joins Ray (a local, loopback-only instance unless an address is given) and builds
every group in the background; `/readyz` turns ready once one group can take a job. A job goes to
the smallest idle group whose token budget fits it (`domain.topology.place`) and runs on all of
that group's ranks at once; rank 0's steps stream to the runner. A group whose rank fails or
dies is torn down at once and rebuilt before its next job; a watchdog pings idle groups and
rebuilds any that stopped answering.

Checkpoints (`job.checkpoints`): rank 0 decides when (every rank agrees at the step boundary),
copies the loop state off its device and serialises it off its loop; the driver writes it through
the artifact store in a thread of its own and reports it after its step's progress. A checkpoint
to continue from goes to every rank with the job.

Ray itself is watched too (`RayHost.lost`, every `head_check_s`): when its head is lost, the
executor is not ready (saying why), running jobs fail `executor_lost` within a poll, and once no
thread is inside Ray any more it starts (or joins) Ray again and rebuilds every group.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.backoff import Backoff, retry
from h3core.domain.capabilities import Capabilities, GroupBudget
from h3core.domain.quality import QUALITIES
from h3core.domain.topology import Topology, can_ever_fit, place, rank_device_problem
from h3core.executors.base import CheckpointSaved, ExecutorFailure, Heartbeat, JobSpec, Result, Update
from h3core.executors.distributed.cluster import ClusterSettings, RayHost
from h3core.executors.distributed.group import Group, GroupError
from h3core.executors.distributed.rank import Payload, RankSpec, Serialised
from h3core.executors.pipeline.attention import DEFAULT_MATH_MAX_TOKENS
from h3core.executors.pipeline.caching import quality_info
from h3core.executors.pipeline.driver import CheckpointWriter, media_for, model_failure, save_video, stream
from h3core.executors.pipeline.generate import Control
from h3core.executors.pipeline.kernel_probe import DEFAULT_TOLERANCE, at_start
from h3core.executors.pipeline.limits import ModelLimits, kernel_limit
from h3core.executors.pipeline.model import device_name
from h3core.executors.reports import DeviceMemory, GroupHealth, HeadHealth, ProbeRow

log = logging.getLogger("h3core.executors.distributed")
# After the head is lost, how long to wait for threads to leave Ray before restarting it anyway.
# Each returns within a poll, or within Ray's own timeout on a call to the GCS (60 s).
QUIET_S = 90.0
RECONNECT_BACKOFF_S = (1.0, 30.0)  # first and longest wait between tries to reach Ray again


@dataclass(frozen=True)
class DistributedSettings:
    """How the distributed executor runs: the model folder, the topology of groups and how they split the
    model, device and dtype, the attention kernel, the timers of its watchdogs, the groups' token budgets
    and the Ray cluster."""

    model_dir: Path
    topology: Topology
    device: str = "cpu"  # "cpu" (gloo) or "cuda" (NCCL, one GPU per rank)
    dtype: str = "float32"
    attention: str = "auto"  # a kernel's name, or auto: measured at start (kernel_probe), then run by every rank
    attention_tolerance: float = DEFAULT_TOLERANCE
    attention_cache: Path | None = None
    math_max_tokens: int = DEFAULT_MATH_MAX_TOKENS
    prompt_cache: int = 32
    timeout_s: float = 120.0  # bound on every collective, so a rank never waits forever for a partner
    watchdog_s: float = 10.0  # how often idle groups are pinged (and dead ones rebuilt)
    head_check_s: float = 1.0  # how often the Ray head is probed
    grace_s: float = 2.0  # after a rank fails, how long to wait for the others' reports (root cause)
    rank_threads: int | None = None  # torch threads per rank on a CPU
    placement: Mapping[str, str] = field(default_factory=dict)  # "text_encoder" / "vae" -> "cpu" or "cuda"
    budgets: Mapping[int, int] = field(default_factory=dict)  # tokens a group of each size fits (measured)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)


class DistributedExecutor:
    """The pipeline on groups of Ray actors: each job runs on one idle group whose budget fits it, and a
    group that fails is rebuilt."""

    name = "pipeline"

    def __init__(
        self,
        settings: DistributedSettings,
        artifacts: ArtifactStore,
        upload_path: Callable[[str], Path],
        *,
        host: RayHost | None = None,
    ) -> None:
        """`host`: a Ray connection that outlives this executor (connected by its owner, who closes
        it); by default the executor makes its own on `running()` and closes it at the end."""
        self.settings = settings
        self.artifacts = artifacts
        self._upload_path = upload_path
        s = settings
        if problem := rank_device_problem(s.device, s.placement):
            raise ValueError(problem)
        # Decided now, so a kernel these devices cannot run is refused at start, and every rank runs the one
        # kernel the Running events name. On GPUs it is measured in a child process: the GPUs are the ranks'.
        self.attention = at_start(
            s.model_dir,
            s.device,
            s.dtype,
            s.attention,
            tolerance=s.attention_tolerance,
            math_max_tokens=s.math_max_tokens,
            cache=s.attention_cache,
            in_child=s.device == "cuda",
        )
        self.plan = self.attention.plan
        self.limits = ModelLimits.of(s.model_dir)
        self.hardware = device_name(s.device)
        self._shared_host = host
        self._host = host
        self.groups = [
            Group(
                plan,
                self._spec(plan.size),
                gpus_per_rank=1.0 if s.device == "cuda" else 0.0,
                grace_s=s.grace_s,
                lost=self._outage,
            )
            for plan in s.topology.groups()
        ]
        self._claimed: set[int] = set()  # groups running a job or being checked
        self._building: set[int] = set()
        self._changed = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._controls: dict[tuple[str, int], Control] = {}  # the running attempts' (job id, attempt)
        # Threads inside a Ray call (builds and pings are abandoned on shutdown); Ray is shut down only once none is.
        self._inflight = 0
        self._quiet = threading.Condition()
        self._generation = 0  # heads connected since the first: a build begun on an older one is repeated

    def _spec(self, size: int) -> RankSpec:
        s = self.settings
        parallel = s.topology.parallel
        return RankSpec(
            model_dir=str(s.model_dir),
            device=s.device,
            dtype=s.dtype,
            attention=self.plan.kernel,
            math_max_tokens=s.math_max_tokens,
            prompt_cache=s.prompt_cache,
            fsdp=size > 1 and "fsdp" in parallel,
            ulysses=size > 1 and "ulysses" in parallel,
            timeout_s=s.timeout_s,
            threads=s.rank_threads,
            placement=tuple(sorted(s.placement.items())),
        )

    # -- health -------------------------------------------------------------------------------

    def health(self) -> list[GroupHealth]:
        """A snapshot of every group's health."""
        return [replace(g.health, ranks=[dict(r) for r in g.health.ranks]) for g in self.groups]

    def head(self) -> HeadHealth:
        """A snapshot of the Ray head's health (state, losses, reconnects, why it was last lost)."""
        return replace(self._host.health) if self._host is not None else HeadHealth()

    def _outage(self) -> str | None:
        host = self._host
        return host.outage if host is not None else None

    def capabilities(self) -> Capabilities:
        """The model folder's limits, each group size's token budget and the kernel's bound; not ready until
        a group is ready, nor while the Ray head is lost."""
        s = self.settings
        groups = tuple(
            GroupBudget(size=size, tokens=s.budgets[size], source="group_budgets setting, unverified")
            if size in s.budgets
            else GroupBudget(size=size)
            for size in sorted(set(s.topology.group_sizes))
        )
        topology = "+".join(str(n) for n in s.topology.group_sizes)
        caps = self.limits.capabilities(
            hardware=self.hardware,
            kernel=self.plan.kernel,
            not_ready=self._not_ready(),
            groups=groups,
            topology=topology,
            **kernel_limit(self.plan),
        )
        return caps.model_copy(update={"checkpoints": True, "qualities": QUALITIES, "continues_segments": True})

    def _not_ready(self) -> str | None:
        if (outage := self._outage()) is not None:
            return f"{outage}; reconnecting"
        if self._tg is not None and any(g.health.state in ("ready", "busy") for g in self.groups):
            return None
        if self._tg is None:
            return "not started"
        # Read each group's fields, not a copy of its ranks: rank threads update those meanwhile.
        parts = [
            f"group {g.plan.index}: {g.health.state}" + (f" ({g.health.last_error})" if g.health.last_error else "")
            for g in self.groups
        ]
        return "no group can take a job: " + "; ".join(parts)

    def check(self, job: JobSpec) -> None:
        """The model folder's pre-check, and a job whose tokens fit no group's budget is `invalid`."""
        self.limits.check(job.request)
        if not can_ever_fit(job.tokens, [g.plan for g in self.groups], self.settings.budgets):
            raise ExecutorFailure(
                "invalid", f"tokens: {job.tokens} fit no group of this topology (budgets by size: {dict(self.settings.budgets)})"
            )

    def attention_report(self) -> tuple[ProbeRow, ...]:
        """What the start-up probe measured, one row per kernel (the chosen one among them)."""
        return self.attention.rows

    async def device_memory(self) -> tuple[DeviceMemory, ...] | None:
        """None: the devices are the ranks' (Ray actors, often on other hosts), not asked from here
        yet; /readyz's groups and each job's events say what the ranks report."""
        return None

    # -- life ---------------------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Start or join Ray (unless given a host), build every group in the background and watch the groups
        and the head; on exit stop the jobs, tear the groups down and close a host of its own."""
        own = self._shared_host is None
        host = RayHost(self.settings.cluster, ranks=self.settings.topology.devices) if own else self._shared_host
        assert host is not None
        self._host = host
        async with anyio.create_task_group() as tg:
            try:
                if own:  # on the host's own thread; this worker thread only waits for it
                    await anyio.to_thread.run_sync(host.connect)
                self._tg = tg
                for group in self.groups:
                    self._rebuild(group)
                tg.start_soon(self._watchdog)
                tg.start_soon(self._watch_head, host)
                yield
            finally:
                self._tg = None
                for control in self._controls.values():
                    control.stop.set()
                tg.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self._teardown_all)
                    # Killing the actors ended every build and ping; wait for their threads to leave Ray.
                    await anyio.to_thread.run_sync(self._wait_quiet, 60.0)
                    if own:
                        await anyio.to_thread.run_sync(host.close)

    def _teardown_all(self) -> None:
        for group in self.groups:
            group.teardown()

    def _tracked(self, call: Callable[[], Any]) -> Any:
        """Run `call` (which talks to Ray) in this worker thread, counted in `_inflight`."""
        with self._quiet:
            self._inflight += 1
        try:
            return call()
        finally:
            with self._quiet:
                self._inflight -= 1
                self._quiet.notify_all()

    def _wait_quiet(self, timeout_s: float) -> bool:
        with self._quiet:
            return self._quiet.wait_for(lambda: self._inflight == 0, timeout_s)

    def _rebuild(self, group: Group) -> None:
        if self._tg is None or self._outage() is not None or group.plan.index in self._building:
            return
        self._building.add(group.plan.index)
        self._tg.start_soon(self._build, group)

    async def _build(self, group: Group) -> None:
        generation = self._generation
        try:
            # Abandoned on shutdown (loading real weights takes minutes); the actors are killed by the teardown.
            await anyio.to_thread.run_sync(self._tracked, group.build, abandon_on_cancel=True)
        except GroupError:
            pass  # recorded in group.health; the watchdog tries again
        finally:
            self._building.discard(group.plan.index)
            if generation != self._generation:
                self._rebuild(group)  # begun on a head since lost: build it on this one
            self._notify()

    async def _watch_head(self, host: RayHost) -> None:
        while True:
            await anyio.sleep(self.settings.head_check_s)
            why = await anyio.to_thread.run_sync(host.lost, abandon_on_cancel=True)
            if why is not None:
                await self._recover(host, f"Ray head lost: {why}")

    async def _recover(self, host: RayHost, reason: str) -> None:
        """Fail what runs on the lost head, start or join Ray again, and rebuild every group."""
        log.warning("%s; failing the jobs on it and reconnecting", reason, extra={"reason": reason})
        host.begin_outage(reason)  # from here every wait on Ray in a group gives up within a poll
        for group in self.groups:
            group.forget(reason)
        self._notify()
        # Restarting Ray under a thread still inside it would strand that thread (or worse).
        if not await anyio.to_thread.run_sync(self._wait_quiet, QUIET_S, abandon_on_cancel=True):
            log.warning("threads still inside Ray %g s after the head was lost; reconnecting anyway", QUIET_S)
        for group in self.groups:
            group.forget(reason)  # again: a build may have finished meanwhile

        def failed(exc: Exception, tries: int, pause: float) -> None:
            error = f"{type(exc).__name__}: {exc}"
            host.health.last_error = f"{reason}; reconnecting failed ({error}), next try in {pause:g} s"[:1000]
            log.warning("%s", host.health.last_error, extra={"reason": reason, "error": error})

        # Until it works: the head may take a while to come back. RECONNECT_BACKOFF_S is read here, for tests.
        await retry(
            lambda: anyio.to_thread.run_sync(host.reconnect, abandon_on_cancel=True),
            Backoff(*RECONNECT_BACKOFF_S),
            retry_if=lambda exc: True,
            on_retry=failed,
        )
        log.info("Ray reconnected (%s); rebuilding every group", host.health.address, extra={"address": host.health.address})
        self._generation += 1
        for group in self.groups:
            self._rebuild(group)
        self._notify()

    async def _watchdog(self) -> None:
        while True:
            await anyio.sleep(self.settings.watchdog_s)
            if self._outage() is not None:
                continue  # the head's watcher rebuilds every group once it is back
            for group in self.groups:
                index = group.plan.index
                if index in self._claimed or index in self._building:
                    continue
                if group.health.state == "ready":
                    self._claimed.add(index)
                    try:
                        problem = await anyio.to_thread.run_sync(self._tracked, group.ping, abandon_on_cancel=True)
                    finally:
                        self._claimed.discard(index)
                    if problem is not None:
                        self._rebuild(group)
                elif group.health.state == "dead":
                    self._rebuild(group)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # -- the contract -------------------------------------------------------------------------

    def reference(self, job: JobSpec) -> str | None:
        """None: the job runs on this executor's own groups, with no id of its own."""
        return None

    def info(self, job: JobSpec) -> dict[str, str]:
        """The attention plan, device, dtype, model folder, group sizes and parallelism."""
        s = self.settings
        sizes = "+".join(str(n) for n in s.topology.group_sizes)
        return {
            "attention": self.plan.describe(),
            "device": s.device,
            "dtype": s.dtype,
            "model": str(s.model_dir),
            "groups": sizes,
            "parallel": s.topology.parallel,
        } | quality_info(job.request.quality)

    async def run(self, job: JobSpec) -> AsyncIterator[Update]:
        """Wait (with heartbeats) for the smallest idle group that fits the job and answers a ping, then run
        the job on all its ranks, rank 0's steps streamed; a cancel stops every rank at one step boundary."""
        if self._tg is None:
            raise ExecutorFailure("executor_error", "the distributed executor is not running")
        self.check(job)
        group = None
        while group is None:
            idle = [g.plan for g in self.groups if g.health.state == "ready" and g.plan.index not in self._claimed]
            chosen = place(job.tokens, idle, self.settings.budgets)
            if chosen is not None:
                candidate = self.groups[chosen.index]
                self._claimed.add(chosen.index)
                # A rank may have died since the watchdog last looked: find out now, not with a failed attempt.
                problem = await anyio.to_thread.run_sync(self._tracked, candidate.ping)
                if problem is None:
                    group = candidate
                    break
                self._claimed.discard(chosen.index)
                self._rebuild(candidate)
                yield Heartbeat(f"rebuilding {candidate.name}: {problem}")
                continue
            changed = self._changed
            with anyio.move_on_after(5):
                await changed.wait()
            yield Heartbeat("waiting for a group")
        control = Control()
        self._controls[job.job_id, job.attempt] = control
        try:
            yield Heartbeat(f"on {group.name} ({group.plan.size} ranks)")
            payload = self._payload(job)
            work = functools.partial(self._job_sync, group, job, payload)
            async for update in stream(self._tg, lambda c: self._tracked(functools.partial(work, c)), control):
                yield update
        finally:
            self._controls.pop((job.job_id, job.attempt), None)
            self._claimed.discard(group.plan.index)
            if group.health.state == "dead":
                self._rebuild(group)
            self._notify()

    def _payload(self, job: JobSpec) -> Payload:
        media = media_for(job, self._upload_path)
        roles = {
            "first": (media.first,) if media.first else (),
            "last": (media.last,) if media.last else (),
            "images": media.images,
            "videos": media.videos,
            "audios": media.audios,
        }
        files = {role: tuple((p.name, p.read_bytes()) for p in paths) for role, paths in roles.items() if paths}
        return Payload(
            request=job.request.model_dump(mode="json"),
            files=files,
            checkpoints=job.checkpoints.model_dump() if job.checkpoints is not None else None,
            resume=job.resume.data if job.resume is not None else None,
        )

    def save_on_stop(self, job: JobSpec) -> None:
        """The stop that follows is h3core's own: every rank stops at one step, rank 0's checkpoint of it stored."""
        control = self._controls.get((job.job_id, job.attempt))
        if control is not None:
            control.save_on_stop = True

    def _job_sync(
        self, group: Group, job: JobSpec, payload: Payload, control: Control
    ) -> Result | ExecutorFailure | CheckpointSaved | None:
        """Runs in a worker thread: every exception becomes an outcome."""
        import ray

        writer = CheckpointWriter(self.artifacts, job, control.on_saved)
        wait_s = self.settings.timeout_s + 30.0

        def store(made: Serialised) -> None:  # from this thread; the fetch and the write run in the writer's

            def fetch() -> bytes:
                return ray.get(made.data, timeout=wait_s)

            writer.hand_serialised(made.step, made.total, fetch, paused_s=made.paused_s, made_s=made.serialise_s)

        try:
            with writer.finishing():  # every checkpoint rank 0 made is stored (and reported) before what follows
                out: dict[str, Any] | None = group.run(payload, control, stop_timeout_s=wait_s, on_checkpoint=store)
            if out is None:
                return writer.last if control.save_on_stop and writer.last is not None else None
            artifact = save_video(self.artifacts, job, out["frames"], out["audio"], out["sample_rate"], control)
            return Result(artifact, out.get("cache"))
        except Exception as exc:  # noqa: BLE001 - a worker thread: report whatever happened
            return model_failure(exc, where=group.name, tokens=job.tokens)
