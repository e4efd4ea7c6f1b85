"""What every part kept in an S3-compatible object store shares: where (`s3://bucket/prefix`), the
client (boto3, made from the environment as every AWS tool makes one), and its "not there"."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

__all__ = ["client_for", "is_missing", "parse_s3_url"]


def client_for() -> Any:
    """A boto3 S3 client as every AWS tool makes one from the environment (AWS_ENDPOINT_URL,
    AWS_REGION, keys or a profile), with path-style addressing, which every S3-compatible server
    takes (a bucket's virtual host needs DNS), and retries with backoff."""
    import boto3
    from botocore.config import Config

    config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 5, "mode": "standard"})
    return boto3.client("s3", config=config)


def is_missing(exc: Exception) -> bool:
    """Whether a client's error says there is no such object (or upload)."""
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError):
        return False
    code = str(exc.response.get("Error", {}).get("Code", ""))
    return code in ("404", "NoSuchKey", "NotFound", "NoSuchUpload")


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket[/prefix]`; ValueError naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ValueError(f"{url!r} is not an s3://bucket/prefix URL")
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r}: an s3:// URL has no query or fragment")
    return parts.netloc, parts.path.strip("/")
