"""HTTP service load test on loopback: status polls and submits against `h3core serve`.

    python -m bench.throughput.http_load --workdir /tmp/h3bench            # 100k stored jobs, 64 pollers, 8 submitters, 20 s
    python -m bench.throughput.http_load --jobs 5000 --seconds 5 --workdir /tmp/h3bench-small   # a quick look (a minute)
    python -m bench.throughput.http_load --workdir /tmp/h3bench --breakdown 2000     # + each step of a GET/POST timed alone
    python -m bench.throughput.http_load --workdir /tmp/h3bench --poll-every 0.5 --passes "pollers only,mixed"  # paced pollers
    python -m bench.throughput.http_load --workdir /tmp/h3bench --split   # two processes: H3_ROLE=runner and H3_ROLE=api
    python -m bench.throughput.http_load --workdir /tmp/h3bench --passes "" --profile mixed --seconds 10   # server under cProfile

The store: `--jobs` finished jobs (default 100,000), each a full log as the runner writes it
(`Submitted`, `Admitted`, `Running`, 5 x `Progress`, `Done`, 64x64x24 requests), written through
`SQLiteEventStore(durable=False).import_events` in batches of 5,000 jobs (about 35 s for 100,000
jobs, 900,000 events, 350 MiB). It is cached in `--workdir` as `http-j<jobs>-s5-v<n>.db` with a
`.json` beside it and reused when its job count matches; opening it migrates it to the current
schema. Each pass runs on a fresh copy, so every pass starts from the same file and the cache never
holds a pass's jobs.

The server is the real one: `python -m h3core.cli serve --port P --db DB --artifacts D --uploads U`
in a subprocess, with `H3_EXECUTOR=fake`, `H3_FAKE_STEP_SECONDS=0` (no time per step; it still
writes each job's mp4 with fsync) and `H3_SLOTS=--slots`, every other `H3_*` variable removed from
its environment. The default is 16 slots: with a zero-time executor a job holds its slot only for
the runner's own round trips (the claim, the artifact write, the terminal commit), so the slots are
how many of those overlap (bench/RESULTS.md has the runs that chose 16, and 32 with --split). Its
store is `durable=True` (the service's default). The port comes from binding 127.0.0.1:0; the bench
waits for `GET /healthz` and stops the server with SIGTERM after the pass. The store copy is
flushed to disk (`os.sync()`) before the server starts, so the kernel's writeback of 350 MiB does
not land on the pass's fsyncs (it did: one pass in three ran at half speed).

--split: the service as two processes on the pass's store, started the way docs/operations.md
describes: `H3_ROLE=runner` (the runner and the fake executor, no HTTP, `H3_POLL_INTERVAL=0.05`),
then `H3_ROLE=api` (the HTTP API, which stores submits and follows the store for the runner's
events). The load goes to the api process once its `/readyz` is 200 (a runner process holds the
lock). Server CPU is the two processes' sum. `--profile` passes run one process whatever --split says.

The client runs in this process: anyio (asyncio) with one `aiohttp.ClientSession` (one keep-alive
HTTP/1.1 connection) per loop. It was `httpx.AsyncClient` until 2026-11-30, which cost several
times the CPU per GET (bench/RESULTS.md): figures taken with httpx are lower for that reason alone.
Client and server share the same cores: every request the client makes costs CPU the server does
not get; the CPU table shows the split.

Passes: each is `--warmup` seconds of load, not counted, then the measured `--seconds` window.
- mixed: `--pollers` loops of `GET /v1/jobs/{id}` on random stored job ids (closed loop: the next
  request goes out as soon as the last one is answered; `--poll-every S` paces each poller to one
  request every S seconds instead), and at the same time `--submitters` loops posting
  `{"prompt": "bench", "width": 64, "height": 64, "frames": 24, "steps": 5}` to `/v1/jobs`;
- pollers only, submits only: the same loops alone, so the interference is visible.

Figures:
- Status polls: requests answered 200 that were sent and answered inside the window; requests/s;
  latency p50/p90/p99/max, measured in the client from send to the whole response. With
  closed-loop pollers, mean latency = pollers / requests per second (Little's law): the p99 target
  is then a throughput target.
- Submits: the same for `POST /v1/jobs` answered 201.
- End to end, read from the pass's store file after the server stopped: done in window (submitted
  jobs whose `finished_at`, server clock, falls inside the window); e2e jobs/s (that / window);
  submit->done (`finished_at - created_at` of those jobs); not done at window end (submitted jobs,
  warm-up included, still queued or running when the window closed: the backlog the submitters
  built); then, no load (after the window the server runs on for `--drain` seconds with no request
  at all, and the jobs it finishes per second show what the runner does alone; `>=` when the
  backlog ran out first).
- CPU: server CPU/wall (utime + stime of the server process from `/proc/PID/stat`, every thread),
  client CPU/wall (this process), their sum against the cores there are, and the server's CPU per
  HTTP request answered (with submits, that includes the runner's work for the jobs).
- Against the targets: p99 status latency < 20 ms at 64 pollers; >= 300 jobs/s end to end.

--breakdown N: after the passes, in this process, on a copy of the store and with the runner not
started, each step of a status read timed alone, N calls each: the SQL, the `JobState` parse,
`store.get`, the `JobView`, the JSON body as Litestar renders it, the thread hop the handler makes
(`anyio.to_thread.run_sync`) and the one Litestar makes for a sync guard, then the whole Litestar
app called directly as ASGI (one at a time, and `--pollers` at a time); and for a submit, the whole
app (one fsync'd append each), the admission decision and `store.queue_position`. Wall p50/p99 and
CPU per call (this process, all threads). The steps do not simply add up (a thread hop is cheaper
when the worker threads are busy; concurrent calls contend for the GIL), and the whole-app rows
leave out uvicorn, its HTTP parser (httptools with uvicorn[standard]) and the sockets; the server's
own CPU per GET in the pollers-only pass is printed under the table for comparison.

--profile PASS: one more pass of that kind with the server run by bench.throughput._serve_profiled
instead of `h3core serve`: the same app (`create_app` with settings from the same flags and
environment) on uvicorn with the same options, with a `cProfile.Profile(time.thread_time)` in the
event loop thread and in every thread started after it (anyio's worker threads: store reads,
appends), so each thread's CPU time is counted and time blocked on a lock, a socket or an fsync is
not. The server stops when its stdin closes and writes the merged profile to
`WORKDIR/server-<pass>.prof`. Printed: the top `--top` functions by own time, own time by package,
and h3core's and the service's functions by cumulative time. cProfile slows Python code several
times over (function-call-heavy code the most), so read the shares, not the times, and not the
pass's own figures.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import anyio
import httpx

from bench.common import ROOT, console, ms, parse, pct, print_load_at_end, print_machine, rate, show, table, version
from h3core import (
    Admitted,
    Artifact,
    Done,
    Event,
    GenerationRequest,
    Progress,
    RetryPolicy,
    Running,
    SQLiteEventStore,
    Submitted,
)
from h3core.adapters.store.sqlite import SCHEMA_VERSION

# Bump when the shape of the built store changes, so a cached file is not reused.
HTTP_BUILD_VERSION = 1
SUBMIT_BODY = {"prompt": "bench", "width": 64, "height": 64, "frames": 24, "steps": 5}
STORED_STEPS = SUBMIT_BODY["steps"]
TARGET_P99_S = 0.020
TARGET_POLLERS = 64
TARGET_JOBS_S = 300


# -- the stored jobs -------------------------------------------------------------------------


def finished_job(n: int, t0: datetime) -> list[Event]:
    """One finished job's log as the runner writes it: Submitted, Admitted, Running, Progress x
    STORED_STEPS, Done; the request is the one the submitters send (with its own seed)."""
    job_id = uuid.UUID(int=random.Random(n).getrandbits(128)).hex
    req = GenerationRequest(prompt=f"bench job {n}", width=64, height=64, frames=24, steps=STORED_STEPS, seed=n)
    bodies = [
        Submitted(request=req, retry=RetryPolicy()),
        Admitted(tokens=1_000 + n % 1000),
        Running(attempt=1, executor="fake", executor_ref=f"fake-{job_id}-1", info={"plan": "finish"}),
        *[Progress(step=s, total=STORED_STEPS) for s in range(1, STORED_STEPS + 1)],
        Done(artifact=Artifact(path=f"{job_id}/attempt-1.mp4", bytes=23_456, sha256=f"{n:064x}", frames=24, duration_s=1.0)),
    ]
    return [Event(job_id=job_id, seq=i + 1, at=t0 + timedelta(milliseconds=10 * i), body=b) for i, b in enumerate(bodies)]


def build_store(path: Path, jobs: int, batch_jobs: int = 5_000) -> dict:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    store = SQLiteEventStore(path, durable=False)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    t_start = last_print = time.perf_counter()
    events = 0
    try:
        for first in range(0, jobs, batch_jobs):
            pending = [
                e for n in range(first, min(jobs, first + batch_jobs)) for e in finished_job(n, base + timedelta(seconds=n))
            ]
            events += store.import_events(pending)
            now = time.perf_counter()
            if now - last_print > 10:
                console.print(f"  built {first + batch_jobs:,} / {jobs:,} jobs ({events / (now - t_start):,.0f} events/s)")
                last_print = now
        counts = store.counts()
    finally:
        store.close()  # the last connection to close checkpoints the WAL into the file
    if counts != {"done": jobs}:
        raise SystemExit(f"built store has {counts}, expected {jobs} done jobs")
    return {"jobs": jobs, "events": events, "build_s": time.perf_counter() - t_start}


def cached_store(workdir: Path, jobs: int) -> tuple[Path, dict, bool]:
    path = workdir / f"http-j{jobs}-s{STORED_STEPS}-v{HTTP_BUILD_VERSION}.db"
    meta_path = path.with_suffix(".json")
    if path.exists() and meta_path.exists() and not Path(f"{path}-wal").exists():
        meta = json.loads(meta_path.read_text())
        store = SQLiteEventStore(path, durable=False)  # migrates a file built by an older schema
        try:
            ok = store.counts() == {"done": jobs} == {"done": meta["jobs"]}
        finally:
            store.close()
        if ok:
            return path, meta, True
        console.print(f"cached {path.name} does not match its metadata; rebuilding")
    meta_path.unlink(missing_ok=True)
    console.print(f"building {path} ({jobs:,} finished jobs) ...")
    meta = build_store(path, jobs)
    meta_path.write_text(json.dumps(meta))
    return path, meta, False


def stored_ids(path: Path) -> tuple[list[str], int]:
    store = SQLiteEventStore(path, durable=False)
    try:
        ids = store.job_ids()
        newest = store.list_jobs(limit=1)[0][0]  # queue_order of the last stored job
    finally:
        store.close()
    return ids, newest


# -- the server ------------------------------------------------------------------------------


def _http_impl() -> str:
    """What `h3core serve` runs on: uvicorn's "auto" picks uvloop and httptools when installed."""
    from importlib.util import find_spec

    loop = "uvloop" if find_spec("uvloop") else "asyncio"
    http = "httptools" if find_spec("httptools") else "h11"
    return f"{loop} + {http}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    db: Path
    root: Path
    slots: int
    profile: Path | None = None
    role: str = "all"  # H3_ROLE: "runner" has no HTTP (and is started before its "api" partner)
    code: Path = ROOT  # the checkout whose h3core runs (bench.studies.submit runs an older one beside this)
    env: dict[str, str] = field(default_factory=dict)  # more H3_* settings (bench.throughput.readyz: H3_READY_CACHE)
    artifacts: str = ""  # --artifacts: a folder or an s3:// URL (bench.throughput.artifacts); default root/artifacts
    wrapper: tuple[str, ...] = ()  # a command the server runs under (bench.studies.submit_ir: valgrind)
    port: int = 0
    proc: subprocess.Popen | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.root / f"server-{self.role}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60, probe: str | None = None) -> None:
        """Start and wait for `probe` (default: /readyz in the api role, whose runner is elsewhere; else /healthz)."""
        probe = probe or ("readyz" if self.role == "api" else "healthz")
        env = {k: v for k, v in os.environ.items() if not k.startswith("H3_")}
        # The checkout's h3core first; this one's bench package after it, for the profiled server (a module of it).
        pythonpath = os.pathsep.join(dict.fromkeys([str(self.code), *([str(ROOT)] if self.profile else [])]))
        env.update(H3_EXECUTOR="fake", H3_FAKE_STEP_SECONDS="0", H3_SLOTS=str(self.slots), PYTHONPATH=pythonpath)
        env.update(H3_ROLE=self.role, H3_POLL_INTERVAL="0.05")  # a runner apart sees new work by polling
        env.update(self.env)
        for attempt in range(3):
            self.port = free_port()
            args = ["--port", str(self.port), "--db", str(self.db), "--artifacts", self.artifacts or str(self.root / "artifacts")]
            args += ["--uploads", str(self.root / "uploads")]
            if self.profile is None:
                cmd = [*self.wrapper, sys.executable, "-m", "h3core.cli", "serve", *args]
                stdin = subprocess.DEVNULL
            else:  # the same app under cProfile; stops when its stdin closes (see _serve_profiled.py)
                cmd = [sys.executable, "-m", "bench.throughput._serve_profiled", str(self.profile), *args]
                stdin = subprocess.PIPE
            with open(self.log, "ab") as out:
                self.proc = subprocess.Popen(cmd, stdin=stdin, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.root)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                if self.role == "runner":
                    if "ready" in self.log.read_text():
                        return
                    time.sleep(0.05)
                    continue
                try:
                    if httpx.get(f"{self.url}/{probe}", timeout=1).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
            self.stop()
            if "address already in use" not in self.log.read_text().lower() or attempt == 2:
                raise SystemExit(f"server did not answer /healthz within {timeout} s; its log:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.profile is not None and self.proc.stdin is not None:
            self.proc.stdin.close()
        else:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the load --------------------------------------------------------------------------------


@dataclass
class Load:
    poll_s: list[float] = field(default_factory=list)
    submit_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    window_s: float = 0.0
    window: tuple[datetime, datetime] | None = None
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


async def load(
    url: str,
    ids: list[str],
    *,
    pollers: int,
    submitters: int,
    warmup: float,
    seconds: float,
    poll_every: float,
    server_pids: list[int],
    seed: int,
) -> Load:
    out = Load()
    clock = time.perf_counter
    # One session, so one keep-alive connection, per loop. aiohttp, not httpx: the client shares
    # the machine with the server, and httpx.AsyncClient cost 0.8 ms of CPU per GET here (a whole
    # core at 1,242 GET/s, more than the server spent); a single client shared by 72 loops was
    # worse still (httpcore scans its whole pool per request).
    timeout = aiohttp.ClientTimeout(total=60)
    body = json.dumps(SUBMIT_BODY).encode()
    post_headers = {"Content-Type": "application/json"}
    async with AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=1), timeout=timeout))
            for _ in range(pollers + submitters)
        ]
        p0, d0 = clock(), datetime.now(UTC)
        start, end = p0 + warmup, p0 + warmup + seconds

        async def poller(k: int, client: aiohttp.ClientSession) -> None:
            rng = random.Random(seed * 1000 + k)
            # Paced pollers each start at a random phase and keep to their own schedule, so they do
            # not fire together (64 in step would be a burst of 64 every period).
            due = clock() + rng.uniform(0, poll_every)
            while True:
                if poll_every:
                    await anyio.sleep(max(0.0, due - clock()))
                    due = max(due + poll_every, clock())  # a late answer: the next one goes at once
                t0 = clock()
                try:
                    async with client.get(f"/v1/jobs/{rng.choice(ids)}") as r:
                        await r.read()
                    ok, what = r.status == 200, str(r.status)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    ok, what = False, type(exc).__name__
                t1 = clock()
                if not ok:
                    out.error(f"GET {what}")
                elif t0 >= start and t1 <= end:
                    out.poll_s.append(t1 - t0)

        async def submitter(client: aiohttp.ClientSession) -> None:
            while True:
                t0 = clock()
                try:
                    async with client.post("/v1/jobs", data=body, headers=post_headers) as r:
                        await r.read()
                    ok, what = r.status == 201, str(r.status)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    ok, what = False, type(exc).__name__
                t1 = clock()
                if not ok:
                    out.error(f"POST {what}")
                elif t0 >= start and t1 <= end:
                    out.submit_s.append(t1 - t0)

        async with anyio.create_task_group() as tg:
            for k in range(pollers):
                tg.start_soon(poller, k, clients[k])
            for k in range(submitters):
                tg.start_soon(submitter, clients[pollers + k])
            await anyio.sleep(start - clock())
            cpu0, srv0 = time.process_time(), sum(map(cpu_seconds, server_pids))
            await anyio.sleep(end - clock())
            out.client_cpu_s, out.server_cpu_s = time.process_time() - cpu0, sum(map(cpu_seconds, server_pids)) - srv0
            tg.cancel_scope.cancel()
        out.window_s = seconds
        out.window = (d0 + timedelta(seconds=warmup), d0 + timedelta(seconds=warmup + seconds))
    return out


