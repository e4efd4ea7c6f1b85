"""The fleet under faults: runner nodes and an API node on one PostgreSQL, a submit/cancel flood
with webhooks and live streams, and per trial one fault of the store or of a process.

    python -m bench.crash.fleet_faults                      # 3 trials of every kind (about 20 min)
    python -m bench.crash.fleet_faults --trials 1 --kinds terminate_backends,delivery_killed --seconds 8

Every trial starts from nothing: a fresh schema on one PostgreSQL the bench starts
(tests/pgserver.py; commits made durable for the store's database, `synchronous_commit=on`, so
that an immediate stop loses nothing PostgreSQL acknowledged), `--runners` runner nodes (`h3core
serve --role all`, the fake executor, 2 slots each, lease `--lease`; role `all` rather than
`runner` for their `/metrics`, which says which node's child process delivers webhooks) and one
API node (`--role api`), every node with the webhook secret and the loopback receiver allowed.
While it runs:

- the flood: 3 clients submit through the API node (`--rate` jobs/s in all; 2 to 8 steps of
  0.05 to 0.2 s each, with a webhook for start, progress and completed to a receiver in this
  process), a fourth cancels an acknowledged job every `--cancel-every` s;
- `--streams` live streams (`GET /v1/jobs/{id}/stream` through the API node) of jobs submitted
  first, long enough to outlast the fault; a stream that ends without its terminal event is cut,
  and opened again with Last-Event-ID until it gets it;
- the fault, at a random moment (seeded) 25 to 60 % into `--seconds`, one of:
  `restart_fast` and `restart_immediate` (`pg_ctl restart -m fast|immediate`, down 1 to 8 s),
  `postmaster_pause` (SIGSTOP of the postmaster for `--pause` s: new connections hang, open
  sessions go on), `runner_frozen` (SIGSTOP of the runner node holding most leases for
  `--freeze` s, past its lease, then SIGCONT), `terminate_backends` (`pg_terminate_backend` of
  every session), `delivery_killed` (SIGKILL of the child process delivering webhooks, the one
  whose node's /metrics says `h3core_webhook_delivering 1`) and `delivery_frozen` (SIGSTOP of that
  child for `--delivery-freeze` s, longer than the delivery turn's lease, then SIGCONT);
- a supervisor: a node process that exits is counted and started again 2 s later, as systemd
  would.

The flood runs `--seconds`, and at least `--recover` s after the fault has ended. Then every job
gets `--drain` s to end and every terminal event's webhook `--deliver` s more to arrive; the
nodes are stopped (SIGTERM) and the store is read. Counted per trial, summed per kind:

- acknowledged: submits answered 201; lost: of those, jobs the store does not have; stuck: jobs
  of the store not ended by the drain's deadline; two terminals: logs with more than one
  terminal event; verify: `h3core verify` on the store (and the shared artifacts folder);
- 201 after return: seconds from the fault's end (the store back: `pg_ctl start` returned, the
  postmaster or process continued; the signal or the statement for the instant kinds) to the
  first 201 answered after it ("never": none before the flood ended); 5xx / 4xx / no answer: the
  flood's submits answered so, over the trial (none is due outside the fault);
- webhooks missing: ended jobs whose terminal event never reached the receiver; after terminal:
  deliveries of a job that arrived after its terminal one (a repeat of an id already received,
  same `webhook-id`, is dropped first: at least once allows it); terminal webhook max: the
  longest from a terminal event stored to its webhook's arrival (one machine's clock);
- streams cut: streams that ended without their terminal event at least once; unfinished: never
  got it, even opened again; gaps: a stream whose events, over its connections, skip a seq;
- node exits: node processes that exited during the trial (name and exit status below the
  table); none is due, since every fault is shorter than the store retry (`H3_STORE_RETRY`, 30 s).

A kind passes when lost, stuck, two terminals, verify failures, webhooks missing, after
terminal, streams cut, unfinished, gaps and node exits are 0 in every trial and submits answer
201 again within 10 s of the store's return.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.common import ROOT, console, parse, postgres, print_load_at_end, print_machine, show, table, wait_for
from bench.crash.webhooks import SECRET, Receiver, child_pids, serve_receiver
from bench.throughput.nodes import Node
from h3core.adapters.store.postgres import PostgresEventStore
from h3core.domain.events import TERMINAL_TYPES, event_from_json

KINDS = (
    "restart_fast",
    "restart_immediate",
    "postmaster_pause",
    "runner_frozen",
    "terminate_backends",
    "delivery_killed",
    "delivery_frozen",
)
RECOVERY_BAR_S = 10.0  # the bound: submits answer 201 again within this of the store's return
SIZE = {"width": 64, "height": 64, "frames": 12}
HOOK_EVENTS = ["start", "progress", "completed"]


def _sql(url: str, query: str, params: tuple = ()) -> list[tuple] | None:
    """Rows of `query` on a connection of its own (this process's reads must not depend on a pool
    the fault broke); None while the server does not answer."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(query, params).fetchall()
    except psycopg.Error:
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ready(node: Node) -> bool:
    try:
        return httpx.get(node.url + "/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def delivering(runners: list[Node]) -> tuple[Node, int] | None:
    """The runner node whose child process delivers webhooks now (its /metrics says so), and that
    child's pid; None if none says so."""
    for node in runners:
        try:
            text = httpx.get(node.url + "/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        if node.proc is not None and re.search(r"^h3core_webhook_delivering 1(\.0)?$", text, re.M):
            for pid in child_pids(node.proc.pid):
                if "delivery_process" in _cmdline(pid):
                    return node, pid
    return None


# -- the flood --------------------------------------------------------------------------------


@dataclass
class Answer:
    sent: float  # monotonic
    answered: float
    status: int | None  # None: no answer (a timeout, a refused connection)
    job: str | None


@dataclass
class Flood:
    """Submits with webhooks and cancels through the API node, until `stop` is set."""

    api: Node
    hook: str
    seed: int
    rate: float
    cancel_every: float
    answers: list[Answer] = field(default_factory=list)
    cancels: Counter[str] = field(default_factory=Counter)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def acknowledged(self) -> list[str]:
        with self.lock:
            return [a.job for a in self.answers if a.status == 201 and a.job is not None]

    def submit(self, client: httpx.Client, prompt: str, steps: int, step_s: float, priority: int = 0) -> Answer:
        body = {**SIZE, "prompt": f"{prompt} [fake step={step_s:g}]", "steps": steps, "priority": priority}
        body |= {"webhook": self.hook, "webhook_events_filter": HOOK_EVENTS}
        sent = time.monotonic()
        try:
            r = client.post(self.api.url + "/v1/jobs", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}, timeout=20)
            status, job = r.status_code, (r.json().get("id") if r.status_code == 201 else None)
        except (httpx.HTTPError, ValueError):
            status, job = None, None
        answer = Answer(sent, time.monotonic(), status, job)
        with self.lock:
            self.answers.append(answer)
        return answer

    def _submitter(self, seed: int, every: float) -> None:
        rng = random.Random(seed)
        with httpx.Client() as client:
            while not self.stop.is_set():
                self.submit(client, f"flood {uuid.uuid4().hex[:8]}", rng.randint(2, 8), rng.uniform(0.05, 0.2))
                self.stop.wait(rng.uniform(0.5, 1.5) * every)

    def _canceller(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client() as client:
            while not self.stop.wait(self.cancel_every):
                if jobs := self.acknowledged()[-20:]:  # recent ones: most of them are still queued or running
                    try:
                        r = client.post(self.api.url + f"/v1/jobs/{rng.choice(jobs)}/cancel", timeout=20)
                        self.cancels[str(r.status_code)] += 1
                    except httpx.HTTPError:
                        self.cancels["no answer"] += 1

    def start(self, clients: int = 3) -> None:
        every = clients / self.rate
        self.threads = [threading.Thread(target=self._submitter, args=(self.seed + i, every)) for i in range(clients)]
        self.threads.append(threading.Thread(target=self._canceller, args=(self.seed + clients,)))
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


# -- live streams ------------------------------------------------------------------------------


class Stream(threading.Thread):
    """One job's live stream through the API node, opened again with Last-Event-ID until its
    terminal event comes or `deadline` (monotonic) passes."""

    def __init__(self, api: Node, job: str, deadline: float) -> None:
        super().__init__(daemon=True)
        self.api, self.job, self.deadline = api, job, deadline
        self.seqs: list[int] = []
        self.terminal = False
        self.cuts = 0

    def run(self) -> None:
        while not self.terminal and time.monotonic() < self.deadline:
            last = self.seqs[-1] if self.seqs else 0
            headers = {"Last-Event-ID": str(last)} if last else {}
            try:
                with (
                    httpx.Client(timeout=httpx.Timeout(10, read=30)) as client,
                    client.stream("GET", self.api.url + f"/v1/jobs/{self.job}/stream", headers=headers) as r,
                ):
                    if r.status_code == 204:  # ended, nothing after `last`: its terminal event never came
                        return
                    if r.status_code == 200:
                        for line in r.iter_lines():
                            if line.startswith("data: "):
                                event = event_from_json(line.removeprefix("data: "))
                                self.seqs.append(event.seq)
                                if event.terminal:
                                    self.terminal = True
                                    return
            except httpx.HTTPError:
                pass
            self.cuts += 1
            time.sleep(0.5)

    @property
    def gaps(self) -> bool:
        return self.seqs != list(range(1, len(self.seqs) + 1))


# -- the nodes and their supervisor ------------------------------------------------------------


@dataclass
class Fleet:
    runners: list[Node]
    api: Node
    exits: list[tuple[str, int]] = field(default_factory=list)  # (node, exit status)
    stop: threading.Event = field(default_factory=threading.Event)
    watcher: threading.Thread | None = None

    @property
    def nodes(self) -> list[Node]:
        return [*self.runners, self.api]

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        self.watcher = threading.Thread(target=self._supervise, daemon=True)
        self.watcher.start()

    def _supervise(self) -> None:
        """Start again, 2 s later, a node whose process exited (a supervisor's restart)."""
        down: dict[str, float] = {}
        while not self.stop.wait(0.5):
            for node in self.nodes:
                assert node.proc is not None
                if node.name not in down and node.proc.poll() is not None:
                    self.exits.append((node.name, node.proc.returncode))
                    down[node.name] = time.monotonic()
                elif node.name in down and time.monotonic() - down[node.name] > 2:
                    del down[node.name]
                    node.start()

    def close(self) -> None:
        """SIGTERM to every node at once, then SIGKILL to any still there after 30 s."""
        self.stop.set()
        if self.watcher is not None:
            self.watcher.join()
        alive = [n.proc for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        for proc in alive:
            proc.send_signal(signal.SIGCONT)  # a frozen one would not hear the SIGTERM
            proc.send_signal(signal.SIGTERM)
        for proc in alive:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- the faults --------------------------------------------------------------------------------


@dataclass
class Fault:
    began: float  # monotonic
    ended: float  # the store (or the process) back
    detail: str


def _pg_restart(mode: str) -> Callable[[Any, Fleet, str, random.Random, argparse.Namespace], Fault]:
    def fault(server: Any, fleet: Fleet, url: str, rng: random.Random, args: argparse.Namespace) -> Fault:
        down = rng.uniform(1.0, 8.0)
        began = time.monotonic()
        server.restart(mode, down)
        return Fault(began, time.monotonic(), f"down {down:.1f} s")

    return fault


def _postmaster_pause(server: Any, fleet: Fleet, url: str, rng: random.Random, args: argparse.Namespace) -> Fault:
    began = time.monotonic()
    server.pause()
    try:
        time.sleep(args.pause)
    finally:
        server.resume()
    return Fault(began, time.monotonic(), f"paused {args.pause:g} s")


def _terminate_backends(server: Any, fleet: Fleet, url: str, rng: random.Random, args: argparse.Namespace) -> Fault:
    began = time.monotonic()
    n = server.terminate_backends()
    return Fault(began, time.monotonic(), f"{n} sessions ended")


def _runner_frozen(server: Any, fleet: Fleet, url: str, rng: random.Random, args: argparse.Namespace) -> Fault:
    held = Counter(node for (node,) in _sql(url, "SELECT node_id FROM leases") or [])
    most = max(held.values(), default=0)
    victim = rng.choice([r for r in fleet.runners if held[r.name] == most])
    assert victim.proc is not None
    began = time.monotonic()
    victim.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(args.freeze)
    finally:
        victim.proc.send_signal(signal.SIGCONT)
    return Fault(began, time.monotonic(), f"{victim.name} ({most} leases) frozen {args.freeze:g} s")


def _delivery(freeze: bool) -> Callable[[Any, Fleet, str, random.Random, argparse.Namespace], Fault]:
    def fault(server: Any, fleet: Fleet, url: str, rng: random.Random, args: argparse.Namespace) -> Fault:
        found = delivering(fleet.runners)
        began = time.monotonic()
        if found is None:
            return Fault(began, began, "none: no node said it delivers")
        node, pid = found
        if not freeze:
            os.kill(pid, signal.SIGKILL)
            return Fault(began, time.monotonic(), f"{node.name}'s child {pid} killed")
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(args.delivery_freeze)
        finally:
            os.kill(pid, signal.SIGCONT)
        return Fault(began, time.monotonic(), f"{node.name}'s child frozen {args.delivery_freeze:g} s")

    return fault


FAULTS: dict[str, Callable[[Any, Fleet, str, random.Random, argparse.Namespace], Fault]] = {
    "restart_fast": _pg_restart("fast"),
    "restart_immediate": _pg_restart("immediate"),
    "postmaster_pause": _postmaster_pause,
    "runner_frozen": _runner_frozen,
    "terminate_backends": _terminate_backends,
    "delivery_killed": _delivery(freeze=False),
    "delivery_frozen": _delivery(freeze=True),
}


# -- one trial ---------------------------------------------------------------------------------


def _length(kind: str, args: argparse.Namespace) -> float:
    """About how long the fault of `kind` lasts (a restart: down at most 8 s, plus the stop and start)."""
    return {
        "restart_fast": 10.0,
        "restart_immediate": 10.0,
        "postmaster_pause": args.pause,
        "runner_frozen": args.freeze,
        "delivery_frozen": args.delivery_freeze,
    }.get(kind, 0.0)


def _until(predicate: Callable[[], bool], timeout: float, what: str, fleet: Fleet) -> None:
    if not wait_for(predicate, timeout):
        logs = "; ".join(f"{n.name}: {n.work / (n.name + '.log')}" for n in fleet.nodes)
        raise SystemExit(f"timed out waiting for {what} (logs: {logs})")


def _statuses(url: str) -> dict[str, tuple[str, int]] | None:
    rows = _sql(url, "SELECT job_id, status, last_seq FROM jobs")
    return None if rows is None else {job: (status, seq) for job, status, seq in rows}


def trial(server: Any, work: Path, kind: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    work.mkdir(parents=True)
    rng = random.Random(f"{args.seed}-{kind}-{n}")
    url = server.fresh_schema()
    rec = Receiver()
    receiver, hook = serve_receiver(rec)
    settings = {
        "lease": args.lease,
        "slots": 2,
        "max_attempts": 20,
        "retry_on": "interrupted,executor_lost",
        "fake_step_seconds": 0.1,
        "webhook_secret": SECRET,
        "webhooks_allow": "127.0.0.1",
        "log_level": "info",
    }
    runners = [Node(work, url, "all", f"r{i}", **settings) for i in range(args.runners)]
    fleet = Fleet(runners, Node(work, url, "api", "api", **settings))
    began = time.monotonic()
    fleet.start()
    flood = Flood(fleet.api, hook, rng.randrange(2**31), args.rate, args.cancel_every)
    streams: list[Stream] = []
    try:
        _until(lambda: all(_ready(node) for node in fleet.nodes), 180, "every node to be ready", fleet)
        if kind.startswith("delivery"):
            wait_for(lambda: delivering(fleet.runners) is not None, 60)  # else the fault says none did: a failed trial
        at = rng.uniform(0.25, 0.6) * args.seconds
        outlast = at + _length(kind, args) + 6  # a stream's job runs past the fault
        with httpx.Client() as client:
            for i in range(args.streams):
                answer = flood.submit(client, f"streamed {i}", int(outlast / 0.2), 0.2, priority=1)
                if answer.job is not None:
                    streams.append(Stream(fleet.api, answer.job, float("inf")))
        started = time.monotonic()
        setup = started - began
        for s in streams:
            s.start()
        flood.start()
        time.sleep(max(0.0, started + at - time.monotonic()))
        fault = FAULTS[kind](server, fleet, url, rng, args)
        time.sleep(max(0.0, started + args.seconds - time.monotonic(), fault.ended + args.recover - time.monotonic()))
        flood.join()
        drained = time.monotonic() + args.drain
        for s in streams:
            s.deadline = drained + args.deliver
        last: dict[str, tuple[str, int]] = {}

        def ended() -> bool:
            nonlocal last
            last = _statuses(url) or last
            return bool(last) and all(status in TERMINAL_TYPES for status, _ in last.values())

        wait_for(ended, args.drain)
        drain = time.monotonic() - drained + args.drain
        stuck = sorted(j for j, (status, _) in last.items() if status not in TERMINAL_TYPES)

        def answered() -> set[str]:
            return {g[0] for g in rec.answered()}

        terminal_ids = {f"msg_{j}_{seq}" for j, (status, seq) in last.items() if status in TERMINAL_TYPES}
        wait_for(lambda: terminal_ids <= answered(), args.deliver)
        for s in streams:
            s.join(max(0.0, s.deadline - time.monotonic()) + 35)
    finally:
        flood.join()
        fleet.close()
        for s in streams:
            s.deadline = 0  # their node is gone: no more tries
        receiver.shutdown()
        receiver.server_close()
    result = _judge(url, work, kind, n, fault, flood, streams, rec, fleet, stuck)
    return {**result, "setup s": setup, "drain s": drain, "trial s": time.monotonic() - began}


def _judge(
    url: str,
    work: Path,
    kind: str,
    n: int,
    fault: Fault,
    flood: Flood,
    streams: list[Stream],
    rec: Receiver,
    fleet: Fleet,
    stuck: list[str],
) -> dict[str, Any]:
    """What the trial's store, receiver, streams and flood show, once every node has stopped."""
    store = PostgresEventStore(url)
    try:
        rows = _sql(url, "SELECT job_id FROM jobs")
        if rows is None:
            raise SystemExit(f"the store at {url} does not answer after the trial")
        jobs = [job for (job,) in rows]
        logs = {job: store.events(job) for job in jobs}
    finally:
        store.close()
    acknowledged = flood.acknowledged()
    terminal = {job: next(e for e in reversed(events) if e.terminal) for job, events in logs.items() if events[-1].terminal}
    # The receiver's monotonic clock, to the wall clock the events' `at` are on.
    offset = time.time() - time.monotonic()
    arrivals: dict[str, list[tuple[str, float]]] = {}
    for msg_id, body, _, at in rec.answered():
        arrivals.setdefault(json.loads(body)["data"]["job_id"], []).append((msg_id, at + offset))
    missing, after, latencies = 0, 0, []
    for job, end in terminal.items():
        end_id = f"msg_{job}_{end.seq}"
        seen: set[str] = set()
        got_end = None
        for msg_id, at in arrivals.get(job, []):
            if msg_id in seen:
                continue  # a repeat of an id already received: allowed
            if got_end is not None:
                after += 1
            seen.add(msg_id)
            if msg_id == end_id:
                got_end = at
        if got_end is None:
            missing += 1
        else:
            latencies.append(got_end - end.at.timestamp())
    # Back to 201: the first 201 after the store's return that no refused or unanswered submit follows.
    answers = sorted(flood.answers, key=lambda a: a.answered)
    failed = [a.answered for a in answers if a.status != 201]
    since = max([fault.ended, *failed])
    back = next((a.answered - fault.ended for a in answers if a.status == 201 and a.answered >= since), None)
    codes = Counter(a.status for a in flood.answers)
    verify = subprocess.run(
        [sys.executable, "-m", "h3core.cli", "verify", "--db", url, "--artifacts", str(work / "artifacts")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return {
        "kind": kind,
        "fault": fault.detail,
        "acknowledged": len(acknowledged),
        "n": n,
        "cancels": dict(flood.cancels),
        "lost": sum(1 for j in acknowledged if j not in logs),
        "stuck": len(stuck),
        "two terminals": sum(1 for events in logs.values() if sum(e.terminal for e in events) > 1),
        "verify": verify.returncode == 0,
        "verify out": (verify.stdout + verify.stderr).strip()[-300:],
        "returned s": back,
        "5xx": sum(c for s, c in codes.items() if s is not None and s >= 500),
        "4xx": sum(c for s, c in codes.items() if s is not None and 400 <= s < 500),
        "no answer": codes[None],
        "missing": missing,
        "after terminal": after,
        "webhook max s": max(latencies, default=float("nan")),
        "streams": len(streams),
        "cut": sum(1 for s in streams if s.cuts),
        "unfinished": sum(1 for s in streams if not s.terminal),
        "gaps": sum(1 for s in streams if s.gaps),
        "exits": list(fleet.exits),
        "statuses": dict(Counter(events[-1].type for events in logs.values())),
    }


# -- the tables --------------------------------------------------------------------------------

ZERO = ["lost", "stuck", "two terminals", "missing", "after terminal", "cut", "unfinished", "gaps"]


def _returned(values: list[float | None]) -> str:
    """The slowest return to 201 of `values`, or "never (n)" where n trials never returned."""
    never = sum(v is None for v in values)
    return f"never ({never})" if never else f"{max(v for v in values if v is not None):.1f}"


def _seconds(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _passes(results: list[dict[str, Any]]) -> bool:
    return all(
        all(r[c] == 0 for c in ZERO)
        and r["verify"]
        and not r["exits"]
        and r["returned s"] is not None
        and r["returned s"] <= RECOVERY_BAR_S
        and not r["fault"].startswith("none")
        for r in results
    )


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    t = table(
        f"every trial: {args.runners} runner nodes and 1 API node on one PostgreSQL, a {args.seconds:g} s flood "
        f"at {args.rate:g} jobs/s, {args.streams} streams",
        ["kind", "n", "acked", "lost", "stuck", "2 ends", "verify", "201 back s", "5xx/4xx/none"]
        + ["hooks missing", "after end", "hook max s", "cut/unf/gap", "exits"],
        caption="acked: submits answered 201; 2 ends: logs with two terminal events; 201 back s: from the store's "
        "return to the first 201 no failed submit follows; 5xx/4xx/none: the flood's submits answered so or not at all; "
        "hooks missing: terminal events whose webhook never came; after end: a job's deliveries after its terminal one; "
        "hook max s: the longest from a terminal event to its webhook; cut/unf/gap: streams that ended without their "
        "terminal event / never got it / skipped a seq; exits: node processes that exited (their status)",
        left=2,
    )
    for r in results:
        t.add_row(
            r["kind"],
            str(r["n"]),
            str(r["acknowledged"]),
            str(r["lost"]),
            str(r["stuck"]),
            str(r["two terminals"]),
            "clean" if r["verify"] else "FAILED",
            _returned([r["returned s"]]),
            f"{r['5xx']}/{r['4xx']}/{r['no answer']}",
            str(r["missing"]),
            str(r["after terminal"]),
            _seconds(r["webhook max s"]),
            f"{r['cut']}/{r['unfinished']}/{r['gaps']}",
            " ".join(f"{name}({rc})" for name, rc in r["exits"]) or "0",
        )
    show(t)
    for r in results:
        console.print(
            f"- {r['kind']} {r['n']}: fault {r['fault']}; cancels answered {json.dumps(r['cancels'])}; "
            f"{r['streams']} streams; final statuses {json.dumps(r['statuses'])}"
            + ("" if r["verify"] else f"; h3core verify: {r['verify out']}")
        )
    console.print()
    s = table(
        "per kind: the issue's bar",
        ["kind", "trials", "acked", "lost", "stuck", "2 ends", "verify", "201 back s", "hook miss", "after end"]
        + ["hook max s", "cut", "unf", "exits", "verdict"],
        caption="sums over the kind's trials; 201 back s and hook max s: the largest; verify: trials whose verify failed; "
        f"verdict: pass when every count is 0 (stream gaps too), verify clean and submits answer 201 again within "
        f"{RECOVERY_BAR_S:g} s of the store's return, in every trial of the kind",
    )
    for kind in dict.fromkeys(r["kind"] for r in results):
        rs = [r for r in results if r["kind"] == kind]
        total = lambda c, rs=rs: str(sum(r[c] for r in rs))  # noqa: E731
        s.add_row(
            kind,
            str(len(rs)),
            total("acknowledged"),
            total("lost"),
            total("stuck"),
            total("two terminals"),
            str(sum(not r["verify"] for r in rs)),
            _returned([r["returned s"] for r in rs]),
            total("missing"),
            total("after terminal"),
            _seconds(max((r["webhook max s"] for r in rs if not math.isnan(r["webhook max s"])), default=math.nan)),
            total("cut"),
            total("unfinished"),
            str(sum(len(r["exits"]) for r in rs)),
            "pass" if _passes(rs) else "FAIL",
        )
    show(s)


def main(argv: list[str] | None = None, pg: object | None = None) -> None:
    """`pg`: a running tests.pgserver.PgServer to use (its sessions are ended and it is restarted:
    never the suite's shared one), else one is started."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=3, help="trials of each kind (default 3)")
    ap.add_argument("--kinds", type=lambda s: s.split(","), default=list(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    ap.add_argument("--seconds", type=float, default=10.0, help="the flood's least length (default 10)")
    ap.add_argument("--rate", type=float, default=4.0, help="submits per second, in all (default 4)")
    ap.add_argument("--cancel-every", type=float, default=1.5, help="seconds between cancels (default 1.5)")
    ap.add_argument("--streams", type=int, default=3, help="live streams per trial (default 3)")
    ap.add_argument("--runners", type=int, default=3, help="runner nodes (default 3)")
    ap.add_argument("--lease", type=float, default=2.0, help="the nodes' lease, H3_LEASE (default 2)")
    ap.add_argument("--pause", type=float, default=10.0, help="postmaster_pause: seconds paused (default 10)")
    ap.add_argument("--freeze", type=float, default=5.0, help="runner_frozen: seconds frozen (default 5)")
    ap.add_argument("--delivery-freeze", type=float, default=10.0, help="delivery_frozen: seconds frozen (default 10)")
    ap.add_argument("--recover", type=float, default=12.0, help="the flood's least length after the fault (default 12)")
    ap.add_argument("--drain", type=float, default=60.0, help="seconds every job has to end after the flood (default 60)")
    ap.add_argument("--deliver", type=float, default=30.0, help="then seconds for the terminal webhooks (default 30)")
    ap.add_argument("--seed", type=int, default=37)
    ap.add_argument("--workdir", type=Path, default=None, help="logs and artifacts (default: a new temp dir)")
    args = parse(ap, argv, __spec__.name)
    if unknown := [k for k in args.kinds if k not in KINDS]:
        ap.error(f"--kinds: unknown {', '.join(unknown)}; known: {', '.join(KINDS)}")
    if args.freeze <= args.lease:
        ap.error(f"--freeze ({args.freeze:g} s) must outlast --lease ({args.lease:g} s)")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="h3bench-fleet-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    print_machine(work, "the fleet under faults")
    results = []
    with postgres(pg) as server:
        # Durable commits: an immediate stop must not lose what PostgreSQL acknowledged (the
        # throwaway server runs with synchronous_commit off; a database's setting wins over it).
        _sql(server.url(), "ALTER DATABASE postgres SET synchronous_commit = on")
        if _sql(server.url(), "SHOW synchronous_commit") != [("on",)]:
            raise SystemExit("could not make the store's commits durable (synchronous_commit)")
        for kind in args.kinds:
            for n in range(args.trials):
                r = trial(server, work / f"{kind}-{n}", kind, n, args)
                results.append(r)
                console.print(
                    f"{kind} {n}: {r['fault']}; {r['acknowledged']} acked, lost {r['lost']}, stuck {r['stuck']}, "
                    f"201 back {_returned([r['returned s']])} s, hooks missing {r['missing']}, streams cut {r['cut']}, "
                    f"exits {r['exits']}; {r['trial s']:.0f} s (nodes ready in {r['setup s']:.0f} s, "
                    f"drained in {r['drain s']:.0f} s)"
                )
    report(results, args)
    print_load_at_end()


if __name__ == "__main__":
    main()
