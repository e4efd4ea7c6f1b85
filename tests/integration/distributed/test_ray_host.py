"""Ray kills a local head when the *thread* that started it ends (Linux PR_SET_PDEATHSIG), and a
pooled thread ends when it is retired for being idle. `RayHost` starts Ray on a thread of its
own that lives until `close`, so a head asked for from a thread that ends lives on. Each case
runs in a process of its own (one Ray per process; this package's tests share another)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from ray.core.generated.gcs_pb2 import GcsNodeInfo

from h3core import LocalArtifactStore
from h3core.domain.topology import Topology
from h3core.executors.distributed import executor as executor_module
from h3core.executors.distributed.cluster import ClusterSettings, RayHost
from h3core.executors.distributed.executor import DistributedExecutor, DistributedSettings
from h3core.executors.distributed.group import Group
from h3core.runtime.logs import fields
from tests.integration.distributed.conftest import until

pytestmark = [pytest.mark.timeout(300), pytest.mark.ray]
ROOT = Path(__file__).resolve().parents[3]


def ask_from_a_thread_that_ends(how: str) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", "tests.integration.distributed.head_owner", how],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    last = run.stdout.strip().splitlines()[-1:] or [""]
    assert run.returncode == 0 and last[0].startswith("{"), f"exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return json.loads(last[0])


def test_a_head_started_on_a_thread_that_ends_dies_with_it():
    assert ask_from_a_thread_that_ends("thread") == {"gcs_alive": False}


def test_a_head_asked_of_a_host_from_a_thread_that_ends_lives_until_the_host_closes():
    assert ask_from_a_thread_that_ends("host") == {
        "answered": True,
        "gcs_alive": True,
        "lost": None,
        "gcs_alive_after_close": False,
    }


# -- noticing a lost head: the probe ------------------------------------------------------------


class _NodeKey:
    def __init__(self, hex_id: str) -> None:
        self.hex_id = hex_id

    def hex(self) -> str:
        return self.hex_id


class _Node:
    """What `RayHost.lost` reads of the node Ray started: its processes that exited."""

    def __init__(self) -> None:
        self.dead: list = []

    def dead_processes(self) -> list:
        return self.dead


class _Gcs:
    """The GCS as the driver's client sees it: each probe gets the next answer (an exception: no answer)."""

    def __init__(self) -> None:
        self.answers: list = []

    def get_all_node_info(self, timeout: float):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class _Probed(RayHost):
    """Connected, as far as its probe can tell, to node "ab" of a GCS whose answers are scripted."""

    def __init__(self) -> None:
        super().__init__(ClusterSettings(), ranks=1)
        self.node, self.gcs = _Node(), _Gcs()
        self._node_id = "ab"
        self.health.address = "127.0.0.1:1"

    def _head(self):
        return self.node, self.gcs


@pytest.fixture
def probed():
    host = _Probed()
    yield host, host.node, host.gcs
    host.close()


def _nodes(state):
    return {_NodeKey("ab"): GcsNodeInfo(state=state)}


def test_the_probe_forgives_a_slow_gcs_but_not_one_that_stopped_answering(probed):
    host, _, gcs = probed
    slow = TimeoutError("Timed out while waiting for GCS to become available.")
    gcs.answers = [slow, slow, _nodes(GcsNodeInfo.ALIVE), slow, slow, slow]
    # Two misses, an answer (which forgives them), then as many misses in a row as it takes.
    seen = [host.lost() for _ in range(host.MISSES * 2)]
    assert seen[: host.MISSES * 2 - 1] == [None] * (host.MISSES * 2 - 1)
    assert seen[-1] is not None and "the GCS at 127.0.0.1:1 did not answer 3 probes in a row" in seen[-1]


def test_the_probe_reports_this_machines_raylet_dead_in_the_gcs(probed):
    host, _, gcs = probed
    gcs.answers = [_nodes(GcsNodeInfo.ALIVE), _nodes(GcsNodeInfo.DEAD), {}]
    assert host.lost() is None
    assert "this machine's raylet (node ab) is not alive" in host.lost()
    assert "this machine's raylet (node ab) is not alive" in host.lost()  # not in the GCS's list at all


