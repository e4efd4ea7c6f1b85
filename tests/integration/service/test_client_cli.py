"""The client side of the CLI (`submit --watch`, `cancel`) and the settings file, against a real server."""

from __future__ import annotations

import hashlib
import subprocess
import sys

from tests.integration.conftest import clean_env, poll
from tests.integration.service.conftest import Servers


# A bound on a loaded machine, not a measure: a command that imports torch can take a minute there.
def h3(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "h3core.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**clean_env(), "COLUMNS": "120", **(env or {})},
    )


def test_submit_watch_follows_the_job_and_downloads_its_video(api_server, tmp_path):
    out = tmp_path / "fox.mp4"
    run = h3(
        "submit",
        "--url",
        api_server.url,
        "--prompt",
        "a red fox",
        "--width",
        "448",
        "--height",
        "256",
        "--frames",
        "24",
        "--steps",
        "4",
        "--quality",
        "fast",
        "--watch",
        "--download",
        str(out),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "done in" in run.stdout and f"saved {out}" in run.stdout
    sha = run.stdout.split("sha256 ")[1].split(")")[0]
    assert hashlib.sha256(out.read_bytes()).hexdigest() == sha
    job_id = run.stdout.split("job ", 1)[1].split()[0]
    with api_server.client() as client:
        assert client.get(f"/v1/jobs/{job_id}").json()["request"]["quality"] == "fast"


def test_submit_reports_a_refusal_with_the_ceiling_and_a_failure_with_how_to_replay_it(api_server):
    refused = h3("submit", "--url", api_server.url, "--prompt", "x", "--frames", "900")
    assert refused.returncode == 2 and "ceiling: 430 frames (vram)" in refused.stderr
    failed = h3(
        "submit",
        "--url",
        api_server.url,
        "--prompt",
        "x [fake fail_at=2 kind=oom]",
        "--steps",
        "3",
        "--width",
        "448",
        "--height",
        "256",
        "--frames",
        "24",
        "--watch",
    )
    assert failed.returncode == 1 and "failed: oom" in failed.stdout and "h3core replay" in failed.stdout


def test_cancel_through_the_service(api_server):
    with api_server.client() as api:
        job = api.post(
            "/v1/jobs", json={"prompt": "long [fake step=0.2]", "width": 448, "height": 256, "frames": 24, "steps": 100}
        ).json()
        poll(lambda: api.get(f"/v1/jobs/{job['id']}").json()["status"] == "running", 20, "the job to start")
        run = h3("cancel", job["id"], "--url", api_server.url)
        assert run.returncode == 0 and ("cancel requested" in run.stdout or "cancelled" in run.stdout), run.stdout
        poll(lambda: api.get(f"/v1/jobs/{job['id']}").json()["status"] == "cancelled", 20, "the job to end")
    again = h3("cancel", job["id"][:12], "--url", api_server.url)  # the start of an id, as `submit --watch` shows it
    assert again.returncode == 2 and "409" in again.stderr, "found by its start: the job that has ended"
    unknown = h3("cancel", "ffffffffffff", "--url", api_server.url)
    assert unknown.returncode == 2 and "404" in unknown.stderr


def test_settings_come_from_a_toml_file_below_the_environment(tmp_path):
    config = tmp_path / "h3core.toml"
    config.write_text('slots = 3\nfake_step_seconds = 0.01\ncapacity_profile = "/nonexistent.toml"\n')
    servers = Servers(tmp_path)
    try:
        # The file's bad profile path is named in the error: the file is read.
        server = servers.make({"H3_CONFIG": str(config)})
        server.launch()
        assert server.wait(20) == 2 and "/nonexistent.toml" in server.log()
        # The environment wins over the file.
        from importlib import resources

        profile = tmp_path / "profile.toml"
        profile.write_text(resources.files("h3core.profiles").joinpath("4x2080ti-sage-fp16.toml").read_text())
        server = servers.make({"H3_CONFIG": str(config), "H3_CAPACITY_PROFILE": str(profile)}).start()
        server.stop()
        # A key the settings do not know is refused, by name.
        config.write_text("slots = 3\nbogus = 1\n")
        server = servers.make({"H3_CONFIG": str(config)})
        server.launch()
        assert server.wait(20) == 2 and "unknown setting(s) ['bogus']" in server.log()
    finally:
        servers.kill_all()
