"""`h3core serve --devices 2 --group-size 2` on a CPU: a real server whose pipeline runs on a
two-rank group of Ray actors; it serves jobs after being left idle, survives a rank killed
mid-job and its Ray head lost mid-job, keeps every socket on loopback, and leaves no process
behind when stopped."""

from __future__ import annotations

import ipaddress
import os
import signal
import time

import pytest

from tests.integration.service.conftest import Servers, poll, wait_job

pytest.importorskip("diffusers", reason="the pipeline extra is not installed")
pytest.importorskip("ray", reason="the distributed extra is not installed")
psutil = pytest.importorskip("psutil")
pytestmark = [pytest.mark.timeout(400), pytest.mark.ray]

JOB = {"prompt": "a red fox in snow", "width": 64, "height": 64, "frames": 22, "steps": 3}
# Longer than any thread pool keeps an idle thread (anyio's: 10 s). A head started on such a
# thread is killed when the thread is retired (Ray ties it to that thread with PR_SET_PDEATHSIG).
IDLE_S = 15


def tree(pid: int) -> list:
    return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]


def ranks(pid: int) -> list:
    return [p for p in psutil.Process(pid).children(recursive=True) if _title(p).startswith("ray::RankWorker")]


def _title(p) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def head(pid: int) -> dict[str, psutil.Process]:
    """The essential processes of the Ray head the server started (its children)."""
    out = {}
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if p.name() in ("gcs_server", "raylet") and p.status() != psutil.STATUS_ZOMBIE:
                out[p.name()] = p
        except psutil.Error:
            pass
    return out


def alive(p) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def listening(pid: int) -> set[str]:
    out = set()
    for p in tree(pid):
        try:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    out.add(c.laddr.ip)
        except psutil.Error:
            pass
    return out


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def test_a_two_rank_group_outlives_idleness_a_killed_rank_and_a_lost_ray_head(servers: Servers, tiny_model):
    server = servers.make(
        {
            "H3_EXECUTOR": "pipeline",
            "H3_MODEL_DIR": str(tiny_model),
            "H3_DEVICES": "2",
            "H3_GROUP_SIZE": "2",
            "H3_RANK_THREADS": "1",
            "H3_GROUP_TIMEOUT": "30",
            # Nothing but the head's own probe touches Ray while the server idles.
            "H3_WATCHDOG_INTERVAL": "3600",
            # No retry: a failed attempt ends its job, and the jobs queued behind it show the wait.
            "H3_MAX_ATTEMPTS": "1",
            # Without H3_RAY_ADDRESS the service starts a Ray of its own, whatever Ray's own
            # variable (or a file left by an old `ray start`) says.
            "RAY_ADDRESS": "127.0.0.1:9",
        }
    )
    server.start(timeout=120)
    server.wait_ready(180, "the group to start")
    with server.client() as api:
        (group,) = api.get("/readyz").json()["groups"]
        assert (group["size"], group["state"], group["rebuilds"]) == (2, "ready", 0)
        addresses = listening(server.proc.pid)
        assert addresses and all(loopback(a) for a in addresses), addresses
        first_head = head(server.proc.pid)
        assert set(first_head) == {"gcs_server", "raylet"}, first_head

        # Idle: no request, no ping (the stimulus itself, not a wait for something).
        time.sleep(IDLE_S)
        first = api.post("/v1/jobs", json=JOB).json()
        assert wait_job(api, first["id"], timeout=120)["status"] == "done", server.log()
        assert all(alive(p) for p in first_head.values()), "the Ray head died while the server was idle"
        running = next(e for e in api.get(f"/v1/jobs/{first['id']}/events").json() if e["body"]["type"] == "running")
        assert running["body"]["info"]["groups"] == "2" and running["body"]["info"]["parallel"] == "fsdp+ulysses"

        # A rank killed once a long job is under way: the job fails as executor_lost at once,
        # the group is rebuilt, and the next job runs on it.
        long = api.post("/v1/jobs", json={**JOB, "steps": 400}).json()
        poll(lambda: (api.get(f"/v1/jobs/{long['id']}").json()["step"] or 0) >= 2, 60, "the long job to step")
        ranks(server.proc.pid)[-1].send_signal(signal.SIGKILL)
        lost = wait_job(api, long["id"], timeout=20)
        assert lost["status"] == "failed" and lost["error"]["kind"] == "executor_lost", lost
        assert "of group 0" in lost["error"]["message"], lost
        after = api.post("/v1/jobs", json=JOB).json()
        assert wait_job(api, after["id"], timeout=180)["status"] == "done"
        (group,) = api.get("/readyz").json()["groups"]
        assert group["rebuilds"] == 1 and group["state"] == "ready"
        metrics = api.get("/metrics").text
        assert 'h3core_group_rebuilds_total{group="0"} 1.0' in metrics
        assert 'h3core_group_up{group="0",size="2"} 1.0' in metrics
        assert "h3core_ray_head_up 1.0" in metrics and "h3core_ray_head_losses_total 0.0" in metrics

        # The Ray head's GCS killed mid-job, with a job queued behind: the running job fails as
        # executor_lost within 10 s, the service is not ready (and says why) until Ray is back and
        # the group rebuilt, the queued job waits for that and then runs, and the server lives on.
        long = api.post("/v1/jobs", json={**JOB, "steps": 400}).json()
        queued = api.post("/v1/jobs", json=JOB).json()
        poll(lambda: (api.get(f"/v1/jobs/{long['id']}").json()["step"] or 0) >= 2, 60, "the long job to step")
        gcs = head(server.proc.pid)["gcs_server"]
        gcs.kill()
        lost = wait_job(api, long["id"], timeout=10, what="the job on the lost head to end")
        assert lost["status"] == "failed" and lost["error"]["kind"] == "executor_lost", lost
        assert "Ray head lost" in lost["error"]["message"] and f"pid {gcs.pid}" in lost["error"]["message"], lost
        down = api.get("/readyz")
        assert down.status_code == 503 and "Ray head lost" in down.text, down.text
        metrics = api.get("/metrics").text
        assert "h3core_ray_head_up 0.0" in metrics and "h3core_ray_head_losses_total 1.0" in metrics
        seen = []

        def back() -> bool:
            ready = api.get("/readyz").status_code == 200
            seen.append((ready, api.get(f"/v1/jobs/{queued['id']}").json()["status"]))
            return ready

        poll(back, 180, "Ray and the group to be back", lambda: api.get("/readyz").text + server.log())
        assert all(status == "queued" for ready, status in seen if not ready), seen
        assert wait_job(api, queued["id"], timeout=120)["status"] == "done"
        (group,) = api.get("/readyz").json()["groups"]
        assert group["rebuilds"] == 2 and group["state"] == "ready"
        metrics = api.get("/metrics").text
        assert "h3core_ray_head_up 1.0" in metrics and "h3core_ray_head_losses_total 1.0" in metrics
        second_head = head(server.proc.pid)
        assert set(second_head) == {"gcs_server", "raylet"} and second_head["gcs_server"].pid != gcs.pid
        assert not any(alive(p) for p in first_head.values()), "the lost head's raylet outlived it"
        assert server.running
    pids = [p.pid for p in tree(server.proc.pid)]
    server.stop(timeout=60)
    poll(
        lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids),
        30,
        "every Ray process to exit",
    )


