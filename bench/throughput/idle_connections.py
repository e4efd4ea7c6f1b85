"""/healthz and /v1/jobs while idle connections are held open against `h3core serve` (issue 38).

    .venv/bin/python -m bench.throughput.idle_connections                          # 0, 600, 1000, 5000 idle
    .venv/bin/python -m bench.throughput.idle_connections --idle 0,1000 --probes 500
    .venv/bin/python -m bench.throughput.idle_connections --code /tmp/h3-before    # another checkout's h3core

For each count, one fresh server (fake executor, an empty store) with the header and keep-alive
timeouts raised past the pass, so every idle connection stays open while it is measured: that
many TCP connections are opened and send nothing, then `--probes` GET /healthz are made one
after another, each on a connection of its own as a kubelet's probe is (raw sockets: no client
library's cost in the figures), then as many GET /v1/jobs?limit=1. A count past
H3_MAX_OPEN_CONNECTIONS (4096) shows the idlest connections closed to make room. The open-file
limit of this process (and so of the server it starts) is raised to hold the connections.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import socket
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.common import console, ms, parse, pct, print_load_at_end, print_machine, show, table
from bench.throughput.http_load import ROOT, Server


def get(port: int, path: str) -> tuple[int, float]:
    """One GET on a new connection, read to its close: (status, seconds); status 0: no answer."""
    t0 = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    except OSError:
        return 0, time.perf_counter() - t0
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    return status, time.perf_counter() - t0


def still_open(conns: list[socket.socket]) -> int:
    """How many of `conns` the server has not closed."""
    n = 0
    for c in conns:
        c.setblocking(False)
        try:
            n += c.recv(1) != b""
        except BlockingIOError:
            n += 1
        except OSError:
            pass
    return n


def raise_open_files(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = n + 2048
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", default="0,600,1000,5000", help="idle connection counts, comma-separated")
    parser.add_argument("--probes", type=int, default=300, help="GET /healthz (and GET /v1/jobs) per count")
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose h3core serves")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parse(parser, argv, __spec__.name)
    counts = [int(c) for c in args.idle.split(",")]
    raise_open_files(max(counts))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="h3idle-"))
    work.mkdir(parents=True, exist_ok=True)
    print_machine(work, "Machine")
    t = table(
        "/healthz and /v1/jobs with idle connections open",
        [
            "idle connections",
            "healthz p50 ms",
            "p99 ms",
            "max ms",
            "healthz statuses",
            "/v1/jobs p50 ms",
            "/v1/jobs statuses",
            "idle still open",
        ],
        caption=f"h3core from {args.code}; {args.probes} sequential probes per row, each on a new connection. "
        "Statuses: code x count (0: closed without an answer). 'idle still open': of the idle connections, "
        "after the probes.",
    )
    for n in counts:
        root = work / f"idle-{n}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        server = Server(
            db=root / "h3.db",
            root=root,
            slots=1,
            code=args.code,
            env={"H3_HEADER_TIMEOUT": "600", "H3_KEEP_ALIVE_TIMEOUT": "600", "H3_LOG_LEVEL": "warning"},
        )
        server.start()
        idle: list[socket.socket] = []
        try:
            for _ in range(n):
                idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=30))
            get(server.port, "/healthz")  # accepted after every idle one (the listen queue is FIFO)
            health = [get(server.port, "/healthz") for _ in range(args.probes)]
            jobs = [get(server.port, "/v1/jobs?limit=1") for _ in range(args.probes)]
            left = still_open(idle)
        finally:
            for c in idle:
                c.close()
            server.stop()
        hs = [s for _, s in health]
        codes = lambda rows: ", ".join(f"{c} x{k}" for c, k in sorted(Counter(c for c, _ in rows).items()))  # noqa: E731
        t.add_row(
            f"{n:,}",
            ms(pct(hs, 50)),
            ms(pct(hs, 99)),
            ms(max(hs)),
            codes(health),
            ms(pct([s for _, s in jobs], 50)),
            codes(jobs),
            f"{left:,}",
        )
        console.print(f"idle {n}: done")
    show(t)
    print_load_at_end()


if __name__ == "__main__":
    main()