def end_to_end(db: Path, base_order: int, window: tuple[datetime, datetime], drain: tuple[datetime, datetime] | None) -> dict:
    """Jobs the passes submitted (queue_order past the stored ones), read from the stopped server's file."""
    w0, w1 = window
    store = SQLiteEventStore(db, durable=False)
    try:
        new = []
        before = None
        while True:
            rows = store.list_jobs(limit=5000, before=before)
            rows = [(o, s) for o, s in rows if o > base_order]
            if not rows:
                break
            new += [s for _, s in rows]
            before = rows[-1][0]
    finally:
        store.close()
    done = [s for s in new if s.status == "done" and s.finished_at is not None and w0 <= s.finished_at <= w1]
    submitted = [s for s in new if w0 <= s.created_at <= w1]
    open_at_end = [s for s in new if s.created_at <= w1 and (s.finished_at is None or s.finished_at > w1)]
    drained = [s for s in new if drain and s.status == "done" and s.finished_at and drain[0] < s.finished_at <= drain[1]]
    return {
        "drained": len(drained),
        "drain_s": (drain[1] - drain[0]).total_seconds() if drain else 0.0,
        "submitted": len(submitted),
        "done": len(done),
        "latency": [(s.finished_at - s.created_at).total_seconds() for s in done],
        "open_at_end": len(open_at_end),
        "failed": sum(1 for s in new if s.status in ("failed", "cancelled")),
    }