def test_with_a_ray_address_the_groups_are_placed_on_that_cluster(servers: Servers, tiny_model, tmp_path):
    """An operator's Ray (here a head started with `ray start --block`, loopback only): the
    service joins it instead of starting its own, and its ranks run on that cluster's node."""
    import secrets
    import subprocess
    import sys
    from pathlib import Path

    from tests.integration.conftest import clean_env
    from tests.integration.service.conftest import free_port

    port = free_port()
    ray_cli = str(Path(sys.executable).with_name("ray"))
    # The operator's cluster requires a token (Ray's default); the service is given the same one.
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    # Its ranks at normal priority, as docs/operations.md asks of an operator's cluster.
    env = {**clean_env(), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_worker_niceness": "0", **auth}
    head = subprocess.Popen(
        [
            ray_cli,
            "start",
            "--head",
            "--block",
            "--port",
            str(port),
            "--num-cpus",
            "2",
            "--include-dashboard",
            "false",
            "--node-ip-address",
            "127.0.0.1",
        ],
        env=env,
        stdout=open(tmp_path / "head.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        server = servers.make(
            {
                "H3_EXECUTOR": "pipeline",
                "H3_MODEL_DIR": str(tiny_model),
                "H3_DEVICES": "1",
                "H3_RANK_THREADS": "1",
                "H3_RAY_ADDRESS": f"127.0.0.1:{port}",
                **auth,
            }
        )
        server.start(timeout=120)
        server.wait_ready(180, "the group to start")
        with server.client() as api:
            assert not ranks(server.proc.pid), "with an address the service must not start Ray itself"
            assert ranks(head.pid), "the rank should run on the operator's cluster"
            assert {p.nice() for p in ranks(head.pid)} == {os.nice(0)}, "RAY_worker_niceness=0 is how"
            job = api.post("/v1/jobs", json=JOB).json()
            assert wait_job(api, job["id"], timeout=120)["status"] == "done"
        server.stop(timeout=60)
        poll(lambda: not ranks(head.pid), 30, "the service's ranks to leave the cluster when it stops")
        assert head.poll() is None, "stopping the service must leave the operator's cluster running"
    finally:
        head.terminate()
        head.wait(60)
        # `ray start` leaves its address in /tmp/ray for later ray.init() calls; this one is gone.
        left = Path("/tmp/ray/ray_current_cluster")
        if left.exists() and left.read_text().strip() == f"127.0.0.1:{port}":
            left.unlink()
