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
- `before_commit`: killed inside the commit, before anything records it: a complete `.part` file.

After the last kill, every job left running is judged as recovery judges it (is its attempt's
committed video intact?); then a clean worker runs until every job has ended. Counted per kind:
acknowledged jobs lost, jobs not ended (stuck), attempts recorded as interrupted, videos finished
but unrecorded at the crash,
how many of those ended done on that same attempt with the same sha256 (adopted) and how many
ran again (thrown away), finished videos recovery removed (a whole video, not a `.part`, named
as discarded in the log), partial files left, files `h3core gc` would remove, and `h3core verify`
(logs and every video's sha256) failures.
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
from h3core.domain.adoption import Adopt, judge
from h3core.domain.request import GenerationRequest
from h3core.domain.retention import garbage
from h3core.runtime.submissions import Submissions

CRASHING = ROOT / "tests" / "integration" / "crashing_worker.py"
KINDS = ("random", "double", "after_commit", "after_record", "before_commit")


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


def _finished_discarded(detail: str | None) -> int:
    """Whole videos among the files a recovery discarded (its failure's detail lists them)."""
    if not detail or not detail.startswith("discarded: "):
        return 0
    paths = [item.split(" (", 1)[0] for item in detail.removeprefix("discarded: ").split("; ")]
    return sum(1 for p in paths if not p.endswith((".part", ".record.json")))


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
    unrecorded = {}
    for state in store.unfinished():
        verdict = judge(state, videos.committed(state.job_id, state.attempt))
        if isinstance(verdict, Adopt):
            unrecorded[state.job_id] = (state.attempt, verdict.artifact.sha256)

    final = _worker(db, artifacts, log)
    wait_for(lambda: all(s is not None and s.terminal for s in map(store.get, ids)), 120)
    final.send_signal(signal.SIGTERM)
    final.wait(30)

    states = {j: store.get(j) for j in ids}
    files = videos.files()
    adopted = sum(
        1
        for j, (attempt, sha) in unrecorded.items()
        if states[j].status == "done" and states[j].attempt == attempt and states[j].artifact.sha256 == sha
    )
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
        "finished_discarded": sum(_finished_discarded(e.body.detail) for j in ids for e in store.events(j) if e.type in _ENDS),
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
        "unrecorded: videos committed but not yet recorded done at the crash; adopted: of those, ended done on that "
        "attempt with the same sha256; rerun: of those, ran again; finished_discarded: whole videos (not "
        "`.part` files) recovery removed, as the log names them; part_left: partial files after recovery; "
        "garbage: files `h3core gc` would remove; verify_failed: trials where `h3core verify` (logs and sha256) failed.",
    )
    for kind in kinds:
        total = dict.fromkeys(columns[2:], 0)
        started = time.perf_counter()
        for n in range(a.trials):
            for k, v in trial(kind, workdir / f"{kind}-{n}", rng, a.jobs, a.steps).items():
                total[k] += v
        t.add_row(kind, str(a.trials), *(str(total[c]) for c in columns[2:]))
        console.print(f"{kind}: {a.trials} trials in {time.perf_counter() - started:.1f} s")
    show(t)
    print_load_at_end()


if __name__ == "__main__":
    main()
