"""Nodes that share no folder, their videos in a real S3-compatible object store (SeaweedFS,
tests/seaweed.py), their jobs in one PostgreSQL: a video one node made is served by the other
(whole, by range, HEAD, previews, or a redirect to a presigned URL), and a DELETE through either
removes the object for both."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import httpx
import pytest

from tests.factories import png
from tests.integration.service.conftest import Server, Servers, clean_env, submit, wait_job

pytestmark = pytest.mark.timeout(300)


def node(servers: Servers, pg_url: str, s3_env: dict[str, str], name: str, **env: str) -> Server:
    server = servers.make({**s3_env, "H3_NODE": name, **env})
    server.db = pg_url  # type: ignore[assignment]
    server.artifacts = s3_env["H3_ARTIFACTS"]  # type: ignore[assignment]
    server.uploads = s3_env["H3_ARTIFACTS"] + "-uploads"  # type: ignore[assignment]
    return server.start(120)


def test_a_video_made_on_one_node_is_served_by_another_and_a_delete_through_either_removes_it(servers, pg_url, s3_env, seaweed):
    maker = node(servers, pg_url, s3_env, "gpu-1")
    other = node(servers, pg_url, s3_env, "api-1", H3_ROLE="api")
    redirecting = node(servers, pg_url, s3_env, "api-2", H3_ROLE="api", H3_ARTIFACT_SERVING="redirect")
    with maker.client() as a, other.client() as b, redirecting.client() as c:
        # An upload one node takes is admitted by another (its record in the bucket) and run by a third.
        up = b.post("/v1/uploads", content=png(64, 48), headers={"Content-Type": "image/png"})
        assert up.status_code == 201, up.text
        keyed = submit(c, steps=1, mode="fl2va", keyframes={"first": up.json()["id"]})
        assert wait_job(c, keyed["id"])["status"] == "done"

        job = submit(b, steps=2)["id"]
        done = wait_job(b, job)
        assert done["status"] == "done", done
        sha = done["artifact"]["sha256"]
        assert not list(maker.root.glob("artifacts/**/*.mp4")) and not list((maker.root / "staging").rglob("*.mp4"))

        whole = b.get(f"/v1/jobs/{job}/video")
        assert whole.status_code == 200 and hashlib.sha256(whole.content).hexdigest() == sha
        assert a.get(f"/v1/jobs/{job}/video").content == whole.content, "the maker serves the same bytes"
        ranged = b.get(f"/v1/jobs/{job}/video", headers={"Range": "bytes=10-19"})
        assert ranged.status_code == 206 and ranged.content == whole.content[10:20]
        assert ranged.headers["content-range"] == f"bytes 10-19/{len(whole.content)}"
        head = b.head(f"/v1/jobs/{job}/video")
        assert head.headers["etag"] == f'"{sha}"' and head.headers["content-length"] == str(len(whole.content))
        thumb = b.get(f"/v1/videos/{job}/content", params={"variant": "thumbnail"})
        assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/webp", thumb.text

        moved = c.get(f"/v1/jobs/{job}/video")
        assert moved.status_code == 307 and moved.headers["h3-url-expires"], moved.text
        assert moved.headers["location"].startswith(seaweed.endpoint)
        direct = httpx.get(moved.headers["location"], headers={"Range": "bytes=0-99"})
        assert direct.status_code == 206 and direct.content == whole.content[:100], "the presigned URL reads the object"

        said = cli("verify", "--db", pg_url, "--artifacts", s3_env["H3_ARTIFACTS"], env=s3_env)
        assert f"checked 2 videos in {s3_env['H3_ARTIFACTS']} (size and sha256)" in said, said
        said = cli("gc", "--dry-run", "--db", pg_url, "--artifacts", s3_env["H3_ARTIFACTS"], env=s3_env)
        assert "2 files in s3://" in said and "0 not needed" in said, said
        # An upload a killed node left unfinished (not the job's video): gc aborts it.
        bucket, prefix = s3_env["H3_ARTIFACTS"].removeprefix("s3://").split("/", 1)
        s3, key = seaweed.client(), f"{prefix}/{job}/attempt-9.mp4"
        s3.create_multipart_upload(Bucket=bucket, Key=key)
        said = cli("gc", "--db", pg_url, "--artifacts", s3_env["H3_ARTIFACTS"], env=s3_env)
        assert f"removed {job}/attempt-9.mp4.part (0 bytes): the job is done with attempt 1's video" in said, said
        assert not s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads"), "aborted"

        assert b.delete(f"/v1/videos/{job}").status_code == 200
        for client in (a, b, c):
            assert client.get(f"/v1/jobs/{job}/video").status_code == 410
        assert httpx.get(moved.headers["location"]).status_code == 404, "the object itself is gone"
    said = cli("verify", "--db", pg_url, "--artifacts", s3_env["H3_ARTIFACTS"], env=s3_env)
    assert "1 of them deleted" in said and "OK:" in said, said


def cli(*args: str, env: dict[str, str]) -> str:
    """`h3core ARGS` in a process of its own, its output; it must exit 0."""
    done = subprocess.run(
        [sys.executable, "-m", "h3core.cli", *args], env={**clean_env(), **env, "COLUMNS": "200"}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return " ".join(done.stdout.split())
