"""Which PostgreSQL driver for `PostgresEventStore`: one append's transaction (BEGIN, the events
table lock, a state read, an event insert, the projection upsert, COMMIT) timed with psycopg 3
(sync, as the store calls it from a worker thread) and with asyncpg, on a throwaway server.

    python -m bench.studies.pg_driver [--appends 2000]

Needs the `postgres` extra and PostgreSQL's binaries; asyncpg where installed (not a dependency: only
this measurement uses it; without it, its row says so).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from importlib.util import find_spec

from bench.common import console, parse, pct, postgres, print_machine, show, table

SCHEMA = [
    "CREATE TABLE events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, job_id text, seq int, body text)",
    "CREATE TABLE jobs (job_id text PRIMARY KEY, last_seq int, state text)",
    "INSERT INTO jobs SELECT 'j' || i, 0, '{}' FROM generate_series(0, 99) i",
]
BODY = '{"type":"progress","step":1,"total":10,"v":1}' * 4


def psycopg_appends(url: str, n: int) -> list[float]:
    import psycopg

    out = []
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(n):
            job = f"j{i % 100}"
            t = time.perf_counter()
            with conn.transaction():
                conn.execute("LOCK TABLE events IN EXCLUSIVE MODE")
                seq = conn.execute("SELECT last_seq FROM jobs WHERE job_id = %s", (job,)).fetchone()[0] + 1
                conn.execute("INSERT INTO events (job_id, seq, body) VALUES (%s, %s, %s)", (job, seq, BODY))
                conn.execute("UPDATE jobs SET last_seq = %s, state = %s WHERE job_id = %s", (seq, BODY, job))
            out.append(time.perf_counter() - t)
    return out


async def asyncpg_appends(url: str, n: int) -> list[float]:
    import asyncpg

    out = []
    conn = await asyncpg.connect(url)
    try:
        for i in range(n):
            job = f"j{i % 100}"
            t = time.perf_counter()
            async with conn.transaction():
                await conn.execute("LOCK TABLE events IN EXCLUSIVE MODE")
                seq = await conn.fetchval("SELECT last_seq FROM jobs WHERE job_id = $1", job) + 1
                await conn.execute("INSERT INTO events (job_id, seq, body) VALUES ($1, $2, $3)", job, seq, BODY)
                await conn.execute("UPDATE jobs SET last_seq = $1, state = $2 WHERE job_id = $3", seq, BODY, job)
            out.append(time.perf_counter() - t)
    finally:
        await conn.close()
    return out


def main(argv: list[str] | None = None, pg: object | None = None) -> None:
    """`pg`: a running tests.pgserver.PgServer to use (the smoke tests pass the suite's), else one is started."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200, help="appends before the timed ones (default 200)")
    args = parse(parser, argv, __spec__.name)
    print_machine("/tmp", "PostgreSQL driver: one append's transaction")
    t = table(f"{args.appends} appends in a row, one connection", ["driver", "appends/s", "p50 ms", "p99 ms"])
    with postgres(pg) as server:
        for name, run in (
            ("psycopg 3 (sync)", psycopg_appends),
            ("asyncpg", lambda url, n: asyncio.run(asyncpg_appends(url, n))),
        ):
            if name == "asyncpg" and find_spec("asyncpg") is None:  # not a dependency: a row that says so
                t.add_row(name, "not installed (pip install asyncpg)", "-", "-")
                continue
            url = server.fresh_schema()
            import psycopg

            with psycopg.connect(url, autocommit=True) as conn:
                for sql in SCHEMA:
                    conn.execute(sql)
            run(url, args.warmup)  # warm: prepared statements, caches
            times = run(url, args.appends)
            t.add_row(*(name, f"{len(times) / sum(times):.0f}", f"{pct(times, 50) * 1e3:.3f}", f"{pct(times, 99) * 1e3:.3f}"))
    show(t)
    console.print("The store is called from worker threads (its API is sync): asyncpg would need an event loop per thread.")


if __name__ == "__main__":
    main()
