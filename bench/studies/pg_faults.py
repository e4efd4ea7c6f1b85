"""What the PostgreSQL store's connections do under faults (`h3core.adapters.store._postgres`), on a
throwaway server:

1. what checking a pooled connection before it is lent costs a point read: none, psycopg_pool's
   `check_connection` (a round trip each time), and h3core's (a round trip only where the server
   wrote to the idle connection);
2. after every session is ended (`pg_terminate_backend`, as a restart does) with the pool's idle
   connections dead: how many reads fail, and how long until one goes through, with each check;
3. how long an append waits behind a writer frozen inside its write, holding the events lock
   (the server ends such a session after `STALLED_TRANSACTION_S`).

    python -m bench.studies.pg_faults [--reads 3000] [--pool 8] [--stalls 3]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterator

from bench.common import console, parse, pct, postgres, print_machine, show, table

APP = "h3bench"  # the application_name of the bench's pooled sessions: only those are ended
_check_us: list[float] = []  # h3core's check alone, µs a call


def _ended(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True, application_name=f"{APP}-ender") as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (APP,))


@contextlib.contextmanager
def _pools(url: str, size: int) -> Iterator[list[tuple[str, Callable[[], object], Callable[[], None]]]]:
    """(name, one point read, fill the pool with `size` idle connections) for each check."""
    from psycopg_pool import ConnectionPool

    from h3core.adapters.store._postgres import Connections

    opened: list[ConnectionPool] = []
    rows = []
    for name, check in (("no check", None), ("psycopg_pool's check_connection", ConnectionPool.check_connection)):
        pool = ConnectionPool(url, min_size=1, max_size=size, kwargs={"autocommit": True}, check=check, open=True)
        pool.wait()
        opened.append(pool)

        def read(pool=pool) -> object:
            with pool.connection() as conn:
                return conn.execute("SELECT 1").fetchall()

        rows.append((name, read, lambda pool=pool: _fill(pool.connection, size)))
    db = Connections(url, pool_size=size, connect_timeout_s=10)
    rows.append(("h3core's (Connections)", lambda: db.read("SELECT 1"), lambda: _fill(db.connection, size)))
    with db.connection() as conn:  # the check alone, on an idle connection: what it adds to a checkout
        began, n = time.perf_counter(), 2000
        for _ in range(n):
            db._check(conn)
        _check_us[:] = [(time.perf_counter() - began) / n * 1e6]
    try:
        yield rows
    finally:
        for pool in opened:
            pool.close()
        db.close()


def _fill(lend: Callable[[], contextlib.AbstractContextManager], size: int) -> None:
    with contextlib.ExitStack() as stack:
        for _ in range(size):
            stack.enter_context(lend())


def _after_termination(url: str, read: Callable[[], object], fill: Callable[[], None]) -> tuple[int, float]:
    """Reads that failed after every pooled session was ended, and seconds to the first that went through."""
    fill()
    _ended(url)
    time.sleep(0.2)  # the backends are gone
    failed, began = 0, time.perf_counter()
    while True:
        try:
            read()
            return failed, time.perf_counter() - began
        except Exception:
            failed += 1


def _stall(url: str) -> float:
    """Seconds an append waited behind a writer frozen inside its write."""
    from h3core.adapters.store._postgres import Connections
    from h3core.adapters.store.postgres import PostgresEventStore
    from h3core.domain.events import Admitted
    from h3core.testing.factories import submitted

    store, frozen = PostgresEventStore(url), Connections(url, pool_size=1, connect_timeout_s=10)
    holding, thaw = threading.Event(), threading.Event()

    def freeze(conn) -> None:
        holding.set()
        thaw.wait(60)
        conn.execute("SELECT 1")

    def writer() -> None:
        with contextlib.suppress(Exception):  # its session was ended: what is measured
            frozen.write(freeze)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        holding.wait(30)
        began = time.perf_counter()
        store.append(f"j{time.monotonic_ns()}", [submitted(), Admitted()], expected_seq=0)
        return time.perf_counter() - began
    finally:
        thaw.set()
        thread.join()
        frozen.close()
        store.close()


def main(argv: list[str] | None = None, pg: object | None = None) -> None:
    """`pg`: a running tests.pgserver.PgServer to use (the smoke tests pass the suite's), else one is started."""
    from h3core.adapters.store._postgres import STALLED_TRANSACTION_S

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=3000, help="point reads timed per check (default 3000)")
    parser.add_argument("--pool", type=int, default=8, help="pooled connections (the store's default: 8)")
    parser.add_argument("--stalls", type=int, default=3, help="appends behind a frozen writer (default 3)")
    args = parse(parser, argv, __spec__.name)
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)  # each dead connection it discards: the table counts them
    print_machine("/tmp", "PostgreSQL store connections under faults")
    with postgres(pg) as server:
        url = server.fresh_schema() + f"&application_name={APP}"
        columns = ["check", "reads/s", "p50 µs", "p99 µs"]
        cost = table(f"A point read, {args.reads} in a row, by the check before lending", columns)
        ended = table(
            f"Every session ended (pg_terminate_backend) with {args.pool} idle pooled connections",
            ["check", "reads failed", "s to the first read through"],
        )
        with _pools(url, args.pool) as pools:
            for name, read, fill in pools:
                for _ in range(min(200, args.reads)):  # warm
                    read()
                times = []
                for _ in range(args.reads):
                    began = time.perf_counter()
                    read()
                    times.append(time.perf_counter() - began)
                cost.add_row(name, f"{len(times) / sum(times):.0f}", f"{pct(times, 50) * 1e6:.0f}", f"{pct(times, 99) * 1e6:.0f}")
                failed, took = _after_termination(url, read, fill)
                ended.add_row(name, str(failed), f"{took:.3f}")
        stalls = [_stall(url) for _ in range(args.stalls)]
    show(cost)
    console.print(f"h3core's check alone, on an idle connection: {_check_us[0]:.1f} µs a call.\n")
    show(ended)
    if stalls:  # --stalls 0: none measured (each takes the bound)
        stall = table(
            "An append behind a writer frozen inside its write (the events lock held)",
            ["appends", "min s", "median s", "max s", "bound (STALLED_TRANSACTION_S)"],
        )
        median = statistics.median(stalls)
        stall.add_row(str(len(stalls)), f"{min(stalls):.2f}", f"{median:.2f}", f"{max(stalls):.2f}", f"{STALLED_TRANSACTION_S:g}")
        show(stall)
        console.print("The server ends the frozen writer's session once it has sat idle in its transaction for the bound.")


if __name__ == "__main__":
    main()
