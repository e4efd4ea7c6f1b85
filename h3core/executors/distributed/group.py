"""One group of ranks as the executor sees it: build it, run a job on every rank at once, follow
rank 0's steps, stop it, and tear it down whole when any rank fails.

Every method here is synchronous (Ray's API is); the executor calls them from worker threads.

A failed rank takes the group with it. The other ranks may be waiting in a collective for the
one that failed; they are not left to time out: the executor kills every actor of the group at
once and builds a new group before the group's next job. The failure the job records is the
root cause, chosen from what the ranks reported within a short grace: a rank that died
(`executor_lost`) before one that ran out of memory (`oom`) before the errors that the others
raised only because their partner was gone.

When the Ray head itself is lost (`lost()` says why), every wait here gives up within a poll:
a running job fails `executor_lost` at once, and the group forgets its actors without asking
the dead head to remove them (the head's end took them with it).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from h3core.domain.topology import GroupPlan
from h3core.executors.base import ExecutorFailure
from h3core.executors.distributed.cluster import RANK_ENV, remote_rank
from h3core.executors.distributed.rank import Payload, RankSpec, Serialised
from h3core.executors.pipeline.generate import Control
from h3core.executors.reports import GroupHealth

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

# Lower is closer to the root cause.
_PRIORITY = {"executor_lost": 0, "oom": 1, "invalid": 2}


class GroupError(Exception):
    """The group could not be built (the message names the rank and the reason)."""


class HeadLost(Exception):
    """The Ray head was lost while the group waited on it (the message says how)."""


class Group:
    """One group of `plan.size` ranks, one Ray actor each, placed together on one node; `health` is its
    snapshot for /readyz and /metrics."""

    def __init__(
        self,
        plan: GroupPlan,
        spec: RankSpec,
        *,
        gpus_per_rank: float = 0.0,
        build_timeout_s: float = 600.0,
        grace_s: float = 2.0,
        poll_s: float = 0.05,
        lost: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.plan = plan
        self.spec = spec
        self.gpus_per_rank = gpus_per_rank
        self.build_timeout_s = build_timeout_s
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.lost = lost  # why the Ray head is lost, or None
        self.actors: list[Any] = []
        self.placement: PlacementGroup | None = None
        self.health = GroupHealth(index=plan.index, size=plan.size)

    @property
    def name(self) -> str:
        """The group's name in messages and logs: "group <index>"."""
        return f"group {self.plan.index}"

    # -- life ---------------------------------------------------------------------------------

    def build(self) -> None:
        """Start one actor per rank on one node, join them into a process group, load the model."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.teardown()
        h = self.health
        h.state = "starting"
        if h.builds:
            h.rebuilds += 1
        h.builds += 1
        t0 = time.perf_counter()
        size = self.plan.size
        bundle = {"CPU": 1.0, **({"GPU": self.gpus_per_rank} if self.gpus_per_rank else {})}
        try:
            # Unique per build: names are per Ray namespace, and another executor on the same cluster
            # (a second service joining it, a test) has a "group 0" too; a taken name fails the build.
            name = f"h3core-{self.name}-{uuid.uuid4().hex[:12]}"
            self.placement = placement_group([bundle] * size, strategy="STRICT_PACK", name=name)
            self._get(self.placement.ready())
            remote = remote_rank()
            self.actors = [
                remote.options(
                    num_cpus=1,
                    num_gpus=self.gpus_per_rank,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement, placement_group_bundle_index=rank),
                    runtime_env={"env_vars": RANK_ENV},
                ).remote(rank, size, self.spec)
                for rank in range(size)
            ]
            rendezvous = self._get(self.actors[0].rendezvous.remote())
            h.ranks = self._get([a.setup.remote(rendezvous) for a in self.actors])
        except Exception as exc:  # noqa: BLE001 - Ray's errors, a rank's load error: the group is not usable
            self.teardown()
            h.state = "dead"
            h.last_error = f"{self.name} did not start: {_describe(exc)}"
            raise GroupError(h.last_error) from exc
        h.build_seconds = time.perf_counter() - t0
        h.state = "ready"

    def _get(self, refs: Any) -> Any:
        """`ray.get` within the build timeout, given up as soon as the head is lost."""
        import ray

        deadline = time.monotonic() + self.build_timeout_s
        waiting = refs if isinstance(refs, list) else [refs]
        while True:
            if (why := self.lost()) is not None:
                raise HeadLost(why)
            left = deadline - time.monotonic()
            if left <= 0:
                return ray.get(refs, timeout=0)  # raises GetTimeoutError unless all are ready
            _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=min(left, 0.25))
            if not waiting:
                return ray.get(refs)

    def teardown(self) -> None:
        """Kill every rank at once (none is left waiting in a collective) and free the placement."""
        if not self.actors and self.placement is None:
            return
        if (why := self.lost()) is not None:
            self.forget(why)
            return
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001, S110 - already gone
                pass
        self.actors = []
        if self.placement is not None:
            try:
                remove_placement_group(self.placement)
            except Exception:  # noqa: BLE001, S110 - already removed
                pass
            self.placement = None
        self.health.state = "dead"

    def forget(self, reason: str) -> None:
        """The head is lost: drop the handles without asking it anything (its end took the ranks)."""
        self.actors = []
        self.placement = None
        self.health.state = "dead"
        self.health.last_error = reason

    def ping(self, timeout_s: float = 10.0) -> str | None:
        """None when every rank answers; otherwise what is wrong (and the group is torn down)."""
        import ray

        if not self.actors:
            return f"{self.name} has no ranks"
        refs = [a.ping.remote() for a in self.actors]
        for rank, ref in enumerate(refs):
            try:
                if (why := self.lost()) is not None:
                    raise HeadLost(why)
                ray.get(ref, timeout=timeout_s)
            except Exception as exc:  # noqa: BLE001 - dead or unresponsive: either way not usable
                reason = f"rank {rank} of {self.name} did not answer a ping: {_describe(exc)}"
                self.health.last_error = reason
                self.teardown()
                return reason
        return None

    # -- one job ------------------------------------------------------------------------------

    def run(
        self,
        payload: Payload,
        control: Control,
        *,
        stop_timeout_s: float,
        on_checkpoint: Callable[[Serialised], None] = lambda serialised: None,
    ) -> dict[str, Any] | None:
        """Run `payload` on every rank; rank 0's result, None when stopped; raises `ExecutorFailure`. Rank 0's
        steps and stages go to `control`, its checkpoints to `on_checkpoint` (each after its step's)."""
        import ray

        if (why := self.lost()) is not None:
            raise self._head_lost(why)
        actors = list(self.actors)
        if not actors:
            raise ExecutorFailure("executor_lost", f"{self.name} has no ranks")
        self.health.state = "busy"
        shared = ray.put(payload)  # once for every rank: it may carry a checkpoint and uploads
        refs = {a.run.remote(shared): rank for rank, a in enumerate(actors)}
        relay = _Relay(actors[0], control, on_checkpoint)
        results: dict[int, Any] = {}
        failures: list[tuple[int, ExecutorFailure]] = []
        first_failure: float | None = None
        stop_deadline: float | None = None
        try:
            while refs:
                if (why := self.lost()) is not None:
                    raise self._head_lost(why)
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=self.poll_s)
                relay()
                for ref in ready:
                    rank = refs.pop(ref)
                    try:
                        results[rank] = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - every way a rank can fail is classified below
                        failures.append((rank, self._failure(rank, exc)))
                        first_failure = first_failure or time.monotonic()
                now = time.monotonic()
                if first_failure is not None and now - first_failure > self.grace_s:
                    break
                if control.stop.is_set() and stop_deadline is None:
                    stop_deadline = now + stop_timeout_s
                    actors[0].stop.remote(control.save_on_stop)
                if stop_deadline is not None and now > stop_deadline and not failures:
                    self.health.last_error = f"{self.name} did not stop within {stop_timeout_s:g} s"
                    self.teardown()
                    return None
            if failures:
                failures.sort(key=lambda f: (_PRIORITY.get(f[1].kind, 9), f[0]))
                root = failures[0][1]
                clean = root.kind == "invalid" and not refs and len(failures) == len(actors)
                if not clean:  # a refused request leaves every rank where it was; anything else does not
                    self.health.last_error = root.message
                    self.teardown()
                raise root
            relay(final=True)
            return results.get(0)
        finally:
            if self.health.state == "busy":
                self.health.state = "ready"

    def _head_lost(self, why: str) -> ExecutorFailure:
        self.forget(why)
        return ExecutorFailure("executor_lost", f"{self.name}: {why}; its ranks went with it")

    def _failure(self, rank: int, exc: BaseException) -> ExecutorFailure:
        from ray.exceptions import RayActorError, RayTaskError

        pid = next((r.get("pid") for r in self.health.ranks if r.get("rank") == rank), None)
        who = f"rank {rank} of {self.name}" + (f" (pid {pid})" if pid else "")
        if isinstance(exc, RayActorError):
            return ExecutorFailure("executor_lost", f"{who} is gone: {_describe(exc)}", type(exc).__name__)
        cause = exc.cause if isinstance(exc, RayTaskError) else exc
        if isinstance(cause, ExecutorFailure):
            message = cause.message if cause.kind == "invalid" else f"{self.name}: {cause.message}"
            return ExecutorFailure(cause.kind, message[:2000], cause.detail)
        return ExecutorFailure("executor_error", f"{who}: {_describe(cause or exc)}", type(cause or exc).__name__)


