"""Several nodes on one PostgreSQL: crash trials, jobs/s by runner nodes, claim latency, event-to-SSE.

    python -m bench.throughput.nodes                    # everything
    python -m bench.throughput.nodes --only trials --trials 10

Every server is a real `h3core serve` process (fake executor) on a throwaway PostgreSQL
(tests/pgserver.py, `fsync=off`) and one shared artifact folder:

- `trials`: 3 runner nodes and 2 API nodes; a client floods both API nodes with submits (each
  with an Idempotency-Key) and cancels; each trial SIGKILLs one runner node at a random moment,
  waits until another node has ended every attempt it held, then starts it again. At the end:
  acknowledged jobs lost, jobs not ended, jobs with two terminal events, how long after the kill
  each killed attempt was ended (and whether another node ran it again), `h3core verify`.
- `jobs`: jobs/s end to end (submit over HTTP to an API node until every job is done; zero-time
  fake) with 1, 2 and 4 runner nodes, against one SQLite `serve` (role all) and the same client.
- `claim`: one claim (read the queue's head, write its `running`) with 50,000 jobs queued, in process.
- `sse`: event-to-SSE latency across nodes: the runner node stores a step, an API node's live
  stream delivers it (wall clock of one machine; p50/p99).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench.common import ROOT, console, parse, pct, postgres, print_load_at_end, print_machine, show, table
from h3core.adapters.store.postgres import PostgresEventStore
from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.domain.admission import QueueFilter
from h3core.domain.events import Admitted, Running
from h3core.testing.factories import submitted

JOB = {"width": 448, "height": 256, "frames": 12}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One `h3core serve` process."""

    def __init__(self, work: Path, db: str, role: str, name: str, **settings: object) -> None:
        self.work, self.db, self.role, self.name, self.settings = work, db, role, name, settings
        self.port = _port() if role != "runner" else None
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("H3_")}
        env.update(
            PYTHONPATH=str(ROOT),
            H3_DB=str(self.db),
            H3_ROLE=self.role,
            H3_EXECUTOR="fake",
            H3_ARTIFACTS=str(self.work / "artifacts"),
            H3_UPLOADS=str(self.work / "uploads"),
            H3_POLL_INTERVAL="0.05",
            H3_LOG_LEVEL="warning",
        )
        if self.role != "api":
            env["H3_NODE"] = self.name
        if self.port is not None:
            env["H3_PORT"] = str(self.port)
        env.update({f"H3_{k.upper()}": str(v) for k, v in self.settings.items()})
        log = open(self.work / f"{self.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "h3core.cli", "serve"], cwd=self.work, env=env, stdout=log, stderr=log
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def _until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def _ready(node: Node) -> bool:
    try:
        return httpx.get(node.url + "/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _submit(client: httpx.Client, node: Node, prompt: str, steps: int) -> str | None:
    body = {**JOB, "prompt": prompt, "steps": steps}
    try:
        r = client.post(node.url + "/v1/jobs", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}, timeout=30)
    except httpx.HTTPError:
        return None
    return r.json()["id"] if r.status_code in (200, 201) else None


# -- crash trials ---------------------------------------------------------------------------


def trials(server, work: Path, args: argparse.Namespace) -> None:
    n, lease, runner_nodes, api_nodes = args.trials, args.lease, args.runners, args.apis
    url = server.fresh_schema()
    rng = random.Random(args.seed)
    settings = {"lease": lease, "slots": 2, "max_attempts": 20, "retry_on": "interrupted", "tail_interval": 0.5}
    runners = [Node(work, url, "runner", f"r{i}", **settings) for i in range(runner_nodes)]
    apis = [Node(work, url, "api", f"a{i}", **settings) for i in range(api_nodes)]
    for node in [*runners, *apis]:
        node.start()
    store = PostgresEventStore(url)
    acknowledged: list[str] = []
    stop = threading.Event()
    cancels = 0

    def flood() -> None:
        nonlocal cancels
        with httpx.Client() as client:
            while not stop.is_set():
                api = rng.choice(apis)
                job = _submit(client, api, "a fox [fake step=0.05]", rng.randint(5, 30))
                if job is not None:
                    acknowledged.append(job)
                if acknowledged and rng.random() < 0.1:  # a cancel, sent to either API node
                    victim = rng.choice(acknowledged)
                    try:
                        client.post(rng.choice(apis).url + f"/v1/jobs/{victim}/cancel", timeout=30)
                        cancels += 1
                    except httpx.HTTPError:
                        pass
                time.sleep(args.submit_every)

    # (job, seconds from the kill to its end, the end names the dead node, the killed attempt, the end's type)
    killed: list[tuple[str, float, bool, int, str]] = []
    try:
        _until(lambda: all(_ready(a) for a in apis), 120, "the API nodes to be ready")
        flooder = threading.Thread(target=flood)
        flooder.start()
        for trial in range(n):
            time.sleep(rng.uniform(1.0, 3.0))
            busy = set(store.leases.lease_holders().values())
            victim = rng.choice([r for r in runners if r.name in busy] or runners)  # one running something, if any is
            victim.kill()
            at = datetime.now(UTC)
            held = {j: store.get(j).attempt for j, node in store.leases.lease_holders().items() if node == victim.name}
            console.print(f"trial {trial + 1}: SIGKILL {victim.name}, holding {len(held)} attempts")

            def ended(job: str, attempt: int) -> bool:
                s = store.get(job)
                return s is not None and (s.status != "running" or s.attempt != attempt)

            _until(
                lambda held=held: all(ended(j, a) for j, a in held.items()), lease * 4 + 60, "the killed node's attempts to end"
            )
            for job, attempt in held.items():
                events = store.events(job)
                # The event that ended the killed attempt: the first after the kill that left it.
                end = next(e for e in events if e.at >= at and e.type in ("attempt_failed", "failed", "cancelled", "done"))
                named = f"node {victim.name} stopped heartbeating" in str(e.body) if (e := end) else False
                killed.append((job, (end.at - at).total_seconds(), named, attempt, end.type))
            victim.start()
            _until(
                lambda victim=victim: any(n.node_id == victim.name and n.pid == victim.proc.pid for n in store.leases.nodes()),
                120,
                f"{victim.name} to rejoin",
            )
        stop.set()
        flooder.join()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and any(not store.get(j).terminal for j in acknowledged):
            time.sleep(0.2)
        stuck = [j for j in acknowledged if store.get(j) is None or not store.get(j).terminal]
        # Killed attempts that ran again (the retry policy's next attempt, on any node), once all ended.
        again = sum(
            any(isinstance(e.body, Running) and e.body.attempt > attempt for e in store.events(job))
            for job, _, _, attempt, _ in killed
        )
        lost = [j for j in acknowledged if store.get(j) is None]
        double = [j for j in acknowledged if sum(e.terminal for e in store.events(j)) > 1]
        verify = subprocess.run(
            [sys.executable, "-m", "h3core.cli", "verify", "--db", url, "--artifacts", str(work / "artifacts")],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        stop.set()
        for node in [*runners, *apis]:
            node.stop()
    delays = [d for _, d, *_ in killed]
    ends: dict[str, int] = {}
    for *_, kind in killed:
        ends[kind] = ends.get(kind, 0) + 1
    statuses: dict[str, int] = {}
    for j in acknowledged:
        statuses[store.get(j).status] = statuses.get(store.get(j).status, 0) + 1
    store.close()
    t = table(
        f"crash trials: {runner_nodes} runner nodes, {api_nodes} API nodes, one SIGKILLed per trial (lease {lease:g}s)",
        [
            "trials",
            "acknowledged",
            "cancels sent",
            "lost",
            "stuck",
            "two terminals",
            "killed attempts",
            "ends naming the dead node",
            "run again",
            "kill to end p50 / max s",
            "verify",
        ],
        caption=f"final statuses: {json.dumps(statuses)}; killed attempts ended as {json.dumps(ends)}; "
        "bound: lease + lease/3 (the takeover look) + a poll",
    )
    t.add_row(
        str(n),
        str(len(acknowledged)),
        str(cancels),
        str(len(lost)),
        str(len(stuck)),
        str(len(double)),
        str(len(killed)),
        str(sum(named for _, _, named, _, _ in killed)),
        str(again),
        f"{pct(delays, 50):.2f} / {max(delays, default=float('nan')):.2f}",
        "clean" if verify.returncode == 0 else verify.stdout[-300:],
    )
    show(t)


# -- jobs/s -------------------------------------------------------------------------------


def jobs_per_second(server, work: Path, jobs: int, runner_nodes: list[int]) -> None:
    t = table(
        f"jobs/s end to end: {jobs} zero-time fake jobs submitted over HTTP, until all are done",
        ["store", "runner nodes", "jobs/s"],
    )
    for kind, count in [("sqlite", 1)] + [("postgres", n) for n in runner_nodes]:
        run = work / f"jobs-{kind}-{count}"
        run.mkdir()
        if kind == "sqlite":
            nodes = [Node(run, str(run / "h3.db"), "all", "all", slots=4)]
            api = nodes[0]
        else:
            url = server.fresh_schema()
            nodes = [Node(run, url, "runner", f"r{i}", slots=4) for i in range(count)] + [Node(run, url, "api", "api")]
            api = nodes[-1]
        for node in nodes:
            node.start()
        try:
            _until(lambda api=api: _ready(api), 120, "the API to be ready")
            store = SQLiteEventStore(nodes[0].db) if kind == "sqlite" else PostgresEventStore(nodes[0].db)
            started = time.perf_counter()
            with httpx.Client() as client, ThreadPoolExecutor(8) as pool:  # 8 submitters: the client is not the limit
                ids = list(pool.map(lambda _, api=api: _submit(client, api, "fast [fake step=0]", 1), range(jobs)))
            _until(lambda store=store, ids=ids: store.counts().get("done", 0) >= len(ids), 600, "every job to be done")
            elapsed = time.perf_counter() - started
            store.close()
        finally:
            for node in nodes:
                node.stop()
        t.add_row(kind, str(count), f"{jobs / elapsed:.1f}")
    show(t)


# -- claim latency ------------------------------------------------------------------------


def claim_latency(server, work: Path, queued: int, claims: int) -> None:
    """One claim as a runner makes it: with no filter (a single runner), and with a node's pre-filter
    (a shared store) when every queued job fits the node and when the queue's first half is jobs too
    long for it (the store walks past them in SQL; none of them is parsed)."""
    t = table(
        f"one claim (the queue's head read, its `running` written) with {queued:,} queued",
        ["store", "pre-filter", "p50 ms", "p99 ms"],
    )
    node = QueueFilter(max_frames=200)
    cases = [
        ("none (one runner)", None, 0),
        ("a node's, every job fits", node, 0),
        ("a node's, first half too long", node, queued // 2),
    ]
    for kind in ("sqlite", "postgres"):
        for label, fits, too_long in cases:
            store = (
                SQLiteEventStore(work / f"claims-{uuid.uuid4().hex}.db", durable=False)
                if kind == "sqlite"
                else PostgresEventStore(server.fresh_schema())
            )
            for start in range(0, queued, 2000):
                batch = range(start, min(queued, start + 2000))
                store.append_batch([(f"j{i:06d}", [submitted(frames=400 if i < too_long else 50), Admitted()], 0) for i in batch])
            times = []
            for _ in range(claims):
                began = time.perf_counter()
                (head,) = store.queued(1, fits=fits) if fits is not None else store.queued(1)
                store.append_batch([(head.job_id, [Running(attempt=1, executor="x")], head.last_seq)])
                times.append(time.perf_counter() - began)
            store.close()
            t.add_row(kind, label, f"{pct(times, 50) * 1e3:.2f}", f"{pct(times, 99) * 1e3:.2f}")
    show(t)


# -- event to SSE -------------------------------------------------------------------------


def sse_latency(server, work: Path, jobs: int) -> None:
    url = server.fresh_schema()
    runner, api = Node(work, url, "runner", "r0", slots=1), Node(work, url, "api", "api", tail_interval=0.5)
    for node in (runner, api):
        node.start()
    delays: list[float] = []
    try:
        _until(lambda: _ready(api), 120, "the API node to be ready")
        with httpx.Client(timeout=60) as client:
            for _ in range(jobs):
                job = _submit(client, api, "steps [fake step=0.02]", 40)
                with client.stream("GET", api.url + f"/v1/jobs/{job}/stream") as stream:
                    for line in stream.iter_lines():
                        if line.startswith("data: "):
                            event = json.loads(line.removeprefix("data: "))
                            if event["body"]["type"] == "progress":
                                delays.append((datetime.now(UTC) - datetime.fromisoformat(event["at"])).total_seconds())
    finally:
        for node in (runner, api):
            node.stop()
    t = table(
        "event to SSE across nodes: a runner node stores a step, an API node's live stream delivers it",
        ["events", "p50 ms", "p99 ms"],
        caption="the API node's poll fallback is 0.5 s (H3_TAIL_INTERVAL): what is faster came by LISTEN/NOTIFY",
    )
    t.add_row(str(len(delays)), f"{pct(delays, 50) * 1e3:.1f}", f"{pct(delays, 99) * 1e3:.1f}")
    show(t)


def main(argv: list[str] | None = None, pg: object | None = None) -> None:
    """`pg`: a running tests.pgserver.PgServer to use (the smoke tests pass the suite's), else one is started."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["trials", "jobs", "claim", "sse"], action="append", help="a part (repeatable)")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--runners", type=int, default=3, help="runner nodes in the trials (default 3; at least 2)")
    parser.add_argument("--apis", type=int, default=2, help="API nodes in the trials (default 2)")
    parser.add_argument("--submit-every", type=float, default=0.02, help="the trials' client: seconds between submits")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--runner-nodes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4], help="jobs/s")
    parser.add_argument("--queued", type=int, default=50_000)
    parser.add_argument("--claims", type=int, default=200, help="claims timed per case (default 200)")
    parser.add_argument("--sse-jobs", type=int, default=5, help="jobs whose steps the SSE part times (default 5)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None, help="logs and SQLite files (default: a new temp dir)")
    args = parse(parser, argv, __spec__.name)
    parts = args.only or ["trials", "jobs", "claim", "sse"]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="h3nodes-"))
    work.mkdir(parents=True, exist_ok=True)
    print_machine(work, "several nodes on one PostgreSQL")
    with postgres(pg) as server:
        if "trials" in parts:
            (work / "trials").mkdir()
            trials(server, work / "trials", args)
        if "jobs" in parts:
            jobs_per_second(server, work, args.jobs, args.runner_nodes)
        if "claim" in parts:
            claim_latency(server, work, args.queued, args.claims)
        if "sse" in parts:
            (work / "sse").mkdir()
            sse_latency(server, work / "sse", args.sse_jobs)
    print_load_at_end()


if __name__ == "__main__":
    main()