@dataclass
class Pass:
    name: str
    pollers: int
    submitters: int
    load: Load
    e2e: dict


def run_pass(
    name: str, args: argparse.Namespace, cached: Path, ids: list[str], base_order: int, profile: Path | None = None
) -> Pass:
    root = args.workdir / f"pass-{name}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    db = root / "h3.db"
    shutil.copyfile(cached, db)  # every pass starts from the same file
    os.sync()  # written back now, not by the kernel during the pass (it slowed every fsync of one)
    pollers = 0 if name == "submits only" else args.pollers
    submitters = 0 if name == "pollers only" else args.submitters
    # --split: the runner in a process of its own (H3_ROLE=runner), the HTTP API in another (api).
    servers = (
        [Server(db, root, args.slots, role="runner"), Server(db, root, args.slots, role="api")]
        if args.split and profile is None
        else []
    )
    server = servers[-1] if servers else Server(db, root, args.slots, profile=profile)
    for s in servers[:-1]:
        s.start()
    server.start()
    try:
        assert server.proc is not None
        result = anyio.run(
            lambda: load(
                server.url,
                ids,
                pollers=pollers,
                submitters=submitters,
                warmup=args.warmup,
                seconds=args.seconds,
                poll_every=args.poll_every,
                server_pids=[s.proc.pid for s in servers or [server] if s.proc is not None],
                seed=len(name),
            )
        )
        drain = None
        if submitters and args.drain > 0:  # no more requests: how fast does the runner empty the queue left?
            d0 = datetime.now(UTC)
            time.sleep(args.drain)
            drain = (d0, datetime.now(UTC))
    finally:
        for s in reversed(servers or [server]):
            s.stop()
    assert result.window is not None
    e2e = end_to_end(db, base_order, result.window, drain)
    err = f", errors {result.errors}" if result.errors else ""
    console.print(
        f"  {name}: {len(result.poll_s):,} polls, {len(result.submit_s):,} submits, {e2e['done']:,} done in the window{err}"
    )
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return Pass(name, pollers, submitters, result, e2e)