class _Relay:
    """Follows rank 0's reports: one poll at a time, and one that is slow to answer is waited for on the next
    call, never dropped (the events it carries are gone from rank 0 once it answers)."""

    def __init__(self, rank0, control: Control, on_checkpoint: Callable[[Serialised], None]) -> None:
        self.rank0 = rank0
        self.control = control
        self.on_checkpoint = on_checkpoint
        self._pending: Any = None  # the poll under way

    def __call__(self, *, final: bool = False) -> None:
        import ray
        from ray.exceptions import GetTimeoutError

        while True:
            if self._pending is None:
                self._pending = self.rank0.poll.remote()
            try:
                events = ray.get(self._pending, timeout=5.0)
            except GetTimeoutError:
                return  # still on its way: the next call waits for it
            except Exception:  # noqa: BLE001 - rank 0 gone: its run() reference says how
                self._pending = None
                return
            self._pending = None
            for event in events:
                if event[0] == "step":
                    self.control.on_step(event[1], event[2])
                elif event[0] == "checkpoint":
                    self.on_checkpoint(event[1])
                else:
                    self.control.on_stage(event[1])
            if not final:
                return
            final = False  # once more: a poll that was under way when rank 0 finished saw only part


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = next((line for line in text if line.strip()), "")
    return f"{type(exc).__name__}: {first}"[:500]
