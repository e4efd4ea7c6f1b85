"""Crash trials with the videos in an object store: runner nodes on one PostgreSQL and one
SeaweedFS, each with folders of its own (nothing shared on disk), one killed with SIGKILL around
the upload of a video; what survives, and what is left in the bucket and on the nodes' disks.

    python -m bench.crash.s3_nodes                              # 10 trials of each kind (about 10 min on 2 busy cores)
    python -m bench.crash.s3_nodes --trials 2 --kinds mid_upload,random

Every trial starts from nothing: a fresh schema on one throwaway PostgreSQL (tests/pgserver.py) and
a fresh prefix in one throwaway SeaweedFS (tests/seaweed.py), `--jobs` jobs stored as `h3core
enqueue` does (retried up to 5 attempts), then `--nodes` `h3core worker` processes (`r0`, `r1`,
...: the fake executor, 1 slot), each started in a folder of its own with its own `H3_STAGING`.
The fake writes YUV4MPEG2 (`CRASHING_FAKE_ENCODING`, tests/integration/crashing_worker.py):
`--frames` frames of 128x128 are 17.7 MB at the default 720, above the store's 16 MiB multipart
threshold, so every video goes up as a multipart upload of 2 parts streamed from the staged file.

The kinds (the first three kill inside the real commit, at a point, not at a time guessed):

- `before_upload`: `r0` kills itself as its first video's upload starts (staged whole and hashed);
- `mid_upload`: `r0` kills itself once the first part of its first video's multipart upload is
  stored (boto3's `after-call.s3.UploadPart`): an upload begun, never completed;
- `after_upload`: `r0` kills itself once its first video is up with its record, before `Done`;
- `random`: a node that holds a lease at a random moment (seeded) in the queue's run is killed.

For the first three, `r0` starts alone and the other nodes once it holds a job. The killed node is
started again at once (`at_once`, even trials; lease `--lease`, h3core's 30 s: it is back within
it, and its own recovery finds its attempt, its staged file and its upload) or once another node
has taken its attempts over (`late`, odd trials; lease `--short-lease`: past it another node ends
them, and can only adopt a video whose object is complete; a staged file on the dead node's disk
is not there for it, so that attempt runs again: a rerun, not a loss). Then every job gets 120 s to
end, the nodes are stopped (SIGTERM), and each trial is counted, summed per kind and restart:

- lost: acknowledged jobs the store lacks, or that ended without their video; stuck: not ended;
  exits: node processes that exited unasked (each is started again at once); verify: trials where
  `h3core verify --artifacts s3://...` (logs, and every done video's sha256 in the bucket) failed;
- uploads, after gc: unfinished multipart uploads under the trial's prefix at the end
  (list_multipart_uploads), before and after `h3core gc` (run as an operator would, from any box);
  gc removed: what it removed; staged left: files left in the nodes' staging folders; back s: the
  longest from the kill to the restarted node being ready (after its recovery; late: the wait for
  the takeover included);
- held: attempts the killed node held at the kill; staged / uploads at kill: their staged files on
  its disk and their multipart uploads begun, then; finished: held attempts whose video was whole
  at the kill (a staged file or an object byte for byte the video the job ended with: the fake
  draws the same video on every attempt); adopted own / other: held attempts that ended done on
  that attempt, by the killed node's restart / by another node (the writer of the `recovered`
  event, as the store records it); rerun fin / unfin: held attempts that ran again, whose video
  was finished / not finished at the kill.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psycopg

from bench.common import ROOT, console, parse, postgres, print_load_at_end, print_machine, seaweed, show, table
from h3core.adapters.artifacts.s3 import S3ArtifactStore, parse_s3_url
from h3core.adapters.store.postgres import PostgresEventStore
from h3core.domain.admission import AdmitAll
from h3core.domain.request import GenerationRequest
from h3core.domain.retry import RetryPolicy
from h3core.runtime.config import RunnerConfig
from h3core.runtime.submissions import Submissions

CRASHING = ROOT / "tests" / "integration" / "crashing_worker.py"
KINDS = ("before_upload", "mid_upload", "after_upload", "random")
RESTARTS = ("at_once", "late")
SIDE = 128  # the fake draws at most 128 pixels a side: 24,582 bytes a frame in YUV4MPEG2
END_S = 120.0  # every job ends within this after the restart (a loaded box included)


class Node:
    """One `h3core worker` (through crashing_worker.py: `mode` names where it kills itself, `none`
    nowhere) in its own folder, with its own staging folder."""

    def __init__(self, work: Path, name: str, env: dict[str, str]) -> None:
        self.root, self.name = work / name, name
        self.root.mkdir(parents=True)
        self.staging = self.root / "staging"
        self.log = self.root / "worker.log"
        self.env = {**env, "H3_NODE": name, "H3_STAGING": str(self.staging)}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, mode: str = "none") -> None:
        cmd = [sys.executable, str(CRASHING), mode, "worker"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.root)
        self.starts += 1

    def ready(self) -> bool:
        """Started and past its recovery (`worker: ready` once per start)."""
        return self.log.read_bytes().count(b"worker: ready") >= self.starts

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def staged_left(self) -> int:
        return sum(1 for p in self.staging.rglob("*") if p.is_file()) if self.staging.exists() else 0


def _env(pg_url: str, s3_url: str, s3_env: dict[str, str], lease: float, args: argparse.Namespace) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("H3_", "AWS_"))}
    env.update(s3_env)
    env.update(
        PYTHONPATH=str(ROOT),
        CRASHING_FAKE_ENCODING="y4m",
        H3_DB=pg_url,
        H3_ARTIFACTS=s3_url,
        H3_EXECUTOR="fake",
        H3_FAKE_STEP_SECONDS=str(args.step),
        H3_POLL_INTERVAL="0.05",
        H3_SLOTS="1",
        H3_LEASE=str(lease),
        H3_LOG_LEVEL="warning",
    )
    return env


def _cli(env: dict[str, str], *args: str) -> tuple[int, str]:
    """`h3core ARGS` in this process (a process of its own costs seconds on a loaded box): exit code, output."""
    from typer.testing import CliRunner

    from h3core.cli import app

    aws = {k: v for k, v in env.items() if k.startswith("AWS_")}
    result = CliRunner().invoke(app, list(args), env={**aws, "COLUMNS": "200", "AWS_PROFILE": None})
    return result.exit_code, result.output


async def _enqueue(url: str, args: argparse.Namespace) -> list[str]:
    store = PostgresEventStore(url)
    try:  # as `enqueue` stores them, every request admitted (no node has joined yet to judge it)
        submissions = Submissions(store, RunnerConfig(retry=RetryPolicy(max_attempts=5)), admission=AdmitAll())
        requests = [
            GenerationRequest(prompt=f"s3 trial job {i}", steps=args.steps, frames=args.frames, width=SIDE, height=SIDE, seed=i)
            for i in range(args.jobs)
        ]
        return [(await submissions.submit(r)).state.job_id for r in requests]
    finally:
        store.close()


def _uploads(s3: Any, s3_url: str) -> int:
    """Multipart uploads begun under the trial's prefix and neither completed nor aborted."""
    bucket, prefix = parse_s3_url(s3_url)
    pages = s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix + "/")
    return sum(len(page.get("Uploads", [])) for page in pages)


