"""`h3core serve` under cProfile, for http_load --profile: every thread profiled, stopped by closing stdin.

    python -m bench.throughput._serve_profiled OUT.prof --port P --db DB --artifacts DIR --uploads DIR

The app is built the way `h3core serve` builds it (Settings from H3_* and these flags, then
h3core.service.app.create_app) and run by uvicorn with the same options. The main thread (the event
loop: HTTP parsing, routing, handlers, serialisation) and every worker thread started afterwards
(anyio's to_thread pool: store reads and appends) get their own cProfile.Profile, timed with
time.thread_time: each thread's CPU time, so time spent blocked (waiting for a lock, a socket, an
fsync) is not counted. When stdin reaches end of file the server shuts down and the profiles are
merged into OUT.prof.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import threading
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--artifacts", type=Path, required=True)
    ap.add_argument("--uploads", type=Path, required=True)
    args = ap.parse_args()

    import uvicorn

    from h3core.runtime.settings import Settings
    from h3core.service.app import create_app

    settings = Settings(port=args.port, db=args.db, artifacts=args.artifacts, uploads=args.uploads)
    app = create_app(settings)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            timeout_graceful_shutdown=max(5, int(settings.cancel_grace) + 5),
            access_log=settings.log_level == "debug",
        )
    )

    def stop_at_eof() -> None:
        sys.stdin.read()
        server.should_exit = True

    profiles: list[cProfile.Profile] = []

    def start_in_thread(*_: object) -> None:
        p = cProfile.Profile(time.thread_time)
        profiles.append(p)
        p.enable()  # replaces this hook for the rest of the thread's life

    threading.Thread(target=stop_at_eof, daemon=True).start()
    threading.setprofile(start_in_thread)  # threads started from here on
    main_profile = cProfile.Profile(time.thread_time)
    main_profile.enable()
    try:
        server.run()
    finally:
        main_profile.disable()
        threading.setprofile(None)  # type: ignore[arg-type]
        stats = pstats.Stats(main_profile)
        for p in profiles:
            stats.add(p)
        stats.dump_stats(str(args.out))
        print(f"profile of {1 + len(profiles)} threads written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
