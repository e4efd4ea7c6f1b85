"""A multi-device server left idle: does its Ray head outlive the idleness, and does a job run after?

    python -m bench.studies.ray_idle [--idle 120] [--jobs 2]

Starts the real `h3core serve --devices 2 --group-size 2` (the tiny random model, CPU ranks, a Ray
head of its own on 127.0.0.1), waits until it is ready, sends nothing for `--idle` seconds (the
watchdog off, so only the head's own probe touches Ray), then runs `--jobs` jobs one after the
other. Prints one row: the head's processes before and after, each job's status and seconds, and
whether the server is still alive and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import parse, print_load_at_end, print_machine, show, table
from h3core.executors.pipeline.tiny import make_tiny
from tests.integration.service.conftest import Servers, poll, wait_job
from tests.integration.service.test_groups_http import alive, head

JOB = {"prompt": "a red fox in snow", "width": 64, "height": 64, "frames": 22, "steps": 3}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=120.0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--model-dir", help="the tiny random model's folder (default: written in a new temp dir)")
    args = parse(parser, argv, __spec__.name)
    tmp = Path(tempfile.mkdtemp(prefix="h3-ray-idle-"))
    print_machine(tmp, "a multi-device server left idle")
    servers = Servers(tmp)
    try:
        server = servers.make(
            {
                "H3_EXECUTOR": "pipeline",
                "H3_MODEL_DIR": str(args.model_dir or make_tiny(tmp / "tiny")),
                "H3_DEVICES": "2",
                "H3_GROUP_SIZE": "2",
                "H3_RANK_THREADS": "1",
                "H3_WATCHDOG_INTERVAL": "3600",
                "RAY_ADDRESS": "127.0.0.1:9",  # never someone else's Ray
            }
        )
        server.start(timeout=120)
        with server.client() as api:
            poll(lambda: api.get("/readyz").status_code == 200, 240, "the group to start", server.log)
            before = head(server.proc.pid)
            time.sleep(args.idle)  # the stimulus: nothing at all happens
            head_lived = all(alive(p) for p in before.values())
            jobs = []
            for _ in range(args.jobs):
                t0 = time.monotonic()
                job = api.post("/v1/jobs", json=JOB).json()
                state = wait_job(api, job["id"], timeout=300)
                jobs.append(f"{state['status']} {time.monotonic() - t0:.1f}s")
            after = head(server.proc.pid)
            losses = next(
                (
                    line.split()[-1]
                    for line in api.get("/metrics").text.splitlines()
                    if line.startswith("h3core_ray_head_losses_total")
                ),
                "?",
            )
        server_alive = server.running
        server.stop()
        stopped = server.proc.returncode
    finally:
        servers.kill_all()
    pids = lambda h: ",".join(f"{k}={p.pid}" for k, p in sorted(h.items()))  # noqa: E731
    t = table(
        f"A 2-device server (tiny model, CPU ranks) idle {args.idle:g} s, then {args.jobs} job(s)",
        ["idle s", "head before", "head lived", "head after", "head losses", "jobs", "server alive", "exit on SIGTERM"],
        caption="head: the Ray head's gcs_server and raylet (name=pid); the same pids after means nothing restarted Ray.",
    )
    t.add_row(
        f"{args.idle:.0f}",
        pids(before),
        "yes" if head_lived else "no",
        pids(after),
        losses,
        "; ".join(jobs),
        "yes" if server_alive else "no",
        str(stopped),
    )
    show(t)
    print_load_at_end()


if __name__ == "__main__":
    main()
