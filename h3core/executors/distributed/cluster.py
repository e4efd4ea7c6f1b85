"""Ray, as h3core uses it: a local instance pinned to loopback, or an operator's cluster.

Without an address, Ray starts here. Left to its defaults it binds its gRPC servers to every
interface and advertises the host's routable address; Ray's local-only mode (the switch it uses
on laptops, `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`) keeps the node address and every port on
127.0.0.1. The switch is read when `ray` is imported and inherited by Ray's own processes, so it
is set before the import and, if `ray` was imported already, on its constants as well.

With an address (`H3_RAY_ADDRESS`), h3core joins that cluster and places each group on one
node (a strictly packed placement group), so a group's ranks still meet on that node's loopback.
A loopback address (a cluster on this machine) keeps the local-only switch too: without it Ray
rewrites 127.0.0.1 to the host's routable address before connecting.

`RayHost` owns that connection for an executor's whole life, on one thread of its own: Ray ties
the head processes it starts to the thread that started them (Linux PR_SET_PDEATHSIG fires when
that *thread* exits), so a pooled thread, which is retired when idle (anyio's after 10 s), would
take the head down with it.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Ray's core installs a C++ failure-signal handler in the process that calls ray.init; it takes
# SIGTERM before the service's own graceful-shutdown handler. The service stops itself.
NO_SIGNAL_HANDLER = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"
# Collective libraries pick an interface from the host name unless told; a group is on one node.
RANK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


@dataclass(frozen=True)
class ClusterSettings:
    address: str | None = None  # None: a local Ray on loopback
    cpus: int | None = None  # logical CPUs of a local Ray (None: this machine's, at least one per rank)


def connect(settings: ClusterSettings, *, ranks: int) -> bool:
    """Start or join Ray unless this process already has; True if this call started it.

    A local Ray's head lives as long as the thread that calls this: call it on a thread that
    lives as long as Ray should (`RayHost` does), never on a pooled one.
    """
    os.environ.setdefault(NO_SIGNAL_HANDLER, "1")
    if settings.address is None or _loopback(settings.address):
        # Also for a cluster on this machine's loopback: Ray would otherwise rewrite 127.0.0.1 to
        # the host's routable address before it connects.
        os.environ[LOCAL_ONLY] = "0"
        if "ray" in sys.modules:
            from ray._private import ray_constants

            ray_constants.ENABLE_RAY_CLUSTER = False
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "namespace": "h3core",
        "log_to_driver": True,
        "configure_logging": False,
    }
    if settings.address is None:
        # "local": always a new instance of our own. With None, Ray joins whatever cluster it finds
        # on this machine (RAY_ADDRESS, or the file a `ray start` leaves in /tmp/ray, even a dead one).
        kwargs["address"] = "local"
        kwargs["num_cpus"] = max(settings.cpus or os.cpu_count() or 1, ranks)
    else:
        kwargs["address"] = settings.address
    ray.init(**kwargs)
    return True


def _loopback(address: str) -> bool:
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def disconnect() -> None:
    import ray

    ray.shutdown()


T = TypeVar("T")


class RayHost:
    """Ray for one executor: started (or joined) and ended from one thread that lives until
    `close`. Every method blocks its caller until that thread has done the work.
    """

    def __init__(self, settings: ClusterSettings, *, ranks: int) -> None:
        self.settings = settings
        self.ranks = ranks
        # One worker thread, never retired while the pool is open (unlike anyio's or an idle pool's).
        self._owner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="h3core-ray")
        self.started = False  # whether this host's connection is its own (closed by `close`)

    def _on_owner(self, fn: Callable[[], T]) -> T:
        return self._owner.submit(fn).result()

    def connect(self) -> None:
        """Start or join Ray (a Ray this process already has is joined, and left running by `close`)."""
        self._on_owner(self._connect)

    def close(self) -> None:
        """Shut down what this host started or joined, and end its thread."""
        try:
            if self.started:
                self._on_owner(self._disconnect)
        finally:
            self._owner.shutdown(wait=True)

    def _connect(self) -> None:
        self.started = connect(self.settings, ranks=self.ranks) or self.started

    def _disconnect(self) -> None:
        disconnect()
        self.started = False


def remote_rank():
    """`RankWorker` as a Ray actor class; threaded, so poll/stop/ping answer while a job runs."""
    import ray

    from h3core.executors.distributed.rank import RankWorker

    return ray.remote(max_concurrency=4, max_restarts=0)(RankWorker)