# -- report ----------------------------------------------------------------------------------


def report(passes: list[Pass], args: argparse.Namespace) -> None:
    poll_note = (
        "closed loop, each poller sends its next GET as soon as the last one answered"
        if not args.poll_every
        else (
            f"each poller sends one GET every {args.poll_every} s at its own random phase, or at once if the last answer "
            "came later"
        )
    )
    t = table(
        "Status polls: GET /v1/jobs/{id} on random stored (done) jobs",
        ["pass", "pollers", "submitters", "requests", "requests/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors"],
        caption=f"Latency: from the client's send to the whole response read, measured in the client ({poll_note}). "
        f"Only requests sent and answered inside the {args.seconds:g} s window count (after {args.warmup:g} s of warm-up). "
        f"With closed-loop pollers, latency ~ pollers / requests per second (Little's law).",
    )
    for p in passes:
        if p.pollers:
            lat = p.load.poll_s
            errs = sum(n for k, n in p.load.errors.items() if k.startswith("GET"))
            t.add_row(
                p.name,
                str(p.pollers),
                str(p.submitters),
                f"{len(lat):,}",
                rate(len(lat), p.load.window_s),
                ms(pct(lat, 50)),
                ms(pct(lat, 90)),
                ms(pct(lat, 99)),
                ms(max(lat, default=float("nan"))),
                str(errs),
            )
    show(t)

    t = table(
        "Submits: POST /v1/jobs",
        ["pass", "pollers", "submitters", "submits", "submits/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors"],
        caption=f"Body {json.dumps(SUBMIT_BODY)}; closed loop, each submitter posts again as soon as it has its answer. "
        "Counted: answered 201, sent and answered inside the window.",
    )
    for p in passes:
        if p.submitters:
            lat = p.load.submit_s
            errs = sum(n for k, n in p.load.errors.items() if k.startswith("POST"))
            t.add_row(
                p.name,
                str(p.pollers),
                str(p.submitters),
                f"{len(lat):,}",
                rate(len(lat), p.load.window_s),
                ms(pct(lat, 50)),
                ms(pct(lat, 90)),
                ms(pct(lat, 99)),
                ms(max(lat, default=float("nan"))),
                str(errs),
            )
    show(t)

    t = table(
        "End to end: submitted jobs reaching done",
        [
            "pass",
            "submitted in window",
            "done in window",
            "e2e jobs/s",
            "submit->done p50 ms",
            "submit->done p99 ms",
            "not done at window end",
            "then, no load: jobs/s",
        ],
        caption=f"Each job: Submitted+Admitted, Running, {STORED_STEPS} x Progress, Done: 8 durable appends through the "
        "runner's single writer. done in window: jobs whose finished_at (server clock) is inside the window; e2e jobs/s "
        "= that / window length. submit->done: finished_at - created_at of those jobs. Both read from the store file "
        "after the server stopped. not done at window end: jobs submitted (warm-up included) that were still queued "
        f"or running when the window closed. then, no load: jobs done per second in the {args.drain:g} s after the "
        "window, with the server up and no request at all (the runner alone, emptying that backlog; '>=' when "
        "it emptied it before the time was up).",
    )
    for p in passes:
        if p.submitters:
            e = p.e2e
            drain = "-"
            if e["drain_s"]:
                drain = ("" if e["drained"] < e["open_at_end"] else ">= ") + rate(e["drained"], e["drain_s"])
            t.add_row(
                p.name,
                f"{e['submitted']:,}",
                f"{e['done']:,}",
                rate(e["done"], p.load.window_s),
                ms(pct(e["latency"], 50)),
                ms(pct(e["latency"], 99)),
                f"{e['open_at_end']:,}",
                drain,
            )
    show(t)
    failed = {p.name: p.e2e["failed"] for p in passes if p.e2e["failed"]}
    if failed:
        console.print(f"jobs that ended failed or cancelled (should be none): {failed}\n")

    t = table(
        "Where the CPU went during the window",
        ["pass", "server CPU/wall", "client CPU/wall", "together", "machine has", "server CPU ms / request"],
        caption="server: utime+stime of the server process (all threads, /proc/PID/stat; "
        "with --split, of both processes); client: this process. "
        "server CPU ms / request: server CPU time / HTTP requests answered in the window (in passes with submits it "
        "includes the runner's work for the jobs, which runs in the server process). "
        "Both run on the same cores, so what the client spends is taken from the server. A Python process does "
        "its Python work on one core at a time (the GIL); SQLite and fsync run outside it.",
    )
    for p in passes:
        w = p.load.window_s
        t.add_row(
            p.name,
            f"{p.load.server_cpu_s / w:.2f}",
            f"{p.load.client_cpu_s / w:.2f}",
            f"{(p.load.server_cpu_s + p.load.client_cpu_s) / w:.2f}",
            f"{len(os.sched_getaffinity(0)):.1f}",
            ms(p.load.server_cpu_s / max(1, len(p.load.poll_s) + len(p.load.submit_s))),
        )
    show(t)

    t = table(
        "Against the targets",
        ["target", "pass", "measured", "met"],
        left=2,
        caption="Measured on this machine with the client on the same cores; see the CPU table.",
    )
    for p in passes:
        if p.pollers:
            p99 = pct(p.load.poll_s, 99)
            at = "" if p.pollers == TARGET_POLLERS else f" (at {p.pollers} pollers, not {TARGET_POLLERS})"
            at += f" (each poller paced to 1 GET / {args.poll_every:g} s)" if args.poll_every else " (closed-loop pollers)"
            t.add_row(
                f"status p99 < {TARGET_P99_S * 1000:g} ms at {TARGET_POLLERS} pollers",
                p.name,
                f"{ms(p99)} ms{at}",
                "yes" if p99 < TARGET_P99_S and p.pollers == TARGET_POLLERS else "no",
            )
    for p in passes:
        if p.submitters:
            r = p.e2e["done"] / p.load.window_s
            t.add_row(f">= {TARGET_JOBS_S} jobs/s end to end", p.name, f"{r:,.0f} jobs/s", "yes" if r >= TARGET_JOBS_S else "no")
    show(t)


