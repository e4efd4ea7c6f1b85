"""The new user's path with real diffusion: `h3core serve` with no settings serves the pipeline
executor on a tiny random MiniMax-H3 it writes beside the store; submit, watch, download, replay."""

from __future__ import annotations

import av
import pytest

from tests.integration.service.conftest import DEFAULT_SERVER, Server, Servers
from tests.integration.service.openai_sdk import (
    IGNORE_SDK_DEPRECATION,
    create_to_completed,
    delete_finished_keeps_the_log,
    delete_running_cancels_it,
    refusals,
    remix_to_completed,
    sdk,
)
from tests.integration.service.test_client_cli import h3

pytest.importorskip("diffusers", reason="the pipeline extra is not installed")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def tiny_server(default_server: Server) -> Server:
    return default_server


@DEFAULT_SERVER
def test_the_default_server_runs_real_diffusion_on_the_tiny_model(tiny_server: Server, tmp_path):
    server = tiny_server
    assert (server.root / "h3-tiny-model" / "h3core-model.json").exists()
    with server.client() as api:
        probe = {row["kernel"]: row for row in api.get("/readyz").json()["attention"]}
        assert probe["flash"]["verdict"] == "chosen" and probe["flash"]["error"] < 1e-5 and probe["flash"]["ms"] > 0
        assert probe["efficient"] == {**probe["efficient"], "verdict": "unsupported", "ms": None}
        metrics = api.get("/metrics").text
        assert 'h3core_attention_kernel{kernel="flash"} 1.0' in metrics
        assert 'h3core_attention_probe_verdict{kernel="cudnn",verdict="unsupported"} 1.0' in metrics
        out = tmp_path / "fox.mp4"
        run = h3(
            "submit",
            "--url",
            server.url,
            "--prompt",
            "a red fox on the command line",
            "--width",
            "64",
            "--height",
            "64",
            "--frames",
            "22",
            "--steps",
            "3",
            "--watch",
            "--download",
            str(out),
            timeout=120,
        )
        assert run.returncode == 0, run.stdout + run.stderr + server.log()
        job_id = next(
            j["id"] for j in api.get("/v1/jobs").json()["items"] if j["request"]["prompt"] == "a red fox on the command line"
        )
        events = api.get(f"/v1/jobs/{job_id}/events").json()
    assert [e["body"]["type"] for e in events] == ["submitted", "admitted", "running", "progress", "progress", "progress", "done"]
    assert events[2]["body"]["executor"] == "pipeline" and events[2]["body"]["info"]["attention"] == "flash (asked auto)"
    with av.open(str(out)) as c:
        assert sum(1 for _ in c.decode(video=0)) == 22
        assert c.streams.audio[0].channels == 2
    replay = h3("replay", job_id, "--db", str(server.db))
    assert replay.returncode == 0 and "done" in replay.stdout, replay.stdout + replay.stderr


@DEFAULT_SERVER
@IGNORE_SDK_DEPRECATION
def test_the_openai_sdk_round_trip_on_the_tiny_model(tiny_server: Server):
    client = sdk(tiny_server)
    video = create_to_completed(client, size="64x64", seconds="0.917", frames=22, steps=3)  # 22 frames: 17n + 5
    remix_to_completed(client, video, timeout=120)
    delete_running_cancels_it(
        client, timeout=120, prompt="a fox that takes long", size="64x64", seconds="0.917", extra_body={"steps": 1000}
    )
    delete_finished_keeps_the_log(client, video)
    refusals(client)


def test_pipeline_settings_that_cannot_work_stop_the_server_with_the_setting_named(servers: Servers, tmp_path):
    (tmp_path / "weights").mkdir()
    bad_dir = h3("serve", "--port", "0", "--db", str(tmp_path / "a.db"), "--model-dir", str(tmp_path / "weights"))
    assert bad_dir.returncode == 2 and "model_dir" in bad_dir.stderr and "lacks transformer" in bad_dir.stderr
    made = h3("model", "make-tiny", str(tmp_path / "tiny"))
    assert made.returncode == 0 and "serve it with --model-dir" in made.stderr, made.stderr
    again = h3("model", "make-tiny", str(tmp_path / "tiny"))
    assert again.returncode == 2 and "not empty" in again.stderr
    sage = h3(
        "serve",
        "--port",
        "0",
        "--db",
        str(tmp_path / "b.db"),
        "--attention",
        "sage-fp16",
        env={"H3_MODEL_DIR": str(tmp_path / "tiny")},
    )
    said = "attention/device: attention 'sage-fp16' cannot run here: sage-fp16 needs a CUDA device, not cpu"
    assert sage.returncode == 2 and said in sage.stderr, sage.stderr
    slots = h3("serve", "--port", "0", "--db", str(tmp_path / "c.db"), "--slots", "2")
    assert slots.returncode == 2 and "slots" in slots.stderr
