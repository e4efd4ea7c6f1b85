"""/readyz latency while other processes write the store: this checkout against another commit.

    python -m bench.throughput.readyz --workdir /tmp/h3bench-readyz                    # against 3465f5d, 20 s a pass
    python -m bench.throughput.readyz --workdir /tmp/h3bench-readyz --rounds 2         # passes alternated
    python -m bench.throughput.readyz --writers 0 --submitters 8 --readers 32          # HTTP load only

One `h3core serve` per pass (fake executor, no step time, `--slots` slots, every other setting its
default) on a fresh copy of a store of `--jobs` done jobs (http_load's, cached the same way, built
by the side's own code: an older h3core refuses a newer schema). While
it runs, `--writers` processes write that store (each a closed loop of one new job per durable
transaction through `SQLiteEventStore`, as `h3core enqueue` or an API process beside the runner
writes: `submitted` jobs, which the runner leaves alone until its next start, so the server does no
work for them) and `--pollers` closed loops of `GET /readyz` measure it (the issue's finding: p99
730 ms, max 876, with 8 writers; 98 ms with HTTP load only). `--submitters` closed-loop
`POST /v1/jobs` and `--readers` closed-loop `GET /v1/jobs/{id}` add HTTP load (none by default).

Each pass runs the server and the writers from one checkout: this one, and `--against` (a commit,
unpacked with `git archive` under --workdir: the repository is left as it is; or `--against-path`,
a checkout already on disk). The sides alternate, `--rounds` passes each.

Figures: the polls answered in the window, their latency p50/p99/max in the client, the 503s, the
writers' commits per second, the submits and reads answered per second, and the server's CPU/wall
(below 1 on a 2-core box: crowded out by the writers, the client and whatever else runs).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from bench.common import ROOT, console, export, ms, parse, pct, print_load_at_end, print_machine, show, table, version
from bench.throughput.http_load import SUBMIT_BODY, Server, cpu_seconds

AGAINST = "3465f5d"  # the last commit whose /readyz looked at the store itself (its reads cached for 1 s)

# One writer process: opens the store, says "ready", then writes new jobs, one durable transaction
# each (one per `every` seconds at most; 0: back to back), until the stop file appears; prints how
# many and over how long. Only h3core of the side's checkout is imported (its PYTHONPATH).
WRITER = r"""
import os, sys, time, uuid
from h3core.adapters.store import SQLiteEventStore
from h3core.domain.events import Submitted
from h3core.domain.request import GenerationRequest
from h3core.domain.retry import RetryPolicy

db, stop, every = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = SQLiteEventStore(db)
request = GenerationRequest(prompt="a writer's fox", width=448, height=256, frames=24, steps=1)
body = Submitted(request=request, retry=RetryPolicy())
print("ready", flush=True)
n, began = 0, time.time()
while not os.path.exists(stop):
    store.append(uuid.uuid4().hex, [body])
    n += 1
    if every:
        time.sleep(max(0.0, began + n * every - time.time()))
