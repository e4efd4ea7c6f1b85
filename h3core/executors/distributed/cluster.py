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
take the head down with it. The host also says when the head is lost (`lost`) and starts or
joins it again (`reconnect`).
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from h3core.executors.reports import HeadHealth

LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Ray's core installs a C++ failure-signal handler in the process that calls ray.init; it takes
# SIGTERM before the service's own graceful-shutdown handler. The service stops itself.
NO_SIGNAL_HANDLER = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"
# Ray's core worker ends the whole process (std::_Exit) once the GCS has been unreachable this
# long (60 s by default): the service would die with its head. It outlives the head instead (the
# host notices the loss and reconnects), so the patience is ten years.
GCS_PATIENCE = "RAY_gcs_rpc_server_reconnect_timeout_s"
GCS_PATIENCE_S = 10 * 365 * 24 * 3600
# The head's processes without which nothing runs (the others: dashboard, log monitor, ...).
ESSENTIAL = ("gcs_server", "raylet")
# The ranks' niceness on a head h3core starts (an operator's `ray start`: RAY_worker_niceness=0).
RANK_NICENESS = 0
# Collective libraries pick an interface from the host name unless told; a group is on one node.
RANK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


@dataclass(frozen=True)
class ClusterSettings:
    """Which Ray to use: an operator's cluster at `address`, or (None) a local one on loopback with
    `cpus` logical CPUs."""

    address: str | None = None  # None: a local Ray on loopback
    cpus: int | None = None  # logical CPUs of a local Ray (None: this machine's, at least one per rank)


def connect(settings: ClusterSettings, *, ranks: int) -> bool:
    """Start or join Ray unless this process already has; True if this call started it.

    A local Ray's head lives as long as the thread that calls this: call it on a thread that
    lives as long as Ray should (`RayHost` does), never on a pooled one.
    """
    os.environ.setdefault(NO_SIGNAL_HANDLER, "1")
    # Read by the core worker when ray.init starts it, so also after `ray` was imported.
    os.environ[GCS_PATIENCE] = str(GCS_PATIENCE_S)
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
        # Ray starts its workers at nice 15, for a laptop's sake; here the ranks are the work, and
        # at 15 any busy process at normal priority starves them (bench.studies.rank_priority: a group
        # built in 268 s beside two busy loops on 2 cores; at 0, in 16.5 s).
        kwargs["_system_config"] = {"worker_niceness": RANK_NICENESS}
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
    """Leave Ray (`ray.shutdown`): a head this process started ends with it."""
    import ray

    ray.shutdown()


T = TypeVar("T")


class RayHost:
    """Ray for one executor: started (or joined), probed, restarted and ended from one thread
    that lives until `close`. Every method blocks its caller until that thread has done the work.
    """

    # A GCS that does not answer a probe within PROBE_TIMEOUT_S this many times in a row is lost
    # (one slow answer on a loaded machine is not); a dead essential process is lost at once.
    PROBE_TIMEOUT_S = 4.0
    MISSES = 3

    def __init__(self, settings: ClusterSettings, *, ranks: int) -> None:
        self.settings = settings
        self.ranks = ranks
        # One worker thread, never retired while the pool is open (unlike anyio's or an idle pool's).
        self._owner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="h3core-ray")
        self.started = False  # whether this host's connection is its own (closed by `close`)
        self.health = HeadHealth()
        self._node_id: str | None = None
        self._misses = 0

    def _on_owner(self, fn: Callable[[], T]) -> T:
        return self._owner.submit(fn).result()

    @property
    def outage(self) -> str | None:
        """Why the head is lost, from `begin_outage` until a `reconnect` succeeds (else None)."""
        h = self.health
        return h.last_error if h.state in ("lost", "reconnecting") else None

    def connect(self) -> None:
        """Start or join Ray (a Ray this process already has is joined, and left running by `close`)."""
        self.health.state = "connecting"
        try:
            self._on_owner(self._connect)
        except BaseException as exc:
            self.health.state, self.health.last_error = "down", f"{type(exc).__name__}: {exc}"[:500]
            raise
        self.health.state = "up"

    def begin_outage(self, reason: str) -> None:
        """The head is lost (`reason`, from `lost`): `outage` says so until a reconnect succeeds."""
        h = self.health
        h.last_error = reason
        h.losses += 1
        h.state = "lost"

    def reconnect(self) -> None:
        """Drop the connection to a lost head and start (local) or join (an address) Ray again."""
        self.health.state = "reconnecting"
        self._on_owner(self._reconnect)
        self.health.reconnects += 1
        self.health.state = "up"

    def close(self) -> None:
        """Shut down what this host started or joined, and end its thread."""
        try:
            if self.started:
                self._on_owner(self._disconnect)
        finally:
            self._owner.shutdown(wait=True)
            self.health.state = "down"

    def _connect(self) -> None:
        self.started = connect(self.settings, ranks=self.ranks) or self.started
        import ray  # after `connect`: it sets what Ray reads when it is imported
        from ray._private import worker

        self.health.address = worker._global_node.gcs_address if worker._global_node else None
        self._node_id = ray.get_runtime_context().get_node_id()
        self._misses = 0

    def _reconnect(self) -> None:
        self._disconnect()
        self._connect()

    def _disconnect(self) -> None:
        disconnect()
        self.started = False

    def _head(self) -> tuple[Any, Any] | None:
        """Ray's node in this process (its `dead_processes()`) and its GCS client; None: not connected."""
        from ray._private import worker

        node = worker._global_node
        if node is None or not worker.global_worker.connected:
            return None
        return node, worker.global_worker.gcs_client

    def lost(self) -> str | None:
        """Why the head is lost (None: it answers). Any thread; one probe takes at most PROBE_TIMEOUT_S."""
        # protobuf's generated module makes its message classes at import: mypy sees none of them.
        from ray.core.generated.gcs_pb2 import GcsNodeInfo  # type: ignore[attr-defined]

        try:
            head = self._head()
            if head is None:
                return "this process is not connected to Ray"
            node, gcs = head
            # A head this process started: its processes are ours to watch, and their end is certain.
            dead = [f"{kind} (pid {p.pid}) exited with {p.returncode}" for kind, p in node.dead_processes() if kind in ESSENTIAL]
            if dead:
                return "; ".join(dead)
            nodes = gcs.get_all_node_info(timeout=self.PROBE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - any failure to get an answer is a miss
            self._misses += 1
            if self._misses < self.MISSES:
                return None
            return f"the GCS at {self.health.address} did not answer {self._misses} probes in a row: {type(exc).__name__}: {exc}"[
                :500
            ]
        self._misses = 0
        ours = next((info for node_id, info in nodes.items() if node_id.hex() == self._node_id), None)
        if ours is None or ours.state != GcsNodeInfo.ALIVE:
            return f"this machine's raylet (node {str(self._node_id)[:12]}) is not alive in the GCS at {self.health.address}"
        return None


def remote_rank():
    """`RankWorker` as a Ray actor class; threaded, so poll/stop/ping answer while a job runs."""
    import ray

    from h3core.executors.distributed.rank import RankWorker

    return ray.remote(max_concurrency=4, max_restarts=0)(RankWorker)
