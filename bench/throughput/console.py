"""The operator console under load: the queue page's server time over a big store, and how often a
page following many running jobs is told to update (two bars from issue 25).

    python -m bench.throughput.console --workdir /tmp/h3bench      # 10,000 jobs; 200 running for 15 s
    python -m bench.throughput.console --running 0                 # the page times alone
    python -m bench.throughput.console --jobs 2000 --running 50 --seconds 5   # a quick look

1. Queue page, server time. A store of `--jobs` jobs (mostly done, some failed, cancelled, queued
   and running), and the page rendered in process as its handler renders it
   (`h3core.service.console.pages.render_queue`: the store reads and the template, no HTTP),
   `--reps` times per view after one untimed (templates compile on first use): p50 and p99. The bar
   is 100 ms. The first page lists every running job (up to 200), the first 50 queued and 50
   ended, so its cost follows those counts, not the store's size: a deep page (a cursor 100 pages
   back) costs what the first `ended` page does. A text filter reads and matches rows here (at most
   5,000 a request, then an "Older" link goes on).
2. Updates to a page following `--running` running jobs. `h3core serve` (fake executor, one slot
   per job, steps of `--step` s), `--running` long jobs submitted, and the console's change stream
   (/console/stream, what the queue page follows) read for `--seconds`: the updates a page receives
   per second (mean, and the most in any one second) beside the job events stored meanwhile. The
   bar is 4 a second.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench.common import ms, parse, pct, print_load_at_end, print_machine, show, table
from bench.throughput.http_load import Server
from h3core import Admitted, Artifact, Cancelled, Done, Failed, GenerationRequest, Progress, Running, SQLiteEventStore, Submitted
from h3core.runtime.settings import Settings
from h3core.service.console.pages import render_queue
from h3core.service.console.queue import Filter
from h3core.service.context import build_service

ARTIFACT = Artifact(path="x/attempt-1.mp4", bytes=1000, sha256="0" * 64, frames=24, duration_s=1.0)


def bodies(n: int, rng: random.Random) -> list:
    mode = "t2va"
    request = GenerationRequest(
        mode=mode, prompt=f"bench fox {n} in {rng.choice(['snow', 'rain', 'fog'])}", width=832, height=480, frames=121, steps=20
    )
    out = [Submitted(request=request), Admitted(tokens=1000)]
    fate = rng.random()
    if fate < 0.015:
        return out  # queued
    out.append(Running(attempt=1, executor="fake", info={"kernel": "sdpa"}))
    out += [Progress(step=s, total=20) for s in range(1, rng.randint(2, 20))]
    if fate < 0.02:
        return out  # running
    if fate < 0.07:
        return [*out, Failed(kind="oom", message="out of memory")]
    if fate < 0.10:
        return [*out, Cancelled(reason="bench")]
    return [*out, Done(artifact=ARTIFACT)]


def build_store(db: Path, jobs: int) -> None:
    """The store, written beside `db` and renamed into place once whole (a later run reuses it)."""
    rng = random.Random(7)
    part = db.with_name(db.name + ".part")
    part.unlink(missing_ok=True)
    store = SQLiteEventStore(part, durable=False)
    try:
        for start in range(0, jobs, 500):
            store.append_batch([(f"bench{n:06d}", bodies(n, rng), None) for n in range(start, min(start + 500, jobs))])
    finally:
        store.close()
    part.rename(db)


def queue_times(db: Path, root: Path, reps: int) -> list[tuple[str, list[float], int]]:
    svc = build_service(Settings(db=db, artifacts=root / "artifacts", uploads=root / "uploads", executor="fake"))
    views = {
        "first page (running, queued, ended)": (Filter(), None),
        "status=done": (Filter(status="done"), None),
        "status=failed, mode=t2va": (Filter(status="failed", mode="t2va"), None),
        "text 'rain' (read and matched here)": (Filter(text="rain"), None),
        "page 100 of 'ended' (a cursor deep in the store)": (Filter(status="ended"), 500),
        "live fragment (what an update fetches)": (Filter(), None),
    }
    out = []
    try:
        for name, (wanted, before) in views.items():
            fragment = name.startswith("live")
            render_queue(svc, wanted, before, None, fragment)  # once untimed: the templates compile on first use
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                response = render_queue(svc, wanted, before, None, fragment)
                times.append(time.perf_counter() - t)
            out.append((name, times, len(response.content)))
    finally:
        svc.store.close()
    return out


def update_rate(root: Path, running: int, step: float, seconds: float) -> dict[str, float]:
    server = Server(db=root / "live.db", root=root, slots=running, env={"H3_FAKE_STEP_SECONDS": str(step)})
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as api:
            for n in range(running):
                r = api.post(
                    "/v1/jobs", json={"prompt": f"a long fox {n}", "width": 64, "height": 64, "frames": 8, "steps": 1000}
                )
                r.raise_for_status()
            deadline = time.monotonic() + 60
            while api.get("/v1/jobs", params={"status": "running", "limit": 500}).json()["items"].__len__() < running:
                if time.monotonic() > deadline:
                    raise SystemExit("the jobs did not all start within 60 s")
                time.sleep(0.2)
            cursor_before = events_stored(server)
            stamps: list[float] = []
            ids = 0
            start = time.monotonic()
            with api.stream("GET", "/console/stream", timeout=httpx.Timeout(5, read=10)) as stream:
                for line in stream.iter_lines():
                    now = time.monotonic()
                    if now - start > seconds:
                        break
                    if line.startswith("event: changed"):
                        stamps.append(now - start)
                    elif line.startswith("data: ") and stamps and '"jobs"' in line:
                        ids += len(json.loads(line[6:])["jobs"])
            elapsed = time.monotonic() - start
            stored = events_stored(server) - cursor_before
            for job in api.get("/v1/jobs", params={"status": "running", "limit": 500}).json()["items"]:
                api.post(f"/v1/jobs/{job['id']}/cancel")
    finally:
        server.stop()
    per_second = [sum(1 for s in stamps if i <= s < i + 1) for i in range(int(elapsed))]
    return {
        "updates": len(stamps),
        "seconds": elapsed,
        "mean": len(stamps) / elapsed,
        "max_1s": max(per_second, default=0),
        "events_per_s": stored / elapsed,
        "ids_per_update": ids / max(len(stamps), 1),
    }


def events_stored(server: Server) -> int:
    import sqlite3

    with sqlite3.connect(server.db) as conn:
        return conn.execute("SELECT count(*) FROM events").fetchone()[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--running", type=int, default=200, help="0: skip the live part")
    parser.add_argument("--step", type=float, default=0.1)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parse(parser, argv, __spec__.name)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="h3bench-console-"))
    root.mkdir(parents=True, exist_ok=True)
    print_machine(root, "Machine")

    db = root / f"console-{args.jobs}.db"
    if not db.exists():
        build_store(db, args.jobs)
    store = SQLiteEventStore(db)
    counts = store.counts()
    store.close()
    t = table(
        f"Queue page, server time, {args.jobs} jobs in the store",
        ["view", "p50", "p99", "bytes"],
        caption=f"{', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}; {args.reps} renders per view; bar: 100 ms.",
    )
    for name, times, size in queue_times(db, root, args.reps):
        t.add_row(name, ms(pct(times, 50)), ms(pct(times, 99)), str(size))
    show(t)

    if args.running <= 0:  # the page times alone
        print_load_at_end()
        return
    r = update_rate(root, args.running, args.step, args.seconds)
    t = table(
        f"Updates to a page following {args.running} running jobs",
        ["jobs running", "events stored/s", "updates", "updates/s (mean)", "most in 1 s", "jobs named per update"],
        caption=f"{r['seconds']:.1f} s of /console/stream; fake steps of {args.step} s; bar: at most 4 updates a second.",
    )
    t.add_row(
        str(args.running),
        f"{r['events_per_s']:.0f}",
        str(r["updates"]),
        f"{r['mean']:.2f}",
        str(r["max_1s"]),
        f"{r['ids_per_update']:.0f}",
    )
    show(t)
    print(f"_run at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC_")
    print_load_at_end()


if __name__ == "__main__":
    main()