store.close()
print(n, time.time() - began, flush=True)
"""


@dataclass
class Side:
    name: str
    code: Path
    store: Path = Path()  # its cached store of done jobs, built and migrated by its own code
    ids: list[str] = field(default_factory=list)


@dataclass
class Pass:
    side: str
    readyz_s: list[float] = field(default_factory=list)
    not_ready: int = 0
    why: Counter[str] = field(default_factory=Counter)  # what the 503s said (their store and runner checks)
    answered: Counter[str] = field(default_factory=Counter)  # "POST" (submits), "GET" (reads) in the window
    errors: dict[str, int] = field(default_factory=dict)
    writes_per_s: float = 0.0
    server_cpu_s: float = 0.0
    seconds: float = 0.0

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


async def load(url: str, ids: list[str], out: Pass, args: argparse.Namespace, server_pid: int) -> None:
    clock = time.perf_counter
    timeout = aiohttp.ClientTimeout(total=30)
    body = json.dumps(SUBMIT_BODY).encode()
    headers = {"Content-Type": "application/json"}
    async with AsyncExitStack() as stack:

        async def session() -> aiohttp.ClientSession:
            connector = aiohttp.TCPConnector(limit=1)  # one keep-alive connection per loop
            return await stack.enter_async_context(aiohttp.ClientSession(url, connector=connector, timeout=timeout))

        submitters = [await session() for _ in range(args.submitters)]
        readers = [await session() for _ in range(args.readers)]
        pollers = [await session() for _ in range(args.pollers)]
        start = clock() + args.warmup
        end = start + args.seconds

        def counted(t0: float, t1: float) -> bool:
            return t0 >= start and t1 <= end

        async def closed_loop(what: str, request: Callable[[], Any], expect: int) -> None:
            while True:
                t0 = clock()
                try:
                    async with request() as r:
                        await r.read()
                    if r.status != expect:
                        out.error(f"{what} {r.status}")
                    elif counted(t0, clock()):
                        out.answered[what] += 1
                except (aiohttp.ClientError, TimeoutError) as exc:
                    out.error(f"{what} {type(exc).__name__}")

        async def poll(client: aiohttp.ClientSession) -> None:
            while True:
                t0 = clock()
                try:
                    async with client.get(args.path) as r:
                        answer = await r.read()
                    t1 = clock()
                    if counted(t0, t1):
                        out.readyz_s.append(t1 - t0)
                        if r.status != 200:
                            out.not_ready += 1
                            why = json.loads(answer)
                            out.why[f"store: {why.get('store')}; runner: {why.get('runner')}"[:100]] += 1
                except (aiohttp.ClientError, TimeoutError) as exc:
                    out.error(f"readyz {type(exc).__name__}")

        async with anyio.create_task_group() as tg:
            for client in submitters:
                tg.start_soon(closed_loop, "POST", functools.partial(client.post, "/v1/jobs", data=body, headers=headers), 201)
            for k, client in enumerate(readers):
                pick = random.Random(k).choice
                tg.start_soon(closed_loop, "GET", lambda c=client, pick=pick: c.get(f"/v1/jobs/{pick(ids)}"), 200)
            for client in pollers:
                tg.start_soon(poll, client)
            await anyio.sleep(start - clock())
            cpu0 = cpu_seconds(server_pid)
            await anyio.sleep(end - clock())
            out.server_cpu_s = cpu_seconds(server_pid) - cpu0
            out.seconds = args.seconds
            tg.cancel_scope.cancel()


def cache_for(side: Side, args: argparse.Namespace) -> None:
    """The side's store of `--jobs` done jobs, built (or found cached) by its own code: a store of
    this checkout's schema would be refused by an older h3core. Its ids read with sqlite3 alone."""
    folder = args.workdir / f"store-{hashlib.sha1(str(side.code.resolve()).encode()).hexdigest()[:10]}"
    folder.mkdir(parents=True, exist_ok=True)
    build = "import sys; from pathlib import Path; from bench.throughput.http_load import cached_store; "
    build += "print(cached_store(Path(sys.argv[1]), int(sys.argv[2]))[0])"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(side.code), str(ROOT)]))}
    made = subprocess.run(
        [sys.executable, "-c", build, str(folder), str(args.jobs)], env=env, cwd=folder, capture_output=True, text=True
    )
    if made.returncode != 0:
        raise SystemExit(f"building the store with {side.name}'s code failed:\n{made.stderr[-3000:]}")
    side.store = Path(made.stdout.strip().splitlines()[-1])
    conn = sqlite3.connect(side.store)
    try:
        side.ids = [j for (j,) in conn.execute("SELECT job_id FROM jobs ORDER BY queue_order")]
    finally:
        conn.close()


def run_pass(side: Side, n: int, args: argparse.Namespace) -> Pass:
    root = args.workdir / f"readyz-{n}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    db = root / "h3.db"
    shutil.copyfile(side.store, db)
    os.sync()
    server = Server(db, root, args.slots, code=side.code)
    server.start()
    out = Pass(side.name)
    writers: list[subprocess.Popen[str]] = []
    stop = root / "stop-writers"
    try:
        assert server.proc is not None
        env = {**os.environ, "PYTHONPATH": str(side.code)}
        for _ in range(args.writers):  # cwd: `-c` puts it first on sys.path; this checkout's h3core is not to shadow the side's
            cmd = [sys.executable, "-c", WRITER, str(db), str(stop), str(args.write_every)]
            writers.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=root))
        for w in writers:  # each has imported h3core and opened the store: from now on they write
            assert w.stdout is not None and w.stdout.readline().strip() == "ready", "a writer did not start"
        anyio.run(load, server.url, side.ids, out, args, server.proc.pid)
        stop.touch()
        for w in writers:
            written, took = w.communicate(timeout=120)[0].split()
            out.writes_per_s += int(written) / float(took)
    finally:
        stop.touch()
        for w in writers:
            if w.poll() is None:
                w.kill()
        server.stop()
    shutil.rmtree(root, ignore_errors=True)
    err = f", errors {out.errors}" if out.errors else ""
    err += f"; the 503s said {dict(out.why.most_common(3))}" if out.why else ""
    console.print(
        f"  {side.name}: {len(out.readyz_s)} polls, {out.not_ready} not ready, {out.writes_per_s:,.0f} writes/s, "
        f"{out.answered['POST']} submits, {out.answered['GET']} reads{err}"
    )
    return out


