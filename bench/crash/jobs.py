"""Crash trials: real `h3core worker` processes killed with SIGKILL, then restarted; what survives.

    python -m bench.crash.jobs                          # 10 trials of each kind, 6 jobs each
    python -m bench.crash.jobs --trials 3 --kinds after_commit,random

Kinds of trial (each on a fresh store and artifact folder, jobs stored as `h3core enqueue` does):

- `random`: a worker killed at a random moment (seeded) while it works through the jobs;
- `double`: the same, then the restarted worker killed again at a random moment;
- `after_commit`: a worker that kills itself inside the artifact commit, after the video and its
  record are written, before the runner can write Done (tests/integration/crashing_worker.py);
- `after_record`: killed inside the commit after its record, before the rename: a complete
  `.part` file that its record names (recovery finishes the rename);
- `before_record`: killed inside the commit after the `.part` is fsynced and hashed, before its
  record: a complete `.part` file nothing records (recovery reads it whole and commits it);
- `before_commit`: killed as the commit starts, the encoder done: a complete `.part` file;
- `mid_write`: the `.part` cut short (as a kill while the encoder writes leaves it), killed
  before the commit: never a whole video, never to be adopted.

After the last kill, each job left running has its attempt's files read (sha256, nothing judged
or renamed); then a clean worker runs until every job has ended. A video was finished at the kill
where one of those files is byte for byte the video the job ended with (the fake draws the same
video on every attempt: a rerun makes it again). Counted per kind: acknowledged jobs lost, jobs
not ended (stuck), attempts recorded as interrupted, videos finished but not recorded done at the
crash (unrecorded), how many of those ended done on that same attempt (adopted) and how many ran
again (rerun: the encode redone), finished videos recovery removed (a whole video, not a `.part`,
named as discarded in the log), complete staged videos it removed (a `.part` named as discarded
whose sha256 is the job's final video's), partial files left, files `h3core gc` would remove, and
`h3core verify` (logs and every video's sha256) failures.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from bench.common import ROOT, console, parse, print_load_at_end, print_machine, show, table, wait_for
from h3core.adapters.artifacts import LocalArtifactStore
from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.domain.request import GenerationRequest
from h3core.domain.retention import garbage
from h3core.runtime.submissions import Submissions

CRASHING = ROOT / "tests" / "integration" / "crashing_worker.py"
KINDS = ("random", "double", "after_commit", "after_record", "before_record", "before_commit", "mid_write")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("H3_")}


def _cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "h3core.cli", *map(str, args)], capture_output=True, text=True, env=_env(), timeout=120
    )


def _worker(db: Path, artifacts: Path, log: Path, *, crash_at: str | None = None, step: float = 0.02) -> subprocess.Popen:
    program = [str(CRASHING), crash_at] if crash_at else ["-m", "h3core.cli"]
    cmd = [
        sys.executable,
        *program,
        "worker",
        "--db",
        db,
        "--artifacts",
        artifacts,
        "--executor",
        "fake",
        "--poll-interval",
        "0.05",
        "--fake-step-seconds",
        step,
    ]
    with open(log, "ab") as out:
        return subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=db.parent)


async def _enqueue(db: Path, jobs: int, steps: int) -> list[str]:
    store = SQLiteEventStore(db)
    try:
        submissions = Submissions(store)  # as `enqueue` does
        requests = [GenerationRequest(prompt=f"trial job {i}", steps=steps, frames=12, width=64, height=64) for i in range(jobs)]
        return [(await submissions.submit(r)).state.job_id for r in requests]
    finally:
        store.close()


def _kill_at_random(proc: subprocess.Popen, log: Path, rng: random.Random, window: float) -> None:
    wait_for(lambda: b"worker: ready" in log.read_bytes() or proc.poll() is not None, 60)
    deadline = time.monotonic() + rng.uniform(0.0, window)
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.005)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(30)


_ENDS = ("attempt_failed", "failed")


def _discarded(detail: str | None) -> list[tuple[str, str]]:
    """The (path, sha256) of each file a recovery discarded (its failure's detail lists them)."""
    if not detail or not detail.startswith("discarded: "):
        return []
    items = [item.split(" (", 1) for item in detail.removeprefix("discarded: ").split("; ")]
    return [(path, rest.rsplit("sha256 ", 1)[-1].rstrip(")")) for path, rest in items]


def trial(kind: str, work: Path, rng: random.Random, jobs: int, steps: int) -> dict[str, int]:
    work.mkdir(parents=True)
    db, artifacts, log = work / "h3.db", work / "artifacts", work / "worker.log"
    ids = anyio.run(_enqueue, db, jobs, steps)
    # The whole queue takes about jobs * (steps * step + ~0.05 s); kill somewhere inside it.
    window = jobs * (steps * 0.02 + 0.05)
    kills = 0
    if kind in ("random", "double"):
        for _ in range(2 if kind == "double" else 1):
            _kill_at_random(_worker(db, artifacts, log), log, rng, window)
            kills += 1
    else:
        proc = _worker(db, artifacts, log, crash_at=kind, step=0.0)
        proc.wait(60)
        kills += proc.returncode == -signal.SIGKILL

    store = SQLiteEventStore(db, durable=False)
    videos = LocalArtifactStore(artifacts)
    # Read, not judged: recovery's own verdict is what the trial measures.
    left = {
        s.job_id: (s.attempt, {f.sha256 for f in videos.attempt_files(s.job_id, s.attempt)})
        for s in store.unfinished()
        if s.status == "running"
    }

    final = _worker(db, artifacts, log)
    wait_for(lambda: all(s is not None and s.terminal for s in map(store.get, ids)), 120)
    final.send_signal(signal.SIGTERM)
    final.wait(30)

    states = {j: store.get(j) for j in ids}
    files = videos.files()
    made = {j: s.artifact.sha256 for j, s in states.items() if s is not None and s.artifact is not None}
    unrecorded = {j: attempt for j, (attempt, shas) in left.items() if made.get(j) in shas}
    adopted = sum(1 for j, attempt in unrecorded.items() if states[j].attempt == attempt)
    discarded = [(j, f) for j in ids for e in store.events(j) if e.type in _ENDS for f in _discarded(e.body.detail)]
    verify = _cli("verify", "--db", db, "--artifacts", artifacts)
    out = {
        "jobs": jobs,
        "kills": kills,
        "lost": sum(1 for j in ids if states[j] is None) + len(set(store.job_ids()) ^ set(ids)),
        "stuck": sum(1 for s in states.values() if s is None or not s.terminal),
        "interrupted": sum(
            1 for j in ids for e in store.events(j) if e.type in ("attempt_failed", "failed") and e.body.kind == "interrupted"
        ),
        "unrecorded": len(unrecorded),
        "adopted": adopted,
        "rerun": len(unrecorded) - adopted,
        "finished_discarded": sum(1 for _, (path, _) in discarded if not path.endswith((".part", ".record.json"))),
        "staged_discarded": sum(1 for j, (path, sha) in discarded if path.endswith(".part") and sha == made.get(j)),
        "part_left": sum(1 for f in files if f.partial),
        "garbage": len(garbage(files, {j: store.get(j) for j in {f.job_id for f in files}})),
        "verify_failed": int(verify.returncode != 0),
    }
    store.close()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=10, help="trials of each kind")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--jobs", type=int, default=6)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=None)
    a = parse(p, argv, __spec__.name)
    kinds = [k for k in a.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        p.error(f"unknown kind(s) {sorted(unknown)}; known: {', '.join(KINDS)}")
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="h3crash-"))
    print_machine(workdir, "Crash trials")
    rng = random.Random(a.seed)
    columns = [
        "kind",
        "trials",
        "jobs",
        "kills",
        "lost",
        "stuck",
        "interrupted",
        "unrecorded",
        "adopted",
        "rerun",
        "finished_discarded",
        "part_left",
        "garbage",
        "verify_failed",
    ]
    t = table(
        f"SIGKILL trials ({a.jobs} jobs x {a.steps} steps each, seed {a.seed})",
        columns,
        caption="interrupted: attempts recovery recorded as interrupted (a kill landed mid-job); "
        "unrecorded: videos finished (staged or committed: byte for byte the job's final video) but not yet recorded "
        "done at the crash; adopted: of those, ended done on that attempt; rerun: of those, ran again (the encode "
        "redone); finished_discarded: whole videos (not `.part` files) recovery removed, as the log names them; "
        "part_left: partial files after recovery; garbage: files `h3core gc` would remove; "
        "verify_failed: trials where `h3core verify` (logs and sha256) failed.",
    )
    # The issue-36 question on its own (the table above is as wide as a terminal allows): was a
    # finished encode ever redone, or a complete `.part` thrown away?
    encodes = ["kind", "trials", "unrecorded", "adopted", "rerun", "staged_discarded"]
    e = table(
        "Finished encodes at the kill",
        encodes,
        caption="unrecorded, adopted, rerun: as above; staged_discarded: complete `.part` files recovery removed "
        "(named as discarded in the log with the sha256 of the video the job ended with). 0 rerun and 0 "
        "staged_discarded: no finished encode was redone.",
    )
    for kind in kinds:
        total: dict[str, int] = {}
        started = time.perf_counter()
        for n in range(a.trials):
            for k, v in trial(kind, workdir / f"{kind}-{n}", rng, a.jobs, a.steps).items():
                total[k] = total.get(k, 0) + v
        t.add_row(kind, str(a.trials), *(str(total[c]) for c in columns[2:]))
        e.add_row(kind, str(a.trials), *(str(total[c]) for c in encodes[2:]))
        console.print(f"{kind}: {a.trials} trials in {time.perf_counter() - started:.1f} s")
    show(t)
    show(e)
    print_load_at_end()


if __name__ == "__main__":
    main()
