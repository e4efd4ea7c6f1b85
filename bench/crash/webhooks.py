"""Webhook crash trials: a real `h3core worker` delivering webhooks killed with SIGKILL while
deliveries are pending, then restarted; is every terminal event delivered, and how often twice?

    python -m bench.crash.webhooks                 # 10 trials, 6 jobs each
    python -m bench.crash.webhooks --trials 3 --jobs 4

Each trial, on a fresh store: jobs asking for `start` and `completed` webhooks are stored (as an
api process stores them), a worker (fake executor) runs them and delivers to a receiver on
loopback in this process, and is killed with SIGKILL at a random moment (seeded) after it is
ready and a job has ended. In odd trials the receiver is down (500) until the kill, so terminal
events are pending in retry backoff when it dies; in even trials it answers after 0.3 s and the
kill, of the worker and its delivering process both, lands while a terminal event's send is in
flight (its answer goes to a dead process: the receiver has it, the subscription's place does
not, so it is sent again: a repeat, same id). In odd trials only the worker is killed: its
delivering process must end by itself (stdin, its lifeline, ends), counted as orphans if not.
Then the receiver answers at once and a clean worker runs until every job's terminal event has
been answered (or `--wait` runs out). Counted per trial: terminal events, those first answered
after the restart, lost (never answered: must be 0), repeats (an id answered more than once:
allowed, at least once), repeats whose body differs from the first (must be 0), ids no event of
the log has (must be 0), and delivering processes alive 10 s after the kill (the child must die
with its parent).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio

from bench.common import console, parse, print_load_at_end, print_machine, show, table, wait_for
from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.domain.request import GenerationRequest
from h3core.domain.webhooks import Allow, WebhookTarget
from h3core.runtime.submissions import Submissions, WebhookPolicy
from h3core.runtime.webhooks import SUBSCRIPTION

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@dataclass
class Receiver:
    """A loopback receiver: answers 500 while `down`, 204 otherwise; records (id, body, answered, when)."""

    down: bool = False
    delay_s: float = 0.0  # before each answer
    got: list[tuple[str, str, bool, float]] = field(default_factory=list)
    arrived: set[str] = field(default_factory=set)  # ids whose request came in, answered yet or not
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answered(self) -> list[tuple[str, str, bool, float]]:
        with self.lock:
            return [g for g in self.got if g[2]]


def serve_receiver(rec: Receiver) -> tuple[ThreadingHTTPServer, str]:
    """`rec` served on a free loopback port, in a thread: the server (to shut down) and its URL."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length", 0))).decode()
            with rec.lock:
                rec.arrived.add(self.headers.get("webhook-id", ""))
            time.sleep(rec.delay_s)
            with rec.lock:
                ok = not rec.down
                rec.got.append((self.headers.get("webhook-id", ""), body, ok, time.monotonic()))
            self.send_response(204 if ok else 500)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/hook"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("H3_")}
    return {**env, "H3_WEBHOOK_SECRET": SECRET, "H3_WEBHOOKS_ALLOW": "127.0.0.1"}


def _worker(db: Path, log: Path, step: float) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "h3core.cli", "worker", "--db", db, "--artifacts", db.parent / "artifacts"]
    cmd += ["--executor", "fake", "--poll-interval", "0.05", "--fake-step-seconds", step]
    with open(log, "ab") as out:
        return subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=db.parent)


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started that still run (Linux)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return False


async def _enqueue(db: Path, jobs: int, steps: int, url: str) -> None:
    store = SQLiteEventStore(db)
    try:
        # As an api process does, with a secret to sign with and the loopback receiver allowed.
        submissions = Submissions(store, webhooks=WebhookPolicy(signing=True, allow=Allow(["127.0.0.0/8"])))
        hook = WebhookTarget(url=url, events=("start", "completed"))
        for i in range(jobs):
            request = GenerationRequest(prompt=f"trial job {i}", steps=steps, frames=12, width=64, height=64)
            await submissions.submit(request, webhook=hook)
    finally:
        store.close()


def _terminal_ids(db: Path) -> tuple[set[str], int]:
    """The webhook-id of every ended job's terminal event, and how many jobs have not ended."""
    store = SQLiteEventStore(db)
    try:
        ids, unended = set(), 0
        for job_id in store.job_ids():
            last = store.events(job_id)[-1]
            if last.terminal:
                ids.add(f"msg_{job_id}_{last.seq}")
            else:
                unended += 1
        return ids, unended
    finally:
        store.close()


def _caught_up(db: Path) -> bool:
    store = SQLiteEventStore(db)
    try:
        return store.position(SUBSCRIPTION) == store.cursor()
    finally:
        store.close()