def print_profile(path: Path, top: int) -> None:
    st = pstats.Stats(str(path))
    stats = st.stats  # type: ignore[attr-defined]
    total = st.total_tt  # type: ignore[attr-defined]
    t = table(
        f"Server profile (cProfile, CPU time of every thread): top {top} functions by own time",
        ["function", "calls", "own s", "own %", "cumulative s"],
        caption=f"{total:.1f} s of CPU in all, over the event loop thread and the worker threads (time.thread_time: "
        "waiting for a lock, a socket or an fsync is not counted). cProfile slows Python code down several times, so "
        f"read shares, not absolute times. Full data: `.venv/bin/python -m pstats {path}`.",
    )
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]:
        t.add_row(f"{short(file)}:{line}:{fn}", f"{nc:,}", f"{tt:.2f}", f"{100 * tt / total:.1f}", f"{ct:.2f}")
    show(t)

    by_area: dict[str, float] = {}
    for (file, _line, fn), (_cc, _nc, tt, _ct, _callers) in stats.items():
        by_area[area(file, fn)] = by_area.get(area(file, fn), 0.0) + tt
    t = table(
        "Server profile: own CPU time by package",
        ["package", "own s", "own %"],
        caption="The same profile, own time grouped by where the function lives (C functions by the module named in "
        "their cProfile entry).",
    )
    for name, tt in sorted(by_area.items(), key=lambda kv: kv[1], reverse=True)[:15]:
        t.add_row(name, f"{tt:.2f}", f"{100 * tt / total:.1f}")
    show(t)

    ours = [(k, v) for k, v in stats.items() if k[0].startswith(str(ROOT)) and "site-packages" not in k[0]]
    t = table(
        "Server profile: h3core's and the service's own functions by cumulative time",
        ["function", "calls", "own s", "cumulative s", "cumulative %"],
        caption="Cumulative: the function and everything it called, in its thread. For coroutines cProfile counts each "
        "resumption as a call, and time spent suspended is not included.",
    )
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in sorted(ours, key=lambda kv: kv[1][3], reverse=True)[:top]:
        t.add_row(f"{short(file)}:{line}:{fn}", f"{nc:,}", f"{tt:.2f}", f"{ct:.2f}", f"{100 * ct / total:.1f}")
    show(t)


