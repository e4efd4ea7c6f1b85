"""Groups of real Ray actors on a CPU (gloo, Ray on loopback) serving the tiny model.

One local Ray for the package, owned by a `RayHost` that every executor shares (a test that
loses the head leaves a new one behind). A group takes about 8 s to build here (each rank
imports torch and diffusers), so the tests that leave their group serving (or rebuilt) share one
runner for their module; the others build their own (`make_runner`).
Faults are injected inside a rank through Ray's `__ray_call__`, with functions from `faults`,
which is pickled by value so the actors need not import the tests.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

pytest.importorskip("ray", reason="the distributed extra is not installed")
pytest.importorskip("diffusers", reason="the pipeline extra is not installed")

import ray  # noqa: E402

from h3core import LocalArtifactStore, RetryPolicy, Runner, RunnerConfig, SQLiteEventStore  # noqa: E402
from h3core.adapters.uploads import LocalUploadStore  # noqa: E402
from h3core.domain.request import GenerationRequest  # noqa: E402
from h3core.domain.topology import Topology  # noqa: E402
from h3core.executors.distributed.cluster import ClusterSettings, RayHost  # noqa: E402
from h3core.executors.distributed.executor import DistributedExecutor, DistributedSettings  # noqa: E402
from tests import waiting  # noqa: E402
from tests.integration.distributed import faults  # noqa: E402
from tests.waiting import until  # noqa: E402

ray.cloudpickle.register_pickle_by_value(faults)


# Package scope: this Ray is gone before the service tests start Ray of their own.
@pytest.fixture(scope="package")
def ray_host():
    host = RayHost(ClusterSettings(cpus=4), ranks=4)
    # Asked from a thread that ends at once, as a pooled thread does when retired: the head must
    # live on (on the host's own thread) for every test here.
    with ThreadPoolExecutor(max_workers=1) as asker:
        asker.submit(host.connect).result()
    yield host
    host.close()


@asynccontextmanager
async def running_groups(
    root: Path,
    tiny_model: Path,
    ray_host: RayHost,
    devices: int = 2,
    group_size: str = "2",
    parallel: str = "fsdp+ulysses",
    **settings,
) -> AsyncIterator[Runner]:
    """A runner on groups of rank actors of the tiny model, every group ready."""
    uploads = LocalUploadStore(root / "uploads")
    topology = Topology.parse(devices, group_size, parallel)  # type: ignore[arg-type]
    settings.setdefault("timeout_s", 30.0)
    executor = DistributedExecutor(
        DistributedSettings(model_dir=tiny_model, topology=topology, rank_threads=1, **settings),
        LocalArtifactStore(root / "artifacts"),
        lambda upload_id: uploads.path(uploads.get(upload_id)),
        host=ray_host,
    )
    store = SQLiteEventStore(root / "h3.db", durable=False)
    config = RunnerConfig(
        slots=len(topology.group_sizes),
        stall_timeout_s=60.0,
        cancel_grace_s=60.0,
        poll_interval_s=0.05,
        retry=RetryPolicy(max_attempts=1),
    )
    runner = Runner(store, executor, config)
    runner.uploads = uploads
    async with anyio.create_task_group() as tg:
        await tg.start(runner.run)
        await until(lambda: all(h.state == "ready" for h in executor.health()), timeout=120)
        yield runner
        tg.cancel_scope.cancel()


@pytest.fixture
def make_runner(tmp_path, tiny_model, ray_host):
    """A runner of the test's own (its groups built for it): `async with make_runner(...) as runner`."""
    return functools.partial(running_groups, tmp_path, tiny_model, ray_host)


def req(**kw) -> GenerationRequest:
    return GenerationRequest(
        **{"prompt": "a red fox in snow", "width": 64, "height": 64, "frames": 22, "steps": 4, "seed": 7, **kw}
    )


async def ended(runner: Runner, job_id: str, timeout: float = 120.0):
    """A group's job takes longer than the in-process pipeline's: a deadline of its own."""
    return await waiting.ended(runner, job_id, timeout)


async def steps_seen(runner: Runner, job_id: str, n: int, timeout: float = 60.0) -> None:
    await until(lambda: (runner.store.get(job_id).step or 0) >= n or runner.store.get(job_id).terminal, timeout)


def on_rank(executor: DistributedExecutor, group: int, rank: int, fn, *args):
    """Run `fn(worker, *args)` inside a rank's actor; returns its result."""
    return ray.get(executor.groups[group].actors[rank].__ray_call__.remote(fn, *args), timeout=30)


def kill_rank(executor: DistributedExecutor, group: int, rank: int) -> int:
    pid = on_rank(executor, group, rank, faults.pid)
    os.kill(pid, signal.SIGKILL)
    return pid
