"""Event store benchmark: durable append rate and latency, queue reads against the backlog, and replay
(read + parse + fold) rate.

    python -m bench.throughput.store                       # everything, default sizes
    python -m bench.throughput.store --jobs 50 --floor-ops 300 --backlogs 100,1000 --events 20000 --workdir /tmp/h3bench-small
    python -m bench.throughput.store --skip-replay         # appends and queue reads only
    python -m bench.throughput.store --skip-append --skip-queue --workdir /tmp/h3bench   # replay, reusing the built file

`--workdir` is where every database file goes (default: a fresh temporary directory). The replay
database is cached there as `replay-e<events>-s<steps>-v<n>.db` with a `.json` beside it, written
only once the build finished; a later run with the same `--workdir`, `--events` and `--steps`
reuses it after checking its event and job counts.

Reference floors: what the same disk does with no h3core at all, measured first. `fsync 200 B`:
`os.write` of 200 bytes and `os.fsync`, per operation. `sqlite tx, WAL, synchronous=FULL / NORMAL`:
the plain `sqlite3` module with the store's journal mode, one `BEGIN IMMEDIATE; INSERT one row;
COMMIT` per operation into a table with a unique `(job_id, seq)` index. A `durable=True` append
cannot beat the FULL row (it is one such transaction plus a read of the job's state and a
projection update); `durable=False` compares with the NORMAL row. The difference is h3core's own
work per append: reading and parsing the job's state, validating and folding the new events
(pydantic), serialising the event and the new state, the projection row.

Append mix: `--jobs` jobs, one after another, each written the way the runner writes it: create
(`Submitted` + `Admitted` in one append, `expected_seq=0`), running (`Running`, `expected_seq`),
`--progress` x progress (`Progress`, one append each, no `expected_seq`, as the runner's driver
does), done (`Done`, `expected_seq`). One caller thread, no contention. Stores: `MemoryEventStore`
(the same domain work with no disk: the cost of validation and the fold),
`SQLiteEventStore(durable=False)` (`synchronous=NORMAL`: survives a process crash, not a power
loss) and `SQLiteEventStore(durable=True)` (`synchronous=FULL`: a returned append is on disk).
Each store gets a fresh file and a short untimed warm-up.
- events/s: events written / wall time of the whole mix; appends/s: `store.append` calls / wall
  time; jobs/s: whole job lives written per second.
- p50 / p99 / max ms: latency of one `store.append` call (nearest-rank percentiles). The max and
  the p99 of `durable=False` include WAL checkpoints, which run inside the commit that crosses
  SQLite's 1000-page threshold.
- by kind of append: the same figures per kind; events/s there is events of that kind / time spent
  in those appends.
- Batching: job creation as one append of two events (what `Runner.submit` does) against two
  appends of one; only the create step is timed, and each job's remaining life is written too, so
  the file grows as in real use. `p50 / p99 ms per job` is both appends together when split.

Queue reads vs backlog: for each `--backlogs` size, a fresh file holding that many queued jobs
(written through `import_events`), then `--reps` timed calls of what the runner and a status page
read: `queued(2)` (a `slots=1` runner's claim: it asks for `slots + busy + 1` jobs), `queued(33)`
(a `slots=16` runner's claim with 15 jobs busy), `counts()` (jobs per status, what a status page
polls) and `unfinished()` (every unfinished job's state, read once at each runner start; it parses
every state, so it is linear in the backlog by design). The table's note names the store's schema
version, the definition of its `jobs_queue` index as read from the file, and SQLite's query plan
for `queued()`. Since schema v2 that index is `(status, priority DESC, queue_order)`, the order
`queued()` asks for, so a claim reads the rows it returns and sorts nothing: the queued() rows
should stay flat as the backlog grows.

Replay: a file holding `--events` events (default 1,000,000): jobs of `4 + --steps` events each
(`Submitted` with a full-size request and an idempotency key, `Admitted`, `Running`, `--steps` x
`Progress`, `Done`), the last job cut short so the count is exact (a legal unfinished job). It is
built through `store.import_events` in transactions of about 50,000 events with `durable=False`,
so it is exactly a file the store writes: `events` rows and the `jobs` projection. The build rate
is printed (not a benchmark figure: `import_events` validates and folds every event as it goes).
Then, with the page cache warm (the file is far smaller than memory), one timed pass each:
- SQL only: the store's own keyset query of `all_events`, batch by batch, rows fetched and dropped
  (the floor: what SQLite alone costs);
- read + parse: `store.all_events(batch)`, which turns every row into an `Event` (pydantic);
- replay = read + parse + fold: the same, the stream grouped into each job's log (it is job by
  job, in submission order) and `h3core.domain.state.fold` applied to each;
- fold only: `fold` over every job's log already parsed (parsed in an untimed pass before);
- projection read: every job's stored state, paging through `store.list_jobs` (current state
  without any replay).
`events/s` and `jobs/s` are per pass; `compare` names the row each is best read against. After
the passes the file is checked: the fold of every job's log must equal that job's projection row,
and for `--sample` random jobs `fold(store.events(job)) == store.get(job)`; it exits 1 on any
mismatch. The peak RSS line is the whole process's, mostly the fold-only pass holding every
parsed event.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import random
import resource
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from bench.common import Timer, console, ms, parse, pct, print_load_at_end, print_machine, rate, show, table
from h3core import (
    Admitted,
    Artifact,
    Done,
    Event,
    EventStore,
    GenerationRequest,
    MemoryEventStore,
    Progress,
    RetryPolicy,
    Running,
    SQLiteEventStore,
    Submitted,
    fold,
)
from h3core.domain.state import JobState

# Bump when the shape of the built replay DB changes, so a cached file is not reused.
REPLAY_BUILD_VERSION = 1


# -- bodies -------------------------------------------------------------------------------


def request(n: int, steps: int, *, small: bool = False) -> GenerationRequest:
    if small:
        return GenerationRequest(prompt=f"bench job {n}", width=64, height=64, frames=24, steps=steps)
    # A request as a client would send it: default canvas, a sentence of prompt, its own seed.
    return GenerationRequest(
        prompt=f"bench job {n}: a red fox trotting through fresh snow at dusk, slow dolly shot, film grain",
        frames=124,
        steps=steps,
        seed=n,
    )


def artifact(job_id: str, frames: int = 124) -> Artifact:
    return Artifact(
        path=f"{job_id}/attempt-1.mp4",
        bytes=1_234_567,
        sha256=hashlib.sha256(job_id.encode()).hexdigest(),
        frames=frames,
        duration_s=frames / 24,
    )


def running(job_id: str) -> Running:
    return Running(attempt=1, executor="fake", executor_ref=f"fake-{job_id}-1", info={"plan": "finish"})


# -- reference floors ---------------------------------------------------------------------


def floor_fsync(directory: Path, n: int) -> list[float]:
    """Append 200 bytes to a file and fsync it, n times: the disk's durable-write floor."""
    path = directory / "fsync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    lat = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            os.write(fd, b"x" * 200)
            os.fsync(fd)
            lat.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return lat


