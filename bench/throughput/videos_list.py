"""GET /v1/videos with thousands of videos deleted, against none (issue 38), on `h3core serve`.

    .venv/bin/python -m bench.throughput.videos_list                                  # 3,000 deleted, 100 probes
    .venv/bin/python -m bench.throughput.videos_list --code /tmp/h3-before --probes 20  # another checkout's h3core

One server (fake executor, no step time, 4 slots, an empty SQLite store). `--kept` videos are made
first, then `--deleted` more, all through POST /v1/jobs, and run to `done`. The lists are timed
(`--probes` sequential requests each, one keep-alive connection) with none deleted, then again
once the newest `--deleted` have gone through DELETE /v1/videos/{id}: the worst case of the
finding, every deleted video newer than the first one kept. /v1/jobs?limit=1 is the yardstick
(it lists every job, deleted videos included, and never looked at deletions).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.common import console, ms, parse, pct, print_load_at_end, print_machine, show, table
from bench.throughput.http_load import ROOT, SUBMIT_BODY, Server

LISTS = ["/v1/videos?limit=1", "/v1/videos?limit=20", "/v1/jobs?limit=1"]


def made(url: str, n: int) -> list[str]:
    """`n` jobs submitted one after another, so the store's order is the order asked (the kept
    ones are the oldest); their ids."""
    with httpx.Client(base_url=url, timeout=60) as c:
        return [c.post("/v1/jobs", json={**SUBMIT_BODY, "prompt": f"bench video {i}"}).json()["id"] for i in range(n)]


def all_done(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=60) as c:
        while time.monotonic() < deadline:
            live = [len(c.get("/v1/jobs", params={"status": s, "limit": 1}).json()["items"]) for s in ("queued", "running")]
            if not any(live):
                return
            time.sleep(0.5)
    raise SystemExit(f"jobs still live after {timeout} s")


def timed(url: str, path: str, probes: int) -> tuple[list[float], set[int]]:
    with httpx.Client(base_url=url, timeout=120) as c:
        c.get(path)  # warm: the first request of a connection pays for it
        seconds, statuses = [], set()
        for _ in range(probes):
            t0 = time.perf_counter()
            r = c.get(path)
            seconds.append(time.perf_counter() - t0)
            statuses.add(r.status_code)
    return seconds, statuses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deleted", type=int, default=3000)
    parser.add_argument("--kept", type=int, default=25)
    parser.add_argument("--probes", type=int, default=100)
    parser.add_argument("--threads", type=int, default=8, help="concurrent DELETEs")
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose h3core serves")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parse(parser, argv, __spec__.name)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="h3videos-"))
    shutil.rmtree(work / "server", ignore_errors=True)
    (work / "server").mkdir(parents=True)
    print_machine(work, "Machine")
    server = Server(db=work / "server" / "h3.db", root=work / "server", slots=4, code=args.code, env={"H3_LOG_LEVEL": "warning"})
    server.start()
    rows = []
    try:
        t0 = time.perf_counter()
        ids = made(server.url, args.kept + args.deleted)
        all_done(server.url, 1800)
        console.print(f"{len(ids)} videos made in {time.perf_counter() - t0:.1f} s")
        gone = ids[args.kept :]
        for deleted in (0, len(gone)):
            if deleted:
                t0 = time.perf_counter()

                def delete(video_id: str) -> int:
                    with httpx.Client(base_url=server.url, timeout=120) as c:
                        return c.delete(f"/v1/videos/{video_id}").status_code

                with ThreadPoolExecutor(args.threads) as pool:
                    codes = set(pool.map(delete, gone))
                assert codes == {200}, codes
                console.print(f"{len(gone)} videos deleted in {time.perf_counter() - t0:.1f} s")
            for path in LISTS:
                seconds, statuses = timed(server.url, path, args.probes)
                rows.append((deleted, path, seconds, statuses))
    finally:
        server.stop()
    t = table(
        "GET /v1/videos with videos deleted",
        ["deleted", "request", "p50 ms", "p99 ms", "max ms", "statuses"],
        left=2,
        caption=f"h3core from {args.code}; {args.kept + args.deleted} videos made, the {args.kept} oldest kept; "
        f"{args.probes} sequential requests per row on one keep-alive connection.",
    )
    for deleted, path, seconds, statuses in rows:
        t.add_row(
            f"{deleted:,}",
            path,
            ms(pct(seconds, 50)),
            ms(pct(seconds, 99)),
            ms(max(seconds)),
            ", ".join(map(str, sorted(statuses))),
        )
    show(t)
    print_load_at_end()


if __name__ == "__main__":
    main()