def test_a_dead_gcs_server_or_raylet_of_a_head_started_here_is_lost_at_once_but_not_a_dead_dashboard(probed):
    host, node, gcs = probed
    gcs.answers = [_nodes(GcsNodeInfo.ALIVE)]
    node.dead = [("dashboard", SimpleNamespace(pid=7, returncode=1))]
    assert host.lost() is None
    node.dead.append(("gcs_server", SimpleNamespace(pid=8, returncode=-9)))
    assert host.lost() == "gcs_server (pid 8) exited with -9"
    node.dead[-1] = ("raylet", SimpleNamespace(pid=9, returncode=-9))
    assert host.lost() == "raylet (pid 9) exited with -9"


# -- after a lost head: the executor ------------------------------------------------------------


class ScriptedRay(RayHost):
    """A `RayHost` whose Ray is scripted (none is started): `loss` is what the next probe reports;
    a reconnect waits for `allow`, then fails `failures` times before one succeeds."""

    def __init__(self) -> None:
        super().__init__(ClusterSettings(), ranks=2)
        self.loss: str | None = None
        self.allow = threading.Event()
        self.failures = 0
        self.reconnects_tried = 0

    def _connect(self) -> None:
        self.started = True
        self.health.address = "scripted"

    def _disconnect(self) -> None:
        self.started = False

    def _reconnect(self) -> None:
        self.reconnects_tried += 1
        assert self.allow.wait(60)
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the cluster is down")

    def lost(self) -> str | None:
        loss, self.loss = self.loss, None
        return loss


@pytest.mark.anyio
async def test_a_lost_head_makes_the_executor_not_ready_until_ray_is_back_and_every_group_is_rebuilt(
    tiny_model, tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="h3core.executors.distributed")

    def build(group: Group) -> None:  # no Ray here: every build succeeds at once
        group.health.builds += 1
        group.health.rebuilds = group.health.builds - 1
        group.health.state = "ready"

    monkeypatch.setattr(Group, "build", build)
    monkeypatch.setattr(executor_module, "RECONNECT_BACKOFF_S", (0.01, 0.01))
    host = ScriptedRay()
    host.connect()
    settings = DistributedSettings(model_dir=tiny_model, topology=Topology.parse(2, "1", "fsdp+ulysses"), head_check_s=0.01)
    executor = DistributedExecutor(settings, LocalArtifactStore(tmp_path / "a"), lambda u: tmp_path / u, host=host)
    async with executor.running():
        await until(lambda: executor.capabilities().runnable_modes, timeout=30)
        host.failures = 2
        host.loss = "gcs_server (pid 8) exited with -9"
        await until(lambda: host.reconnects_tried == 1, timeout=30)
        # Lost: not ready, saying why; every group is down with the same reason; nothing rebuilt yet.
        caps = executor.capabilities()
        assert not caps.runnable_modes
        assert caps.mode("t2va").reason == "Ray head lost: gcs_server (pid 8) exited with -9; reconnecting"
        assert [(g.state, g.last_error) for g in executor.health()] == [
            ("dead", "Ray head lost: gcs_server (pid 8) exited with -9")
        ] * 2
        head = executor.head()
        assert (head.state, head.losses, head.reconnects) == ("reconnecting", 1, 0)
        host.allow.set()
        await until(lambda: executor.capabilities().runnable_modes, timeout=30)
        assert host.reconnects_tried == 3  # two that failed, then one that worked
        head = executor.head()
        assert (head.state, head.losses, head.reconnects) == ("up", 1, 1)
        assert "reconnecting failed (ConnectionError: the cluster is down)" in head.last_error
        await until(lambda: all(g.state == "ready" for g in executor.health()), timeout=30)
        assert [g.rebuilds for g in executor.health()] == [1, 1]
    assert host.started  # a host the executor was given is left to its owner
    host.close()
    said = [
        (r.levelname, r.getMessage().split(";")[0], fields(r)) for r in caplog.records if r.name == "h3core.executors.distributed"
    ]
    reason = "Ray head lost: gcs_server (pid 8) exited with -9"
    assert said == [
        ("WARNING", reason, {"reason": reason}),
        ("WARNING", reason, {"reason": reason, "error": "ConnectionError: the cluster is down"}),
        ("WARNING", reason, {"reason": reason, "error": "ConnectionError: the cluster is down"}),
        ("INFO", "Ray reconnected (scripted)", {"address": "scripted"}),
    ]