def report(passes: list[Pass], args: argparse.Namespace) -> None:
    t = table(
        f"{args.path} under {args.writers} store writers"
        + (f" (one transaction each per {args.write_every:g} s)" if args.write_every else "")
        + f" and {args.pollers} pollers"
        + (f", {args.submitters} submitters + {args.readers} readers" if args.submitters or args.readers else ""),
        ["checkout", "polls", "p50 ms", "p99 ms", "max ms", "503", "writes/s", "submits/s", "reads/s", "server CPU/wall"],
        caption=(
            f"{args.seconds:g} s measured per pass after {args.warmup:g} s of warm-up; latency is a poller's wall time "
            f"for one GET {args.path} on its own keep-alive connection (closed loops). writes/s: the writer processes' "
            "durable transactions (one new job each), summed."
        ),
        left=1,
    )
    for p in passes:
        s = p.readyz_s
        t.add_row(
            p.side,
            f"{len(s):,}",
            ms(pct(s, 50)),
            ms(pct(s, 99)),
            ms(max(s)) if s else "nan",
            str(p.not_ready),
            f"{p.writes_per_s:,.0f}",
            f"{p.answered['POST'] / p.seconds:,.0f}",
            f"{p.answered['GET'] / p.seconds:,.0f}",
            f"{p.server_cpu_s / p.seconds:.2f}",
        )
    show(t)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=None, help="the stored-jobs DB is cached here (default: a new temp dir)")
    ap.add_argument("--jobs", type=int, default=5_000, help="finished jobs in the store (default 5,000)")
    ap.add_argument("--writers", type=int, default=8, help="processes writing the store (default 8)")
    ap.add_argument("--pollers", type=int, default=32, help="closed-loop GET /readyz loops (default 32)")
    ap.add_argument(
        "--write-every", type=float, default=0.0, help="seconds between a writer's transactions (default 0: back to back)"
    )
    ap.add_argument("--path", default="/readyz", help="what the pollers ask for (/healthz: the floor under the same load)")
    ap.add_argument("--submitters", type=int, default=0, help="closed-loop POST /v1/jobs loops (default 0)")
    ap.add_argument("--readers", type=int, default=0, help="closed-loop GET /v1/jobs/{id} loops (default 0)")
    ap.add_argument("--seconds", type=float, default=20, help="measured window per pass (default 20)")
    ap.add_argument("--warmup", type=float, default=3, help="load before the window, not counted (default 3)")
    ap.add_argument("--slots", type=int, default=4, help="H3_SLOTS for the server (default 4)")
    ap.add_argument("--rounds", type=int, default=1, help="passes per checkout, the sides alternating (default 1)")
    ap.add_argument("--against", default=AGAINST, help=f"the commit to compare with (default {AGAINST})")
    ap.add_argument("--against-path", type=Path, default=None, help="a checkout of --against already on disk (no archive)")
    args = parse(ap, argv, __spec__.name)
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="h3bench-readyz-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    print_machine(args.workdir, "h3core /readyz while other processes write the store")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "h3core"], capture_output=True, text=True).stdout
    sides = [
        Side(f"{head or 'this'}{' + changes' if dirty else ''} (this checkout)", ROOT),
        Side(args.against, args.against_path or export(args.against, args.workdir)),
    ]
    for side in sides:
        cache_for(side, args)
    console.print(
        f"Store: {len(sides[0].ids):,} done jobs (built by each side's code), a fresh copy per pass. "
        "Server: `python -m h3core.cli serve` (one process, "
        f"uvicorn {version('uvicorn')}, litestar {version('litestar')}), H3_EXECUTOR=fake, H3_FAKE_STEP_SECONDS=0, "
        f"H3_SLOTS={args.slots}. Client: aiohttp {version('aiohttp')} in this process, one connection per loop; "
        f"server, writers and client share this machine's {len(os.sched_getaffinity(0))} cores.\n"
    )
    order = [side for k in range(args.rounds) for side in (sides if k % 2 == 0 else sides[::-1])]
    passes = [run_pass(side, n, args) for n, side in enumerate(order)]
    report(passes, args)
    print_load_at_end()


if __name__ == "__main__":
    main()
