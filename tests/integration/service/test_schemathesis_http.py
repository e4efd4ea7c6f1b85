"""Schemathesis, every check it has (`--checks all`, nothing excluded), against the live service's
own OpenAPI document: 0 failures.

It runs the schemathesis command line itself (all four phases: examples, coverage, fuzzing and
the stateful links between operations), bounded for CI: 25 examples per operation, one worker,
a fixed seed and deterministic generation. `schemathesis.toml` beside this file gives it one
custom check and one allowance, both explained there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import schemathesis

from tests.integration.service.conftest import Servers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HERE = Path(__file__).parent
OPERATIONS = {
    "GET /v1/jobs",
    "POST /v1/jobs",
    "GET /v1/jobs/{job_id}",
    "PATCH /v1/jobs/{job_id}",
    "POST /v1/jobs/{job_id}/cancel",
    "POST /v1/jobs/{job_id}/retry",
    "GET /v1/jobs/{job_id}/events",
    "GET /v1/jobs/{job_id}/stream",
    "GET /v1/jobs/{job_id}/video",
    "GET /v1/jobs/{job_id}/webhooks",
    "HEAD /v1/jobs/{job_id}/video",
    "POST /v1/uploads",
    "GET /v1/ceilings",
    "GET /v1/nodes",
    "PATCH /v1/nodes/{node_id}",
    "GET /healthz",
    "GET /readyz",
    "GET /metrics",
    "POST /v1/videos",
    "GET /v1/videos",
    "GET /v1/videos/{video_id}",
    "DELETE /v1/videos/{video_id}",
    "GET /v1/videos/{video_id}/content",
    "POST /v1/videos/{video_id}/remix",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # Steps so slow that no generated job finishes (nor renders a video) while the fuzzing runs.
    servers = Servers(tmp_path_factory.mktemp("schemathesis"))
    # No webhook secret: every webhook is refused (422), so nothing is ever sent off this machine.
    server = servers.start({"H3_FAKE_STEP_SECONDS": "30"})
    try:
        yield server
        assert server.running, server.log()
        server.stop(timeout=15)
    finally:
        servers.kill_all()


def test_every_operation_is_in_the_document(server):
    schema = schemathesis.openapi.from_url(f"{server.url}/schema/openapi.json")
    assert {f"{r.ok().method.upper()} {r.ok().path}" for r in schema.get_all_operations()} == OPERATIONS


def test_schemathesis_with_every_check_finds_nothing(server, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCHEMATHESIS_", "H3_"))}
    env["SCHEMATHESIS_HOOKS"] = str(HERE / "schemathesis_hooks.py")
    run = subprocess.run(
        [
            str(Path(sys.executable).with_name("schemathesis")),
            "--config-file",
            str(HERE / "schemathesis.toml"),
            "--no-color",
            "run",
            f"{server.url}/schema/openapi.json",
            "--checks",
            "all",
            "--max-examples",
            "25",
            "--seed",
            "1",
            "--generation-deterministic",
            "--workers",
            "1",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-12000:] + "\n" + server.log()
    assert f"Selected: {len(OPERATIONS)}/{len(OPERATIONS)}" in out and f"Tested: {len(OPERATIONS)}" in out, out[-3000:]
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in out, out[-3000:]
    assert "0 failures" in out or "failures" not in out.rsplit("SUMMARY", 1)[-1].split("Test cases")[0], out[-3000:]