def _tried(rec: Receiver) -> set[str]:
    """The ids tried and answered (500 while down)."""
    with rec.lock:
        return {g[0] for g in rec.got}


def _all_ids(db: Path) -> set[str]:
    store = SQLiteEventStore(db)
    try:
        return {f"msg_{e.job_id}_{e.seq}" for job_id in store.job_ids() for e in store.events(job_id)}
    finally:
        store.close()


def trial(n: int, work: Path, rng: random.Random, jobs: int, steps: int, step_s: float, wait_s: float) -> dict[str, int]:
    work.mkdir(parents=True)
    db = work / "h3.db"
    log = work / "worker.log"
    rec = Receiver(down=n % 2 == 1, delay_s=0.0 if n % 2 else 0.3)
    server, url = serve_receiver(rec)
    try:
        anyio.run(_enqueue, db, jobs, steps, url)
        first = _worker(db, log, step_s)
        wait_for(lambda: b"worker: ready" in log.read_bytes() or first.poll() is not None, 60)
        # Odd trials: killed once a terminal event's first try failed (it waits in backoff), at a
        # random moment within the span the other jobs take to run. Even: while a terminal event's
        # send is in flight (the receiver holds it 0.3 s), so the worker dies before its answer.
        wait_for(lambda: bool(_terminal_ids(db)[0] & (_tried(rec) if rec.down else rec.arrived)), 60)
        time.sleep(rng.uniform(0.0, jobs * steps * step_s if rec.down else rec.delay_s * 0.8))
        children = child_pids(first.pid)  # the delivering process
        if not rec.down:  # even trials: the delivering process is killed too, mid-send (a machine's crash)
            for pid in children:
                os.kill(pid, signal.SIGKILL)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        killed_at = time.monotonic()
        orphans = sum(1 for pid in children if not wait_for(lambda pid=pid: not _alive(pid), 10))
        rec.down, rec.delay_s = False, 0.0
        second = _worker(db, log, step_s)
        try:
            # Until every terminal event is answered and the restarted worker's subscription has
            # moved past them all (so what it sends again, it has sent).
            wait_for(
                lambda: (t := _terminal_ids(db))[1] == 0 and t[0] <= {g[0] for g in rec.answered()} and _caught_up(db), wait_s
            )
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(30)
    finally:
        server.shutdown()
        server.server_close()
    terminal, unended = _terminal_ids(db)
    answered = rec.answered()
    first_answer: dict[str, float] = {}
    bodies: dict[str, set[str]] = {}
    for msg_id, body, _, at in answered:
        first_answer.setdefault(msg_id, at)
        bodies.setdefault(msg_id, set()).add(json.dumps(json.loads(body), sort_keys=True))
    known = _all_ids(db)
    return {
        "terminal": len(terminal),
        "after restart": sum(1 for i in terminal if first_answer.get(i, 0) > killed_at),
        "lost": len(terminal - set(first_answer)) + unended,  # a job that never ended: its end never told
        "repeats": len(answered) - len(first_answer),
        "repeats differing": sum(1 for b in bodies.values() if len(b) > 1),
        "unknown ids": len(set(first_answer) - known),
        "delivering processes": len(children),
        "orphans": orphans,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--step-seconds", type=float, default=0.05)
    ap.add_argument("--wait", type=float, default=120.0, help="seconds the restarted worker has to deliver (default 120)")
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--workdir", type=Path, default=None, help="where its files go (default: a new temp dir)")
    args = parse(ap, argv, __spec__.name)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="h3bench-webhook-crash-"))
    print_machine(work, "h3core webhook crash trials")
    rng = random.Random(args.seed)
    columns = [
        "terminal",
        "after restart",
        "lost",
        "repeats",
        "repeats differing",
        "unknown ids",
        "delivering processes",
        "orphans",
    ]
    t = table(
        f"kill -9 of a delivering worker, {args.trials} trials of {args.jobs} jobs (odd trials: receiver down until the kill)",
        ["trial", *columns],
        caption="lost, repeats differing, unknown ids and orphans must be 0; repeats carry the id of their first send",
    )
    totals = dict.fromkeys(columns, 0)
    for n in range(args.trials):
        r = trial(n, work / f"t{n}", rng, args.jobs, args.steps, args.step_seconds, args.wait)
        console.print(f"  trial {n}: {r}")
        t.add_row(str(n), *(str(r[c]) for c in columns))
        for c in columns:
            totals[c] += r[c]
    t.add_row("all", *(str(totals[c]) for c in columns))
    show(t)
    print_load_at_end()


if __name__ == "__main__":
    main()