def floor_sqlite(directory: Path, n: int, synchronous: str) -> list[float]:
    """Plain sqlite3, same WAL mode and pragmas as the store: one INSERT of a ~100-byte row per
    BEGIN IMMEDIATE..COMMIT into a table with a unique (job_id, seq) index. No pydantic, no
    projection: what SQLite alone costs per transaction on this disk."""
    path = directory / f"floor-{synchronous.lower()}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, job_id TEXT, seq INTEGER, body TEXT)")
    conn.execute("CREATE UNIQUE INDEX events_job_seq ON events (job_id, seq)")
    body = json.dumps({"type": "progress", "step": 1, "total": 10}) + " " * 60
    lat = []
    try:
        for i in range(n):
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO events (job_id, seq, body) VALUES (?, ?, ?)", (f"j{i // 13}", i % 13 + 1, body))
            conn.execute("COMMIT")
            lat.append(time.perf_counter() - t0)
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    return lat


# -- appends ------------------------------------------------------------------------------


def append_mix(store: EventStore, jobs: int, progress: int, *, split_create: bool = False) -> dict[str, list[float]]:
    """Each job's life as the runner writes it: create (Submitted+Admitted in one append, with
    expected_seq=0), Running (expected_seq), `progress` Progress appends (no expected_seq, as the
    runner's driver appends them), Done (expected_seq). Returns append latencies by kind."""
    lat: dict[str, list[float]] = {"create": [], "running": [], "progress": [], "done": []}
    if split_create:
        lat = {"submitted": [], "admitted": [], **{k: v for k, v in lat.items() if k != "create"}}
    clock = time.perf_counter
    for n in range(jobs):
        job_id = uuid.uuid4().hex
        sub = Submitted(request=request(n, progress, small=True))
        if split_create:
            t0 = clock()
            store.append(job_id, [sub], expected_seq=0)
            t1 = clock()
            state, _ = store.append(job_id, [Admitted()], expected_seq=1)
            lat["submitted"].append(t1 - t0)
            lat["admitted"].append(clock() - t1)
        else:
            t0 = clock()
            state, _ = store.append(job_id, [sub, Admitted()], expected_seq=0)
            lat["create"].append(clock() - t0)
        t0 = clock()
        state, _ = store.append(job_id, [running(job_id)], expected_seq=state.last_seq)
        lat["running"].append(clock() - t0)
        for step in range(1, progress + 1):
            t0 = clock()
            store.append(job_id, [Progress(step=step, total=progress)])
            lat["progress"].append(clock() - t0)
        t0 = clock()
        store.append(job_id, [Done(artifact=artifact(job_id, 24))], expected_seq=state.last_seq + progress)
        lat["done"].append(clock() - t0)
    return lat


EVENTS_PER_APPEND = {"create": 2, "submitted": 1, "admitted": 1, "running": 1, "progress": 1, "done": 1}


def fresh_db(workdir: Path, name: str) -> Path:
    path = workdir / name
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


def bench_appends(workdir: Path, jobs: int, progress: int, floor_n: int) -> None:
    per_job = 4 + progress
    console.print(
        f"## Appends: {jobs} jobs, each Submitted+Admitted (one append), Running, {progress} x Progress, Done "
        f"= {per_job} events in {per_job - 1} appends per job\n"
    )

    # Floors first, on the same disk.
    t = table(
        "Reference floors on the same disk (no h3core)",
        ["operation", "ops", "ops/s", "p50 ms", "p99 ms"],
        caption="fsync: os.write(200 B)+os.fsync per op. sqlite: BEGIN IMMEDIATE; one INSERT; COMMIT per op, WAL, "
        "plain sqlite3 module. A durable=True append cannot beat the 'synchronous=FULL' row; the gap to it is "
        "h3core's own work (pydantic validation, fold, projection row).",
    )
    for label, lat in (
        ("fsync 200 B", floor_fsync(workdir, floor_n)),
        ("sqlite tx, WAL, synchronous=FULL", floor_sqlite(workdir, floor_n, "FULL")),
        ("sqlite tx, WAL, synchronous=NORMAL", floor_sqlite(workdir, floor_n, "NORMAL")),
    ):
        t.add_row(label, f"{len(lat):,}", rate(len(lat), sum(lat)), ms(pct(lat, 50)), ms(pct(lat, 99)))
    show(t)

    stores: list[tuple[str, Callable[[], EventStore]]] = [
        ("memory (no disk)", MemoryEventStore),
        ("sqlite durable=False (NORMAL)", lambda: SQLiteEventStore(fresh_db(workdir, "append-fast.db"), durable=False)),
        ("sqlite durable=True (FULL)", lambda: SQLiteEventStore(fresh_db(workdir, "append-durable.db"), durable=True)),
    ]
    results: list[tuple[str, dict[str, list[float]], float, float]] = []
    for label, make in stores:
        store = make()
        try:
            append_mix(store, max(5, jobs // 50), progress)  # warm up: imports, caches, first pages
            gc.collect()
            with Timer() as tm:
                lat = append_mix(store, jobs, progress)
        finally:
            store.close()
        results.append((label, lat, tm.s, tm.cpu))

    t = table(
        "Append mix: all appends",
        ["store", "appends", "events", "events/s", "appends/s", "jobs/s", "p50 ms", "p99 ms", "max ms", "CPU/wall"],
        caption="events/s = events written / wall time of the whole mix (one caller thread, no contention). "
        "p50/p99/max: latency of one store.append call, over all kinds. CPU/wall: process CPU time / wall time "
        "(1.0 = one core busy all the time; below 1 = waiting on the disk).",
    )
    for label, lat, wall, cpu in results:
        all_lat = [x for v in lat.values() for x in v]
        events = sum(EVENTS_PER_APPEND[k] * len(v) for k, v in lat.items())
        t.add_row(
            label,
            f"{len(all_lat):,}",
            f"{events:,}",
            rate(events, wall),
            rate(len(all_lat), wall),
            rate(jobs, wall),
            ms(pct(all_lat, 50)),
            ms(pct(all_lat, 99)),
            ms(max(all_lat)),
            f"{cpu / wall:.2f}",
        )
    show(t)

    t = table(
        "Append mix: latency by kind of append",
        ["store", "append", "events/append", "count", "events/s", "p50 ms", "p99 ms"],
        left=2,
        caption="events/s here = events of that kind / time spent in those appends.",
    )
    for label, lat, _, _ in results:
        for kind, v in lat.items():
            t.add_row(
                label,
                kind,
                str(EVENTS_PER_APPEND[kind]),
                f"{len(v):,}",
                rate(EVENTS_PER_APPEND[kind] * len(v), sum(v)),
                ms(pct(v, 50)),
                ms(pct(v, 99)),
            )
    show(t)

    # Batching: the same job creation as one append of two events, or two appends of one.
    t = table(
        "Batching: creating a job as one append of 2 events vs two appends of 1",
        ["store", "create as", "jobs", "jobs created/s", "events/s", "p50 ms per job", "p99 ms per job"],
        left=2,
        caption="Only the create step is timed (Submitted+Admitted); the rest of each job's life is written too, "
        "so the file grows the same way. 'per job' = both appends together when split.",
    )
    for durable in (False, True):
        for split in (False, True):
            name = f"batch-{'durable' if durable else 'fast'}-{'split' if split else 'one'}.db"
            store = SQLiteEventStore(fresh_db(workdir, name), durable=durable)
            try:
                append_mix(store, max(5, jobs // 50), progress, split_create=split)
                lat = append_mix(store, jobs, progress, split_create=split)
            finally:
                store.close()
            per_job = [a + b for a, b in zip(lat["submitted"], lat["admitted"], strict=True)] if split else lat["create"]
            t.add_row(
                f"sqlite durable={durable}",
                "2 appends x 1 event" if split else "1 append x 2 events",
                f"{jobs:,}",
                rate(jobs, sum(per_job)),
                rate(2 * jobs, sum(per_job)),
                ms(pct(per_job, 50)),
                ms(pct(per_job, 99)),
            )
    show(t)
    for p in workdir.glob("*.db*"):
        if p.name.startswith(("append-", "batch-")):
            p.unlink()


# -- queue reads ----------------------------------------------------------------------------


def _time_call(fn: Callable[[], object], reps: int) -> list[float]:
    fn()  # warm: statement cache, pages
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def bench_queue_reads(workdir: Path, backlogs: list[int], reps: int) -> None:
    """What the runner's reads cost as the queue grows: it calls queued(slots + busy + 1) for every
    claim, unfinished() once at start (recovery), and counts() is what a status page polls."""
    rows: list[tuple[str, str, str, str, str]] = []
    schema = index_sql = plan = ""
    for n in backlogs:
        path = fresh_db(workdir, f"queue-{n}.db")
        store = SQLiteEventStore(path, durable=False)
        try:
            at = datetime(2026, 1, 1, tzinfo=UTC)
            pending: list[Event] = []
            for i in range(n):
                job_id = uuid.uuid4().hex
                sub = Submitted(request=request(i, 50), idempotency_key=f"q-{i}")
                pending += [
                    Event(job_id=job_id, seq=1, at=at, body=sub),
                    Event(job_id=job_id, seq=2, at=at, body=Admitted(tokens=31_000)),
                ]
                if len(pending) >= 20_000:
                    store.import_events(pending)
                    pending = []
            if pending:
                store.import_events(pending)
            assert store.counts() == {"queued": n}
            schema = f"v{store.schema_version()}"
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                (index_sql,) = conn.execute(
                    "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = 'jobs_queue'"
                ).fetchone()
                plan = "; ".join(
                    r[3]
                    for r in conn.execute(
                        "EXPLAIN QUERY PLAN SELECT state FROM jobs WHERE status = 'queued' "
                        "ORDER BY priority DESC, queue_order LIMIT 2"
                    )
                )
            finally:
                conn.close()
            for label, fn, k in (
                ("queued(2)", partial(store.queued, 2), reps),
                ("queued(33)", partial(store.queued, 33), reps),
                ("counts()", store.counts, reps),
                ("unfinished()", store.unfinished, max(1, min(reps, 200_000 // max(n, 1)))),
            ):
                lat = _time_call(fn, k)
                rows.append((f"{n:,}", label, str(k), ms(pct(lat, 50)), ms(pct(lat, 99))))
        finally:
            store.close()
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
    t = table(
        "Queue reads vs backlog (jobs queued, none running)",
        ["backlog", "read", "calls", "p50 ms", "p99 ms"],
        left=2,
        caption="queued(2): a slots=1 runner's claim; queued(33): a slots=16 runner's claim with 15 busy. "
        f"Store schema {schema}: queued() (ORDER BY priority DESC, queue_order) is served in order by its index "
        f"`{index_sql}` (SQLite's plan for queued(): {plan}), so a claim reads only the rows it returns "
        "instead of sorting the queue. "
        "unfinished() parses every returned state, so it is O(backlog) by design.",
    )
    for row in rows:
        t.add_row(*row)
    show(t)


# -- replay -------------------------------------------------------------------------------


def job_log(n: int, steps: int, t0: datetime) -> list[Event]:
    """One finished job's log, `4 + steps` events, one second apart from `t0`."""
    job_id = f"{n:08d}-{uuid.UUID(int=random.Random(n).getrandbits(128)).hex[:16]}"
    req = request(n, steps)
    bodies = [
        Submitted(request=req, retry=RetryPolicy(), idempotency_key=f"bench-key-{n}"),
        Admitted(tokens=31_000 + n % 1000),
        running(job_id),
        *[Progress(step=s, total=steps) for s in range(1, steps + 1)],
        Done(artifact=artifact(job_id)),
    ]
    return [Event(job_id=job_id, seq=i + 1, at=t0 + timedelta(seconds=i), body=b) for i, b in enumerate(bodies)]


def build_replay_db(path: Path, events: int, steps: int, chunk_events: int = 50_000) -> dict:
    """Write `events` events through `store.import_events` (durable=False, one transaction per
    ~chunk_events events), so the file is exactly one the store writes: events rows and jobs
    projection. Jobs run one after another; the last one is cut short to hit `events` exactly
    (a prefix of a legal log is a legal, unfinished job)."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    per_job = 4 + steps
    store = SQLiteEventStore(path, durable=False)
    written = 0
    jobs = 0
    base = datetime(2026, 1, 1, tzinfo=UTC)
    t_start = time.perf_counter()
    last_print = t_start
    try:
        pending: list[Event] = []
        while written + len(pending) < events:
            log = job_log(jobs, steps, base + timedelta(seconds=jobs * per_job))
            pending.extend(log[: events - written - len(pending)])
            jobs += 1
            if len(pending) >= chunk_events:
                written += store.import_events(pending)
                pending = []
                now = time.perf_counter()
                if now - last_print > 10:
                    console.print(f"  built {written:,} / {events:,} events ({written / (now - t_start):,.0f}/s)")
                    last_print = now
        if pending:
            written += store.import_events(pending)
    finally:
        store.close()
    return {"events": written, "jobs": jobs, "steps": steps, "build_s": time.perf_counter() - t_start}


def replay_db(workdir: Path, events: int, steps: int) -> tuple[Path, dict, bool]:
    path = workdir / f"replay-e{events}-s{steps}-v{REPLAY_BUILD_VERSION}.db"
    meta_path = path.with_suffix(".json")
    if path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            stored = conn.execute("SELECT count(*) FROM events").fetchone()[0]
            stored_jobs = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
        finally:
            conn.close()
        if stored == meta["events"] == events and stored_jobs == meta["jobs"]:
            return path, meta, True
        console.print(f"cached {path.name} does not match its metadata; rebuilding")
    meta_path.unlink(missing_ok=True)
    console.print(f"building {path} ({events:,} events, {steps} progress events per job) ...")
    meta = build_replay_db(path, events, steps)
    meta_path.write_text(json.dumps(meta))
    return path, meta, False


def sql_floor(path: Path, batch: int) -> int:
    """The store's own keyset query, rows fetched and dropped: the SQLite-only part of a replay."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    n = 0
    last_order, last_seq = -1, 0
    try:
        while True:
            rows = conn.execute(
                "SELECT e.job_id, e.seq, e.at, e.body, j.queue_order FROM events e "
                "JOIN jobs j ON j.job_id = e.job_id "
                "WHERE (j.queue_order, e.seq) > (?, ?) ORDER BY j.queue_order, e.seq LIMIT ?",
                (last_order, last_seq, batch),
            ).fetchall()
            if not rows:
                return n
            n += len(rows)
            last_order, last_seq = rows[-1][4], rows[-1][1]
    finally:
        conn.close()


def by_job(events: Iterator[Event]) -> Iterator[list[Event]]:
    """Group a job-by-job stream (as `all_events` yields it) into each job's log."""
    log: list[Event] = []
    for e in events:
        if log and e.job_id != log[0].job_id:
            yield log
            log = []
        log.append(e)
    if log:
        yield log


def projection(store: SQLiteEventStore, page: int = 2000) -> dict[str, JobState]:
    out: dict[str, JobState] = {}
    before = None
    while True:
        rows = store.list_jobs(limit=page, before=before)
        if not rows:
            return out
        for _order, s in rows:
            out[s.job_id] = s
        before = rows[-1][0]


def bench_replay(workdir: Path, events: int, steps: int, batch: int, sample: int) -> None:
    console.print(f"## Replay: {events:,} events, {steps} progress events per job\n")
    path, meta, cached = replay_db(workdir, events, steps)
    size = sum(Path(f"{path}{s}").stat().st_size for s in ("", "-wal") if Path(f"{path}{s}").exists())
    built = (
        "reused from cache"
        if cached
        else f"built in {meta['build_s']:.1f} s ({meta['events'] / meta['build_s']:,.0f} "
        f"events/s via import_events, durable=False)"
    )
    console.print(f"DB: {path} ({size / 2**20:,.0f} MiB, {meta['jobs']:,} jobs, {meta['events']:,} events), {built}\n")
    n_events, n_jobs = meta["events"], meta["jobs"]

    store = SQLiteEventStore(path, durable=False)
    rows: list[tuple[str, int, int, float, float, str]] = []
    try:
        # Warm the page cache so every pass reads the same way (the file is far smaller than RAM).
        sql_floor(path, batch)
        gc.collect()

        with Timer() as tm:
            n = sql_floor(path, batch)
        assert n == n_events, (n, n_events)
        rows.append(("SQL only: the store's keyset query, rows dropped", n, n_jobs, tm.s, tm.cpu, "floor"))

        gc.collect()
        with Timer() as tm:
            n = sum(1 for _ in store.all_events(batch))
        assert n == n_events
        rows.append(("read + parse: store.all_events()", n, n_jobs, tm.s, tm.cpu, "vs SQL only"))

        gc.collect()
        folded: dict[str, JobState] = {}
        with Timer() as tm:
            for log in by_job(store.all_events(batch)):
                folded[log[0].job_id] = fold(log)
        assert len(folded) == n_jobs
        rows.append(("replay = read + parse + fold, per job", n_events, n_jobs, tm.s, tm.cpu, "vs read + parse"))

        logs = list(by_job(store.all_events(batch)))  # parsed, untimed
        gc.collect()
        with Timer() as tm:
            for log in logs:
                fold(log)
        rows.append(("fold only, events already parsed", sum(map(len, logs)), len(logs), tm.s, tm.cpu, "vs replay"))
        del logs
        gc.collect()

        with Timer() as tm:
            proj = projection(store)
        rows.append(("projection read: every jobs row's state (list_jobs)", 0, len(proj), tm.s, tm.cpu, "vs replay"))

        # The DB must be what the store would have written: the fold of every job's log equals
        # its projection row, and (a sample) fold(store.events(job)) == store.get(job).
        mismatched = [j for j, s in folded.items() if proj.get(j) != s]
        ids = random.Random(0).sample(sorted(folded), min(sample, len(folded)))
        sample_bad = [j for j in ids if fold(store.events(j)) != store.get(j)]
        statuses: dict[str, int] = store.counts()
    finally:
        store.close()

    t = table(
        f"Replay of {n_events:,} events / {n_jobs:,} jobs (warm page cache)",
        ["pass", "events", "jobs", "seconds", "events/s", "jobs/s", "CPU/wall", "compare"],
        caption=f"all_events(batch={batch}). Job-by-job in submission order, each job's log folded with "
        "h3core.domain.state.fold. 'projection read' parses each job's stored state instead of replaying "
        "(what unfinished()/list_jobs cost); its events column is empty because it reads no events.",
    )
    for label, ev, jb, s, cpu, cmp in rows:
        t.add_row(
            label, f"{ev:,}" if ev else "-", f"{jb:,}", f"{s:.2f}", rate(ev, s) if ev else "-", rate(jb, s), f"{cpu / s:.2f}", cmp
        )
    show(t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ok = not mismatched and not sample_bad
    console.print(
        f"check: fold(log) == projection row for {len(folded) - len(mismatched):,}/{len(folded):,} jobs; "
        f"fold(store.events(j)) == store.get(j) for {len(ids) - len(sample_bad)}/{len(ids)} sampled jobs; "
        f"counts {statuses}  ->  {'OK' if ok else 'MISMATCH'}"
    )
    console.print(f"peak RSS of this process: {rss:,.0f} MiB\n")
    if not ok:
        console.print(f"mismatched jobs (first 5): {mismatched[:5]} {sample_bad[:5]}")
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--workdir", type=Path, default=None, help="where DB files go; the replay DB is cached here (default: a new temp dir)"
    )
    ap.add_argument("--jobs", type=int, default=500, help="jobs per append-mix run (default 500)")
    ap.add_argument("--progress", type=int, default=10, help="Progress events per job in the append mix (default 10)")
    ap.add_argument("--floor-ops", type=int, default=2000, help="operations per reference-floor run (default 2000)")
    ap.add_argument("--events", type=int, default=1_000_000, help="events in the replay DB (default 1,000,000)")
    ap.add_argument(
        "--steps", type=int, default=50, help="Progress events per job in the replay DB (default 50, the request default)"
    )
    ap.add_argument("--batch", type=int, default=10_000, help="all_events batch size (default 10,000, the store's default)")
    ap.add_argument("--sample", type=int, default=200, help="jobs checked with store.events + fold vs store.get (default 200)")
    ap.add_argument(
        "--backlogs",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[100, 1000, 10_000, 50_000],
        help="queued-job counts for the queue-read section (default 100,1000,10000,50000)",
    )
    ap.add_argument("--reps", type=int, default=50, help="calls timed per queue read (default 50)")
    ap.add_argument("--skip-append", action="store_true")
    ap.add_argument("--skip-queue", action="store_true")
    ap.add_argument("--skip-replay", action="store_true")
    args = parse(ap, argv, __spec__.name)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="h3bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print_machine(workdir, "h3core event store benchmark")
    if not args.skip_append:
        bench_appends(workdir, args.jobs, args.progress, args.floor_ops)
    if not args.skip_queue:
        bench_queue_reads(workdir, args.backlogs, args.reps)
    if not args.skip_replay:
        bench_replay(workdir, args.events, args.steps, args.batch, args.sample)
    print_load_at_end()


if __name__ == "__main__":
    main()