def _until(predicate: Callable[[], bool], timeout: float, what: str, watch: Callable[[], None]) -> bool:
    """Poll `predicate` (calling `watch` between looks, the supervisor) until it holds; False after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        watch()
        if predicate():
            return True
        time.sleep(0.05)
    console.print(f"  timed out after {timeout:g} s waiting for {what}")
    return False


def _adopter(pg_url: str, job_id: str) -> str | None:
    """The node that wrote the job's `recovered` event (the store records each event's writer)."""
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT node FROM events WHERE job_id = %s AND type = 'recovered'", (job_id,)).fetchone()
    return row[0] if row else None


def trial(kind: str, n: int, work: Path, pg: Any, weed: Any, rng: random.Random, args: argparse.Namespace) -> dict[str, float]:
    work.mkdir(parents=True)
    pg_url, s3_url = pg.fresh_schema(), weed.fresh_url()
    restart = RESTARTS[n % 2]
    env = _env(pg_url, s3_url, weed.env(), args.lease if restart == "at_once" else args.short_lease, args)
    ids = anyio.run(_enqueue, pg_url, args)
    store = PostgresEventStore(pg_url)
    s3 = weed.client()
    nodes = [Node(work, f"r{i}", env) for i in range(args.nodes)]
    exits: list[tuple[str, int]] = []
    victim: Node | None = None
    began = time.monotonic()
    marks: dict[str, float] = {}  # seconds from the trial's start (printed per trial: where its time went)

    def dead_or_holding(node: Node) -> bool:
        return not node.alive() or node.name in store.leases.lease_holders().values()

    def supervise() -> None:
        """A node that exited unasked (not the victim while it is down) is counted and started again."""
        for node in nodes:
            if node is not victim and node.proc is not None and node.proc.poll() is not None:
                exits.append((node.name, node.proc.returncode))
                console.print(f"  {node.name} exited {node.proc.returncode}: {node.log.read_text(errors='replace')[-1500:]}")
                node.start()

    try:
        if kind != "random":  # r0 gets a job of its own: the others start once it holds one
            r0 = nodes[0]
            r0.start(kind)
            _until(lambda: dead_or_holding(r0), 120, "r0 to claim a job", lambda: None)
        for node in nodes:
            if node.proc is None:
                node.start()
        if kind == "random":
            _until(lambda: all(x.ready() for x in nodes), 120, "the nodes to be ready", supervise)
            marks["ready"] = time.monotonic() - began
            # Somewhere in the queue's run: each node makes jobs/3 videos, each its steps and about a second more.
            time.sleep(rng.uniform(0.0, args.jobs / args.nodes * (args.steps * args.step + 1.0)))
            holders = set(store.leases.lease_holders().values())
            victim = rng.choice([x for x in nodes if x.name in holders] or nodes)
            victim.kill()
        else:
            victim = r0
            _until(lambda: not r0.alive(), 120, f"r0 to kill itself ({kind})", supervise)
            assert r0.proc is not None
            if r0.proc.poll() != -signal.SIGKILL:
                r0.kill()
                tail = r0.log.read_text(errors="replace")[-2000:]
                raise SystemExit(f"r0 did not die at {kind} (exit {r0.proc.returncode}): {tail}")
        killed_at = time.monotonic()
        marks["killed"] = killed_at - began
        dead = victim.name
        # Its leases stay its own until they expire: the attempts it held at the kill. What it left
        # of them is read, nothing judged: its staged files on its disk, the objects and uploads.
        held = {j: store.get(j).attempt for j, holder in store.leases.lease_holders().items() if holder == dead}
        at_kill = S3ArtifactStore(s3_url, victim.staging, client=s3)
        left = {j: at_kill.attempt_files(j, a) for j, a in held.items()}

        def ended(job: str, attempt: int) -> bool:
            s = store.get(job)
            return s is not None and (s.status != "running" or s.attempt != attempt)

        if restart == "late":
            _until(lambda: all(ended(j, a) for j, a in held.items()), 4 * args.short_lease + 60, "the takeover", supervise)
            marks["taken over"] = time.monotonic() - began
        back = victim
        back.start()
        victim = None  # from here, any exit is unasked
        _until(back.ready, 120, f"{back.name} to be ready again", supervise)
        marks["back"] = time.monotonic() - began
        _until(lambda: all((s := store.get(j)) is not None and s.terminal for j in ids), END_S, "every job to end", supervise)
        marks["ended"] = time.monotonic() - began
    finally:
        for node in nodes:
            node.stop()

    states = {j: store.get(j) for j in ids}
    videos = {j: s.artifact.sha256 for j, s in states.items() if s is not None and s.status == "done" and s.artifact}
    out: dict[str, float] = dict.fromkeys(COLUMNS, 0)
    for job, attempt in held.items():
        # Finished at the kill: a staged file or object byte for byte the job's final video.
        finished = videos.get(job) in {f.sha256 for f in left[job] if f.sha256 is not None}
        out["finished"] += finished
        out["staged at kill"] += sum(1 for f in left[job] if f.partial and f.sha256 is not None)
        out["uploads at kill"] += sum(1 for f in left[job] if f.partial and f.sha256 is None)  # measured as 0 bytes
        s = states[job]
        if s is not None and s.status == "done" and s.attempt == attempt:
            out["adopted own" if _adopter(pg_url, job) == dead else "adopted other"] += 1
        else:
            out["rerun fin" if finished else "rerun unfin"] += 1
    out["uploads"] = _uploads(s3, s3_url)
    gc_exit, gc = _cli(env, "gc", "--db", pg_url, "--artifacts", s3_url)
    removed = re.search(r"; (\d+) not needed", gc)
    verify_exit, verify = _cli(env, "verify", "--db", pg_url, "--artifacts", s3_url)
    if verify_exit != 0 or gc_exit != 0:
        console.print(f"  {kind} {n}: gc exit {gc_exit}, verify exit {verify_exit}:\n{gc}{verify}")
    marks["checked"] = time.monotonic() - began
    out.update(
        jobs=len(ids),
        lost=sum(1 for j in ids if states[j] is None or (states[j].terminal and j not in videos)),
        stuck=sum(1 for s in states.values() if s is not None and not s.terminal),
        exits=len(exits),
        held=len(held),
        verify=int(verify_exit != 0),
    )
    out["after gc"] = _uploads(s3, s3_url)
    out["gc removed"] = int(removed.group(1)) if removed else -1
    out["staged left"] = sum(node.staged_left() for node in nodes)
    out["back s"] = round(marks["back"] - marks["killed"], 1)
    store.close()
    console.print(f"{kind} {n} ({restart}): " + ", ".join(f"{k} at {v:.1f} s" for k, v in marks.items()))
    return out


JOBS = ["jobs", "lost", "stuck", "exits", "verify", "uploads", "after gc", "gc removed", "staged left"]
KILLED = ["held", "staged at kill", "uploads at kill", "finished", "adopted own", "adopted other", "rerun fin", "rerun unfin"]
COLUMNS = [*JOBS, *KILLED]


def main(argv: list[str] | None = None, pg: object | None = None, server: object | None = None) -> None:
    """`pg`, `server`: a running tests.pgserver.PgServer and tests.seaweed.SeaweedServer to use
    (the suite's), else each is started for the run."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=10, help="trials of each kind (default 10): even ones restart at once, odd late")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    p.add_argument("--nodes", type=int, default=3, help="runner nodes (default 3; late trials need 2 at least)")
    p.add_argument("--jobs", type=int, default=6, help="jobs per trial (default 6)")
    p.add_argument("--steps", type=int, default=4, help="steps per job (default 4)")
    p.add_argument("--step", type=float, default=0.1, help="seconds per step (default 0.1)")
    p.add_argument("--frames", type=int, default=720, help="frames per video, 24,582 bytes each (default 720: 17.7 MB, 2 parts)")
    p.add_argument("--lease", type=float, default=30.0, help="at_once trials: the nodes' lease, H3_LEASE (default 30, h3core's)")
    p.add_argument("--short-lease", type=float, default=5.0, help="late trials: the nodes' lease (default 5)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=None)
    a = parse(p, argv, __spec__.name)
    kinds = [k for k in a.kinds.split(",") if k]
    if unknown := set(kinds) - set(KINDS):
        p.error(f"unknown kind(s) {sorted(unknown)}; known: {', '.join(KINDS)}")
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="h3crash-s3-"))
    print_machine(workdir, "Crash trials with S3 artifacts")
    rng = random.Random(a.seed)
    size = a.frames * (SIDE * SIDE * 3 // 2 + 6) / 1e6
    setup = (
        f"{a.nodes} nodes, {a.jobs} jobs x {a.steps} steps, {a.frames} frames of {SIDE}x{SIDE} y4m ({size:.1f} MB a video); "
        f"lease {a.lease:g} s at once, {a.short_lease:g} s late; seed {a.seed}"
    )
    jobs = table(
        f"Jobs, and what was left in the bucket and on the nodes' disks ({setup})",
        ["kind", "restart", "trials", *JOBS, "back s"],
        left=2,
        caption="sums over the trials (see --help): lost: acknowledged jobs missing or ended without their video; stuck: "
        "not ended; exits: node processes that exited unasked; verify: trials where `h3core verify --artifacts s3://...` "
        "failed; uploads, after gc: unfinished multipart uploads under the trial's prefix at the end, before and after "
        "`h3core gc`; gc removed: files gc removed; staged left: files left in the nodes' staging folders; back s: the "
        "longest from the kill to the killed node's restart being ready (late: the takeover waited for first).",
    )
    killed = table(
        "The killed node's attempts",
        ["kind", "restart", *KILLED],
        left=2,
        caption="held: attempts the killed node held at the kill; staged, uploads at kill: of their files then, staged "
        "on its disk and multipart uploads begun; finished: attempts whose video was whole at the kill (staged or "
        "object); adopted own / other: ended done on that attempt by the killed node's restart / by another node "
        "(the writer of its `recovered` event); rerun fin / unfin: ran again, finished / not at the kill.",
    )
    with postgres(pg) as pg_server, seaweed(server) as weed:
        for kind in kinds:
            started = time.perf_counter()
            totals = {r: dict.fromkeys([*COLUMNS, "back s"], 0.0) for r in RESTARTS}
            runs = dict.fromkeys(RESTARTS, 0)
            for n in range(a.trials):
                got = trial(kind, n, workdir / f"{kind}-{n}", pg_server, weed, rng, a)
                restart = RESTARTS[n % 2]
                runs[restart] += 1
                for k, v in got.items():
                    totals[restart][k] = max(totals[restart][k], v) if k == "back s" else totals[restart][k] + v
                console.print("  " + ", ".join(f"{k} {v:g}" for k, v in got.items()))
            for restart in RESTARTS:
                if runs[restart]:
                    t = totals[restart]
                    jobs.add_row(kind, restart, str(runs[restart]), *(f"{t[c]:g}" for c in JOBS), f"{t['back s']:.1f}")
                    killed.add_row(kind, restart, *(f"{t[c]:g}" for c in KILLED))
            console.print(f"{kind}: {a.trials} trials in {time.perf_counter() - started:.1f} s")
    show(jobs)
    show(killed)
    print_load_at_end()


if __name__ == "__main__":
    main()