def short(file: str) -> str:
    for marker in ("site-packages/", "/lib/python3.11/", "/lib/python3.12/", "/lib/python3.13/", str(ROOT) + "/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


def area(file: str, fn: str) -> str:
    if file == "~":  # a C function: "<method 'execute' of 'sqlite3.Connection' objects>", "<built-in method ...>"
        words = fn.strip("<>").split("'")
        owner = words[3].split(".")[0] if len(words) > 3 else fn
        return f"C: {owner.lstrip('_')}"
    if "site-packages/" in file:
        return file.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if file.startswith(str(ROOT)):
        return file[len(str(ROOT)) + 1 :].split("/", 1)[0]
    return "stdlib asyncio" if "/asyncio/" in file else "stdlib"


# -- in-process breakdown ----------------------------------------------------------------------


async def _asgi(app, method: str, path: str, body: bytes = b"") -> int:  # noqa: ANN001
    """One request straight into the ASGI app: no socket, no HTTP parsing (uvicorn's and its HTTP parser's part)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8100),
        "state": {},
    }
    given = False
    status = 0

    async def receive() -> dict:
        nonlocal given
        if given:
            await anyio.sleep_forever()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


def breakdown(args: argparse.Namespace, cached: Path, ids: list[str], passes: list[Pass]) -> None:
    """Each step of GET /v1/jobs/{id} and POST /v1/jobs timed alone, in this process, on a copy of the store."""
    import sqlite3

    from litestar.concurrency import sync_to_thread
    from litestar.serialization import encode_json, get_serializer

    from h3core.domain.state import JobState
    from h3core.runtime.settings import Settings
    from h3core.service.app import create_app
    from h3core.service.views import job_view

    root = args.workdir / "breakdown"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    shutil.copyfile(cached, root / "h3.db")
    settings = Settings(db=root / "h3.db", artifacts=root / "artifacts", uploads=root / "uploads", slots=args.slots)
    settings = settings.model_copy(update={"executor": "fake", "fake_step_seconds": 0})  # as the passes' servers
    app = create_app(settings)
    svc = app.state.service  # the runner is not started: submits are stored and stay queued
    rng = random.Random(7)
    n = args.breakdown
    sample = [rng.choice(ids) for _ in range(n)]
    conn = sqlite3.connect(f"file:{root / 'h3.db'}?mode=ro", uri=True)
    states_json = [conn.execute("SELECT state FROM jobs WHERE job_id = ?", (j,)).fetchone()[0] for j in sample[:50]]
    states = [JobState.model_validate_json(x) for x in states_json]
    views = [job_view(st, now=datetime.now(UTC), queue_position=None) for st in states]
    serializer = get_serializer(app.type_encoders)
    body = json.dumps(SUBMIT_BODY).encode()
    rows: list[tuple[str, str, int, list[float], float]] = []

    def timed(path: str, label: str, fn, calls: int) -> None:  # noqa: ANN001
        fn(0)  # warm
        lat = []
        cpu0 = time.process_time()
        for k in range(calls):
            t0 = time.perf_counter()
            fn(k)
            lat.append(time.perf_counter() - t0)
        rows.append((path, label, calls, lat, (time.process_time() - cpu0) / calls))

    async def timed_async(path: str, label: str, fn, calls: int, concurrency: int = 1) -> None:  # noqa: ANN001
        await fn(0)
        lat: list[float] = []
        cpu0 = time.process_time()

        async def worker(w: int) -> None:
            for k in range(w, calls, concurrency):
                t0 = time.perf_counter()
                await fn(k)
                lat.append(time.perf_counter() - t0)

        async with anyio.create_task_group() as tg:
            for w in range(concurrency):
                tg.start_soon(worker, w)
        rows.append((path, label, calls, lat, (time.process_time() - cpu0) / calls))

    get_path = "GET /v1/jobs/{id}"
    timed(
        get_path,
        "SQL: SELECT state FROM jobs WHERE job_id = ? (plain sqlite3)",
        lambda k: conn.execute("SELECT state FROM jobs WHERE job_id = ?", (sample[k],)).fetchone(),
        n,
    )
    timed(get_path, "JobState.model_validate_json(state)", lambda k: JobState.model_validate_json(states_json[k % 50]), n)
    timed(get_path, "store.get(id): SQL + parse, called directly", lambda k: svc.store.get(sample[k]), n)
    timed(
        get_path,
        "job_view(state): the JobView model",
        lambda k: job_view(states[k % 50], now=datetime.now(UTC), queue_position=None),
        n,
    )
    timed(get_path, "encode_json(view) with the app's encoders (the body)", lambda k: encode_json(views[k % 50], serializer), n)

    async def run_async() -> None:
        async def to_thread(k: int) -> None:
            await anyio.to_thread.run_sync(svc.store.get, sample[k])

        async def get(k: int) -> None:
            assert await _asgi(app, "GET", f"/v1/jobs/{sample[k]}") == 200

        async def post(_k: int) -> None:
            assert await _asgi(app, "POST", "/v1/jobs", body) == 201

        async def hop(_k: int) -> None:
            await anyio.to_thread.run_sync(int)

        async def guard_hop(_k: int) -> None:
            await sync_to_thread(int)

        await timed_async(get_path, "await anyio.to_thread.run_sync(store.get, id) (the handler's call)", to_thread, n)
        await timed_async(get_path, "  the thread hop alone: anyio.to_thread.run_sync(int)", hop, n)
        await timed_async(get_path, f"  the same, {args.pollers} at a time", hop, n, concurrency=args.pollers)
        await timed_async(get_path, "  Litestar's hop for a sync guard: sync_to_thread(int)", guard_hop, n)
        await timed_async(get_path, "whole ASGI app: Litestar routing, guard, DI, handler, render", get, n)
        await timed_async(get_path, f"whole ASGI app, {args.pollers} requests at a time", get, n, concurrency=args.pollers)
        post_n = max(20, n // 10)
        await timed_async("POST /v1/jobs", "whole ASGI app (store durable=True: one fsync'd append)", post, post_n)

    anyio.run(run_async)
    post_path = "POST /v1/jobs"
    req = GenerationRequest.model_validate(SUBMIT_BODY)
    timed(post_path, "admission: LocalAdmission.decide(request)", lambda k: svc.contract.decide(req, {}), n)
    queued = svc.store.counts().get("queued", 0)
    some_queued = svc.store.queued(1)[0].job_id
    timed(
        post_path,
        f"store.queue_position(id) with {queued:,} queued (each 201 reports it)",
        lambda k: svc.store.queue_position(some_queued),
        max(20, n // 10),
    )
    conn.close()
    svc.store.close()
    shutil.rmtree(root, ignore_errors=True)

    t = table(
        "Per-request work, one step at a time, in this process (no sockets, no HTTP parsing)",
        ["request", "step", "calls", "wall p50 ms", "wall p99 ms", "CPU ms / call"],
        left=2,
        caption="Each step run alone on a copy of the store (the runner not started), one call at a time unless it says "
        "otherwise. CPU ms / call: this process's CPU time (all threads) / calls. 'whole ASGI app' calls the Litestar "
        "app directly, without uvicorn, its HTTP parser or sockets. The steps do not simply add up: a thread hop costs less when "
        "the workers are busy, and concurrent calls contend for the GIL.",
    )
    for path, label, calls, lat, cpu in rows:
        t.add_row(path, label, f"{calls:,}", ms(pct(lat, 50)), ms(pct(lat, 99)), ms(cpu))
    show(t)
    for p in passes:
        if p.name == "pollers only":
            per = p.load.server_cpu_s / max(1, len(p.load.poll_s))
            console.print(f"For comparison, the server process spent {ms(per)} ms of CPU per GET in the 'pollers only' pass.\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=None, help="the stored-jobs DB is cached here (default: a new temp dir)")
    ap.add_argument("--jobs", type=int, default=100_000, help="finished jobs in the store (default 100,000)")
    ap.add_argument("--seconds", type=float, default=20, help="measured window per pass (default 20)")
    ap.add_argument("--warmup", type=float, default=2, help="load before the window, not counted (default 2)")
    ap.add_argument("--pollers", type=int, default=64, help="concurrent GET /v1/jobs/{id} loops (default 64)")
    ap.add_argument("--submitters", type=int, default=8, help="concurrent POST /v1/jobs loops (default 8)")
    ap.add_argument("--slots", type=int, default=16, help="H3_SLOTS for the server (default 16)")
    ap.add_argument(
        "--poll-every",
        type=float,
        default=0.0,
        help="seconds between one poller's GETs (default 0: closed loop, as fast as answered)",
    )
    ap.add_argument(
        "--passes",
        default="mixed,pollers only,submits only",
        help="which passes, in order (default: mixed,pollers only,submits only)",
    )
    ap.add_argument(
        "--drain",
        type=float,
        default=5,
        help="after a pass with submits, seconds the server runs on with no requests (default 5)",
    )
    ap.add_argument(
        "--profile",
        metavar="PASS",
        default=None,
        help="then one more pass of this kind (mixed, pollers only, submits only) with the server under cProfile",
    )
    ap.add_argument("--top", type=int, default=30, help="functions listed from the profile (default 30)")
    ap.add_argument(
        "--breakdown",
        type=int,
        default=0,
        metavar="N",
        help="then time each step of a GET and a POST in this process, N calls each (default 0: skip)",
    )
    ap.add_argument(
        "--split",
        action="store_true",
        help="run the service as two processes on the same store: H3_ROLE=runner (the jobs) and H3_ROLE=api (HTTP)",
    )
    ap.add_argument("--keep", action="store_true", help="keep each pass's DB and server log under WORKDIR/pass-NAME")
    args = parse(ap, argv, __spec__.name)
    names = [n.strip() for n in args.passes.split(",") if n.strip()]
    unknown = (set(names) | ({args.profile} if args.profile else set())) - {"mixed", "pollers only", "submits only"}
    if unknown:
        ap.error(f"unknown pass(es) {sorted(unknown)}")

    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="h3bench-http-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    print_machine(args.workdir, "h3core HTTP service load test")
    cached, meta, reused = cached_store(args.workdir, args.jobs)
    ids, base_order = stored_ids(cached)
    built = "reused from cache" if reused else f"built in {meta['build_s']:.1f} s"
    split = (
        "; --split: two processes on that store, H3_ROLE=runner (the jobs, H3_POLL_INTERVAL=0.05) and H3_ROLE=api "
        "(HTTP; sees the runner's events by following the store)"
        if args.split
        else ""
    )
    size = cached.stat().st_size / 2**20
    console.print(
        f"Store: {cached} ({size:,.0f} MiB, {len(ids):,} done jobs, "
        f"{meta['events']:,} events, schema v{SCHEMA_VERSION}), {built}.\n"
        f"Server: `python -m h3core.cli serve` (uvicorn {version('uvicorn')} with {_http_impl()}, "
        f"litestar {version('litestar')}; "
        f"store durable=True, the service's default), "
        f"H3_EXECUTOR=fake, H3_SLOTS={args.slots}, H3_FAKE_STEP_SECONDS=0, "
        f"a fresh copy of the store per pass{split}. "
        f"Client: aiohttp {version('aiohttp')} ClientSession on anyio (asyncio), HTTP/1.1 keep-alive, "
        "one client (one connection) per loop, in this process.\n"
        f"Client and server share this machine's {len(os.sched_getaffinity(0))} cores: the client's CPU is part of "
        "the cost of every figure below.\n"
    )
    passes = [run_pass(n, args, cached, ids, base_order) for n in names]
    if passes:
        report(passes, args)
    if args.breakdown:
        breakdown(args, cached, ids, passes)
    if args.profile:
        prof = args.workdir / f"server-{args.profile.replace(' ', '-')}.prof"
        console.print(f"profiling: one more '{args.profile}' pass with the server under cProfile -> {prof}")
        run_pass(args.profile, args, cached, ids, base_order, profile=prof)
        print_profile(prof, args.top)
    print_load_at_end()


if __name__ == "__main__":
    main()
