"""The suite's S3 server (tests/seaweed.py, the `seaweed` and `s3_url` fixtures) does what the
S3-backed artifact store relies on: ranged reads, object metadata, conditional puts, copies,
multipart uploads listed and aborted, presigned GETs; and it leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import httpx
import psutil
import pytest
from botocore.exceptions import ClientError

from tests.seaweed import NoSeaweed, SeaweedServer, running_seaweed, s3_client

DATA = bytes(range(256)) * 64  # 16 KiB


def split(url: str) -> tuple[str, str]:
    """`s3://bucket/prefix` as (bucket, prefix)."""
    assert url.startswith("s3://"), url
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix


def test_a_fresh_place_is_empty_and_keeps_bytes_metadata_and_ranges(seaweed: SeaweedServer, s3_url: str):
    bucket, prefix = split(s3_url)
    assert prefix and s3_url != seaweed.fresh_url()
    s3 = s3_client(seaweed)
    assert s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["KeyCount"] == 0
    key = f"{prefix}/job/attempt-1.mp4"
    s3.put_object(Bucket=bucket, Key=key, Body=DATA, Metadata={"sha256": "abc", "attempt": "1"})

    got = s3.get_object(Bucket=bucket, Key=key, Range="bytes=100-299")
    assert got["Body"].read() == DATA[100:300] and got["ContentRange"] == f"bytes 100-299/{len(DATA)}"
    assert s3.head_object(Bucket=bucket, Key=key)["Metadata"] == {"sha256": "abc", "attempt": "1"}

    with pytest.raises(ClientError) as refused:  # create-only: a second writer of the same key loses
        s3.put_object(Bucket=bucket, Key=key, Body=b"other", IfNoneMatch="*")
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"

    s3.copy_object(Bucket=bucket, Key=f"{prefix}/copy.mp4", CopySource={"Bucket": bucket, "Key": key})
    assert s3.head_object(Bucket=bucket, Key=f"{prefix}/copy.mp4")["Metadata"]["sha256"] == "abc"


def test_multipart_uploads_are_listed_under_their_prefix_and_aborted(seaweed: SeaweedServer, s3_url: str):
    bucket, prefix = split(s3_url)
    s3 = s3_client(seaweed)
    upload = s3.create_multipart_upload(Bucket=bucket, Key=f"{prefix}/big.mp4")["UploadId"]
    s3.upload_part(Bucket=bucket, Key=f"{prefix}/big.mp4", UploadId=upload, PartNumber=1, Body=DATA)

    listed = s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix + "/").get("Uploads", [])
    assert [(u["Key"], u["UploadId"]) for u in listed] == [(f"{prefix}/big.mp4", upload)]
    other = seaweed.fresh_url()  # another test's place in the same bucket sees none of it
    assert not s3.list_multipart_uploads(Bucket=bucket, Prefix=split(other)[1] + "/").get("Uploads")

    s3.abort_multipart_upload(Bucket=bucket, Key=f"{prefix}/big.mp4", UploadId=upload)
    assert not s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix + "/").get("Uploads")
    assert s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["KeyCount"] == 0


def test_a_presigned_get_serves_the_object_and_a_fresh_bucket_is_empty(seaweed: SeaweedServer):
    bucket = seaweed.fresh_bucket()
    s3 = s3_client(seaweed)
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    s3.put_object(Bucket=bucket, Key="v.mp4", Body=DATA, ContentType="video/mp4")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "v.mp4"}, ExpiresIn=60)
    assert url.startswith(f"{seaweed.endpoint}/{bucket}/v.mp4?")
    with httpx.Client(trust_env=False) as http:  # no proxy between the test and 127.0.0.1
        whole = http.get(url)
        part = http.get(url, headers={"Range": "bytes=0-9"})
        tampered = http.get(url.replace("v.mp4", "w.mp4"))
    assert whole.status_code == 200 and whole.content == DATA and whole.headers["content-type"] == "video/mp4"
    assert part.status_code == 206 and part.content == DATA[:10]
    assert tampered.status_code == 403


def test_a_client_given_only_the_environment_reaches_the_server(aws_environ: SeaweedServer, s3_env: dict[str, str]):
    import boto3

    bucket, prefix = split(s3_env["H3_ARTIFACTS"])
    s3_client(aws_environ).put_object(Bucket=bucket, Key=f"{prefix}/a", Body=b"x")
    assert s3_env.items() >= {k: os.environ[k] for k in aws_environ.env()}.items()  # what a child would be given
    from_env = boto3.client("s3")  # endpoint, keys and region from AWS_* alone
    assert from_env.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["KeyCount"] == 1


def test_a_server_leaves_no_process_folder_or_socket_behind():
    with running_seaweed() as server:
        s3_client(server).put_object(Bucket=server.fresh_bucket(), Key="a", Body=b"x")
        sockets = [Path(f"/tmp/seaweedfs-{role}-grpc-{server.ports[f'{role}.port.grpc']}.sock") for role in ("master", "s3")]
        assert all(s.exists() for s in sockets)
    with contextlib.suppress(psutil.NoSuchProcess):  # its pid, if already reused, is not a weed
        assert psutil.Process(server.pid).name() != "weed"
    assert not server.folder.exists() and not any(s.exists() for s in sockets)


def test_a_missing_binary_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("H3_WEED_BIN", str(tmp_path / "weed"))
    with pytest.raises(NoSeaweed, match=f"no SeaweedFS binary at {tmp_path / 'weed'}"), running_seaweed():
        pass
