"""/readyz latency while the service is loaded: submits and status reads against `h3core serve`,
and one prober asking /readyz at a steady pace, as a kubelet does (more often, for the samples).

    python -m bench.throughput.readyz --workdir /tmp/h3bench                    # H3_READY_CACHE 0 vs 1, 20 s each
    python -m bench.throughput.readyz --workdir /tmp/h3bench-readyz --caches 0,1,0,1   # passes alternated

One `h3core serve` per pass (fake executor, no step time, `--slots` slots) on a fresh copy of a
store of `--jobs` done jobs (http_load's, cached the same way), loaded by `--submitters`
closed-loop `POST /v1/jobs` and `--readers` closed-loop `GET /v1/jobs/{id}` (the load test that
found a probe's p99 at 1.24 s: 8 writers and 32 readers), while one prober sends `GET /readyz`
every `--probe-every` seconds on its own connection. The passes differ only in `H3_READY_CACHE`:
`0` is the uncached path (the store's write lock on every probe, on a worker thread: /readyz
before the cache), `1` the default (the store is writable if this process committed within the
last second; the disk is looked at once a second at most; docs/operations.md, Metrics).

Figures: the probes answered in the window, their latency p50/p99/max in the client, the 503s, the
submits and reads answered per second, and the server's CPU/wall (below 1 on a 2-core box: crowded
out by the client and whatever else runs).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
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

from bench.common import console, ms, parse, pct, print_load_at_end, print_machine, show, table, version
from bench.throughput.http_load import SUBMIT_BODY, Server, cached_store, cpu_seconds, stored_ids


@dataclass
class Probes:
    cache: str
    readyz_s: list[float] = field(default_factory=list)
    not_ready: int = 0
    answered: Counter[str] = field(default_factory=Counter)  # "POST" (submits), "GET" (reads) in the window
    errors: dict[str, int] = field(default_factory=dict)
    server_cpu_s: float = 0.0
    seconds: float = 0.0

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


async def load(url: str, ids: list[str], out: Probes, args: argparse.Namespace, server_pid: int) -> None:
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
        prober = await session()
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

        async def probe() -> None:
            due = clock()
            while True:
                await anyio.sleep(max(0.0, due - clock()))
                due = max(due + args.probe_every, clock())  # a late answer: the next probe goes at once
                t0 = clock()
                try:
                    async with prober.get("/readyz") as r:
                        await r.read()
                    t1 = clock()
                    if counted(t0, t1):
                        out.readyz_s.append(t1 - t0)
                        out.not_ready += r.status != 200
                except (aiohttp.ClientError, TimeoutError) as exc:
                    out.error(f"readyz {type(exc).__name__}")

        async with anyio.create_task_group() as tg:
            for client in submitters:
                tg.start_soon(closed_loop, "POST", functools.partial(client.post, "/v1/jobs", data=body, headers=headers), 201)
            for k, client in enumerate(readers):
                pick = random.Random(k).choice
                tg.start_soon(closed_loop, "GET", lambda c=client, pick=pick: c.get(f"/v1/jobs/{pick(ids)}"), 200)
            tg.start_soon(probe)
            await anyio.sleep(start - clock())
            cpu0 = cpu_seconds(server_pid)
            await anyio.sleep(end - clock())
            out.server_cpu_s = cpu_seconds(server_pid) - cpu0
            out.seconds = args.seconds
            tg.cancel_scope.cancel()


def run_pass(cache: str, n: int, args: argparse.Namespace, cached: Path, ids: list[str]) -> Probes:
    root = args.workdir / f"readyz-{n}-cache-{cache}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    db = root / "h3.db"
    shutil.copyfile(cached, db)
    os.sync()
    server = Server(db, root, args.slots, env={"H3_READY_CACHE": cache})
    server.start()
    out = Probes(cache)
    try:
        assert server.proc is not None
        anyio.run(load, server.url, ids, out, args, server.proc.pid)
    finally:
        server.stop()
    shutil.rmtree(root, ignore_errors=True)
    err = f", errors {out.errors}" if out.errors else ""
    console.print(
        f"  H3_READY_CACHE={cache}: {len(out.readyz_s)} probes, {out.answered['POST']} submits, {out.answered['GET']} reads{err}"
    )
    return out


def report(passes: list[Probes], args: argparse.Namespace) -> None:
    t = table(
        f"/readyz under {args.submitters} submitters + {args.readers} readers, one probe every {args.probe_every:g} s",
        ["H3_READY_CACHE", "probes", "p50 ms", "p99 ms", "max ms", "503", "submits/s", "reads/s", "server CPU/wall"],
        caption=(
            f"{args.seconds:g} s measured per pass after {args.warmup:g} s of warm-up; probe latency is the prober's "
            "wall time for one GET /readyz on its own keep-alive connection. 0: the store's write lock on every "
            "probe (the path before the cache); 1: the default. Submits and reads: closed loops, answered in the window."
        ),
        left=1,
    )
    for p in passes:
        s = p.readyz_s
        t.add_row(
            p.cache,
            f"{len(s):,}",
            ms(pct(s, 50)),
            ms(pct(s, 99)),
            ms(max(s)) if s else "nan",
            str(p.not_ready),
            f"{p.answered['POST'] / p.seconds:,.0f}",
            f"{p.answered['GET'] / p.seconds:,.0f}",
            f"{p.server_cpu_s / p.seconds:.2f}",
        )
    show(t)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=None, help="the stored-jobs DB is cached here (default: a new temp dir)")
    ap.add_argument("--jobs", type=int, default=5_000, help="finished jobs in the store (default 5,000)")
    ap.add_argument("--caches", default="0,1", help="H3_READY_CACHE of each pass, in order (default 0,1)")
    ap.add_argument("--seconds", type=float, default=20, help="measured window per pass (default 20)")
    ap.add_argument("--warmup", type=float, default=3, help="load before the window, not counted (default 3)")
    ap.add_argument("--submitters", type=int, default=8, help="closed-loop POST /v1/jobs loops (default 8)")
    ap.add_argument("--readers", type=int, default=32, help="closed-loop GET /v1/jobs/{id} loops (default 32)")
    ap.add_argument("--probe-every", type=float, default=0.1, help="seconds between /readyz probes (default 0.1)")
    ap.add_argument("--slots", type=int, default=4, help="H3_SLOTS for the server (default 4)")
    args = parse(ap, argv, __spec__.name)
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="h3bench-readyz-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    print_machine(args.workdir, "h3core /readyz under load")
    cached, _, _ = cached_store(args.workdir, args.jobs)
    ids, _ = stored_ids(cached)
    console.print(
        f"Store: {len(ids):,} done jobs, a fresh copy per pass. Server: `python -m h3core.cli serve` (one process, "
        f"uvicorn {version('uvicorn')}, litestar {version('litestar')}), H3_EXECUTOR=fake, H3_FAKE_STEP_SECONDS=0, "
        f"H3_SLOTS={args.slots}. Client: aiohttp {version('aiohttp')} in this process, one connection per loop; "
        f"client and server share this machine's {len(os.sched_getaffinity(0))} cores.\n"
    )
    passes = [run_pass(c.strip(), n, args, cached, ids) for n, c in enumerate(args.caches.split(",")) if c.strip()]
    report(passes, args)
    print_load_at_end()


if __name__ == "__main__":
    main()
