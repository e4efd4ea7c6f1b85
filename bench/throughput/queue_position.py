"""What a queued job's position costs to read, as the queue grows: each submit's 201 and each GET of
a queued job report it, read inline on the event loop (a point read).

    python -m bench.throughput.queue_position                        # 1,000 / 10,000 / 50,000 queued
    python -m bench.throughput.queue_position --backlogs 100,5000 --reps 50

For the head of the queue (position 1) and the newest job (position = the backlog), on SQLite and
on PostgreSQL (a throwaway server, tests/pgserver.py), the store's count against the one it
replaced: one range of the queue's index with an OR (`priority > p OR (priority = p AND
queue_order <= q)`), which the databases stepped over every queued job for, where the store's two
ranges (jobs of a higher priority; jobs of the same one up to this) step only over the jobs ahead.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import parse, pct, postgres, print_load_at_end, print_machine, show, table
from h3core.adapters.store.postgres import PostgresEventStore
from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.domain.events import Admitted
from h3core.testing.factories import submitted

ONE_RANGE = (
    "SELECT (SELECT count(*) FROM jobs o WHERE o.status = 'queued' AND "
    "(o.priority > j.priority OR (o.priority = j.priority AND o.queue_order <= j.queue_order))) "
    "FROM jobs j WHERE j.job_id = ? AND j.status = 'queued'"
)


def timed(store, job_id: str, reps: int) -> tuple[int, list[float]]:
    position = store.queue_position(job_id)  # warm
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        store.queue_position(job_id)
        out.append(time.perf_counter() - t0)
    return position, out


def main(argv: list[str] | None = None, pg: object | None = None) -> None:
    """`pg`: a running tests.pgserver.PgServer to use (the smoke tests pass the suite's), else one is started."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backlogs", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 10_000, 50_000])
    ap.add_argument("--reps", type=int, default=30, help="reads timed per case (default 30)")
    ap.add_argument("--workdir", type=Path, default=None, help="where its files go (default: a new temp dir)")
    args = parse(ap, argv, __spec__.name)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="h3qpos-"))
    work.mkdir(parents=True, exist_ok=True)
    print_machine(work, "queue position read vs backlog")
    t = table(
        "queue_position(job): one read, as the backlog grows (every job priority 0)",
        ["store", "queued", "job (position)", "count", "p50 ms", "p99 ms"],
    )
    with postgres(pg) as server:
        for queued in args.backlogs:
            for kind in ("sqlite", "postgres"):
                if kind == "sqlite":
                    store = SQLiteEventStore(work / f"q-{queued}.db", durable=False)
                else:
                    store = PostgresEventStore(server.fresh_schema())
                try:
                    for start in range(0, queued, 2000):
                        ids = range(start, min(queued, start + 2000))
                        store.append_batch([(f"j{i:07d}", [submitted(frames=50), Admitted()], 0) for i in ids])
                    ours = store._sql.queue_position
                    before = ONE_RANGE.replace("?", store._sql.placeholder)
                    for which, job_id in (("head", "j0000000"), ("newest", f"j{queued - 1:07d}")):
                        for label, sql in (("one range, OR (before)", before), ("two ranges (the store's)", ours)):
                            store._sql.queue_position = sql
                            position, lat = timed(store, job_id, args.reps)
                            p50, p99 = f"{pct(lat, 50) * 1e3:.3f}", f"{pct(lat, 99) * 1e3:.3f}"
                            t.add_row(kind, f"{queued:,}", f"{which} ({position:,})", label, p50, p99)
                        store._sql.queue_position = ours
                finally:
                    store.close()
    show(t)
    print_load_at_end()


if __name__ == "__main__":
    main()
